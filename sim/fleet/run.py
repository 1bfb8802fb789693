"""``run_fleet``: one run of N replicas behind a router (``sim.runner.run`` calls it when
``RunConfig.is_fleet``). A pure function of (trace, config, seed), like a single run.

Results: the requests of every replica in one table with a ``replica`` column; the summary
is computed over all of them with the same code as a single server's (so fleet totals are the
sums of the replicas'), plus the fleet metrics (``sim.fleet.metrics``) and, under
``replica_summaries``, each replica's own summary; ``tables["load"]`` holds each replica's
waiting and running requests at every routing decision (``kvsim plot`` draws it), and
``tables["routing"]`` every decision with the router's belief beside the truth.

Each replica is built, bound and summarized with ``sim.runner.run``'s own steps (the engine
registry, ``bind_policy``, ``run_fields``); tests/test_fleet.py's ``--replicas 1`` golden
fails the moment the two differ in any field.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import simpy

from costmodel.units import Units, ranges_units
from sim.engines import ENGINES
from sim.replay import Replay
from sim.report.progress import current as current_progress
from sim.runner import RunResult, answer_fields, bind_policy, run_fields

from .fleet import Fleet, ReplicaSignals
from .metrics import fleet_metrics, merge_recorders, recorder_for
from .pool import SharedPool
from .pooltier import FleetPool

# The router's RNG stream: seeded by the run's seed, apart from every policy's.
ROUTER_STREAM = 0x524F55544552  # "ROUTER"


class FleetSizeError(ValueError):
    """More replicas than the trace has requests (exit status 2)."""

    exit_code = 2


def check_fleet_size(cfg, trace) -> None:
    """Refuse a fleet that the trace cannot occupy: with more replicas than requests, some
    replicas serve nothing whatever the router does (and each costs its engine)."""
    if cfg.is_fleet and cfg.replicas > len(trace):
        raise FleetSizeError(f"--replicas {cfg.replicas:,}: the trace has {len(trace):,} "
                             f"requests, so {cfg.replicas - len(trace):,} replicas or more "
                             f"could never serve one; use at most {len(trace):,}")


def run_fleet(cfg, trace, spec, profile, timeline=None) -> RunResult:
    check_fleet_size(cfg, trace)
    env = simpy.Environment()
    engines, policies = [], []
    signals = [ReplicaSignals(i) for i in range(cfg.replicas)]
    for i in range(cfg.replicas):
        policy = cfg.make_policy()
        bind_policy(env, cfg, spec, profile, policy, trace.sessions)
        rec = recorder_for(trace, signals[i])
        engine = ENGINES[cfg.engine].build(env, cfg, spec, profile, policy, rec)
        if timeline is not None:  # sim/timeline.py: one track per replica
            timeline.use_clock(lambda: env.now)
            rec.observe(timeline.track(i, lambda e=engine: (len(e.waiting),
                                                            len(e.running))))
        engines.append(engine)
        policies.append(policy)
    sessions = recorder_for(trace)
    router = cfg.make_router()
    pool = build_pool(env, cfg, spec, profile, engines) if cfg.pool else None
    fleet = Fleet(env, engines, router, cfg.block_size, sessions,
                  np.random.default_rng([cfg.seed, ROUTER_STREAM]), pool, signals)
    gaps = trace.gaps(cfg.gaps)
    bar = current_progress()  # observes replies only (sim/report/progress.py)
    replay = Replay(env, trace, fleet, gaps, trace.start_offsets(cfg.gaps), cfg.sessions,
                    cfg.time_scale, on_reply=bar.advance if bar.counts("requests") else None,
                    max_concurrency=cfg.max_concurrency)
    driver = env.process(replay.closed_loop() if cfg.replay == "closed" else replay.open_loop())
    env.run(until=driver)  # both loops end with the last reply
    fleet.close()

    tables = []
    for i, e in enumerate(engines):
        t = ideal_columns(e.rec.table(), fleet, cfg.block_size)
        t.insert(0, "replica", np.full(len(t), i, dtype=np.int64))
        tables.append(t)
    served = [t for t in tables if len(t)] or tables[:1]  # idle replicas add no rows
    table = pd.concat(served, ignore_index=True) if len(served) > 1 else served[0]
    table = table.sort_values(["send_s", "request"], kind="stable").reset_index(drop=True)
    merged = merge_recorders(trace, [e.rec for e in engines], sessions)
    summary = merged.summary(env.now, cfg.block_size, table)
    summary.update(run_fields(cfg, policies[0], profile, spec, trace, table))
    summary.update(answer_fields(cfg, profile, table, summary, set(merged.session_end)))
    metrics, per_replica = fleet_metrics(fleet, engines, tables, sessions, env.now,
                                         cfg.block_size, table)
    summary.update(metrics)
    if cfg.vllm_patch != "none":  # as a single run's summary: the patch and its counters
        summary["vllm_patch"] = cfg.vllm_patch
        for replica_summary, e in zip(per_replica, engines, strict=True):
            replica_summary.update(e.patch_summary())
    summary["replica_summaries"] = per_replica
    tables = {"load": _load_table(fleet), "routing": _routing_table(fleet)}
    if pool is not None:
        table = pool_columns(table, pool, cfg.block_size)
        summary.update(pool_summary(pool, table, env.now, cfg))
        summary["pool_notes"] = pool_notes(pool, table)
        tables["pool"] = pool_table(pool)
        if timeline is not None:
            timeline.pool_fetches(pool.transfers, cfg.replicas)
        tables["pool_transfers"] = pd.DataFrame(
            np.asarray(pool.transfers, dtype=float).reshape(-1, 3),
            columns=["start_s", "end_s", "bytes"])
    return RunResult(cfg, table, summary, tables)


def ideal_columns(table: pd.DataFrame, fleet: Fleet, bs: int) -> pd.DataFrame:
    """A replica's requests with the fleet's ideal: ``ideal_hit_tokens`` becomes the prefix an
    unlimited cache shared by the fleet held at the request's admission (the trace's own
    ideal, whatever the router), ``routed_ideal_hit_tokens`` the replica's own unlimited
    cache's (what the routing left it; the engine's ideal, against which it counts
    ``recomputed_tokens``). A dropped request has neither (0)."""
    t = table.copy()
    at = t.columns.get_loc("ideal_hit_tokens")
    routed = t["ideal_hit_tokens"].to_numpy()
    ideal = fleet.ideal_blocks
    t["ideal_hit_tokens"] = np.asarray([ideal.get(int(r), 0) for r in t["request"]],
                                       dtype=np.int64) * bs
    t.insert(at + 1, "routed_ideal_hit_tokens", routed)
    return t


def build_pool(env: simpy.Environment, cfg, spec, profile, engines) -> FleetPool:
    """The shared pool of a fleet run, priced by the run's cost model."""
    base = profile.prefill_seconds(Units())

    def recompute_seconds(ranges: list[tuple[int, int]]) -> float:
        return profile.prefill_seconds(ranges_units(spec, ranges)) - base

    return FleetPool(env, SharedPool(cfg.pool // cfg.block_size, cfg.pool_watermark,
                                     cfg.pool_evict_fraction),
                     engines, cfg.block_size, spec.kv_bytes_per_token * cfg.block_size,
                     cfg.pool_bandwidth * 1e9, cfg.pool_latency_us * 1e-6, cfg.pool_write,
                     recompute_seconds)


def pool_columns(table: pd.DataFrame, pool: FleetPool, bs: int) -> pd.DataFrame:
    """Where each reused token came from: ``pool_tokens`` (fetched from the pool; they land on
    the replica's GPU, so ``hit_gpu_tokens`` counts them too: the blocks the request's fetch
    landed that its admission reused; landed blocks evicted before admission are not
    counted), ``local_gpu_tokens`` (the rest of the GPU hit), ``loaded_cpu_tokens`` (the
    replica's CPU tier, as before); ``fetch_s`` the seconds the request waited for its fetch
    (0: none)."""
    rec = pool.record
    rid = table["request"].to_numpy()
    table = table.copy()
    table["pool_tokens"] = np.asarray([rec.reused.get(int(r), 0) for r in rid],
                                      dtype=np.int64) * bs
    table["local_gpu_tokens"] = table["hit_gpu_tokens"].to_numpy() - table["pool_tokens"]
    table["fetch_s"] = np.asarray([rec.fetch_s.get(int(r), 0.0) for r in rid], dtype=float)
    return table


def pool_summary(pool: FleetPool, table: pd.DataFrame, duration_s: float, cfg) -> dict:
    prompt = int(table["prompt_tokens"].sum()) if len(table) else 0
    fields = pool.summary(duration_s, cfg.replicas)
    for k, col in (("reused_gpu_tokens", "local_gpu_tokens"),
                   ("reused_cpu_tokens", "loaded_cpu_tokens"),
                   ("reused_pool_tokens", "pool_tokens")):
        fields[k] = int(table[col].sum()) if len(table) else 0
    fields["pool_hit_rate"] = fields["reused_pool_tokens"] / prompt if prompt else 0.0
    fields["pool_fetch_s"] = float(table["fetch_s"].sum()) if len(table) else 0.0
    fields["pool_write"] = cfg.pool_write
    fields["pool_bandwidth_gb_s"] = cfg.pool_bandwidth
    fields["pool_latency_us"] = cfg.pool_latency_us
    return fields


def pool_notes(pool: FleetPool, table: pd.DataFrame) -> list[str]:
    """What a user of this pool should know (``kvsim run`` prints them as warnings): prompts
    the pool cannot hold whole, and lookups that stopped behind a CPU-resident prefix."""
    notes = []
    size = pool.pool.capacity * pool.bs
    prompts = table["prompt_tokens"].to_numpy()
    over = int((prompts > size).sum())
    if over:
        notes.append(f"the pool ({size:,} tokens) is smaller than {over:,} of {prompts.size:,} "
                     f"prompts (the longest: {int(prompts.max()):,} tokens): it cannot hold "
                     "such a prompt whole, and a lookup stops at the first block it lacks")
    if pool.behind_cpu:
        notes.append(f"{pool.behind_cpu:,} of {pool.lookups:,} pool lookups that found blocks "
                     "stopped behind a prefix held partly in the replica's CPU tier "
                     f"({pool.behind_cpu_blocks * pool.bs:,} pooled tokens not fetched): "
                     "kvsim lands pool blocks only behind a GPU prefix, so those requests "
                     "loaded the CPU part and computed the rest")
    return notes


def pool_table(pool: FleetPool) -> pd.DataFrame:
    """Pool occupancy at every routing decision and landing (``kvsim plot`` draws it with
    the bytes moved per second)."""
    return pd.DataFrame({
        "time_s": np.asarray(pool.occ_time, dtype=float),
        "blocks": np.asarray(pool.occ_blocks, dtype=np.int64),
        "leased_blocks": np.asarray(pool.occ_leased, dtype=np.int64),
        "tokens": np.asarray(pool.occ_blocks, dtype=np.int64) * pool.bs,
    })


def _routing_table(fleet: Fleet) -> pd.DataFrame:
    """One row per routing decision, in decision order: what the router believed about the
    chosen replica beside the truth (tokens; ``believed`` NaN without a cache view)."""
    d = fleet.decisions
    return pd.DataFrame({
        "time_s": np.asarray(d.time, dtype=float),
        "request": np.asarray(d.rid, dtype=np.int64),
        "session": np.asarray(d.session, dtype=np.int64),
        "replica": np.asarray(d.replica, dtype=np.int64),
        "prompt_tokens": np.asarray(d.prompt_tokens, dtype=np.int64),
        "believed_tokens": np.asarray(d.believed_tokens, dtype=float),
        "true_tokens": np.asarray(d.true_tokens, dtype=np.int64),
        "best_tokens": np.asarray(d.best_tokens, dtype=np.int64),
        "follow_up": np.asarray(d.follow_up, dtype=bool),
        "same_replica": np.asarray(d.same_replica, dtype=bool),
    })


def _load_table(fleet: Fleet) -> pd.DataFrame:
    n = len(fleet.replicas)
    times = np.asarray(fleet.load_time, dtype=float)
    return pd.DataFrame({
        "time_s": np.tile(times, n),
        "replica": np.repeat(np.arange(n, dtype=np.int64), len(times)),
        "waiting": np.concatenate([np.asarray(w, dtype=np.int64)
                                   for w in fleet.load_waiting]) if n else [],
        "running": np.concatenate([np.asarray(w, dtype=np.int64)
                                   for w in fleet.load_running]) if n else [],
    })
