"""The fleet's metrics scraper (sim/fleet/load.py ``Scraper``) takes the samples no event
separates at once; what a router reads at any event must equal what the plain periodic
process (one SimPy timeout per ``scrape_s``, written out below) gives, ties at the same
instant included."""

from __future__ import annotations

import math

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.fleet.load import Scraper, engine_metrics, exact_delay


class Cache:
    capacity_blocks = 100

    def __init__(self) -> None:
        self.free_blocks, self.evictable_blocks = 100, 0


class Engine:
    def __init__(self) -> None:
        self.waiting: list[int] = []
        self.running: list[int] = []
        self.cache = Cache()


class PeriodicScraper(Scraper):
    """The reference: a sample at every grid instant (the scraper's own state and methods,
    one timeout per period)."""

    def _loop(self):
        while not self.stopped:
            self.samples = [engine_metrics(e) for e in self.engines]
            self.at = self.env.now
            yield self.env.timeout(self.period)


def replay(scraper_class, period, actions):
    """Run ``actions`` (delay, engine, kind) as processes next to a scraper; every action
    first reads what the router would see, then changes an engine. Returns the readings."""
    env = simpy.Environment()
    engines = [Engine(), Engine()]
    scraper = scraper_class(env, engines, period)
    scraper.start()
    seen = []

    def actor(delay, e, kind):
        yield env.timeout(delay)
        seen.append((env.now, scraper.at, list(scraper.samples)))
        eng = engines[e]
        if kind == 0:
            eng.waiting.append(1)
        elif kind == 1 and eng.waiting:
            eng.running.append(eng.waiting.pop())
        elif kind == 2 and eng.running:
            eng.running.pop()
        else:
            eng.cache.free_blocks -= 1
            eng.cache.evictable_blocks += 1

    procs = [env.process(actor(d, e, k)) for d, e, k in actions]
    env.run(until=simpy.AllOf(env, procs) if procs else 1.0)
    scraper.stop()
    return seen


# delays on and off the grid: multiples of the period (ties with a sample) and others
delays = st.one_of(st.integers(0, 400).map(lambda k: k * 0.05),
                   st.floats(0, 20, allow_nan=False), st.sampled_from([0.0, 0.05, 0.1]))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([0.05, 0.1, 0.3, 1.0]),
       st.lists(st.tuples(delays, st.integers(0, 1), st.integers(0, 3)), max_size=30))
def test_lazy_samples_equal_the_periodic_process(period, actions):
    assert replay(Scraper, period, actions) == replay(PeriodicScraper, period, actions)


@settings(max_examples=500, deadline=None)
@given(st.floats(0, 1e7, allow_nan=False), st.floats(0, 1e7, allow_nan=False))
def test_exact_delay_lands_on_the_time_or_says_it_cannot(now, later):
    at = max(now, later)
    d = exact_delay(now, at)
    if d is None:  # then no delay near it lands there
        x = at - now
        for _ in range(8):
            x = math.nextafter(x, -math.inf)
        for _ in range(16):
            assert now + x != at
            x = math.nextafter(x, math.inf)
    else:
        assert now + d == at
    assert exact_delay(at, at + 0.05) is not None and exact_delay(now, now) == 0.0


def test_a_time_one_timeout_cannot_reach():
    # the sums on either side of the delay round to even neighbours of ``at``
    assert exact_delay(1.7003886190941557, 1048578.5479098617) is None


def test_a_long_idle_stretch_is_one_event():
    env = simpy.Environment()
    scraper = Scraper(env, [Engine()], 0.05)
    scraper.start()
    env.run(until=0.001)
    t = 0.0
    while t + 0.05 < 3600.0:
        t += 0.05

    def late():
        yield env.timeout(3600.0 - env.now)
        return scraper.at

    got = env.run(until=env.process(late()))
    assert got == t and math.isclose(got, 3600.0 - 0.05, rel_tol=1e-9)
