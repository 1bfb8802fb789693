"""What a fleet run adds to a run: the fleet's size check, the router's RNG stream, the
replicas' recorders and what the fleet served (``fleet_served``, for sim/run/summary.py's one
result assembly): the replicas' requests as one table from their merged recorder, with the
fleet's columns (``fleet_columns``), its tables (``load_columns``, ``routing_columns``), its
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


def fleet_served(fleet: Fleet, engines: list, sessions: RunRecorder,
                 pool: FleetPool | None, now: float, cfg, timeline=None
                 ) -> tuple[RunRecorder, ColumnTable | pd.DataFrame, dict[str, Any],
                            dict[str, ColumnTable | pd.DataFrame]]:
    """What a fleet run served: the recorder of its summary (the replicas' merged: its
    columns are every replica's requests), those requests with the fleet's columns
    (``fleet_columns``), its summary fields (``fleet_metrics``, each replica's summary, the
    pool's fields and notes) and tables (``load``: each replica's queues at every decision,
    ``routing``: belief beside truth; the pool's). The fleet's own records are read first,
    then the recorders once; tables are columns (sim/engines/columns.py), DataFrames where
    the pool's assembly made them."""
    bs = cfg.cache.block_size
    routing, load = routing_columns(fleet), load_columns(fleet)
    homes = session_homes(fleet, len(engines))
    recs = [e.rec for e in engines]
    per_replica = RunRecorder.summaries(recs, sessions, homes, now, bs)
    merged = RunRecorder.merged(recs, sessions)
    requests = merged.columns()
    own = fleet_columns(requests, fleet, bs)
    summary = fleet_metrics(fleet, routing, requests, own, per_replica)
    patch = cfg.value("vllm_patch")
    if patch != "none":  # as a single run's summary: the patch and its counters
        summary["vllm_patch"] = patch
        for replica_summary, e in zip(per_replica, engines, strict=True):
            replica_summary.update(e.patch_summary())
    summary["replica_summaries"] = per_replica
    at = requests.names.index("ideal_hit_tokens")
    table = (requests.with_column("ideal_hit_tokens", own["ideal_hit_tokens"])
             .with_column("routed_ideal_hit_tokens", own["routed_ideal_hit_tokens"], at=at + 1)
             .with_column("replica", own["replica"], at=0))
    tables: dict[str, ColumnTable | pd.DataFrame] = {"load": ColumnTable(load),
                                                     "routing": ColumnTable(routing)}
    if pool is None:
        return merged, table, summary, tables
    # the pool's assembly reads a DataFrame; its columns are the pool's alone (the metrics
    # read none of them)
    frame = table.frame()
    frame, pooled, pool_tables = pool_served(pool, frame, now, cfg, timeline)
    return merged, frame, summary | pooled, tables | pool_tables


def fleet_columns(requests: ColumnTable, fleet: Fleet, bs: int) -> dict[str, np.ndarray]:
    """What the fleet adds to its ``requests``: the ``replica`` each was routed to and the
    fleet's ideal: ``ideal_hit_tokens`` becomes the prefix an unlimited cache shared by the
    fleet held at the request's admission (the trace's own ideal, whatever the router),
    ``routed_ideal_hit_tokens`` is the replica's own unlimited cache's (what the routing left
    it; the engine's ideal, against which it counts ``recomputed_tokens``). A dropped request
    has neither (0)."""
    d = fleet.decisions  # every request was routed once
    routed_to = np.zeros(max(d.rid, default=-1) + 1, dtype=np.int64)
    routed_to[d.rid] = d.replica
    rid = requests["request"]
    ideal = fleet.ideal_blocks
    shared = np.asarray([ideal.get(r, 0) for r in rid.tolist()], dtype=np.int64) * bs
    return {"replica": routed_to[rid], "ideal_hit_tokens": shared,
            "routed_ideal_hit_tokens": requests["ideal_hit_tokens"]}


def routing_columns(fleet: Fleet) -> dict[str, np.ndarray]:
    """One row per routing decision, in decision order: what the router believed about the
    chosen replica beside the truth (tokens; ``believed`` NaN without a cache view)."""
    d = fleet.decisions
    return {
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
    }


def session_homes(fleet: Fleet, n: int) -> list[list[int]]:
    """Per replica, the sessions whose first request it served (their job time counts
    there), in the order they began."""
    home: dict[int, int] = {}  # session -> replica of its first request
    d = fleet.decisions
    for s, r in zip(d.session, d.replica, strict=True):
        home.setdefault(s, r)
    homes: list[list[int]] = [[] for _ in range(n)]
    for s, r in home.items():
        homes[r].append(s)
    return homes


def load_columns(fleet: Fleet) -> dict[str, np.ndarray]:
    """Each replica's waiting and running requests at every routing decision."""
    n = len(fleet.replicas)
    times = np.asarray(fleet.load_time, dtype=float)
    return {
        "time_s": np.tile(times, n),
        "replica": np.repeat(np.arange(n, dtype=np.int64), len(times)),
        "waiting": np.concatenate([np.asarray(w, dtype=np.int64) for w in fleet.load_waiting])
        if n else np.zeros(0, dtype=np.int64),
        "running": np.concatenate([np.asarray(w, dtype=np.int64) for w in fleet.load_running])
        if n else np.zeros(0, dtype=np.int64),
    }


def recorder_for(trace, listener: RecordListener | None = None) -> RunRecorder:
    """A recorder for ``trace``'s sessions (each replica of a run has one:
    sim/run/build.py), telling ``listener`` (when given) what it records."""
    sessions = trace.sessions
    return RunRecorder([s.id for s in sessions], [s.first for s in sessions],
                       [s.parent >= 0 for s in sessions],
                       [s.shared_prefix_blocks for s in sessions], listener)


def cv(values) -> float:
    """Coefficient of variation (population std / mean); NaN for an empty or zero mean."""
    a = np.asarray(values, dtype=float)
    if not a.size or not a.mean():
        return math.nan
    return float(a.std() / a.mean())


def _share(num: float, den: float) -> float:
    return float(num / den) if den else math.nan


def fleet_metrics(fleet: Fleet, routing: dict[str, np.ndarray], requests: ColumnTable,
                  own: dict[str, np.ndarray], per_replica: list[dict[str, Any]]
                  ) -> dict[str, Any]:
    """The fleet's metrics (module docstring) from its decisions (``routing``), every
    replica's ``requests`` and the fleet's columns of them (``own``); each replica's summary
    (``per_replica``, over its own requests) gets the fleet's ideal as its
    ``ideal_hit_rate``, its own as ``routed_ideal_hit_rate``, and its number."""
    kept = ~requests["dropped"].astype(bool)
    prompts = requests["prompt_tokens"][kept]
    where = own["replica"][kept]
    # per replica, as a summary sums its admitted requests (integers: the float sums exact)
    shared = np.bincount(where, own["ideal_hit_tokens"][kept], minlength=len(per_replica))
    replica_prompts = np.bincount(where, prompts, minlength=len(per_replica))
    for i, s in enumerate(per_replica):
        s["routed_ideal_hit_rate"] = s["ideal_hit_rate"]
        s["ideal_hit_rate"] = _share(shared[i], replica_prompts[i])
        s["replica"] = i
    ok = np.isin(routing["request"], requests["request"][kept])
    prompt = float(routing["prompt_tokens"][ok].sum())
    err = routing["believed_tokens"] - routing["true_tokens"].astype(float)
    has_view = fleet.belief is not None and len(err)
    follow = routing["follow_up"]
    busy = [s["prefill_busy_s"] + s["decode_busy_s"] for s in per_replica]
    queue = [float(np.mean(w)) if w else 0.0 for w in fleet.load_waiting]
    return {
        "replicas": len(per_replica),
        "router": fleet.router.label,
        "idle_replicas": sum(1 for k in fleet.inflight.routed if k == 0),
        "reuse_available": _share(routing["best_tokens"][ok].sum(), prompt),
        "reuse_captured": _share(routing["true_tokens"][ok].sum(), prompt),
        "reuse_delivered": _share(requests["hit_gpu_tokens"][kept].sum(), prompt),
        "routed_ideal_hit_rate": _share(float(own["routed_ideal_hit_tokens"][kept].sum()),
                                        float(prompts.sum())),
        "affinity": _share(float(routing["same_replica"][follow].sum()), int(follow.sum())),
        "follow_ups": int(follow.sum()),
        "load_cv_busy": cv(busy),
        "load_cv_queue": cv(queue),
        "load_cv_requests": cv([s["requests"] for s in per_replica]),
        "belief_error_mean_tokens": float(np.abs(err).mean()) if has_view else math.nan,
        "belief_bias_mean_tokens": float(err.mean()) if has_view else math.nan,
        "belief_wrong_share": float((err != 0).mean()) if has_view else math.nan,
    }
