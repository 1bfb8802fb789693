"""Repeats of one run with confidence intervals (docs/engine.md, Metrics).

``run_repeats`` runs a config ``repeats`` times with the decision seeds ``seed``,
``seed + 1``, ... (a fleet's router ties, random eviction victims) on one trace (the trace is
drawn with ``trace_seed``, which defaults to the config's own ``seed``, so every repeat replays
the same requests). Its summary holds, per numeric metric, the mean over the repeats and
``METRIC_ci95``: the half-width of the 95% Student-t interval of that mean
(``t(0.975, N-1) * sd / sqrt(N)``, sd with N-1 degrees of freedom). An engine without
randomness (one server, a deterministic policy) gives identical repeats and intervals of 0.
The requests table is every repeat's, with a ``repeat`` column; other tables and nested
fields are the first repeat's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from costmodel.detmath import ndtri

from .result import RunResult
from .summary import reads_seed
from .trace import load_run_trace

# t(0.975, df) for df = 1..30 (any statistics table); beyond, the Cornish-Fisher series
_T975 = (12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851,
         2.364624252, 2.306004135, 2.262157163, 2.228138852, 2.200985160, 2.178812830,
         2.160368656, 2.144786688, 2.131449546, 2.119905299, 2.109815578, 2.100922040,
         2.093024054, 2.085963447, 2.079613845, 2.073873068, 2.068657610, 2.063898562,
         2.059538553, 2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456)


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom."""
    if df < 1:
        return math.nan
    if df <= len(_T975):
        return _T975[df - 1]
    z = ndtri(0.975)
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def mean_ci(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% interval); NaN values are left out."""
    v = [x for x in values if x == x]
    if not v:
        return math.nan, math.nan
    n = len(v)
    mean = math.fsum(v) / n
    if n == 1:
        return mean, math.nan
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in v) / (n - 1))
    return mean, t975(n - 1) * sd / math.sqrt(n)


def _numeric(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def combine(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """One summary of several repeats (module docstring)."""
    first = summaries[0]
    out: dict[str, Any] = {}
    for k, v in first.items():
        if _numeric(v):
            values = [s[k] for s in summaries if _numeric(s.get(k))]
            mean, ci = mean_ci([float(x) for x in values])
            # a count the repeats agree on stays a count
            same = all(isinstance(x, int) and x == v for x in values)
            out[k] = v if same else mean
            out[f"{k}_ci95"] = ci
        else:
            out[k] = v
    return out


def seed_users(cfg) -> list[str]:
    """What in a run of ``cfg`` draws from its decision seed, the one thing repeats vary (the
    trace is fixed): a fleet's router (ties, random routers; sim/run/kinds.py) and a PD rule
    draw from streams of it, and a policy may read it (``EvictionPolicy.uses_seed``; a user's
    policy file is assumed to). Empty: every repeat is the same run."""
    users = []
    if cfg.is_pd:
        users.append("the PD router and rule")
    elif cfg.is_fleet and cfg.fleet.replicas > 1:
        users.append("the router")
    if reads_seed(type(cfg.make_policy())):
        users.append(f"policy {cfg.policy_label}")
    return users


def run_repeats(cfg, trace, run_one: Callable[[Any, Any, int], RunResult],
                reuse: bool = True) -> RunResult:
    """``cfg.repeats`` runs of ``cfg`` (module docstring) as one ``RunResult``; ``run_one(c,
    trace, k)`` is repeat k's run of config ``c`` (``sim.run.run`` with ``repeats`` 1). Where
    the first repeat drew nothing from its seed (``RunResult.seed_drawn``) the others are that
    run again, so with ``reuse`` they are not run (identical results, a plan's
    session-affinity points in half the time; issue 55)."""
    import pandas as pd  # (not at import: issue 55 start-up)

    from sim.slo import meets, parse_slo, pessimistic

    one = cfg.with_fields(repeats=1, trace_seed=cfg.trace_draw_seed)
    if trace is None:
        trace = load_run_trace(one)
    results = [run_one(one.with_fields(seed=cfg.seed), trace, 0)]
    for k in range(1, cfg.repeats):
        same = reuse and not results[0].seed_drawn
        results.append(results[0] if same else run_one(one.with_fields(seed=cfg.seed + k),
                                                        trace, k))
    summary = combine([r.summary for r in results])
    summary["repeats"] = cfg.repeats
    summary["repeat_seeds"] = [cfg.seed + k for k in range(cfg.repeats)]
    if cfg.slo is not None:
        slo = parse_slo(cfg.slo)
        summary["slo_met_repeats"] = sum(bool(r.summary["slo_met"]) for r in results)
        summary["slo_met"] = meets(slo, pessimistic(summary, slo))
    tables = []
    for k, r in enumerate(results):
        t = r.requests.copy()
        t.insert(0, "repeat", k)
        tables.append(t)
    return RunResult(cfg, pd.concat(tables, ignore_index=True), summary, results[0].tables)
