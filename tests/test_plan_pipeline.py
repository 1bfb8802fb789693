"""``kvsim plan`` runs each point as soon as its round is proven to need it (sim/sweep/plan.py
``Planner._follow``, sim/sweep/plan_runner.py), longest expected first: the same plan as
round by round, the same points, and no worker waiting for a round's last point.

The search runs here on fake points: each point's summary comes from a curve and its cost in
seconds of a fake clock (``FakePool``: two workers, each job takes its cost), so the order
and the pipelining are checked without timing anything."""

from __future__ import annotations

import heapq
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli.main import cli
from sim.io import dumps
from sim.sweep import plan as planmod
from sim.sweep.plan_runner import PointRunner

SLO = "ttft_p90=3s"


class FakePoint:
    def __init__(self, q: planmod.Question, size: int) -> None:
        # one replica routes nothing: every router's point is one point (as make_point's)
        router = q.router if size > 1 else "-"
        gpu = "" if q.gpu == "H100" else f"-{q.gpu}"
        self.id = f"{router}-{q.policy}-{size}{gpu}"
        self.cfg = (router, q.policy, size, q.gpu)


class FakePool:
    """Two workers on a fake clock. A job ``(cfg, (out, whole))`` writes the summary its
    curve gives (in stop mode a miss is a stopped summary) and takes its cost in fake
    seconds. ``stream`` hands jobs to free workers as they come; ``map`` (what an executor
    without a stream offers) runs a batch and returns when all of it is done."""

    interrupt_at: int | None = None  # Ctrl-C once that many jobs started

    def __init__(self, curves, costs, workers: int = 2) -> None:
        self.curves, self.costs, self.workers = curves, costs, workers
        self.now = 0.0
        self.free_at = [0.0] * workers
        self.log: list[tuple[float, float, str, bool]] = []  # (start, end, point, whole)

    def _run(self, cfg, arg) -> tuple[float, dict]:
        (router, policy, size, gpu), (out, whole) = cfg, arg
        key = router if router != "-" else next(iter(self.curves))
        p90 = self.curves[key][size] * (1.0 if gpu == "H100" else 1.5)  # an A100 is slower
        pid = f"{router}-{policy}-{size}" + ("" if gpu == "H100" else f"-{gpu}")
        summary = {"slo": SLO, "gpus": size, "repeats": 1, "dropped_requests": 0,
                   "aborted": 0}
        missed = p90 > 3.0
        if missed and not whole:
            summary.update(slo_met=False, stopped_early=f"ttft_p90 > 3 s ({pid})")
            cost = self.costs(router, size, False)
        else:
            summary.update(ttft_p90_s=p90, ttft_p90_s_ci95=0.0, slo_met=not missed)
            cost = self.costs(router, size, True)
        folder = Path(out) / "points" / pid
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "summary.json").write_text(dumps(summary) + "\n")
        return cost, {"point": pid, "error": None, "exit_code": 0, "cpu_s": cost}

    def stream(self, fn):
        return FakeStream(self)

    def map(self, fn, jobs):
        """The batch on the free workers in its order (each job to the worker free first);
        done when its last job is."""
        done = []
        start = max(self.now, min(self.free_at))
        free = [(max(t, start), w) for w, t in enumerate(self.free_at)]
        heapq.heapify(free)
        for i, (cfg, arg) in enumerate(jobs):
            t, w = heapq.heappop(free)
            cost, info = self._run(cfg, arg)
            self.log.append((t, t + cost, info["point"], arg[1]))
            self.free_at[w] = t + cost
            heapq.heappush(free, (t + cost, w))
            done.append((i, info))
        self.now = max(self.free_at)
        self.free_at = [self.now] * self.workers
        return done

    def close(self) -> None:
        pass


class FakeStream:
    def __init__(self, pool: FakePool) -> None:
        self.pool, self.slots = pool, pool.workers
        self.running: list[tuple[float, int, object, dict]] = []  # (end, seq, key, info)
        self.seq = 0

    def __len__(self) -> int:
        return len(self.running)

    def submit(self, key, job) -> None:
        pool = self.pool
        w = min(range(pool.workers), key=lambda i: pool.free_at[i])
        start = max(pool.now, pool.free_at[w])
        cost, info = pool._run(*job)
        pool.free_at[w] = start + cost
        pool.log.append((start, start + cost, info["point"], job[1][1]))
        self.seq += 1
        heapq.heappush(self.running, (start + cost, self.seq, key, info))

    def stop(self) -> None:
        self.running = []

    def wait(self):
        if self.pool.interrupt_at is not None and len(self.pool.log) >= self.pool.interrupt_at:
            raise KeyboardInterrupt
        end, _, key, info = heapq.heappop(self.running)
        self.pool.now = max(self.pool.now, end)
        return [(key, info)]


def fake_plan(tmp_path, monkeypatch, curves, costs, search: str = "up", stream: bool = True,
              replicas: tuple[int, int] = (1, 8), rounds: bool = False,
              gpus: tuple[str, ...] = ("H100",), policies: tuple[str, ...] = ("sglang",)):
    """``plan`` over fake points on a ``FakePool``; the document, the pool, the runner.
    ``stream=False``: the pool has no stream (batches through ``map``); ``rounds``: nothing
    asked before its round asks (no ``Planner._follow``), as before pipelining."""
    pool = FakePool(curves, costs)
    runners: list[PointRunner] = []
    real = planmod.Planner.__init__

    def init(self, *a, **kw):
        real(self, *a, **kw)
        runners.append(self.runner)

    with monkeypatch.context() as m:
        m.setattr(planmod, "make_point", lambda spec, q, size: FakePoint(q, size))
        m.setattr(planmod.Planner, "__init__", init)
        if not stream:
            m.setattr(FakePool, "stream", None)
        if rounds:
            m.setattr(planmod.Planner, "_follow", lambda self, pid: None)
        spec = planmod.PlanSpec(base={"slo": SLO, "model": "qwen3-8b"}, gpus=list(gpus),
                                tps=[1], routers=list(curves), policies=list(policies),
                                loads=[{"sessions": 24}], replicas=replicas, search=search)
        doc = planmod.plan(spec, tmp_path, pool)
    return doc, pool, runners[0]


CURVES = {"fast": {n: 8.0 / n for n in range(1, 9)},  # meets at 3
          "slow": {n: 24.0 / n for n in range(1, 9)},  # meets at 8
          "never": dict.fromkeys(range(1, 9), 4.0)}


def costs(router: str, size: int, whole: bool) -> float:
    """A whole run costs more with more replicas; a stopped one a fraction of it."""
    return size * (10.0 if whole else 1.0) + (0.5 if router == "slow" else 0.0)


def test_pipelined_plan_is_the_round_by_round_plan(tmp_path, monkeypatch) -> None:
    """Running points as soon as they are proven needed changes neither the plan document
    (rounds included) nor which points run: the same jobs as round by round."""
    piped, ppool, prun = fake_plan(tmp_path / "p", monkeypatch, CURVES, costs)
    rounds, rpool, rrun = fake_plan(tmp_path / "r", monkeypatch, CURVES, costs, stream=False,
                                    rounds=True)
    batched, _, _ = fake_plan(tmp_path / "b", monkeypatch, CURVES, costs, stream=False)
    assert piped == rounds == batched
    assert [a.get("size") for a in piped["answers"]] == [3, 8, None]
    jobs = sorted((p, w) for _, _, p, w in ppool.log)
    assert jobs == sorted((p, w) for _, _, p, w in rpool.log)
    assert prun.runs == rrun.runs == len(jobs)
    # whole: the chosen answer's size one smaller, and the largest size of "never"
    assert sorted(p for p, w in jobs if w) == ["fast-sglang-2", "never-sglang-8"]


TTFTS = st.sampled_from([1.0, 2.0, 2.9, 3.0, 3.1, 4.0, 9.0])  # against a 3 s target


@st.composite
def plans(draw):
    hi = draw(st.integers(1, 6))
    routers = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3,
                            unique=True))
    curves = {r: {n: draw(TTFTS) for n in range(1, hi + 1)} for r in routers}
    cost = {(r, n, w): draw(st.integers(1, 30)) for r in ["-", *routers]
            for n in range(1, hi + 1) for w in (False, True)}
    gpus = draw(st.sampled_from([("H100",), ("A100",), ("H100", "A100")]))
    policies = draw(st.sampled_from([("sglang",), ("sglang", "penelope")]))
    return curves, cost, hi, gpus, policies


@settings(max_examples=60, deadline=None)
@given(plans())
def test_pipelined_plans_are_round_by_round_plans(case) -> None:
    """Any curves (meeting, missing, bumpy, ties), costs, GPUs at two prices and two
    policies: the pipelined plan is the round-by-round plan, document and jobs; a point
    asked for ahead of its round is always one the rounds ask for."""
    import tempfile

    from _pytest.monkeypatch import MonkeyPatch

    curves, cost, hi, gpus, policies = case
    docs, jobs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (stream, rounds) in enumerate([(True, False), (False, True), (False, False)]):
            doc, pool, runner = fake_plan(
                Path(tmp) / str(i), MonkeyPatch(), curves, lambda r, n, w: cost[(r, n, w)],
                stream=stream, rounds=rounds, replicas=(1, hi), gpus=gpus, policies=policies)
            docs.append(doc)
            jobs.append(sorted((p, w) for _, _, p, w in pool.log))
            assert runner.runs == len(pool.log)
    assert docs[0] == docs[1] == docs[2]
    assert jobs[0] == jobs[1] == jobs[2]


def test_no_worker_waits_for_a_rounds_last_point(tmp_path, monkeypatch) -> None:
    """Round by round, a round's longest point leaves the other worker idle; pipelined, no
    worker idles while a point that will be needed could run, which Graham's bound for such
    schedules says: span <= work / 2 + (longest chain of points, each waiting for the one
    before) / 2."""
    _, ppool, _ = fake_plan(tmp_path / "p", monkeypatch, CURVES, costs)
    _, rpool, _ = fake_plan(tmp_path / "r", monkeypatch, CURVES, costs, stream=False,
                            rounds=True)
    work = sum(end - start for start, end, _, _ in ppool.log)
    assert work == sum(end - start for start, end, _, _ in rpool.log)  # the same jobs
    # the longest chain: "never" runs its 8 sizes one after another, then 8 again whole
    chain = sum(costs("never", n, False) for n in range(2, 9)) + costs("-", 1, False) + \
        costs("never", 8, True)
    assert chain >= sum(costs("slow", n, False) for n in range(2, 8)) + costs("-", 1, False) \
        + costs("slow", 8, True)
    bound = work / 2 + chain / 2
    span = max(end for _, end, _, _ in ppool.log)
    round_span = max(end for _, end, _, _ in rpool.log)
    assert span <= bound < round_span


def test_the_picks_size_one_smaller_runs_whole_once_the_pick_is_proven(tmp_path,
                                                                       monkeypatch) -> None:
    """The report shows the pick's size one smaller whole (``Planner.buys``); it runs as
    soon as no open question can be picked instead (here once "never" is past size 3), on
    the worker that "never"'s one-at-a-time sizes leave free, not after its last size."""
    curves = {"fast": CURVES["fast"], "never": CURVES["never"]}

    def slow_never(router: str, size: int, whole: bool) -> float:  # "never" decides late
        return costs(router, size, whole) * (5 if router == "never" else 1)

    piped, ppool, _ = fake_plan(tmp_path / "p", monkeypatch, curves, slow_never)
    rounds, rpool, _ = fake_plan(tmp_path / "r", monkeypatch, curves, slow_never,
                                 stream=False, rounds=True)
    assert piped == rounds and piped["chosen"]["size"] == 3
    for pool, before in ((ppool, True), (rpool, False)):
        whole = next(s for s, _, p, w in pool.log if p == "fast-sglang-2" and w)
        last = next(s for s, _, p, w in pool.log if p == "never-sglang-8" and not w)
        assert (whole < last) == before


def test_a_freed_worker_takes_the_smallest_rank_first(tmp_path) -> None:
    """The runner starts waiting points in rank order (ties: first asked first), as many
    as there are workers, and the next one as a worker frees."""
    pool = FakePool(CURVES, costs)
    runner = PointRunner(tmp_path, pool)
    q = planmod.Question("H100", 1, "fast", "sglang", (("sessions", 24),))
    points = {n: FakePoint(q, n) for n in (2, 3, 4, 5)}
    runner.request(points[2], False, (2, 0.0))
    runner.request(points[3], False, (1, -7.0))
    runner.request(points[4], True, (1, -9.0))
    runner.request(points[5], False, (1, -7.0))
    runner.settle([(p.id, False) for p in points.values()])
    assert [p for _, _, p, _ in pool.log] == ["fast-sglang-4", "fast-sglang-3", "fast-sglang-5",
                                              "fast-sglang-2"]
    assert [s for s, _, _, _ in pool.log][:2] == [0.0, 0.0]  # both workers at once


def test_rank_search_points_by_size_longest_first_whole_runs_last(tmp_path) -> None:
    """``Planner._rank`` (up): smaller sizes first; at one size the question whose size
    one smaller cost most; whole runs again after every search point."""
    spec = planmod.PlanSpec(base={"slo": SLO, "model": "qwen3-8b"}, gpus=["H100"], tps=[1],
                            routers=["a", "b"], policies=["sglang"], loads=[{"sessions": 2}],
                            replicas=(1, 8))
    planner = planmod.Planner(spec, tmp_path, FakePool(CURVES, costs))
    qa, qb = spec.questions()
    for q, cost in ((qa, 1.0), (qb, 5.0)):
        point = FakePoint(q, 3)
        planner.pids[(q, 3)] = point.id
        planner.runner.request(point, False)
        planner.runner.states[point.id].cpu_s = cost
    ranks = {(q.router, n, w): planner._rank(q, n, w) for q in (qa, qb) for n in (4, 5)
             for w in (False, True)}
    assert sorted(ranks, key=ranks.get) == [
        ("b", 4, False), ("a", 4, False), ("a", 5, False), ("b", 5, False),
        ("a", 5, True), ("b", 5, True), ("a", 4, True), ("b", 4, True)]


def test_a_rerun_resumes_every_point(tmp_path, monkeypatch) -> None:
    """A second plan into the same folder runs nothing and gives the same document (but
    for its rounds: the points that stopped and ran again whole are whole from the start,
    so the round that ran them again is not needed)."""
    first, _, _ = fake_plan(tmp_path, monkeypatch, CURVES, costs)
    again, pool, runner = fake_plan(tmp_path, monkeypatch, CURVES, costs)
    assert runner.runs == 0 and pool.log == []
    assert (again.pop("rounds"), first.pop("rounds")) == (8, 9) and again == first


@pytest.mark.parametrize("slo", ["ttft_p90=0.7s", "ttft_p90=0.65s,ttft=1s"])
def test_plan_on_two_workers_is_the_plan_on_one(tmp_path, slo) -> None:
    """The real pool (``LocalPoolExecutor.stream``): every point, summary and the document
    as in this process, round by round."""
    from test_plan_search import BASE

    docs, points = {}, {}
    for jobs in ("1", "2"):
        out = tmp_path / jobs
        res = CliRunner().invoke(cli, [*BASE, "--slo", slo, "-j", jobs, "--out", str(out)])
        assert res.exit_code == 0, res.output
        docs[jobs] = json.loads((out / "plan.json").read_text())
        points[jobs] = {p.name: (p / "summary.json").read_text()
                        for p in (out / "points").iterdir()}
    assert docs["1"] == docs["2"]
    assert points["1"] == points["2"]
    assert docs["2"]["points_stopped"] > 0


def _job_or_exit_once(cfg, arg, get_trace):
    """Kills its own worker the first time it runs (a marker file remembers), else returns
    its name (module level: picklable)."""
    import os
    import time

    marker, name = arg
    if name == "kill" and not Path(marker).exists():
        Path(marker).write_text("")
        os._exit(3)
    time.sleep(0.2)  # still running when the other worker dies
    return name


def test_a_pool_stream_runs_the_jobs_of_a_broken_pool_again(tmp_path) -> None:
    """A worker that dies breaks the pool and every job in it; the stream runs them again
    (``LocalPoolExecutor.map``: its retries) and later jobs get a new pool."""
    from sim.config import RunConfig
    from sim.sweep.executors import LocalPoolExecutor

    marker = str(tmp_path / "killed")
    ex = LocalPoolExecutor(2, max_retries=1)
    try:
        stream = ex.stream(_job_or_exit_once)
        assert stream.slots == 2
        stream.submit("a", (RunConfig(), (marker, "a")))
        stream.submit("kill", (RunConfig(), (marker, "kill")))
        got = {}
        while len(stream):
            got.update(stream.wait())
        stream.submit("b", (RunConfig(), (marker, "b")))
        got.update(stream.wait())
    finally:
        ex.close()
    assert got == {"a": "a", "kill": "kill", "b": "b"}
    assert Path(marker).exists()


def test_ctrl_c_ends_the_running_points_at_once(tmp_path, monkeypatch) -> None:
    """Interrupted, the plan ends its workers' jobs (``PoolStream.stop``) instead of waiting
    for them; a rerun runs what did not finish and gives the plan."""
    stops = []
    real = FakeStream.stop
    monkeypatch.setattr(FakeStream, "stop", lambda self: (stops.append(len(self)), real(self)))
    monkeypatch.setattr(FakePool, "interrupt_at", 5)
    with pytest.raises(KeyboardInterrupt):
        fake_plan(tmp_path, monkeypatch, CURVES, costs)
    assert stops and stops[0] > 0  # it had jobs running, and ended them
    monkeypatch.setattr(FakePool, "interrupt_at", None)
    done, _, _ = fake_plan(tmp_path, monkeypatch, CURVES, costs)
    whole, _, _ = fake_plan(tmp_path / "fresh", monkeypatch, CURVES, costs)
    assert done == whole
