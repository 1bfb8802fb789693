"""The replicas' KV events on their way to the fleet's consumers: the router's exact index
(``beliefs.EventBelief``) and the shared pool (``pooltier.FleetPool``).

Each replica's cache queues the events its appliers cause (``sim.kvcache.events``: blocks
stored on / removed from the GPU, the chain each insert writes, the blocks an operation drops
entirely). The feed turns them on, has each stamped ``(simulated time, serial)`` as it is
emitted, and, before a consumer reads or changes its own state (``deliver``), drains every
replica's queue and hands each event, in the order the replicas emitted them, to every
subscriber with its replica and the time it happened (or, to a consumer whose state is per
replica such as the router's index, each replica's events as one list). A consumer therefore
applies the same events in the same order, each at the time it happened (a lagged index
``lag_s`` after that), as if it had been told at every change, and the engines only append to
queues they own.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import simpy

from sim.kvcache.events import KVEvent

# subscriber(replica, time the event happened, event)
Subscriber = Callable[[int, float, KVEvent], None]
# replica subscriber(replica, [((time, serial), event), ...] of that replica, oldest first)
ReplicaSubscriber = Callable[[int, list[tuple[tuple[float, int], KVEvent]]], None]


class EventSource(Protocol):
    """A replica's cache as the feed sees it (``RadixKVCache``, ``BlockPool``)."""

    def enable_events(self, clock: Callable[[], Any] | None = None,
                      kinds: Iterable[type] | None = None) -> None: ...

    def take_events(self) -> list[tuple[Any, KVEvent]]: ...


def _stamp(item: tuple[int, tuple[tuple[float, int], KVEvent]]) -> tuple[float, int]:
    return item[1][0]


class KVEventFeed:
    """The KV events of ``caches`` (replica i: ``caches[i]``) on ``env``'s clock. A cache
    records only the kinds some subscriber asked for, from the first subscription on; a
    subscriber may also see the other kinds its fellow subscribers asked for."""

    def __init__(self, env: simpy.Environment, caches: Sequence[EventSource]) -> None:
        self.env = env
        self.caches = list(caches)
        self.serial = 0
        self.subscribers: list[Subscriber] = []
        self.replica_subscribers: list[ReplicaSubscriber] = []

    def _stamp(self) -> tuple[float, int]:
        self.serial += 1
        return (self.env.now, self.serial)

    def subscribe(self, subscriber: Subscriber, kinds: Iterable[type] | None = None) -> None:
        """``subscriber`` receives every event of ``kinds`` (default: all) emitted from now
        on, one call per event, all replicas in emission order."""
        self.subscribers.append(subscriber)
        self._enable(kinds)

    def subscribe_replicas(self, subscriber: ReplicaSubscriber,
                           kinds: Iterable[type] | None = None) -> None:
        """``subscriber`` receives the events of ``kinds`` emitted from now on one replica at
        a time: ``subscriber(replica, [((time, serial), event), ...])``, that replica's since
        the last delivery, oldest first. For a consumer whose state is per replica, to which
        the order across replicas makes no difference."""
        self.replica_subscribers.append(subscriber)
        self._enable(kinds)

    def _enable(self, kinds: Iterable[type] | None) -> None:
        kinds = None if kinds is None else tuple(kinds)
        for cache in self.caches:
            cache.enable_events(self._stamp, kinds)

    def deliver(self) -> None:
        """Hand every event emitted since the last call to every subscriber: to each
        replica subscriber replica by replica, to each other subscriber in emission order
        (replicas merged by their stamps)."""
        batches = []
        for r, cache in enumerate(self.caches):
            events = cache.take_events()
            if events:
                batches.append((r, events))
        if not batches:
            return
        for replica_subscriber in self.replica_subscribers:
            for r, events in batches:
                replica_subscriber(r, events)
        subscribers = self.subscribers
        if not subscribers:
            return
        tagged = [[(r, e) for e in events] for r, events in batches]
        merged = tagged[0] if len(tagged) == 1 else heapq.merge(*tagged, key=_stamp)
        for r, ((at, _serial), event) in merged:
            for subscriber in subscribers:
                subscriber(r, at, event)
