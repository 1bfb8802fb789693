"""``kvsim reproduce fleet``: every built-in router x {sglang, penelope} eviction x {2, 4, 8}
replicas on three workloads.

- ``cc-traces``: the shared Claude Code sessions (all 360; ``--trace`` overrides), closed loop
  with ``SESSIONS_PER_REPLICA`` sessions at once per replica (the paper's pressed N for one
  256K-token cache), the paper's 15.6K-token shared prefix and 128K cut, tool gaps, lpm;
- ``mooncake``: the Mooncake FAST'25 synthetic trace (../shared/data/mooncake, 3,993 requests)
  replayed open loop at its arrival times;
- ``prefix-groups``: ``PREFIX_GROUPS`` (SGLang's shared-prefix benchmark shape, two turns per
  user, a rate ramp), open loop, a 64K-token cache per replica so that a fleet of two cannot
  hold every group's prefix and routing decides what is shared.
Every replica is a Qwen3-8B SGLang engine with the model's 256K-token cache unless said. One
row per run: ``{"workload", "router", "policy", "replicas", "ttft_mean_s", "ttft_p90_s",
"jct_mean_s", "hit_rate", "reuse_available", "reuse_captured", "affinity", "load_cv"}``
(``load_cv``: coefficient of variation of busy time across replicas) and a few more (reuse
delivered, belief error, requests). ``--quick``: 2 and 4 replicas on small slices (the
8 sessions with most requests under 64K tokens, the first 300 Mooncake requests, 16 groups of
8 users); without ../shared/data the Claude Code workload is the synthetic one and the Mooncake
workload is left out (a note says so).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from sim.config import RunConfig
from sim.report.tables import Col, narrow_table

from . import pool as pool_study
from .study import SHARED_DATA, Experiment, StudySetup, fleet_summary, run_all

ROUTERS = ("round-robin", "random", "least-load", "power-of-two", "session-affinity",
           "sglang-cache-aware", "dynamo-kv", "llm-d", "mooncake", "preble")
POLICIES = ("sglang", "penelope")
REPLICAS = (2, 4, 8)
QUICK_REPLICAS = (2, 4)
SESSIONS_PER_REPLICA = 8
QUICK_SESSIONS_PER_REPLICA = 4
MOONCAKE = SHARED_DATA / "mooncake" / "synthetic_trace.jsonl.gz"
QUICK_MOONCAKE_SELECT = "first:300"
PREFIX_GROUPS = ("synthetic:prefix-groups?groups=64&prefix=2048&users=16&question=128"
                 "&turns=2&qps=4..32")
QUICK_PREFIX_GROUPS = ("synthetic:prefix-groups?groups=16&prefix=2048&users=8&question=128"
                       "&turns=2&qps=4..32")
PREFIX_GROUPS_GPU_CACHE = 65536

COLUMNS = ("workload", "router", "policy", "replicas", "ttft_mean_s", "ttft_p90_s",
           "jct_mean_s", "hit_rate", "reuse_available", "reuse_captured", "affinity",
           "load_cv")


def workloads(ctx: StudySetup) -> list[tuple[str, RunConfig]]:
    """(name, base config with one replica's settings); sessions are set per replica count."""
    out = []
    cc = ctx.base("qwen3-8b", 1)
    if not ctx.quick:
        cc = cc.with_fields(select=None)  # all sessions, not the paper's top 24
    out.append(("cc-traces", cc))
    if MOONCAKE.is_file():
        moon = RunConfig.from_flat(trace=str(MOONCAKE), trace_format="mooncake", replay="open",
                                   model="qwen3-8b", gpu_cache=262144, scheduler="lpm",
                                   profile=ctx.profile("qwen3-8b"),
                                   select=QUICK_MOONCAKE_SELECT if ctx.quick else None)
        out.append(("mooncake", moon))
    else:
        ctx.notes.append(f"mooncake workload left out: {MOONCAKE} is absent")
    groups = RunConfig.from_flat(trace=QUICK_PREFIX_GROUPS if ctx.quick else PREFIX_GROUPS,
                                 replay="open", model="qwen3-8b", gpu_cache=PREFIX_GROUPS_GPU_CACHE,
                                 scheduler="lpm", profile=ctx.profile("qwen3-8b"))
    out.append(("prefix-groups", groups))
    return out


def configs(ctx: StudySetup) -> tuple[list[tuple[str, str, str, int]], list[RunConfig]]:
    per = QUICK_SESSIONS_PER_REPLICA if ctx.quick else SESSIONS_PER_REPLICA
    keys, cfgs = [], []
    for name, base in workloads(ctx):
        for n in (QUICK_REPLICAS if ctx.quick else REPLICAS):
            for policy in POLICIES:
                for router in ROUTERS:
                    cfg = base.with_preset(policy).with_fields(replicas=n, router=router,
                                                               sessions=per * n)
                    keys.append((name, router, policy, n))
                    cfgs.append(cfg)
    return keys, cfgs


def row(key: tuple[str, str, str, int], s: dict[str, Any]) -> dict[str, Any]:
    name, router, policy, n = key
    return {
        "workload": name, "router": router, "policy": policy, "replicas": n,
        "ttft_mean_s": s["ttft_mean_s"], "ttft_p90_s": s["ttft_p90_s"],
        "jct_mean_s": s["jct_mean_s"], "hit_rate": s["hit_rate"],
        "reuse_available": s["reuse_available"], "reuse_captured": s["reuse_captured"],
        "affinity": s["affinity"], "load_cv": s["load_cv_busy"],
        # local caches only: the pool rows (sim/studies/pool.py) sit beside these in the document
        "pool": 0, "pool_hit_rate": 0.0, "fetched_tokens": 0, "fetch_s": 0.0,
        "reuse_delivered": s["reuse_delivered"], "load_cv_queue": s["load_cv_queue"],
        "belief_error_mean_tokens": s["belief_error_mean_tokens"],
        "requests": s["requests"], "dropped_requests": s["dropped_requests"],
        "idle_replicas": s["idle_replicas"],
    }


def fleet(ctx: StudySetup) -> list[dict[str, Any]]:
    keys, cfgs = configs(ctx)
    return [row(k, s) for k, s in zip(keys, run_all(ctx, cfgs, fleet_summary), strict=True)]


FLEET_KEYS = [Col("router", "router"), Col("policy", "policy"), Col("N", "replicas", "int")]
FLEET_LAYOUTS = [
    ("time", [Col("TTFT\nmean (s)", "ttft_mean_s", "s"), Col("TTFT\np90 (s)", "ttft_p90_s", "s"),
              Col("JCT\nmean (s)", "jct_mean_s", "s"), Col("hit\nrate", "hit_rate", "rate")]),
    ("reuse and balance", [Col("reuse\navailable", "reuse_available", "rate"),
                           Col("reuse\ncaptured", "reuse_captured", "rate"),
                           Col("affinity", "affinity", "rate"),
                           Col("load\nCV", "load_cv", "ratio"),
                           Col("idle\nreplicas", "idle_replicas", "int")]),
]


def fleet_tables(doc: dict[str, Any]) -> list[Table | str]:
    """Per workload, a heading and two narrow tables (this module's columns), then the
    pool part of the study (sim/studies/pool.py)."""
    out: list[Table | str] = []
    notes = "; ".join(doc.get("notes", []))
    for workload in dict.fromkeys(r["workload"] for r in doc["rows"]):
        rows = [r for r in doc["rows"] if r["workload"] == workload]
        out.append(f"kvsim reproduce fleet -- {workload}" + (f" ({notes})" if notes else ""))
        out.extend(narrow_table(f"{workload}: {title}", [*FLEET_KEYS, *cols], rows)
                   for title, cols in FLEET_LAYOUTS)
    if "pool_rows" in doc:  # the pool and capacity part of the experiment
        out.extend(pool_study.pool_tables({**doc, "rows": doc["pool_rows"], "notes": []}))
    return out


def extras(ctx: StudySetup) -> dict[str, Any]:
    """Local caches against the same fleets over a shared pool, and the pooled fleets'
    capacity curves (sim/studies/pool.py)."""
    return {"pool_rows": pool_study.pool(ctx), **pool_study.document_extras(ctx)}


FLEET = Experiment("fleet", fleet, tables=fleet_tables, extras=extras)
