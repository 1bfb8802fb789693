"""Early stops for ``kvsim plan`` (issue 55 item 4): a point's run ends as soon as its SLO
verdict is decided as a **miss** at the repeats' interval's pessimistic end.

A plan runs many sizes only to learn that they miss (sim/sweep/plan.py runs again whole
those whose numbers its report shows). ``StopRule`` watches the
first tokens of a run (a ``sim.engines.StepObserver``: it observes, changes nothing) and
raises ``Decided`` once the run can no longer meet; ``run_or_stop`` then writes a summary
that says so (``stopped_early``) instead of the run's metrics.

Why a stop never changes a verdict (only TTFT decides it: it is final at a request's first
token, or only grows, when a retraction makes the first token come again):

- N, the trace's requests, bounds the rows a run's percentiles and attainment count (one
  record per request: the ``full`` context, no disaggregated pools; otherwise no stop).
- ``ttft_pQ_s <= L`` (a run-level target): numpy's linear percentile of n values is at least
  the one of rank ``floor((n-1)Q/100)`` (ascending), so it exceeds L once ``m`` values do with
  ``m >= n - floor((n-1)Q/100)``; that bound does not decrease with n, so ``m >= N -
  floor((N-1)Q/100) + 1`` suffices (the +1 covers the rounding of the float index).
- ``ttft_mean_s <= L``: TTFTs are >= 0, so the mean of n <= N values is at least the sum so far
  over N.
- ``ttft <= L`` with ``attain=a`` (per request): the attainment is at most ``(N - m)/N`` with m
  requests over L; the run misses once that is below ``a`` (``sim.slo.met_mask``: a dropped or
  aborted request never meets, so it only lowers the attainment further).
- A request counted over L that is later aborted or dropped leaves the percentile, but such a
  request makes the run miss anyway (``sim.slo.meets``). Every comparison keeps a relative margin
  ``EPS`` so no float rounding can turn a counted miss into a met target.
- Repeats: a target's pessimistic end, mean + t(0.975, n-1) sd / sqrt(n) (sim/run/repeats.py),
  is at least the largest repeat's value when t(0.975, n-1) >= n - 1 (Samuelson: max - mean
  <= sd (n-1)/sqrt(n)), which holds for n <= 4 repeats (12.7, 4.30, 3.18; t(0.975, 4) = 2.78 <
  4); the attainment's end is likewise at most the smallest repeat's. So one repeat that
  misses makes the point miss and the other repeats need not run. With more than
  ``MAX_REPEATS`` repeats nothing stops early.

A run that meets is never stopped: its numbers are the answer a plan reports.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sim.engines import StepObserver
from sim.slo import SLO, parse_slo

EPS = 1e-9  # relative margin on every comparison (float rounding)
MAX_REPEATS = 4  # t(0.975, n-1) >= n-1 up to here (module docstring)


class Decided(Exception):
    """The run can no longer meet its SLO (``reason`` says which target, after how much)."""

    def __init__(self, reason: str, replies: int) -> None:
        super().__init__(reason, replies)  # (SimPy raises a copy made from the args)
        self.reason, self.replies = reason, replies


class StopRule(StepObserver):
    """Counts a run's first tokens against the TTFT parts of ``slo`` for a trace of ``n``
    requests (module docstring); raises ``Decided`` from the engine's step once the run
    misses whatever comes after. One per repeat (``fresh``)."""

    def __init__(self, n: int, slo: SLO) -> None:
        self.n, self.slo = n, slo
        # per run-level TTFT percentile target: (summary key, limit, requests over it that
        # decide); the mean's target as a bound on the sum over n; the per-request threshold
        # and the requests over it that decide the attainment
        self.pct: list[tuple[str, float, int]] = []
        self.mean_limit = self.req_limit = math.inf
        self.req_need = 0
        for key, limit in slo.targets.items():
            base, _, stat = key.removesuffix("_s").partition("_")
            if base != "ttft":
                continue
            if stat == "mean":
                self.mean_limit = limit * (1 + EPS) * n
            else:
                q = float(stat.removeprefix("p")) / 100
                self.pct.append((key, limit * (1 + EPS), n - math.floor((n - 1) * q) + 1))
        if "ttft" in slo.thresholds:
            self.req_limit = slo.thresholds["ttft"] * (1 + EPS)
            bound = (slo.attain - EPS) * n  # the run misses once n - over <= bound
            self.req_need = max(1, math.ceil(n - bound))
            while n - self.req_need > bound:
                self.req_need += 1
        self.over = [0] * len(self.pct)
        self.total = 0.0
        self.req_over = 0
        self.seen: set[int] = set()

    @classmethod
    def of(cls, cfg, n: int) -> StopRule | None:
        """The rule for a run of ``cfg`` over a trace of ``n`` requests; None where no early
        stop is sound or possible (no TTFT target, disaggregated pools, a context strategy,
        more than ``MAX_REPEATS`` repeats)."""
        if (cfg.slo is None or cfg.is_pd or cfg.context.strategy != "full"
                or cfg.repeats > MAX_REPEATS or n < 1):
            return None
        rule = cls(n, parse_slo(cfg.slo))
        if not rule.pct and rule.mean_limit == math.inf and rule.req_limit == math.inf:
            return None
        return rule

    def fresh(self) -> StopRule:
        """The same rule with nothing counted (one per repeat)."""
        return StopRule(self.n, self.slo)

    def completed(self, engine, batch: list) -> None:
        seen = self.seen
        for req, _ranges in batch:
            rid = req.rid
            if rid in seen:
                continue
            rec = req.record
            t = rec.ttft_s if rec is not None else math.nan
            if t == t:  # its first token is in (TTFT final, or a lower bound)
                seen.add(rid)
                self._count(t)

    def _count(self, t: float) -> None:
        over = self.over
        for i, (key, limit, need) in enumerate(self.pct):
            if t > limit:
                over[i] += 1
                if over[i] >= need:
                    self._stop(f"{key.removesuffix('_s')} > {_secs(self.slo.targets[key])}: "
                               f"{over[i]:,} of at most {self.n:,} requests over it")
        if self.mean_limit != math.inf:
            self.total += t
            if self.total > self.mean_limit:
                self._stop(f"ttft_mean > {_secs(self.slo.targets['ttft_mean_s'])}: the "
                           f"TTFTs so far sum to {self.total:,.0f} s over at most {self.n:,} "
                           "requests")
        if t > self.req_limit:
            self.req_over += 1
            if self.req_over >= self.req_need:
                self._stop(f"attainment < {self.slo.attain:g}: {self.req_over:,} of at most "
                           f"{self.n:,} requests over ttft {_secs(self.slo.thresholds['ttft'])}")

    def _stop(self, reason: str) -> None:
        raise Decided(reason, len(self.seen))


def _secs(v: float) -> str:
    return f"{v * 1000:g} ms" if v < 1 else f"{v:g} s"


def run_or_stop(cfg, trace, folder: Path) -> None:
    """Run ``cfg`` on ``trace`` into ``folder`` as ``sim.run.run`` would (the same result,
    byte for byte, whenever it meets or its miss is not decided early), or, once a repeat
    is decided to miss (``StopRule``), write only ``config.json`` and a summary that says so
    (``stopped_summary``)."""
    from sim.io import atomic_write_text, dumps
    from sim.run import run, write_result
    from sim.run.repeats import run_repeats

    rule = StopRule.of(cfg, len(trace))
    if rule is None:
        write_result(run(cfg, trace), folder)
        return
    at: list[int] = []  # the repeat running now

    def one(c, t, k: int):
        at.append(k)
        return run(c, t, steps=rule.fresh())

    try:
        result = (run_repeats(cfg, trace, one) if cfg.repeats > 1
                  else run(cfg, trace, steps=rule.fresh()))
    except Decided as d:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "config.json", dumps(cfg.to_dict()) + "\n")
        summary = stopped_summary(cfg, trace, d, (at or [0])[-1])
        atomic_write_text(folder / "summary.json", dumps(summary) + "\n")
        return
    write_result(result, folder)


def stopped_summary(cfg, trace, d: Decided, repeat: int) -> dict[str, Any]:
    """What a stopped point reports: its deployment (GPUs, KV per GPU, the profile that
    priced it), its SLO, ``slo_met`` false and ``stopped_early`` (why, after how many first
    tokens of which repeat); no metrics (the run did not finish)."""
    from costmodel.profile import load_profile
    from sim.deploy import deployment_fields

    profile = load_profile(cfg.cache.profile, cfg.cache.model)
    return {**deployment_fields(cfg, profile), "profile": profile.name,
            "policy": cfg.policy_label, "model": cfg.cache.model, "engine": cfg.engine.name,
            "trace": trace.name, "trace_requests": len(trace), "slo": parse_slo(cfg.slo).text,
            "slo_met": False, "repeats": cfg.repeats,
            "stopped_early": f"{d.reason} after {d.replies:,} first tokens (repeat "
                             f"{repeat + 1} of {cfg.repeats})",
            "stopped_repeat": repeat, "stopped_after_first_tokens": d.replies}
