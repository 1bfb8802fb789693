"""The three kinds of run: one server, a fleet behind a router, a disaggregated fleet.

Each builds its replicas with ``sim.run.build.build_replicas`` on the run's clock and a front
the replay sends to (the engine itself, a ``sim.fleet.Fleet``, a ``sim.fleet.pd.PDFleet``);
its ``serve`` replays the trace to the last reply (``replay``), closes, and says what it
served, as data (``sim.run.summary.Served``): the recorder its summary is computed from, the
requests table, its own summary fields (the replay's last) and tables, whether its front drew
from the decision seed; one assembly, ``sim.run.summary.summarize``, makes every kind's result
from them (a single server adds no fleet field). ``kind_of`` says which a config runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from costmodel.links import get_link
from policies.pd_rules import make_rule
from sim.config import RunConfig
from sim.context import ContextRun, context_summary, parse_context
from sim.deploy import gpus_per_replica
from sim.engines.recorder import RunRecorder
from sim.fleet.fleet import Fleet, ReplicaSignals
from sim.fleet.pd import PDFleet
from sim.fleet.pd_run import PD_STREAM, pd_summary, pd_table
from sim.fleet.pooltier import build_pool
from sim.fleet.results import (
    ROUTER_STREAM,
    check_fleet_size,
    fleet_served,
    recorder_for,
    router_drew,
)
from sim.replay import Replay

from .build import build_replicas
from .summary import Served


def replay(env: simpy.Environment, cfg: RunConfig, trace, front, context=None,
           on_reply: Callable[[], None] | None = None) -> dict[str, Any]:
    """Send ``trace`` to ``front`` as ``cfg.replay`` says and run the clock until the last
    reply (both loops end with it). ``context``: a ``sim.context.ContextRun`` (None under
    ``full``); ``on_reply``: called once per trace request answered (an observer only).
    Returns the replay's own summary fields (what a concurrency cap held back)."""
    t = cfg.traffic
    driver = Replay(env, trace, front, trace.gaps(t.gaps), trace.start_offsets(t.gaps),
                    t.sessions, t.time_scale, context, on_reply=on_reply,
                    max_concurrency=t.max_concurrency)
    env.run(until=env.process(driver.closed_loop() if t.replay == "closed"
                              else driver.open_loop()))
    return driver.throttle_fields()


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

    def serve(self, on_reply: Callable[[], None] | None = None) -> Served:
        cfg, server = self.cfg, self.engine
        replayed = replay(self.env, cfg, self.trace, server, self.context, on_reply)
        server.close()
        rec = server.rec
        table = rec.columns()
        fields = {}
        patch = cfg.value("vllm_patch")
        if patch != "none":  # only then: unpatched summaries stay as they were
            fields = {"vllm_patch": patch, **server.patch_summary()}
        if self.context is not None:  # only then: results under ``full`` stay as they were
            fields.update(context_summary(self.strategy, table.frame(), rec.counters,
                                          self.env.now,
                                          server.cache.working_peak_blocks * cfg.cache.block_size,
                                          cfg.cache.block_size))
        return Served(rec, table, fields | replayed, {}, False)  # one server: no router


class FleetRun:
    """N replicas behind a router, with a shared pool when ``cfg.pool`` (sim/fleet). What it
    served: ``sim.fleet.results.fleet_served`` (the summary is a single server's over every
    replica's requests, so fleet totals are the replicas' sums, plus the fleet's fields)."""

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

    def serve(self, on_reply: Callable[[], None] | None = None) -> Served:
        replayed = replay(self.env, self.cfg, self.trace, self.front, None, on_reply)
        self.front.close()
        drew = router_drew(self.front.router, self.cfg.seed)
        rec, table, fields, tables = fleet_served(self.front, self.engines, self.sessions,
                                                  self.pool, self.env.now, self.cfg,
                                                  self.timeline)
        return Served(rec, table, fields | replayed, tables, drew)


class PDRun:
    """A prefill pool behind the router and a decode pool, paired by the PD rule over the
    links (sim/fleet/pd.py, docs/pd.md). Results: ``sim.fleet.pd_run.pd_table`` (one row per
    request) and, after the common fields, ``pd_summary``; ``tables["pd_transfers"]``."""

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
                             self.sessions, spec, profile, gpus_per_replica(cfg, profile))

    def serve(self, on_reply: Callable[[], None] | None = None) -> Served:
        import pandas as pd  # (not at import: issue 55 start-up)

        cfg, fleet, prefill, decode = self.cfg, self.front, self.prefill, self.decode
        replayed = replay(self.env, cfg, self.trace, fleet, None, on_reply)
        fleet.close()
        table = pd_table(fleet, prefill, decode, self.trace, cfg.cache.block_size)
        fields = pd_summary(fleet, prefill, decode, table, self.env.now, cfg) | replayed
        links = sorted(fleet.queues.items(), key=lambda kv: str(kv[0]))
        if self.timeline is not None:
            from sim.timeline import link_name

            for k, (key, q) in enumerate(links):
                self.timeline.link(link_name(key), q.transfers, len(prefill) + len(decode) + k)
        transfers = [(str(key), *t) for key, q in links for t in q.transfers]
        tables = {"pd_transfers": pd.DataFrame(transfers, columns=["link", "start_s", "end_s",
                                                                    "bytes"])}
        merged = RunRecorder.merged([e.rec for e in prefill + decode], self.sessions)
        return Served(merged, table, fields, tables, True)  # its router and rule draw


def kind_of(cfg: RunConfig) -> type[Server | FleetRun | PDRun]:
    """The kind of run ``cfg`` describes."""
    if cfg.is_pd:
        return PDRun
    return FleetRun if cfg.is_fleet else Server
