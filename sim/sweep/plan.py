"""``kvsim plan``: the smallest and cheapest deployments that meet SLOs, searched by running.

A question is one curve: a GPU kind and TP, a router, an eviction policy and a load (sessions
at once, or an open loop's time scale). Its answer is the fewest replicas (or, with ``pd``
shapes, the smallest prefill:decode pools) whose run **meets** the SLO: every run-level target
and the attainment hold at the pessimistic end of the repeats' 95% intervals (sim/run/repeats.py
``pessimistic``). Searches (``PlanSpec.search``):

- ``up`` (the default): every size from the smallest up, one round per size, until a size
  meets; a run that can no longer meet stops early (sim/sweep/early_stop.py: its summary says
  ``stopped_early`` instead of metrics, and the verdict is the whole run's). A miss then costs
  a fraction of a run and only the answer runs whole, where bisection runs every size it
  tries whole, the largest first; it assumes nothing of the curve and answers as ``full``
  does (issue 55 item 4).
- ``bisect``: the largest size first, then halves, which assumes more replicas never hurt;
  where the sizes it ran contradict that (``Planner.monotone``) or the largest misses, it runs
  every size below its answer, so it answers as ``full`` would whenever the sizes run show the
  curve. Every run whole.
- ``full``: every size, whole (the whole goodput curve).

The rounds' points run on one executor for the whole plan (sim/sweep/plan_runner.py: every
point in ``out/points/<id>`` as a sweep's, so a rerun resumes, on a local pool or Ray). The
rounds decide; a point starts as soon as the results so far prove a round will ask for it
(``Planner._follow``: with ``up``, a question's next size once its size misses), so no worker
waits for a round's last point, and the set of points run and every answer are the rounds'.
Before any runs, ``check_spec`` checks every point as ``kvsim run`` would. Then:

- the cheapest answers by price per hour (``costmodel/data/gpus.yaml`` or a price file of the
  same shape, which must price every GPU searched) and GPU count, at one price the most
  ``margin`` to the SLO first;
- per question the knee of goodput against GPUs over the sizes run (the size farthest above
  the chord from the smallest to the largest, both normalized: where more GPUs stop paying);
- what each choice buys: every router and policy at the cheapest answer's GPU, TP, size and
  load (one more round), against that answer. That round also runs whole what the report
  shows and a search stopped early: the chosen answer's size one smaller and, for a question
  no size meets, its largest size (the nearest shown is among the sizes run whole).

Disaggregated pools: with ``pd`` shapes ``P:D`` the sizes are runs of ``P`` prefill and ``D``
decode workers (docs/pd.md; their ``gpus`` count both pools), taken smallest GPU count
first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import Any

from costmodel.gpus import GPU, load_gpus
from sim.slo import SLO, meets, parse_slo, pessimistic


class PlanError(ValueError):
    exit_code = 2


@dataclass(frozen=True)
class Question:
    gpu: str
    tp: int
    router: str
    policy: str
    load: tuple[tuple[str, Any], ...]  # the load's fields, e.g. (("sessions", 8),)
    mem_fraction: float | None = None  # of each GPU's memory for weights and KV (None: 0.9)

    @property
    def label(self) -> str:
        load = ",".join(f"{k}={v}" for k, v in self.load)
        mem = f" mem{self.mem_fraction:g}" if self.mem_fraction is not None else ""
        return f"{self.gpu}{mem} tp{self.tp} {self.router} {self.policy} {load}".strip()


@dataclass
class PlanSpec:
    base: dict[str, Any]  # RunConfig fields every point shares (trace, model, slo, ...)
    gpus: list[str]
    tps: list[int]
    routers: list[str]
    policies: list[str]
    loads: list[dict[str, Any]]
    replicas: tuple[int, int]  # smallest, largest
    search: str = "up"  # up | bisect | full (module docstring)
    pd: list[tuple[int, int]] = field(default_factory=list)
    prices: dict[str, GPU] | None = None
    mem_fractions: list[float | None] = field(default_factory=lambda: [None])
    # the options the user gave, as RunConfig fields (plus replicas, search): checked for
    # doing nothing in every point (check_spec)
    given: frozenset[str] = frozenset()
    # a field as the user's command line spells it (kvsim plan: its option); None: --NAME
    spell: Callable[[str], str] | None = None

    @property
    def slo(self) -> SLO:
        return parse_slo(self.base["slo"])

    def questions(self) -> list[Question]:
        return [Question(g, t, r, p, tuple(sorted(load.items())), m)
                for g in self.gpus for m in self.mem_fractions for t in self.tps
                for r in self.routers for p in self.policies for load in self.loads]


def parse_range(text: str, what: str = "--replicas") -> tuple[int, int]:
    """``4`` or ``1..16``."""
    lo, sep, hi = str(text).partition("..")
    try:
        a, b = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise PlanError(f"{what} {text!r}: expected N or LO..HI") from None
    if a < 1 or b < a:
        raise PlanError(f"{what} {text!r}: expected 1 <= LO <= HI")
    return a, b


def parse_pd(text: str | None) -> list[tuple[int, int]]:
    """``1:1,2:1`` as (prefill, decode) pairs."""
    if not text:
        return []
    out = []
    for item in text.split(","):
        p, sep, d = item.partition(":")
        if not sep or not p.strip().isdigit() or not d.strip().isdigit() or not (
                int(p) >= 1 and int(d) >= 1):
            raise PlanError(f"--pd {item!r}: expected P:D with P, D >= 1 (e.g. 2:1)")
        out.append((int(p), int(d)))
    return out


def point_fields(spec: PlanSpec, q: Question, size: int | tuple[int, int]) -> dict[str, Any]:
    """The RunConfig fields of question ``q`` at ``size`` replicas (or a P:D shape)."""
    fields = {**spec.base, **dict(q.load), "gpu": q.gpu, "tp": q.tp}
    if q.mem_fraction is not None:
        fields["mem_fraction"] = q.mem_fraction
    if isinstance(size, tuple):  # P prefill and D decode workers (sim/fleet/pd.py)
        fields["prefill_replicas"], fields["decode_replicas"] = size
    else:
        fields["replicas"] = size
    # one replica (or prefill worker) routes nothing: every router's point is the same run
    if (size[0] if isinstance(size, tuple) else size) > 1:
        fields["router"] = q.router
    return fields


def make_point(spec: PlanSpec, q: Question, size: int | tuple[int, int]):
    from policies import PRESETS
    from sim.run.check import check
    from sim.sweep import Point
    from sim.sweep.points import _resolve

    fields = point_fields(spec, q, size)
    where = f"plan {q.label} size {size}"
    cfg = _resolve(fields, where)
    cfg = cfg.with_preset(q.policy) if q.policy in PRESETS else cfg.with_policy(q.policy)
    check(cfg, where)
    values = {"gpu": q.gpu, "mem_fraction": q.mem_fraction, "tp": q.tp, "router": q.router,
              "policy": q.policy,
              **dict(q.load), "size": size if isinstance(size, int) else f"{size[0]}:{size[1]}"}
    return Point(values, cfg)


@dataclass
class Outcome:
    """One evaluated point of the search."""

    question: Question
    size: int | tuple[int, int]
    point: str
    summary: dict[str, Any]
    meets: bool

    @property
    def gpus(self) -> int:
        return int(self.summary["gpus"])

    @property
    def stopped(self) -> str:
        """Why its run stopped early (a decided miss without metrics), or empty."""
        return self.summary.get("stopped_early") or ""


class Planner:
    """Runs the search of ``spec`` into ``out`` through ``executor`` (module docstring)."""

    def __init__(self, spec: PlanSpec, out: str | Path, executor,
                 report: Callable[[str, int, int], None] | None = None,
                 prices: dict[str, GPU] | None = None) -> None:
        from .plan_runner import PointRunner

        self.spec, self.out, self.executor = spec, Path(out), executor
        self.report = report
        self.slo = spec.slo
        self.prices = prices or spec.prices or load_gpus()
        self.outcomes: dict[tuple[Question, Any], Outcome] = {}
        self.rounds = 0
        # questions where bisection fell back to every size below its answer, and why
        self.full_search: dict[Question, str] = {}
        self.runner = PointRunner(out, executor)
        self.runner.on_settled = self._follow
        self.asked: dict[str, list[tuple[Question, Any]]] = {}  # point id -> what asked it
        self.pids: dict[tuple[Question, Any], str] = {}  # (question, size) -> point id
        # what the results so far prove the rounds of ``up`` will ask for (``_follow``): per
        # question the size it runs next, the size that met, or that none does
        self.chain: dict[Question, int] = {}
        self.chain_met: dict[Question, int] = {}
        self.chain_none: set[Question] = set()
        self.chosen_followed = False

    def _ask(self, q: Question, size: Any, whole: bool) -> str:
        """Ask the runner for ``q`` at ``size`` (stop mode, or ``whole``); its point id."""
        pid = self.pids.get((q, size))
        point = None
        if pid is None:
            point = make_point(self.spec, q, size)
            pid = self.pids[(q, size)] = point.id
            self.asked.setdefault(pid, []).append((q, size))
        else:
            point = self.runner.states[pid].point
        self.runner.request(point, whole, self._rank(q, size, whole))
        return pid

    def _rank(self, q: Question, size: Any, whole: bool) -> tuple[float, float]:
        """Which waiting point runs first when a worker frees, smallest first (no result
        depends on it). ``up``: its search's points before whole runs again of stopped
        points (a search point may let its question's next size start, a run again lets
        nothing start); smaller sizes first, as rounds would (no question falls behind);
        at one size the one expected to take longest first (what the question's size one
        smaller cost), so that it does not start last. A round of the other searches has
        every point at once: the largest sizes first (more replicas, longer runs)."""
        n = size if isinstance(size, int) else sum(size)
        if self.spec.search != "up" or self.spec.pd:
            return (-n, 0.0)
        if whole:
            return (math.inf, -n)
        last = self.runner.states.get(self.pids.get((q, n - 1), ""))
        return (n, -last.cpu_s if last is not None else 0.0)

    def _follow(self, pid: str) -> None:
        """A point's result is in (``PointRunner.on_settled``): ask now for what the rounds
        of ``up`` will ask for because of it, so that no worker waits for a round's last
        point. Only what is proven needed: a question's next size once this one misses
        (the rounds ask each question every size up to the first that meets), its largest
        size whole once none meets, and the chosen answer's size one smaller whole once no
        open question can be chosen instead (``_chosen_if_decided``), as ``buys`` shows
        them. The rounds still decide, from the same results: this changes when points run,
        never which, nor what they give."""
        if self.spec.search != "up" or self.spec.pd:
            return
        summary = self.runner.result(pid, False)  # what a stop-mode round reads
        if summary is None:  # failed: the round that asked for it says so
            return
        lo, hi = self.spec.replicas
        for q, n in list(self.asked.get(pid, [])):
            if self.chain.get(q, lo) != n or q in self.chain_met or q in self.chain_none:
                continue
            if meets(self.slo, pessimistic(summary, self.slo)):
                self.chain_met[q] = n
            elif n < hi:
                self.chain[q] = n + 1
                self._ask(q, n + 1, whole=False)
            else:
                self.chain_none.add(q)
                if summary.get("stopped_early"):
                    self._ask(q, n, whole=True)
        if not self.chosen_followed and (chosen := self._chosen_if_decided()) is not None:
            self.chosen_followed = True
            q, n = chosen
            below = self.pids.get((q, n - 1))
            if below is not None and (self.runner.result(below, False) or {}).get(
                    "stopped_early"):
                self._ask(q, n - 1, whole=True)

    def _chosen_if_decided(self) -> tuple[Question, int] | None:
        """The answer ``plan`` will choose, once the results so far prove it: the first in
        ``plan``'s order of those that met, where every open question's next size already
        costs more (price, then GPUs; both grow with the size, ``gpus`` being the replicas
        times a question's GPUs per replica); None while not proven."""
        met = []
        for q, n in self.chain_met.items():
            s = self.runner.result(self.pids[(q, n)], False)
            met.append(((s["gpus"] * self.prices[q.gpu].price_usd_h, s["gpus"],
                         -margin(s, self.slo), q.label), (q, n)))
        if not met:
            return None
        best_key, best = min(met)
        lo = self.spec.replicas[0]
        for q in self.spec.questions():
            if q in self.chain_met or q in self.chain_none:
                continue
            n = self.chain.get(q, lo)
            last = self.pids.get((q, n - 1))
            s = self.runner.result(last, False) if last is not None else None
            if s is None:
                return None
            gpus = s["gpus"] // (n - 1) * n  # its GPUs at its next size
            if (gpus * self.prices[q.gpu].price_usd_h, gpus) <= best_key[:2]:
                return None
        return best

    def _evaluate(self, wanted: list[tuple[Question, Any]], stop: bool = False) -> None:
        """Run the points of ``wanted`` not run yet (one round); with ``stop`` a run ends
        once it can no longer meet (sim/sweep/early_stop.py), without it a point that did
        stop runs again whole. Points asked for earlier (``_follow``) may be in already."""
        from sim.sweep import SweepError

        todo = [(q, s) for q, s in wanted if (q, s) not in self.outcomes
                or (not stop and self.outcomes[(q, s)].stopped)]
        if not todo:
            return
        self.rounds += 1
        pids = [self._ask(q, s, whole=not stop) for q, s in todo]

        def progress(done: int, total: int) -> None:
            if self.report is not None:
                self.report(f"round {self.rounds}", done, total)

        self.runner.settle([(pid, not stop) for pid in pids], progress)
        results = {pid: self.runner.result(pid, not stop) for pid in pids}
        failed = [self.runner.error(pid) for pid, r in results.items() if r is None]
        if failed:  # as a sweep says it (sim/sweep/resume.py run_sweep)
            first = failed[0]
            if len(failed) == len(results) and len({(f["error"], f["exit_code"])
                                                    for f in failed}) == 1:
                raise SweepError(first["error"], first["exit_code"])
            raise SweepError(f"{len(failed)} of {len(results)} points failed (first: point "
                             f"{first['point']}: {first['error']}); the others are in "
                             f"{self.out}/points: fix the cause and rerun to finish",
                             max(f["exit_code"] for f in failed))
        for (q, s), pid in zip(todo, pids, strict=True):
            summary = results[pid]
            ok = meets(self.slo, pessimistic(summary, self.slo))
            self.outcomes[(q, s)] = Outcome(q, s, pid, summary, ok)

    def search(self) -> dict[Question, Outcome | None]:
        """Per question its smallest size that meets, or None within the range."""
        spec = self.spec
        questions = spec.questions()
        if spec.pd:
            shapes = sorted(spec.pd, key=lambda pd: (pd[0] + pd[1], pd))
            self._evaluate([(q, s) for q in questions for s in shapes])
            return {q: next((self.outcomes[(q, s)] for s in shapes
                             if self.outcomes[(q, s)].meets), None) for q in questions}
        lo, hi = spec.replicas
        if spec.search == "up":
            found: dict[Question, int] = {}
            for n in range(lo, hi + 1):
                open_ = [q for q in questions if q not in found]
                if not open_:
                    break
                self._evaluate([(q, n) for q in open_], stop=True)
                found.update({q: n for q in open_ if self.outcomes[(q, n)].meets})
            return {q: self.outcomes[(q, found[q])] if q in found else None for q in questions}
        if spec.search == "full":
            self._evaluate([(q, n) for q in questions for n in range(lo, hi + 1)])
            return {q: next((self.outcomes[(q, n)] for n in range(lo, hi + 1)
                             if self.outcomes[(q, n)].meets), None) for q in questions}
        # bisection: (largest known miss, smallest known meet) per question
        bounds = {q: (lo - 1, hi) for q in questions}
        self._evaluate([(q, hi) for q in questions])
        open_ = [q for q in questions if self.outcomes[(q, hi)].meets]
        while True:
            mids = []
            for q in open_:
                a, b = bounds[q]
                if b - a > 1:
                    mids.append((q, (a + b) // 2))
            if not mids:
                break
            self._evaluate(mids)
            for q, m in mids:
                a, b = bounds[q]
                bounds[q] = (a, m) if self.outcomes[(q, m)].meets else (m, b)
        answers = {q: bounds[q][1] if q in open_ else hi + 1 for q in questions}
        # Bisection assumes more replicas never hurt. Where the sizes run say otherwise, or it
        # found none that meets, run every size below its answer (issue 51, cause B).
        for q in questions:
            if answers[q] > hi:
                self.full_search[q] = "the largest size misses"
            elif not self.monotone(q):
                self.full_search[q] = "not monotone"
        redo = [q for q in questions if q in self.full_search]
        self._evaluate([(q, n) for q in redo for n in range(lo, answers[q])])
        for q in redo:
            answers[q] = next((n for n in range(lo, answers[q])
                               if self.outcomes[(q, n)].meets), answers[q])
        return {q: self.outcomes[(q, n)] if n <= hi else None for q, n in answers.items()}

    def monotone(self, q: Question) -> bool:
        """Whether ``q``'s sizes run so far improve with size: every SLO value at its
        interval's pessimistic end no worse at a larger size (latencies no higher,
        attainment no lower)."""
        runs = sorted((s, pessimistic(o.summary, self.slo))
                      for (qq, s), o in self.outcomes.items() if qq == q)
        keys = [*self.slo.targets, *(["slo_attainment"] if self.slo.thresholds else [])]
        for (_a, va), (_b, vb) in pairwise(runs):
            for k in keys:
                sign = -1.0 if k == "slo_attainment" else 1.0
                if sign * (vb[k] - va[k]) > 0:
                    return False
        return True

    def buys(self, chosen: Outcome | None,
             answers: dict[Question, Outcome | None]) -> list[Outcome]:
        """Every router and policy at the chosen answer's GPU, TP, size and load (a point
        the search stopped early stays so: a decided miss, labelled). Before them, whole,
        what the report shows of points a search may have stopped: the chosen answer's size
        one smaller, and the largest size run of a question no size meets (``_best``)."""
        whole = [(q, max(s for qq, s in self.outcomes if qq == q))
                 for q, o in answers.items() if o is None]
        if chosen is not None and isinstance(chosen.size, int):
            whole.append((chosen.question, chosen.size - 1))
        self._evaluate([k for k in whole if k in self.outcomes and self.outcomes[k].stopped])
        if chosen is None:
            return []
        q0 = chosen.question
        others = [replace(q0, router=r, policy=p) for r in self.spec.routers
                  for p in self.spec.policies]
        self._evaluate([(q, chosen.size) for q in others], stop=self.spec.search == "up")
        return [self.outcomes[(q, chosen.size)] for q in others]


def price_per_hour(o: Outcome, prices: dict[str, GPU]) -> float:
    gpu = prices.get(o.question.gpu)
    return o.gpus * gpu.price_usd_h if gpu is not None else math.nan


def knee(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """The knee of an increasing curve (module docstring); None below 3 points or flat."""
    pts = sorted(points)
    if len(pts) < 3:
        return None
    (x0, y0), (x1, y1) = pts[0], pts[-1]
    if x1 == x0 or y1 == y0:
        return None
    best = max(pts[1:-1], key=lambda p: ((p[1] - y0) / (y1 - y0) - (p[0] - x0) / (x1 - x0),
                                         -p[0]))
    lift = (best[1] - y0) / (y1 - y0) - (best[0] - x0) / (x1 - x0)
    return best if lift > 0 else None


def plan(spec: PlanSpec, out: str | Path, executor,
         report: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Run the search and return the plan document (also written as out/plan.json)."""
    import pandas as pd

    from costmodel.specs import get_spec
    from sim.io import atomic_write_parquet, atomic_write_text, dumps, folder_lock, remove_stale_tmp

    prices = spec.prices or load_gpus()
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    with folder_lock(folder, "kvsim plan"):  # one writer per folder
        remove_stale_tmp(folder)  # a killed writer's leftovers; no writer runs here now
        planner = Planner(spec, folder, executor, report, prices)
        try:
            answers = planner.search()
            met = [o for o in answers.values() if o is not None]
            # cheapest first; at one price the most margin to the SLO first (issue 51).
            # Prices are checked to cover every GPU (check_spec), so no key is NaN (D11:
            # NaN sorts anywhere).
            met.sort(key=lambda o: (price_per_hour(o, prices), o.gpus,
                                    -margin(o.summary, spec.slo), o.question.label))
            buys = planner.buys(met[0] if met else None, answers)
            planner.runner.drain()  # (nothing runs here: every point asked for was needed)
        except Exception:  # a point failed: what runs finishes (a rerun resumes it)
            planner.runner.drain()
            raise
        except BaseException:  # Ctrl-C: end the workers now
            planner.runner.stop()
            raise
        finally:
            remove_stale_tmp(folder)
    rows = []
    for _key, o in sorted(planner.outcomes.items(), key=lambda kv: (kv[0][0].label,
                                                                        str(kv[0][1]))):
        rows.append(_row(o, prices))
    table = pd.DataFrame(rows)
    curves = {}
    for q in spec.questions():
        pts = [(o.gpus, o.summary.get("goodput_rps", math.nan))  # (a stopped run has none)
               for (qq, _s), o in planner.outcomes.items() if qq == q and not o.stopped]
        curves[q.label] = {"points": sorted(pts), "knee_gpus": (k := knee(pts)) and k[0]}
    chosen = met[0] if met else None
    summaries = [o.summary for o in planner.outcomes.values()]
    doc: dict[str, Any] = {
        "slo": spec.slo.text,
        "questions": len(answers),
        "rounds": planner.rounds,
        "points_run": len(planner.outcomes),
        # points whose run stopped once it could no longer meet (no metrics: plan.csv says why)
        "points_stopped": sum(bool(o.stopped) for o in planner.outcomes.values()),
        "answers": [{"question": q.label,
                     "search": "full" if spec.search == "full" or spec.pd else
                     "up" if spec.search == "up" else
                     f"bisect, then every size below ({planner.full_search[q]})" if q in
                     planner.full_search else "bisect",
                     **(_row(o, prices) if o is not None else
                        {"meets": False, "note": "no size in range meets the SLO",
                         "best": _best(planner, q)})} for q, o in answers.items()],
        "cheapest": [_row(o, prices) for o in met],
        "chosen": _row(chosen, prices) if chosen else None,
        "one_smaller": (_row(planner.outcomes[(chosen.question, chosen.size - 1)], prices)
                        if chosen is not None and isinstance(chosen.size, int)
                        and (chosen.question, chosen.size - 1) in planner.outcomes else None),
        "buys": [_row(o, prices) for o in buys],
        "curves": curves,
        "model": spec.base.get("model"),
        # the trace's requests above the model's context: the same in every point
        "over_context_requests": max((s.get("over_context_requests") or 0 for s in summaries),
                                     default=0),
        "model_context": get_spec(spec.base.get("model", "qwen3-8b")).max_context,
    }
    out = Path(out)
    atomic_write_parquet(table, out / "plan.parquet")
    atomic_write_text(out / "plan.csv", table.to_csv(index=False))
    atomic_write_text(out / "plan.json", dumps(doc) + "\n")
    return doc


def margin(summary: dict[str, Any], slo: SLO) -> float:
    """How far a run is inside ``slo`` at its intervals' pessimistic ends: the smallest
    relative slack of a run-level target ((target - value) / target) or of the attainment
    ((value - attain) / attain); negative where it misses."""
    v = pessimistic(summary, slo)
    slack = [(t - v[k]) / t for k, t in slo.targets.items() if t > 0]
    if slo.thresholds and slo.attain > 0:
        slack.append((v["slo_attainment"] - slo.attain) / slo.attain)
    slack = [x for x in slack if x == x]
    return min(slack) if slack else -math.inf


def _best(planner: Planner, q: Question) -> dict[str, Any] | None:
    """The size of ``q`` nearest to meeting (most margin) among those run whole, for the
    hint when none meets."""
    runs = [o for (qq, _s), o in planner.outcomes.items() if qq == q and not o.stopped]
    if not runs:
        return None
    o = max(runs, key=lambda o: (margin(o.summary, planner.slo), -o.gpus))
    values = pessimistic(o.summary, planner.slo)
    keys = [*planner.slo.targets, *(["slo_attainment"] if planner.slo.thresholds else [])]
    return {"size": o.size if isinstance(o.size, int) else f"{o.size[0]}:{o.size[1]}",
            "gpus": o.gpus, "margin": margin(o.summary, planner.slo),
            **{k: values[k] for k in keys}}


SHOWN = ("ttft_p90_s", "ttft_p90_s_ci95", "tpot_mean_s", "itl_p99_s", "slo_attainment",
         "slo_attainment_ci95", "goodput_rps", "goodput_rps_per_gpu", "hit_rate")


def _row(o: Outcome, prices: dict[str, GPU]) -> dict[str, Any]:
    q, s = o.question, o.summary
    slo = parse_slo(s["slo"])
    targets = {k: s.get(k) for t in slo.targets for k in (t, f"{t}_ci95")}
    return {"point": o.point, "question": q.label, "gpu": q.gpu,
            "mem_fraction": s.get("mem_fraction"), "kv_tokens_per_gpu": s.get("kv_tokens_per_gpu"),
            "tp": q.tp, "router": q.router,
            "policy": q.policy, **dict(q.load),
            "size": o.size if isinstance(o.size, int) else f"{o.size[0]}:{o.size[1]}",
            "gpus": o.gpus, "usd_per_h": price_per_hour(o, prices), "meets": o.meets,
            "margin": margin(s, slo),
            # what priced the point: a GPU without a measured profile runs at another's speed
            "profile": s.get("profile"), "profile_note": s.get("profile_note") or "",
            # what a repeat varies: decision seeds only; identical repeats (a router and a
            # policy that draw nothing) leave no interval, so the pessimistic end is the run
            "repeats": s.get("repeats", 1),
            "repeats_identical": bool(s.get("repeats", 1) > 1 and all(
                s.get(f"{k}_ci95") == 0 for k in slo.targets or ("ttft_p90_s",))),
            **{k: s.get(k) for k in SHOWN}, **targets,
            # a decided miss whose run stopped early (search "up"): why; it has no metrics
            "stopped_early": o.stopped}


def check_spec(spec: PlanSpec) -> None:
    """Everything ``kvsim run`` would refuse in any point, before anything runs: the SLO,
    every point's config (the first and last replica count, or every P:D shape: what varies
    between replica counts is only the count), the prices of every GPU, and options that do
    nothing in every point (``sim.config.IDLE_RULES``, as ``kvsim run`` applies them)."""
    from sim.config import idle_fields, spell_fields
    from sim.deploy import check_tp

    plan_option = spec.spell or (lambda f: "--" + f.replace("_", "-"))
    if "slo" not in spec.base or not spec.base["slo"]:
        raise PlanError("--slo is required: the plan finds deployments that meet it")
    slo = spec.slo
    if not slo.targets and not slo.thresholds:
        raise PlanError("--slo names no target")
    if spec.prices is not None:
        missing = [g for g in spec.gpus if g not in spec.prices]
        if missing:  # D11: an unpriced GPU would sort anywhere (NaN) and could be picked
            raise PlanError(f"--prices has no price for {', '.join(missing)} (searched with "
                            f"--gpus; it prices {', '.join(spec.prices)}): add it or drop it "
                            "from --gpus")
    for tp in spec.tps:  # a TP the model's heads do not divide cannot be deployed (P07)
        check_tp(spec.base.get("model", "qwen3-8b"), tp, "plan", plan_option)
    if spec.pd:
        for opt in ("replicas", "search"):
            if opt in spec.given:
                raise PlanError(f"--{opt} does nothing here: with --pd every P:D shape runs "
                                "(the shapes are the sizes searched): drop one")
    lo, hi = spec.replicas
    idle: dict[str, str] | None = None
    for q in spec.questions():
        for n in (spec.pd or sorted({lo, hi})):
            cfg = make_point(spec, q, n).cfg  # a ConfigError names the field (exit 2)
            here = dict(idle_fields(cfg, spec.given))
            idle = here if idle is None else {f: w for f, w in idle.items() if f in here}
    if idle:  # idle in every point: the user typed it for an effect it cannot have
        field, why = next(iter(idle.items()))
        why = why.replace("{prefill_replicas} P {decode_replicas} D", "--pd P:D")
        if spec.pd and field == "router":  # the prefill pool is what routes
            why = "one prefill worker has nothing to route between: add a --pd shape P:D, P > 1"
        raise PlanError(f"{plan_option(field)} does nothing here: "
                        f"{spell_fields(why, plan_option)}")
