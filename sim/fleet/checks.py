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
    if isinstance(cfg.replicas, bool) or not isinstance(cfg.replicas, int) \
            or cfg.replicas < 1:
        return "replicas", f"must be a positive integer, got {cfg.replicas!r}"
    if not isinstance(cfg.router_params, dict):
        return "router_params", "must be a mapping of parameter names to values"
    if cfg.router_params and cfg.router is None:
        return "router_params", "only a 'router' takes parameters"
    if cfg.router is not None and not isinstance(cfg.router, str):
        return "router", f"must be a router name or FILE.py:CLASS, got {cfg.router!r}"
    problem = _pool_problem(cfg) or _pd_problem(cfg)
    if problem is not None or (not cfg.is_fleet and not cfg.is_pd):
        return problem
    if cfg.context != "full":
        return "context", ("context strategies run on one server, not in a fleet "
                           "(--replicas 1 without --router)")
    try:
        cfg.make_router()
    except PolicyError as e:
        return "router", str(e)
    return None


def _pd_problem(cfg: RunConfig) -> Problem:
    for name in ("prefill_replicas", "decode_replicas", "pd_local_threshold"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return name, f"must be an integer >= 0, got {v!r}"
    for name, allowed in (("pd_link_scope", PD_LINK_SCOPES), ("pd_streaming", PD_STREAMING),
                          ("decode_cache", ON_OFF), ("pd_return", PD_RETURNS),
                          ("pd_prealloc", ON_OFF)):
        if getattr(cfg, name) not in allowed:
            return name, f"must be one of {', '.join(allowed)}, got {getattr(cfg, name)!r}"
    try:
        get_link(cfg.pd_link)
    except ProfileError as e:
        return "pd_link", str(e).split(": ", 2)[-1]
    try:
        PD_RULES.get(cfg.pd_rule)
    except PDRuleError as e:
        return "pd_rule", str(e)
    if not cfg.is_pd:
        return None
    if not (cfg.prefill_replicas and cfg.decode_replicas):
        return ("prefill_replicas" if not cfg.prefill_replicas else "decode_replicas",
                "a disaggregated fleet needs both pools: give --prefill-replicas P "
                "and --decode-replicas D (each >= 1)")
    if cfg.replicas != 1:
        return "replicas", ("a disaggregated fleet counts its workers with "
                            "--prefill-replicas and --decode-replicas, not --replicas")
    if not ENGINES[cfg.engine].lands_remote_kv:
        return "engine", (f"the {cfg.engine} engine cannot land KV computed elsewhere "
                          "(EngineBase.lands_remote_kv): a decode worker needs it")
    if cfg.pool:
        return "pool", "a shared pool with disaggregated pools is not modelled"
    return None


def _pool_problem(cfg: RunConfig) -> Problem:
    if isinstance(cfg.pool, bool) or not isinstance(cfg.pool, int) or cfg.pool < 0:
        return "pool", f"must be a size in tokens >= 0, got {cfg.pool!r}"
    if not cfg.pool:
        return None
    if cfg.pool < cfg.block_size:
        return "pool", (f"must hold at least one block ({cfg.block_size} tokens), "
                        f"got {cfg.pool}")
    if cfg.engine != "sglang":
        return "pool", ("the shared pool runs with the sglang engine (vLLM's block "
                        "pool has no insertion point outside a running request)")
    for k, lo in (("pool_bandwidth", 0.0), ("pool_latency_us", None)):
        v = getattr(cfg, k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or (v <= 0 if lo is not None else v < 0):
            return k, f"must be a number {'> 0' if lo is not None else '>= 0'}, got {v!r}"
    for k in ("pool_watermark", "pool_evict_fraction"):
        v = getattr(cfg, k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
            return k, f"must be in (0, 1], got {v!r}"
    if cfg.pool_write not in WRITE_POLICIES:
        return "pool_write", (f"must be one of {', '.join(WRITE_POLICIES)}, "
                              f"got {cfg.pool_write!r}")
    return None
