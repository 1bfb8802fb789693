"""The replicas of a run, the same code for every kind of run: one server, a fleet, the two
pools of a disaggregated fleet. ``build_replicas`` makes each replica (a fresh policy bound to
the run, a recorder of the trace's sessions, the engine ``sim.engines.engine_class`` builds, a
timeline track)."""

from __future__ import annotations

from collections.abc import Sequence

import simpy

from costmodel.units import range_units
from policies import EvictionPolicy, PolicyContext, SessionInfo
from sim.config import RunConfig
from sim.engines import EngineBase, engine_class
from sim.engines.recorder import RecordListener
from sim.fleet.results import recorder_for


def bind_policy(env: simpy.Environment, cfg: RunConfig, spec, profile, policy: EvictionPolicy,
                sessions: tuple[SessionInfo, ...]) -> None:
    """Give a policy its run context: the simulated clock, the recompute price of a token
    range at its positions, and the trace's sessions (read only)."""
    def recompute_seconds(a: int, b: int) -> float:
        """Marginal prefill seconds of tokens [a, b) at their positions."""
        return profile.recompute_seconds(range_units(spec, a, b))

    policy.bind(PolicyContext(now=lambda: env.now, block_size=cfg.cache.block_size, seed=cfg.seed,
                              recompute_seconds=recompute_seconds, sessions=sessions))


def build_replicas(env: simpy.Environment, cfg: RunConfig, spec, profile, trace,
                   listeners: Sequence[RecordListener | None], timeline=None,
                   first_track: int = 0, pool: str | None = None
                   ) -> tuple[list[EngineBase], list[EvictionPolicy]]:
    """One engine per entry of ``listeners`` (what its recorder tells, or None), each with
    its own policy, recorder and, with a ``timeline`` (sim/timeline.py), track
    ``first_track + i`` (named ``POOL i`` when ``pool`` is given: a disaggregated fleet's
    prefill and decode workers)."""
    engines, policies = [], []
    # what a policy may know of the trace's sessions (one tuple serves every replica)
    infos = tuple(SessionInfo(s.id, s.parent, s.agent_type) for s in trace.sessions)
    for i, listener in enumerate(listeners):
        policy = cfg.make_policy()
        bind_policy(env, cfg, spec, profile, policy, infos)
        rec = recorder_for(trace, listener)
        engine = engine_class(cfg).build(env, cfg, spec, profile, policy, rec)
        if timeline is not None:
            timeline.use_clock(lambda: env.now)
            rec.observe(timeline.track(first_track + i,
                                       lambda e=engine: (len(e.waiting), len(e.running)),
                                       f"{pool} {i}" if pool else None))
        engines.append(engine)
        policies.append(policy)
    return engines, policies

