"""What a fleet run adds to a run: the fleet's size check, the router's RNG stream, the
replicas' recorders and what the fleet served (``fleet_served``, for sim/run/summary.py's one
result assembly): its columns (``ideal_columns``), tables (``load_table``, ``routing_table``),
metrics beside each replica's summary (``fleet_metrics``) and the pool's (pooltier.py).

Ideal, two numbers (fractions of the served prompt tokens): ``ideal_hit_rate`` (the run
summary's own field) is the hit of an unlimited cache shared by the fleet, at each request's
admission: the trace's ideal, the same under every router; ``routed_ideal_hit_rate`` is the
hit of each replica's own unlimited cache (what the routing left; a replica counts its
``recomputed_tokens`` against it). ``hit_rate <= routed_ideal_hit_rate <= ideal_hit_rate``.

Reuse, three numbers (fractions of the prompt tokens of the requests served, i.e. not
dropped), measured against the TRUE caches at each routing decision:

    reuse_available  the longest GPU-resident prefix of the prompt on ANY replica
    reuse_captured   the GPU-resident prefix on the replica the router chose
    reuse_delivered  what that replica's engine reused when it admitted the request (its
                     hit_gpu_tokens; later than the decision, so evictions in between and
                     prefixes stored meanwhile count here)

``affinity``: of the requests whose session sent one before (follow-ups), the share routed to
the replica of the session's previous request. Load balance, across replicas (coefficient of
variation = population std / mean; 0 is perfectly even): ``load_cv_busy`` of busy time
(prefill + decode seconds), ``load_cv_queue`` of the mean waiting queue sampled at every
decision, ``load_cv_requests`` of requests served. Router belief on the chosen replica at
decision time (NaN for a router without a cache view): ``belief_error_mean_tokens`` (mean
|believed - true| cached prefix), ``belief_bias_mean_tokens`` (mean believed - true: positive
= over-prediction), ``belief_wrong_share`` (share of decisions where they differ).
``idle_replicas``: replicas the router sent no request to (the fleet is smaller than it looks;
the commands warn).

A replica's summary counts a session's job time (JCT) at the replica that served the
session's first request (its home).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.engines.columns import ColumnTable
from sim.engines.recorder import RecordListener, RunRecorder

from .fleet import Fleet
from .pooltier import FleetPool, pool_served

if TYPE_CHECKING:  # pandas where a table is read as a DataFrame, never by a run (issue 55)
    import pandas as pd

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
                 ) -> tuple[RunRecorder, ColumnTable | pd.DataFrame, dict[str, Any],
                            dict[str, ColumnTable | pd.DataFrame]]:
    """What a fleet run served: the recorder of its summary (the replicas' merged), every
    replica's requests in one table with a ``replica`` column, its summary fields (the fleet
    metrics with each replica's summary, the pool's fields and notes) and tables (``load``:
    each replica's queues at every decision, ``routing``: belief beside truth; the pool's).
    Tables are columns (sim/engines/columns.py), DataFrames where the pool's assembly made them."""
    bs = cfg.cache.block_size
    tables = []
    for i, e in enumerate(engines):
        t = ideal_columns(e.rec.columns(), fleet, bs)
        tables.append(t.with_column("replica", np.full(len(t), i, dtype=np.int64), at=0))
    served = [t for t in tables if len(t)] or tables[:1]  # idle replicas add no rows
    table = ColumnTable.concat(served)
    # sort_values(["send_s", "request"], kind="stable"): a stable lexsort, ties in order
    table = table.rows(np.lexsort((table["request"], table["send_s"])))
    out: dict[str, ColumnTable | pd.DataFrame] = {"load": load_table(fleet),
                                              "routing": routing_table(fleet)}
    merged, summary, per_replica = fleet_metrics(trace, fleet, engines, tables, sessions, now,
                                                 bs, table)
    patch = cfg.value("vllm_patch")
    if patch != "none":  # as a single run's summary: the patch and its counters
        summary["vllm_patch"] = patch
        for replica_summary, e in zip(per_replica, engines, strict=True):
            replica_summary.update(e.patch_summary())
    pooled: dict = {}
    if pool is not None:  # (its columns are the pool's alone: the metrics read none of them)
        frame, pooled, pool_tables = pool_served(pool, table.frame(), now, cfg, timeline)
        out.update(pool_tables)
        return merged, frame, summary | {"replica_summaries": per_replica} | pooled, out
    return merged, table, summary | {"replica_summaries": per_replica}, out


def ideal_columns(table: ColumnTable, fleet: Fleet, bs: int) -> ColumnTable:
    """A replica's requests with the fleet's ideal: ``ideal_hit_tokens`` becomes the prefix an
    unlimited cache shared by the fleet held at the request's admission (the trace's own
    ideal, whatever the router), ``routed_ideal_hit_tokens`` the replica's own unlimited
    cache's (what the routing left it; the engine's ideal, against which it counts
    ``recomputed_tokens``). A dropped request has neither (0)."""
    at = table.names.index("ideal_hit_tokens")
    routed = table["ideal_hit_tokens"]
    ideal = fleet.ideal_blocks
    shared = np.asarray([ideal.get(r, 0) for r in table["request"].tolist()],
                        dtype=np.int64) * bs
    return (table.with_column("ideal_hit_tokens", shared)
            .with_column("routed_ideal_hit_tokens", routed, at=at + 1))


def routing_table(fleet: Fleet) -> ColumnTable:
    """One row per routing decision, in decision order: what the router believed about the
    chosen replica beside the truth (tokens; ``believed`` NaN without a cache view)."""
    d = fleet.decisions
    return ColumnTable({
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


def load_table(fleet: Fleet) -> ColumnTable:
    n = len(fleet.replicas)
    times = np.asarray(fleet.load_time, dtype=float)
    return ColumnTable({
        "time_s": np.tile(times, n),
        "replica": np.repeat(np.arange(n, dtype=np.int64), len(times)),
        "waiting": np.concatenate([np.asarray(w, dtype=np.int64)
                                   for w in fleet.load_waiting]) if n else [],
        "running": np.concatenate([np.asarray(w, dtype=np.int64)
                                   for w in fleet.load_running]) if n else [],
    })


def recorder_for(trace, listener: RecordListener | None = None) -> RunRecorder:
    """A recorder for ``trace``'s sessions (each replica of a run has one:
    sim/run/build.py), telling ``listener`` (when given) what it records."""
    sessions = trace.sessions
    return RunRecorder([s.id for s in sessions], [s.first for s in sessions],
                       [s.parent >= 0 for s in sessions],
                       [s.shared_prefix_blocks for s in sessions], listener)


def merge_recorders(trace, recs: list[RunRecorder], sessions: RunRecorder) -> RunRecorder:
    """One recorder whose counters and histogram are the replicas' sums and whose sessions
    are the fleet's (its ``summary`` then gives the fleet totals)."""
    merged = recorder_for(trace)
    for rec in recs:
        merged.absorb(rec)
    merged.adopt_sessions(sessions)
    return merged


def cv(values) -> float:
    """Coefficient of variation (population std / mean); NaN for an empty or zero mean."""
    a = np.asarray(values, dtype=float)
    if not a.size or not a.mean():
        return math.nan
    return float(a.std() / a.mean())


def _share(num: float, den: float) -> float:
    return float(num / den) if den else math.nan


def routed_ideal_rate(table: ColumnTable) -> float:
    """The replicas' own unlimited caches' hit over the served requests' prompt tokens."""
    ok = ~table["dropped"].astype(bool)
    return _share(float(table["routed_ideal_hit_tokens"][ok].sum()),
                  float(table["prompt_tokens"][ok].sum()))


def fleet_metrics(trace, fleet, engines: list, tables: list[ColumnTable],
                  sessions: RunRecorder, sim_end: float, block_size: int, table: ColumnTable
                  ) -> tuple[RunRecorder, dict[str, Any], list[dict[str, Any]]]:
    """The fleet's recorder (``merge_recorders``), its metrics (module docstring) and each
    replica's summary, from the replicas' requests (``tables``) and all of them (``table``)."""
    routed = [routed_ideal_rate(t) for t in tables]
    fleet_routed = routed_ideal_rate(table)
    merged = merge_recorders(trace, [e.rec for e in engines], sessions)
    d = fleet.decisions
    n = len(engines)
    dec = routing_table(fleet)
    kept = ~table["dropped"].astype(bool)
    served_hits = table["hit_gpu_tokens"][kept]
    ok = dec.rows(np.isin(dec["request"], table["request"][kept]))
    prompt = float(ok["prompt_tokens"].sum())
    believed = dec["believed_tokens"]
    err = believed - dec["true_tokens"].astype(float)
    has_view = fleet.belief is not None and len(dec)
    follow = dec.rows(dec["follow_up"])

    home: dict[int, int] = {}  # session -> replica of its first request
    for s, r in zip(d.session, d.replica, strict=True):
        home.setdefault(s, r)
    per_replica = []
    busy, queue = [], []
    homes: dict[int, list[int]] = {}
    for s, r in home.items():
        homes.setdefault(r, []).append(s)
    idle: tuple | None = None  # (counters, summary) of the first replica that served nothing
    for i, (e, t) in enumerate(zip(engines, tables, strict=True)):
        rec = e.rec
        if not len(t) and idle is not None and rec.counters == idle[0] \
                and np.array_equal(rec.hist, idle[1]):
            s = dict(idle[2])  # an idle replica's summary is every idle replica's
        else:
            mine = homes.get(i, [])
            rec.adopt_sessions(sessions, mine)
            s = rec.summary(sim_end, block_size, t)  # (reads its columns by name)
            s = {k: v for k, v in s.items() if not isinstance(v, dict | list)}
            s["routed_ideal_hit_rate"] = routed[i]
            if not len(t) and not mine and idle is None:
                idle = (dict(rec.counters), rec.hist.copy(), dict(s))
        s["replica"] = i
        per_replica.append(s)
        busy.append(s["prefill_busy_s"] + s["decode_busy_s"])
        w = fleet.load_waiting[i]
        queue.append(float(np.mean(w)) if w else 0.0)
    metrics = {
        "replicas": n,
        "router": fleet.router.label,
        "idle_replicas": sum(1 for k in fleet.inflight.routed if k == 0),
        "reuse_available": _share(ok["best_tokens"].sum(), prompt),
        "reuse_captured": _share(ok["true_tokens"].sum(), prompt),
        "reuse_delivered": _share(served_hits.sum(), prompt),
        "routed_ideal_hit_rate": fleet_routed,
        "affinity": _share(float(follow["same_replica"].sum()), len(follow)),
        "follow_ups": len(follow),
        "load_cv_busy": cv(busy),
        "load_cv_queue": cv(queue),
        "load_cv_requests": cv([s["requests"] for s in per_replica]),
        "belief_error_mean_tokens": float(np.abs(err).mean()) if has_view else math.nan,
        "belief_bias_mean_tokens": float(err.mean()) if has_view else math.nan,
        "belief_wrong_share": float((err != 0).mean()) if has_view else math.nan,
    }
    return merged, metrics, per_replica
