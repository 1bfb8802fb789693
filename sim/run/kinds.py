"""The three kinds of run: one server, a fleet behind a router, a disaggregated fleet.

Each builds its replicas with ``sim.run.build.build_replicas`` on the run's clock and a front
the replay sends to (the engine itself, a ``sim.fleet.Fleet``, a ``sim.fleet.pd.PDFleet``);
after the replay its ``served`` says what it served, as data: the recorder its summary is
computed from, the requests table, its own summary fields and its tables; one assembly,
``sim.run.summary.summarize``, makes every kind's result from them (a single server adds no
fleet field). ``kind_of`` says which a config runs.
"""

from __future__ import annotations

import numpy as np
import simpy

from costmodel.links import get_link
from policies.pd_rules import make_rule
from sim.config import RunConfig
from sim.context import ContextRun, context_summary, parse_context
from sim.deploy import gpus_per_replica
from sim.fleet.fleet import Fleet, ReplicaSignals
from sim.fleet.metrics import fleet_metrics, merge_recorders, recorder_for
from sim.fleet.pd import PDFleet
from sim.fleet.pd_run import PD_STREAM, pd_summary, pd_table
from sim.fleet.results import (
    ROUTER_STREAM,
    build_pool,
    check_fleet_size,
    ideal_columns,
    load_table,
    pool_columns,
    pool_notes,
    pool_summary,
    pool_table,
    routing_table,
)

from .build import build_replicas


class Server:
    """One engine; the replay sends to it directly."""

    def __init__(self, env: simpy.Environment, cfg: RunConfig, spec, profile, trace,
                 timeline=None) -> None:
        self.env, self.cfg, self.spec, self.profile, self.trace = env, cfg, spec, profile, trace
        self.strategy = parse_context(cfg.context.strategy)
        self.context = (None if self.strategy.is_full
                        else ContextRun(self.strategy, trace, cfg.cache.block_size))
        self.engines, self.policies = build_replicas(env, cfg, spec, profile, trace, [None],
                                                     timeline)
        self.engine = self.engines[0]
        self.front = self.engine

    def close(self) -> None:
        self.engine.close()

    def served(self) -> tuple:
        cfg, server = self.cfg, self.engine
        rec = server.rec
        table = rec.table()
        fields = {}
        patch = cfg.value("vllm_patch")
        if patch != "none":  # only then: unpatched summaries stay as they were
            fields = {"vllm_patch": patch, **server.patch_summary()}
        if self.context is not None:  # only then: results under ``full`` stay as they were
            fields.update(context_summary(self.strategy, table, rec.counters, self.env.now,
                                          server.cache.working_peak_blocks * cfg.cache.block_size,
                                          cfg.cache.block_size))
        return rec, table, fields, {}


class FleetRun:
    """N replicas behind a router, with a shared pool when ``cfg.pool`` (sim/fleet).

    Results: the requests of every replica in one table with a ``replica`` column; the
    summary is computed over all of them with the same code as a single server's (so fleet
    totals are the sums of the replicas'), plus the fleet metrics (``sim.fleet.metrics``)
    and, under ``replica_summaries``, each replica's own summary; ``tables["load"]`` holds
    each replica's waiting and running requests at every routing decision (``kvsim plot``
    draws it), and ``tables["routing"]`` every decision with the router's belief beside the
    truth."""

    context = None

    def __init__(self, env: simpy.Environment, cfg: RunConfig, spec, profile, trace,
                 timeline=None) -> None:
        check_fleet_size(cfg, trace)
        self.env, self.cfg, self.spec, self.profile, self.trace = env, cfg, spec, profile, trace
        self.timeline = timeline
        signals = [ReplicaSignals(i) for i in range(cfg.fleet.replicas)]
        self.engines, self.policies = build_replicas(env, cfg, spec, profile, trace, signals,
                                                     timeline)
        self.sessions = recorder_for(trace)
        router = cfg.make_router()
        self.pool = build_pool(env, cfg, spec, profile, self.engines) if cfg.pool.size else None
        self.front = Fleet(env, self.engines, router, cfg.cache.block_size, self.sessions,
                           np.random.default_rng([cfg.seed, ROUTER_STREAM]), self.pool,
                           signals)

    def close(self) -> None:
        self.front.close()

    def served(self) -> tuple:
        import pandas as pd  # (not at import: issue 55 start-up)

        cfg, fleet, engines, pool = self.cfg, self.front, self.engines, self.pool
        now, trace = self.env.now, self.trace
        tables = []
        for i, e in enumerate(engines):
            t = ideal_columns(e.rec.table(), fleet, cfg.cache.block_size)
            t.insert(0, "replica", np.full(len(t), i, dtype=np.int64))
            tables.append(t)
        served = [t for t in tables if len(t)] or tables[:1]  # idle replicas add no rows
        table = pd.concat(served, ignore_index=True) if len(served) > 1 else served[0]
        table = table.sort_values(["send_s", "request"], kind="stable").reset_index(drop=True)
        merged = merge_recorders(trace, [e.rec for e in engines], self.sessions)
        summary, per_replica = fleet_metrics(fleet, engines, tables, self.sessions, now,
                                             cfg.cache.block_size, table)
        patch = cfg.value("vllm_patch")
        if patch != "none":  # as a single run's summary: the patch and its counters
            summary["vllm_patch"] = patch
            for replica_summary, e in zip(per_replica, engines, strict=True):
                replica_summary.update(e.patch_summary())
        summary["replica_summaries"] = per_replica
        out = {"load": load_table(fleet), "routing": routing_table(fleet)}
        if pool is not None:  # (the summary reads the requests' columns by name)
            table = pool_columns(table, pool, cfg.cache.block_size)
            summary.update(pool_summary(pool, table, now, cfg))
            summary["pool_notes"] = pool_notes(pool, table)
            out["pool"] = pool_table(pool)
            if self.timeline is not None:
                self.timeline.pool_fetches(pool.transfers, pool.transfer_replicas,
                                           cfg.fleet.replicas)
            out["pool_transfers"] = pd.DataFrame(
                np.asarray(pool.transfers, dtype=float).reshape(-1, 3),
                columns=["start_s", "end_s", "bytes"])
        return merged, table, summary, out


class PDRun:
    """A prefill pool behind the router and a decode pool, paired by the PD rule over the
    links (sim/fleet/pd.py, docs/pd.md). Results: ``sim.fleet.pd_run.pd_table`` (one row per
    request) and, after the common fields, ``pd_summary``; ``tables["pd_transfers"]``."""

    context = None

    def __init__(self, env: simpy.Environment, cfg: RunConfig, spec, profile, trace,
                 timeline=None) -> None:
        check_fleet_size(cfg, trace)
        self.env, self.cfg, self.spec, self.profile, self.trace = env, cfg, spec, profile, trace
        self.timeline = timeline  # a track per prefill, then per decode worker, then per link
        # A prefill worker serves prefill-only requests: each asks one token, so the engine's
        # decode reservation is one token (SGLang reserves max_new_tokens of the request).
        pcfg = cfg.with_fields(max_new_tokens=1)
        psignals = [ReplicaSignals(i) for i in range(cfg.pd.prefill_replicas)]
        self.prefill, self.policies = build_replicas(env, pcfg, spec, profile, trace,
                                                     psignals, timeline, 0, "prefill")
        self.decode, _ = build_replicas(env, cfg, spec, profile, trace,
                                        [None] * cfg.pd.decode_replicas, timeline,
                                        cfg.pd.prefill_replicas, "decode")
        self.engines = [*self.prefill, *self.decode]
        self.sessions = recorder_for(trace)
        pfleet = Fleet(env, self.prefill, cfg.make_router(), cfg.cache.block_size,
                       recorder_for(trace), np.random.default_rng([cfg.seed, ROUTER_STREAM]),
                       None, psignals)
        rule = make_rule(cfg.pd.pd_rule, np.random.default_rng([cfg.seed, PD_STREAM]))
        self.front = PDFleet(env, cfg, trace, pfleet, self.decode, rule, get_link(cfg.pd.pd_link),
                             self.sessions, spec.kv_bytes_per_token, spec.layers, profile,
                             gpus_per_replica(cfg, profile))

    def close(self) -> None:
        self.front.close()

    def served(self) -> tuple:
        import pandas as pd  # (not at import: issue 55 start-up)

        cfg, fleet, prefill, decode = self.cfg, self.front, self.prefill, self.decode
        now, trace = self.env.now, self.trace
        table = pd_table(fleet, prefill, decode, trace, cfg.cache.block_size)
        merged = merge_recorders(trace, [e.rec for e in prefill + decode], self.sessions)
        links = sorted(fleet.queues.items(), key=lambda kv: str(kv[0]))
        if self.timeline is not None:
            from sim.timeline import link_name

            for k, (key, q) in enumerate(links):
                self.timeline.link(link_name(key), q.transfers, len(prefill) + len(decode) + k)
        transfers = [(str(key), *t) for key, q in links for t in q.transfers]
        tables = {"pd_transfers": pd.DataFrame(transfers, columns=["link", "start_s", "end_s",
                                                                    "bytes"])}
        return merged, table, pd_summary(fleet, prefill, decode, table, now, cfg), tables


def kind_of(cfg: RunConfig) -> type[Server | FleetRun | PDRun]:
    """The kind of run ``cfg`` describes."""
    if cfg.is_pd:
        return PDRun
    return FleetRun if cfg.is_fleet else Server
