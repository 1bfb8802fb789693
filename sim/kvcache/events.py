"""KV events: what a cache tells a consumer about the changes its appliers make, as vLLM's
block pool keeps ``kv_event_queue`` and hands it over with ``take_events``
(vllm/v1/core/block_pool.py; the event types of vllm/distributed/kv_events.py).

A cache emits nothing until a consumer calls its ``enable_events``; from then on every change
of state is appended to the cache's ``KVEventQueue`` where it happens, and ``take_events``
drains it. Events are exact: a block is reported when its state changed, never again while
it keeps that state (a chunk checkpoint that re-inserts the prefix computed so far reports
only the blocks that were not on the GPU)::

    BlockStored(ids, parent)   ids (a chain) became GPU-resident: new, a hole refilled, a CPU
                               copy promoted or loaded; parent: the block before ids[0]
                               (-1: none, the root; None: not said, a load behind a
                               GPU-resident prefix)
    BlockRemoved(ids)          the last GPU copy of each of ids left (deleted or demoted)
    ChainWritten(ids)          a radix insert wrote the chain ids (every block of it resident
                               now): one per insert, the save a pool below the replica
                               stores from (LMCache stores the chunks of each saved sequence)
    BlocksDropped(ids)         the last copy of each of ids left the cache, any tier, as the
                               operation that dropped them reports it to its caller

Each queued event carries a stamp from the consumer's clock, taken when it was emitted: a
consumer that drains several caches at once orders their events by it (the fleet stamps
(simulated time, serial)), and a lagged consumer applies each at its own time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import count
from typing import Any, Final, NamedTuple

import numpy as np


class BlockStored(NamedTuple):
    ids: np.ndarray
    parent: int | None


class BlockRemoved(NamedTuple):
    ids: np.ndarray


class ChainWritten(NamedTuple):
    ids: np.ndarray


class BlocksDropped(NamedTuple):
    ids: np.ndarray


KVEvent = BlockStored | BlockRemoved | ChainWritten | BlocksDropped
EVENT_KINDS: Final = (BlockStored, BlockRemoved, ChainWritten, BlocksDropped)
_new: Final = tuple.__new__


class KVEventQueue:
    """One cache's events in emission order, each as ``(stamp, event)``; ``clock()`` gives
    the stamps (default: 1, 2, 3, ... in emission order). ``kinds`` (default: all four) are
    the event types recorded; the others are not even built (a router's index reads only
    stored and removed blocks, a pool only the chains written or the blocks dropped)."""

    __slots__ = ("clock", "events", "keep_dropped", "keep_removed", "keep_stored",
                 "keep_written")

    def __init__(self, clock: Callable[[], Any] | None = None,
                 kinds: Iterable[type] | None = None) -> None:
        self.clock = clock if clock is not None else count(1).__next__
        self.events: list[tuple[Any, KVEvent]] = []
        self.keep_stored = self.keep_removed = self.keep_written = self.keep_dropped = False
        self.want(EVENT_KINDS if kinds is None else kinds)

    def want(self, kinds: Iterable[type]) -> None:
        """Record ``kinds`` too from now on (the kinds already recorded stay)."""
        kinds = set(kinds)
        unknown = kinds - set(EVENT_KINDS)
        if unknown:
            raise ValueError(f"not a KV event type: {sorted(k.__name__ for k in unknown)}")
        self.keep_stored |= BlockStored in kinds
        self.keep_removed |= BlockRemoved in kinds
        self.keep_written |= ChainWritten in kinds
        self.keep_dropped |= BlocksDropped in kinds

    def stored(self, ids: np.ndarray, parent: int | None) -> None:
        if self.keep_stored:
            self.events.append((self.clock(), _new(BlockStored, (ids, parent))))

    def removed(self, ids: np.ndarray) -> None:
        if self.keep_removed:
            self.events.append((self.clock(), _new(BlockRemoved, (ids,))))

    def written(self, ids: np.ndarray) -> None:
        if self.keep_written:
            self.events.append((self.clock(), _new(ChainWritten, (ids,))))

    def dropped(self, ids: np.ndarray) -> None:
        if self.keep_dropped:
            self.events.append((self.clock(), _new(BlocksDropped, (ids,))))

    def take(self) -> list[tuple[Any, KVEvent]]:
        """Every event since the last call, oldest first; the queue is empty afterwards."""
        out = self.events
        if out:
            self.events = []
        return out


def concat(parts: list[np.ndarray]) -> np.ndarray:
    """The id runs of a result as one array (in order)."""
    if not parts:
        return np.empty(0, dtype=np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)
