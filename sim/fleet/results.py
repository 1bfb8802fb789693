"""What a fleet run adds to a run: the fleet's size check, the router's RNG stream, the shared
pool built from the run's cost model, and what the fleet served (``fleet_served``, which
sim/run/kinds.py's ``FleetRun`` hands to the run's one result assembly): the fleet's columns of
the requests table (``ideal_columns``, ``pool_columns``), its tables (``load_table``,
``routing_table``, ``pool_table``), the fleet metrics (sim/fleet/metrics.py) and the pool's
fields and notes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from costmodel.units import ranges_units

from .fleet import Fleet
from .metrics import fleet_metrics
from .pool import SharedPool
from .pooltier import FleetPool

if TYPE_CHECKING:  # pandas where a table is made: none before a run's first request (issue 55)
    import pandas as pd

    from sim.engines.recorder import RunRecorder

# The router's RNG stream: seeded by the run's seed, apart from every policy's.
ROUTER_STREAM = 0x524F55544552  # "ROUTER"


class FleetSizeError(ValueError):
    """More replicas than the trace has requests (exit status 2)."""

    exit_code = 2


def check_fleet_size(cfg, trace) -> None:
    """Refuse a fleet that the trace cannot occupy: with more replicas than requests, some
    replicas serve nothing whatever the router does (and each costs its engine)."""
    pools = ((("--prefill-replicas", cfg.pd.prefill_replicas),
              ("--decode-replicas", cfg.pd.decode_replicas)) if cfg.is_pd
             else (("--replicas", cfg.fleet.replicas),) if cfg.is_fleet else ())
    for flag, n in pools:  # a PD request takes one worker of each pool
        if n > len(trace):
            raise FleetSizeError(f"{flag} {n:,}: the trace has {len(trace):,} requests, so "
                                 f"{n - len(trace):,} replicas or more could never serve one; "
                                 f"use at most {len(trace):,}")


def router_drew(router, seed: int) -> bool:
    """Whether ``router`` drew from its stream of the run's ``seed`` (``ROUTER_STREAM``): its
    generator moved from where the seed starts it (a router that keeps its own: assume so)."""
    rng = getattr(router, "rng", None)
    if not isinstance(rng, np.random.Generator):
        return True
    start = np.random.default_rng([seed, ROUTER_STREAM]).bit_generator
    return (rng.bit_generator.state != start.state
            or rng.bit_generator.seed_seq.n_children_spawned != 0)


def fleet_served(fleet: Fleet, engines: list, trace, sessions, pool: FleetPool | None,
                 now: float, cfg, timeline=None
                 ) -> tuple[RunRecorder, pd.DataFrame, dict[str, Any], dict[str, pd.DataFrame]]:
    """What a fleet run served: the recorder of its summary (the replicas' merged), every
    replica's requests in one table with a ``replica`` column, its summary fields (the fleet
    metrics with each replica's summary, the pool's fields and notes) and tables (``load``:
    each replica's queues at every decision, ``routing``: belief beside truth; the pool's)."""
    import pandas as pd  # (not at import: issue 55 start-up)

    bs = cfg.cache.block_size
    tables = []
    for i, e in enumerate(engines):
        t = ideal_columns(e.rec.table(), fleet, bs)
        t.insert(0, "replica", np.full(len(t), i, dtype=np.int64))
        tables.append(t)
    served = [t for t in tables if len(t)] or tables[:1]  # idle replicas add no rows
    table = pd.concat(served, ignore_index=True) if len(served) > 1 else served[0]
    table = table.sort_values(["send_s", "request"], kind="stable").reset_index(drop=True)
    out = {"load": load_table(fleet), "routing": routing_table(fleet)}
    pooled: dict = {}
    if pool is not None:  # (the summary reads the requests' columns by name)
        table = pool_columns(table, pool, bs)
        notes = pool_notes(pool, table)
        out["pool"] = pool_table(pool)
        out["pool_transfers"] = pd.DataFrame(
            np.asarray(pool.transfers, dtype=float).reshape(-1, 3),
            columns=["start_s", "end_s", "bytes"])
        pooled = pool_summary(pool, table, now, cfg) | {"pool_notes": notes}
        if timeline is not None:
            timeline.pool_fetches(pool.transfers, pool.transfer_replicas, cfg.fleet.replicas)
    merged, summary, per_replica = fleet_metrics(trace, fleet, engines, tables, sessions, now,
                                                 bs, table)
    patch = cfg.value("vllm_patch")
    if patch != "none":  # as a single run's summary: the patch and its counters
        summary["vllm_patch"] = patch
        for replica_summary, e in zip(per_replica, engines, strict=True):
            replica_summary.update(e.patch_summary())
    return merged, table, summary | {"replica_summaries": per_replica} | pooled, out


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
    t["ideal_hit_tokens"] = np.asarray([ideal.get(r, 0) for r in t["request"].to_numpy().tolist()],
                                       dtype=np.int64) * bs
    t.insert(at + 1, "routed_ideal_hit_tokens", routed)
    return t


def build_pool(env: simpy.Environment, cfg, spec, profile, engines) -> FleetPool:
    """The shared pool of a fleet run, priced by the run's cost model."""
    def recompute_seconds(ranges: list[tuple[int, int]]) -> float:
        return profile.recompute_seconds(ranges_units(spec, ranges))

    pool, bs = cfg.pool, cfg.cache.block_size
    return FleetPool(env, SharedPool(pool.size // bs, pool.pool_watermark,
                                     pool.pool_evict_fraction),
                     engines, bs, spec.kv_bytes_per_token * bs, pool.pool_bandwidth * 1e9,
                     pool.pool_latency_us * 1e-6, pool.pool_write, recompute_seconds)


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
    fields = pool.summary(duration_s, cfg.fleet.replicas)
    for k, col in (("reused_gpu_tokens", "local_gpu_tokens"),
                   ("reused_cpu_tokens", "loaded_cpu_tokens"),
                   ("reused_pool_tokens", "pool_tokens")):
        fields[k] = int(table[col].sum()) if len(table) else 0
    fields["pool_hit_rate"] = fields["reused_pool_tokens"] / prompt if prompt else 0.0
    fields["pool_fetch_s"] = float(table["fetch_s"].sum()) if len(table) else 0.0
    fields["pool_write"] = cfg.pool.pool_write
    fields["pool_bandwidth_gb_s"] = cfg.pool.pool_bandwidth
    fields["pool_latency_us"] = cfg.pool.pool_latency_us
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
    import pandas as pd  # (not at import: issue 55 start-up)

    return pd.DataFrame({
        "time_s": np.asarray(pool.occ_time, dtype=float),
        "blocks": np.asarray(pool.occ_blocks, dtype=np.int64),
        "leased_blocks": np.asarray(pool.occ_leased, dtype=np.int64),
        "tokens": np.asarray(pool.occ_blocks, dtype=np.int64) * pool.bs,
    })


def routing_table(fleet: Fleet) -> pd.DataFrame:
    """One row per routing decision, in decision order: what the router believed about the
    chosen replica beside the truth (tokens; ``believed`` NaN without a cache view)."""
    import pandas as pd  # (not at import: issue 55 start-up)

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


def load_table(fleet: Fleet) -> pd.DataFrame:
    import pandas as pd  # (not at import: issue 55 start-up)

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
