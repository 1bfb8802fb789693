"""A router's load beliefs (``policies.routing``: in-flight always, ``ScrapedMetrics``,
``PredictedLoad``).

- ``InFlight``: what the router dispatched and has not seen finish, per replica (SGLang's
  ``Worker::load()``, Vidur's outstanding requests): requests and prompt tokens.
- ``Scraper``: the engines' own metrics (waiting queue, running requests, KV usage) read every
  ``scrape_s`` simulated seconds by a SimPy process, as a Prometheus scrape would; the router
  sees the last sample. It only reads the engines (``engine_metrics``).
- ``Predicted``: Dynamo's router-side prediction: per worker, the unique blocks of its active
  requests and the prefill tokens (prompt minus believed overlap) of those whose first token
  has not come back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy
from mypy_extensions import mypyc_attr

from .active import ActivePrompts


class InFlight:
    def __init__(self, n: int) -> None:
        self.requests = [0] * n
        self.tokens = [0] * n
        self.routed = [0] * n

    def dispatched(self, replica: int, tokens: int) -> None:
        self.requests[replica] += 1
        self.tokens[replica] += tokens
        self.routed[replica] += 1

    def finished(self, replica: int, tokens: int) -> None:
        self.requests[replica] -= 1
        self.tokens[replica] -= tokens


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """What an engine's metrics endpoint reports: waiting and running requests, and KV usage
    (KV held by running requests and unevictable cache, over capacity: the free and the
    evictable cached blocks both count as available, as SGLang's token_usage and vLLM's
    kv_cache_usage do)."""

    queue: int
    running: int
    kv_usage: float


def engine_metrics(engine) -> EngineMetrics:
    """Read one engine's public counters (never changes it)."""
    cache = engine.cache
    cap = cache.capacity_blocks
    available = cache.free_blocks + getattr(cache, "evictable_blocks", 0)
    return EngineMetrics(len(engine.waiting), len(engine.running),
                         (cap - available) / cap if cap else 0.0)


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (sim/native.py); subclassable
class Scraper:
    """Samples every engine every ``scrape_s`` seconds (the first sample at t = 0).

    The samples are a function of the engines' state, which changes only inside SimPy
    events. So at each sample the scraper looks at the time of the next event anyone has
    scheduled (``env.peek()``) and takes the samples before it at once: they equal this one,
    and no one can read them before that event. Only ``at`` moves, over the same grid the
    periodic process would walk (``t + scrape_s`` added one period at a time), and the next
    real sample is scheduled at that grid time exactly (``exact_delay``; where no single
    timeout lands on it, at an earlier grid time that one does). That event is scheduled
    after the one ``peek`` saw, as the periodic process's would have been, so ties at the
    same instant resolve as before (tests/test_scraper.py)."""

    def __init__(self, env: simpy.Environment, engines: list, scrape_s: float) -> None:
        self.env, self.engines, self.period = env, engines, float(scrape_s)
        self.samples: list[EngineMetrics | None] = [None] * len(engines)
        self.at: float | None = None
        self.stopped = False

    def start(self) -> None:
        self.env.process(self._loop())

    def stop(self) -> None:
        self.stopped = True

    def _loop(self):
        env, period = self.env, self.period
        while not self.stopped:
            self.samples = [engine_metrics(e) for e in self.engines]
            t = self.at = env.now
            upcoming = env.peek()  # the next event of anyone else (ours is not scheduled)
            grid = [t]  # the last few grid times up to the last sample before ``upcoming``
            if upcoming != math.inf:
                while t + period < upcoming:  # samples no event separates from this one
                    t += period
                    grid.append(t)
                    if len(grid) > 16:
                        del grid[:8]
            # The next sample at the grid time after ``grid[k]``, for the latest k whose time
            # one timeout from now lands on exactly; k = 0 is the periodic process's own.
            k, delay = 0, period
            for i in range(len(grid) - 1, 0, -1):
                d = exact_delay(env.now, grid[i] + period)
                if d is not None:
                    k, delay = i, d
                    break
            self.at = grid[k]
            yield env.timeout(delay)


def exact_delay(now: float, at: float) -> float | None:
    """The delay ``d`` for which ``now + d`` is exactly ``at`` in floating point (SimPy
    schedules a timeout at ``now + delay``), for ``at >= now``; None when no ``d`` near
    ``at - now`` lands on it (the sums on either side round to even neighbours)."""
    d = at - now
    for step in (0, 1, -1, 2, -2):
        x = d
        for _ in range(abs(step)):
            x = math.nextafter(x, math.inf if step > 0 else -math.inf)
        if now + x == at:
            return x
    return None


class Predicted:
    def __init__(self, n: int) -> None:
        self.active = [ActivePrompts() for _ in range(n)]  # per replica (sim/fleet/active.py)
        self.prefill: list[dict[int, int]] = [{} for _ in range(n)]  # rid -> prefill tokens
        self.prefill_total = [0] * n

    def active_blocks(self, replica: int) -> int:
        return self.active[replica].unique

    def active_prefixes(self, ids: np.ndarray) -> list[int]:
        """Per replica, the leading blocks of ``ids`` its active requests hold."""
        ids = np.asarray(ids, dtype=np.int64)
        buf = ids.tobytes()
        return [a.prefix(ids, buf) for a in self.active]

    def added(self, replica: int, rid: int, ids: np.ndarray, prefill_tokens: int) -> None:
        self.active[replica].add(ids)
        self.prefill[replica][rid] = prefill_tokens
        self.prefill_total[replica] += prefill_tokens

    def prefill_done(self, replica: int, rid: int) -> None:
        t = self.prefill[replica].pop(rid, None)
        if t is not None:
            self.prefill_total[replica] -= t

    def freed(self, replica: int, rid: int, ids: np.ndarray) -> None:
        self.prefill_done(replica, rid)
        self.active[replica].remove(ids)
