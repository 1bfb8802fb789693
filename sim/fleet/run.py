"""``run_fleet``: one run of N replicas behind a router (``sim.runner.run`` calls it when
``RunConfig.is_fleet``). A pure function of (trace, config, seed), like a single run.

Results: the requests of every replica in one table with a ``replica`` column; the summary
is computed over all of them with the same code as a single server's (so fleet totals are the
sums of the replicas'), plus the fleet metrics (``sim.fleet.metrics``) and, under
``replica_summaries``, each replica's own summary; ``tables["load"]`` holds each replica's
waiting and running requests at every routing decision (``kvsim plot`` draws it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import simpy

from sim.replay import Replay
from sim.runner import RunResult, bind_policy, build_engine, recorder_for, run_fields

from .fleet import Fleet
from .metrics import fleet_metrics, merge_recorders
from .replica import ObservedBlockPool, ObservedRadixKVCache, ObservedRecorder

# The router's RNG stream: seeded by the run's seed, apart from every policy's.
ROUTER_STREAM = 0x524F55544552  # "ROUTER"


def run_fleet(cfg, trace, spec, profile) -> RunResult:
    env = simpy.Environment()
    engines, policies = [], []
    for _ in range(cfg.replicas):
        policy = cfg.make_policy()
        bind_policy(env, cfg, spec, profile, policy)
        rec = recorder_for(trace, ObservedRecorder)
        engines.append(build_engine(env, cfg, spec, profile, policy, rec, trace,
                                    cache_cls=ObservedRadixKVCache,
                                    pool_cls=ObservedBlockPool))
        policies.append(policy)
    sessions = recorder_for(trace)
    router = cfg.make_router()
    fleet = Fleet(env, engines, router, cfg.block_size, sessions,
                  np.random.default_rng([cfg.seed, ROUTER_STREAM]))
    gaps = trace.gaps(cfg.gaps)
    replay = Replay(env, trace, fleet, gaps, trace.start_offsets(cfg.gaps), cfg.sessions,
                    cfg.time_scale)
    driver = env.process(replay.closed_loop() if cfg.replay == "closed" else replay.open_loop())
    env.run(until=driver)
    if cfg.replay == "open":  # the last replies may still be in flight
        while fleet.busy():
            env.step()
    fleet.close()

    tables = []
    for i, e in enumerate(engines):
        t = e.rec.table()
        t.insert(0, "replica", np.full(len(t), i, dtype=np.int64))
        tables.append(t)
    table = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
    table = table.sort_values(["send_s", "request"], kind="stable").reset_index(drop=True)
    merged = merge_recorders(trace, [e.rec for e in engines], sessions)
    summary = merged.summary(env.now, cfg.block_size, table)
    summary.update(run_fields(cfg, policies[0], profile, spec, trace, table))
    metrics, per_replica = fleet_metrics(fleet, engines, tables, sessions, env.now,
                                         cfg.block_size, table)
    summary.update(metrics)
    summary["replica_summaries"] = per_replica
    load = _load_table(fleet)
    return RunResult(cfg, table, summary, {"load": load})


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
