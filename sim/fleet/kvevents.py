"""The replicas' KV events on their way to the fleet's consumers: the router's exact index
(``beliefs.EventBelief``) and the shared pool (``pooltier.FleetPool``).

Each replica's cache queues the events its appliers cause (``sim.kvcache.events``: blocks
stored on / removed from the GPU, the chain each insert writes, the blocks an operation drops
entirely). The feed turns them on, has each stamped ``(simulated time, serial)`` as it is
emitted, and, before a consumer reads or changes its own state (``deliver``), drains every
replica's queue and hands each event, in the order the replicas emitted them, to every
subscriber with its replica and the time it happened. A consumer therefore applies the same
events in the same order, each at the time it happened (a lagged index ``lag_s`` after that),
as if it had been told at every change, and the engines only append to queues they own.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import simpy

from sim.kvcache.events import KVEvent

# subscriber(replica, time the event happened, event)
Subscriber = Callable[[int, float, KVEvent], None]


class EventSource(Protocol):
    """A replica's cache as the feed sees it (``RadixKVCache``, ``BlockPool``)."""

    def enable_events(self, clock: Callable[[], Any] | None = None) -> None: ...

    def take_events(self) -> list[tuple[Any, KVEvent]]: ...


def _stamp(item: tuple[int, tuple[tuple[float, int], KVEvent]]) -> tuple[float, int]:
    return item[1][0]


class KVEventFeed:
    """The KV events of ``caches`` (replica i: ``caches[i]``) on ``env``'s clock."""

    def __init__(self, env: simpy.Environment, caches: Sequence[EventSource]) -> None:
        self.env = env
        self.caches = list(caches)
        self.serial = 0
        self.subscribers: list[Subscriber] = []
        for cache in self.caches:
            cache.enable_events(self._stamp)

    def _stamp(self) -> tuple[float, int]:
        self.serial += 1
        return (self.env.now, self.serial)

    def subscribe(self, subscriber: Subscriber) -> None:
        """``subscriber`` receives every event delivered from now on."""
        self.subscribers.append(subscriber)

    def deliver(self) -> None:
        """Hand every event emitted since the last call to every subscriber, in emission
        order (replicas merged by their stamps)."""
        batches = []
        for r, cache in enumerate(self.caches):
            events = cache.take_events()
            if events:
                batches.append([(r, e) for e in events])
        if not batches:
            return
        merged = batches[0] if len(batches) == 1 else heapq.merge(*batches, key=_stamp)
        subscribers = self.subscribers
        for r, ((at, _serial), event) in merged:
            for subscriber in subscribers:
                subscriber(r, at, event)
