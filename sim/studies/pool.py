"""``kvsim reproduce pool``: local caches only against the same fleet over a shared KV pool,
for a cache-aware router and round robin, on the shared Claude Code traces and the Mooncake
trace; and both traces' capacity curves (``kvsim capacity``'s fleet view).

Timed runs: ``REPLICAS`` Qwen3-8B SGLang replicas (``QUICK_REPLICAS`` with ``--quick``), each
with the model's 256K-token GPU cache; the pool holds ``POOL_PER_REPLICA`` x replicas tokens on
``POOL_BANDWIDTH_GB_S`` links (one 200 Gb/s NIC per replica; Mooncake's nodes have four) with
``POOL_LATENCY_US`` per fetch, write-through. Claude Code: closed loop, ``SESSIONS_PER_REPLICA``
sessions at once per replica, the paper's shared prefix and context cut, tool gaps, lpm.
Mooncake: open loop at its arrival times. One row per run: ``{"workload", "router",
"replicas", "pool", "ttft_mean_s", "ttft_p90_s", "jct_mean_s", "hit_rate", "pool_hit_rate",
"fetched_tokens", "fetch_s", "refused_fetches", "bandwidth_utilization", "reuse_captured"}``.

The cache-aware router is the first of ``CACHE_AWARE`` that is registered (the field's routers,
policies/routers/); with none registered the rows say ``session-affinity`` and a note says so.

Capacity: per workload the same replicas, routers and pools, replayed without a clock over
``CAPACITY_CACHES`` per replica (sim/studies/capacity_fleet.py), each request in flight for
``CAPACITY_IN_FLIGHT_S`` of trace time (the load a router like dynamo-kv weighs); rows as
``kvsim capacity --json``.
``--quick``: two replicas, the 8 Claude Code sessions with most requests under 64K tokens, the
first 300 Mooncake requests, smaller caches and pool. Without ../shared/data the Claude Code
workload is the synthetic one and the Mooncake workload is left out (a note says so).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from sim.config import RunConfig
from sim.report.tables import Col, narrow_table

from .capacity_fleet import fleet_capacity_curve
from .study import SHARED_DATA, Experiment, StudySetup, fleet_summary, run_all

CACHE_AWARE = ("dynamo-kv", "sglang-cache-aware", "llm-d")
REPLICAS, QUICK_REPLICAS = 4, 2
SESSIONS_PER_REPLICA, QUICK_SESSIONS_PER_REPLICA = 8, 4
POOL_PER_REPLICA, QUICK_POOL_PER_REPLICA = 1 << 20, 1 << 17  # tokens
POOL_BANDWIDTH_GB_S = 25.0
POOL_LATENCY_US = 50.0
CAPACITY_CACHES = (1 << 16, 1 << 18, 1 << 20, 1 << 22)
QUICK_CAPACITY_CACHES = (1 << 14, 1 << 16)
CAPACITY_IN_FLIGHT_S = 2.0  # about a request's latency in the timed rows (docs/fleet.md)
MOONCAKE = SHARED_DATA / "mooncake" / "synthetic_trace.jsonl.gz"
QUICK_MOONCAKE_SELECT = "first:300"

COLUMNS = ("workload", "router", "replicas", "pool", "ttft_mean_s", "ttft_p90_s",
           "jct_mean_s", "hit_rate", "pool_hit_rate", "fetched_tokens", "fetch_s",
           "refused_fetches", "bandwidth_utilization", "reuse_captured")


def routers(ctx: StudySetup) -> tuple[str, str]:
    """Round robin and the first registered cache-aware router (see the module doc)."""
    from policies.routing import ROUTERS

    for name in CACHE_AWARE:
        if name in ROUTERS:
            return "round-robin", name
    ctx.notes.append("no cache-aware router is registered: session-affinity stands in")
    return "round-robin", "session-affinity"


def workloads(ctx: StudySetup) -> list[tuple[str, RunConfig]]:
    """(name, base config of one replica); sessions are set per replica count."""
    out = []
    cc = ctx.base("qwen3-8b", 1)
    out.append(("cc-traces", cc))
    if MOONCAKE.is_file():
        out.append(("mooncake", RunConfig.from_flat(
            trace=str(MOONCAKE), trace_format="mooncake", replay="open", model="qwen3-8b",
            gpu_cache=cc.cache.gpu_cache, scheduler="lpm", profile=ctx.profile("qwen3-8b"),
            select=QUICK_MOONCAKE_SELECT if ctx.quick else None)))
    else:
        ctx.notes.append(f"mooncake workload left out: {MOONCAKE} is absent")
    return out


def configs(ctx: StudySetup) -> tuple[list[tuple[str, str, int, int]], list[RunConfig]]:
    n = QUICK_REPLICAS if ctx.quick else REPLICAS
    per = QUICK_SESSIONS_PER_REPLICA if ctx.quick else SESSIONS_PER_REPLICA
    pool = n * (QUICK_POOL_PER_REPLICA if ctx.quick else POOL_PER_REPLICA)
    keys, cfgs = [], []
    for name, base in workloads(ctx):
        for router in routers(ctx):
            for size in (0, pool):
                cfgs.append(base.with_preset("sglang").with_fields(replicas=n, router=router,
                                                                   sessions=per * n, pool=size,
                                    pool_bandwidth=POOL_BANDWIDTH_GB_S,
                                                                   pool_latency_us=POOL_LATENCY_US))
                keys.append((name, router, n, size))
    return keys, cfgs


def row(key: tuple[str, str, int, int], s: dict[str, Any]) -> dict[str, Any]:
    name, router, n, pool = key
    return {
        "workload": name, "router": router, "replicas": n, "pool": pool,
        "ttft_mean_s": s["ttft_mean_s"], "ttft_p90_s": s["ttft_p90_s"],
        "jct_mean_s": s["jct_mean_s"], "hit_rate": s["hit_rate"],
        "pool_hit_rate": s.get("pool_hit_rate", 0.0),
        "fetched_tokens": s.get("reused_pool_tokens", 0),
        "fetch_s": s.get("pool_fetch_s", 0.0),
        "refused_fetches": s.get("pool_refused_fetches", 0),
        "bandwidth_utilization": s.get("pool_bandwidth_utilization", 0.0),
        "reuse_captured": s["reuse_captured"],
    }


def pool(ctx: StudySetup) -> list[dict[str, Any]]:
    """The timed rows (see the module doc)."""
    keys, cfgs = configs(ctx)
    return [row(k, s) for k, s in zip(keys, run_all(ctx, cfgs, fleet_summary), strict=True)]


def capacity(ctx: StudySetup) -> list[dict[str, Any]]:
    """Both traces' capacity curves for the same fleets, without a clock."""
    from sim.run import load_run_trace

    keys, cfgs = configs(ctx)
    caches = QUICK_CAPACITY_CACHES if ctx.quick else CAPACITY_CACHES
    rows = []
    for (name, router, n, size), cfg in zip(keys, cfgs, strict=True):
        trace = load_run_trace(cfg)
        for r in fleet_capacity_curve(trace, caches, n, router, size,
                                      in_flight_s=CAPACITY_IN_FLIGHT_S):
            rows.append({"workload": name, **r.as_dict()})
    return rows


def document_extras(ctx: StudySetup) -> dict[str, Any]:
    """What ``kvsim reproduce pool`` adds beside its rows: the capacity curves."""
    return {"capacity": capacity(ctx), "notes": list(dict.fromkeys(ctx.notes))}


POOL_KEYS = [Col("workload", "workload"), Col("router", "router"),
             Col("N", "replicas", "int"), Col("pool", "pool", "tokens")]
POOL_LAYOUTS = [
    ("with and without a shared pool", [
        Col("TTFT\nmean (s)", "ttft_mean_s", "s"), Col("TTFT\np90 (s)", "ttft_p90_s", "s"),
        Col("JCT\nmean (s)", "jct_mean_s", "s"), Col("hit\nrate", "hit_rate", "rate"),
        Col("reuse\ncaptured", "reuse_captured", "rate")]),
    ("what the pool served", [
        Col("pool\nhit rate", "pool_hit_rate", "rate"),
        Col("fetched\ntokens", "fetched_tokens", "int"), Col("fetch\n(s)", "fetch_s", "s"),
        Col("refused\nfetches", "refused_fetches", "int"),
        Col("link\nbusy", "bandwidth_utilization", "rate")]),
]
CAPACITY_COLUMNS = [Col("workload", "workload"), Col("router", "router"),
                    Col("N", "replicas", "int"),
                    Col("cache per\nreplica", "cache_tokens", "tokens"),
                    Col("pool", "pool_tokens", "tokens"), Col("hit\nrate", "hit_rate", "rate"),
                    Col("from the\npool", "pool_hit_rate", "rate"),
                    Col("infinite\ncache", "ideal_hit_rate", "rate")]


def pool_tables(doc: dict[str, Any]) -> list[Table | str]:
    """The timed rows, then the capacity curves of the same fleets."""
    out: list[Table | str] = [narrow_table(f"kvsim reproduce pool -- {title}",
                                           [*POOL_KEYS, *cols], doc["rows"])
                              for title, cols in POOL_LAYOUTS]
    out.append(narrow_table("capacity (no clock; caches per replica)", CAPACITY_COLUMNS,
                            doc.get("capacity", [])))
    out.extend(f"note: {note}" for note in doc.get("notes", []))
    return out


POOL = Experiment("pool", pool, tables=pool_tables, extras=document_extras)
