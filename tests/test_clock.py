"""The clock's shortcut (sim/engines/clock.py ``Clock.advance``): a server pass that ends before
anything else is due takes no event, and nothing else changes. Checked against SimPy itself:
the same processes on a plain ``simpy.Environment`` give the same log, and the standard runs
(both engines, tiers, fleets with KV-event lag, a shared pool, disaggregation) give the same
summary and per-request frame on a plain environment, where every pass is a timeout.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.run.driver as driver
from sim.config import RunConfig
from sim.engines.clock import Clock
from sim.run import run
from tests.native_probe import RUNS, TRACE


def test_advance_moves_the_clock_only_past_nothing_due() -> None:
    clock = Clock(initial_time=1.0)
    assert clock.advance(2.0) and clock.now == 3.0  # nothing scheduled at all
    clock.timeout(5.0)  # due at 8.0
    assert clock.advance(4.5) and clock.now == 7.5
    assert not clock.advance(0.5) and clock.now == 7.5  # due at the same instant: the event
    assert not clock.advance(1.0) and clock.now == 7.5  # due before
    assert clock.advance(0.25) and clock.now == 7.75
    assert not clock.advance(-1.0) and not clock.advance(math.nan) and clock.now == 7.75
    clock.event().succeed()  # triggered now: due at once, so even a zero wait takes it
    assert not clock.advance(0.0)


def test_advance_reads_the_queue_as_peek_does(monkeypatch) -> None:
    """``advance`` reads SimPy's queue in place (no ``peek`` call per server pass) and
    answers as ``peek`` would: infinity when nothing is scheduled."""
    def never(_self):
        raise AssertionError("advance reads the queue without calling peek")

    monkeypatch.setattr(simpy.Environment, "peek", never)
    clock = Clock()
    assert not clock.advance(math.inf) and clock.now == 0  # inf <= inf: the wait is a timeout
    assert clock.advance(1.0) and clock.now == 1.0
    clock.timeout(2.0)
    assert not clock.advance(2.0) and clock.advance(1.5) and clock.now == 2.5


def _log(env: simpy.Environment, plan: list[list[float]], server: list[float]) -> list:
    """Processes waiting out ``plan``'s delays and a server that lets ``server``'s delays
    pass through ``advance`` where it can (on a ``Clock``); each logs its wake-ups. One
    process triggers an event the server then waits on, as an arrival rings a doorbell."""
    log: list = []
    bell: list[simpy.Event] = [env.event()]

    def proc(k: int, delays: list[float]):
        for d in delays:
            yield env.timeout(d)
            log.append((env.now, f"p{k}"))
            if k == 0 and not bell[0].triggered:
                bell[0].succeed()

    def serve():
        for i, d in enumerate(server):
            if not (isinstance(env, Clock) and env.advance(d)):
                yield env.timeout(d)
            log.append((env.now, "server"))
            if i % 4 == 3:
                bell[0] = env.event()
                yield bell[0]
                log.append((env.now, "rung"))

    for k, delays in enumerate(plan):
        env.process(proc(k, delays))
    env.process(serve())
    env.run()
    return log


# Delays on a coarse grid so that ties (an event due when a pass ends) are frequent.
DELAYS = st.lists(st.integers(0, 6).map(lambda n: n * 0.25), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.lists(DELAYS, min_size=1, max_size=4), DELAYS)
def test_advance_orders_every_wakeup_as_simpy_does(plan: list[list[float]],
                                                   server: list[float]) -> None:
    assert _log(Clock(), plan, server) == _log(simpy.Environment(), plan, server)


class CountingClock(Clock):
    """A clock that counts the passes its shortcut took (so the comparison below is known
    to exercise it)."""
    taken = 0

    def advance(self, delay: float) -> bool:
        moved = super().advance(delay)
        CountingClock.taken += moved
        return moved


# The native core's standard runs plus vLLM's synchronous loop, a mid-run KV-event lag, a
# shared pool and a disaggregated fleet.
EXTRA = {
    "vllm-sync": ({"gpu_cache": 98304, "engine": "vllm", "vllm_async": False}, "vllm"),
    "fleet-lag": ({"gpu_cache": 98304, "replicas": 3, "sessions": 8,
                   "router": "mooncake?event_lag_s=0.25"}, "penelope"),
    "pool": ({"gpu_cache": 65536, "replicas": 2, "router": "dynamo-kv", "sessions": 8,
              "pool": 262144}, "sglang"),
    "pd": ({"gpu_cache": 98304, "prefill_replicas": 2, "decode_replicas": 1, "sessions": 6},
           "sglang"),
}


def _result(fields: dict, preset: str) -> dict:
    cfg = RunConfig.from_flat(**{"trace": TRACE, "max_context": 131072, "sessions": 4,
                                 "gaps": "cap:10", **fields}).with_preset(preset)
    res = run(cfg)
    frame = res.requests.to_csv(index=False, float_format=repr).encode()
    return {"summary": json.dumps(res.summary, sort_keys=True, default=repr),
            "requests": hashlib.sha256(frame).hexdigest(), "rows": len(res.requests)}


@pytest.mark.parametrize("name", [*RUNS, *EXTRA])
@pytest.mark.pure_path("swaps the run's clock class; compiled engines take the compiled Clock only")
def test_a_run_is_the_same_with_and_without_the_shortcut(name: str, monkeypatch) -> None:
    fields, preset = {**RUNS, **EXTRA}[name]
    monkeypatch.setattr(driver, "Clock", CountingClock)
    CountingClock.taken = 0
    fast = _result(fields, preset)
    taken = CountingClock.taken
    monkeypatch.setattr(driver, "Clock", simpy.Environment)
    slow = _result(fields, preset)
    assert fast["rows"] > 0
    assert taken > fast["rows"] // 2  # the shortcut is taken (most passes take it)
    assert fast == slow
