"""What a fleet config must hold before it runs (the run's check, sim/run/check.py, asks):
replicas and a router, a shared pool, the two pools of a disaggregated fleet.
``fleet_problem`` answers ``(field, why)`` for the first field that cannot run, or None.
"""

from __future__ import annotations

import math

from costmodel.errors import ProfileError
from costmodel.links import get_link
from policies import PolicyError
from policies.pd_rules import PD_RULES, PDRuleError
from sim.config import ON_OFF, PD_LINK_SCOPES, PD_RETURNS, PD_STREAMING, RunConfig
from sim.engines import ENGINES

from .pool import WRITE_POLICIES

Problem = tuple[str, str] | None


def fleet_problem(cfg: RunConfig) -> Problem:
    """The first fleet, pool or disaggregation field of ``cfg`` that cannot run."""
    if isinstance(cfg.fleet.replicas, bool) or not isinstance(cfg.fleet.replicas, int) \
            or cfg.fleet.replicas < 1:
        return "replicas", f"must be a positive integer, got {cfg.fleet.replicas!r}"
    if not isinstance(cfg.fleet.router_params, dict):
        return "router_params", "must be a mapping of parameter names to values"
    if cfg.fleet.router_params and cfg.fleet.router is None:
        return "router_params", "only a 'router' takes parameters"
    if cfg.fleet.router is not None and not isinstance(cfg.fleet.router, str):
        return "router", f"must be a router name or FILE.py:CLASS, got {cfg.fleet.router!r}"
    problem = _pool_problem(cfg) or _pd_problem(cfg)
    if problem is not None or (not cfg.is_fleet and not cfg.is_pd):
        return problem
    if cfg.context.strategy != "full":
        return "context", ("context strategies run on one server, not in a fleet "
                           "(--replicas 1 without --router)")
    try:
        cfg.make_router()
    except PolicyError as e:
        return "router", str(e)
    return None


def _pd_problem(cfg: RunConfig) -> Problem:
    for name in ("prefill_replicas", "decode_replicas", "pd_local_threshold"):
        v = cfg.value(name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return name, f"must be an integer >= 0, got {v!r}"
    for name, allowed in (("pd_link_scope", PD_LINK_SCOPES), ("pd_streaming", PD_STREAMING),
                          ("decode_cache", ON_OFF), ("pd_return", PD_RETURNS),
                          ("pd_prealloc", ON_OFF)):
        if cfg.value(name) not in allowed:
            return name, f"must be one of {', '.join(allowed)}, got {cfg.value(name)!r}"
    try:
        get_link(cfg.pd.pd_link)
    except ProfileError as e:
        return "pd_link", str(e).split(": ", 2)[-1]
    try:
        PD_RULES.get(cfg.pd.pd_rule)
    except PDRuleError as e:
        return "pd_rule", str(e)
    if not cfg.is_pd:
        return None
    if not (cfg.pd.prefill_replicas and cfg.pd.decode_replicas):
        return ("prefill_replicas" if not cfg.pd.prefill_replicas else "decode_replicas",
                "a disaggregated fleet needs both pools: give --prefill-replicas P "
                "and --decode-replicas D (each >= 1)")
    if cfg.fleet.replicas != 1:
        return "replicas", ("a disaggregated fleet counts its workers with "
                            "--prefill-replicas and --decode-replicas, not --replicas")
    if not ENGINES[cfg.engine.name].lands_remote_kv:
        return "engine", (f"the {cfg.engine.name} engine cannot land KV computed elsewhere "
                          "(EngineBase.lands_remote_kv): a decode worker needs it")
    if cfg.pool.size:
        return "pool", "a shared pool with disaggregated pools is not modelled"
    return None


def _pool_problem(cfg: RunConfig) -> Problem:
    if isinstance(cfg.pool.size, bool) or not isinstance(cfg.pool.size, int) or cfg.pool.size < 0:
        return "pool", f"must be a size in tokens >= 0, got {cfg.pool.size!r}"
    if not cfg.pool.size:
        return None
    if cfg.pool.size < cfg.cache.block_size:
        return "pool", (f"must hold at least one block ({cfg.cache.block_size} tokens), "
                        f"got {cfg.pool.size}")
    if cfg.engine.name != "sglang":
        return "pool", ("the shared pool runs with the sglang engine (vLLM's block "
                        "pool has no insertion point outside a running request)")
    for k, lo in (("pool_bandwidth", 0.0), ("pool_latency_us", None)):
        v = cfg.value(k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or (v <= 0 if lo is not None else v < 0):
            return k, f"must be a number {'> 0' if lo is not None else '>= 0'}, got {v!r}"
    for k in ("pool_watermark", "pool_evict_fraction"):
        v = cfg.value(k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
            return k, f"must be in (0, 1], got {v!r}"
    if cfg.pool.pool_write not in WRITE_POLICIES:
        return "pool_write", (f"must be one of {', '.join(WRITE_POLICIES)}, "
                              f"got {cfg.pool.pool_write!r}")
    return None
