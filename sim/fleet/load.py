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

from dataclasses import dataclass

import numpy as np
import simpy

from policies.active import ActivePrompts


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


class Scraper:
    """Samples every engine every ``scrape_s`` seconds (the first sample at t = 0)."""

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
        while not self.stopped:
            self.samples = [engine_metrics(e) for e in self.engines]
            self.at = self.env.now
            yield self.env.timeout(self.period)


class Predicted:
    def __init__(self, n: int) -> None:
        self.active = [ActivePrompts() for _ in range(n)]  # per replica (policies/active.py)
        self.prefill: list[dict[int, int]] = [{} for _ in range(n)]  # rid -> prefill tokens
        self.prefill_total = [0] * n

    def active_blocks(self, replica: int) -> int:
        return self.active[replica].unique

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
