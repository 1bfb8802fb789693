"""A router's cache beliefs: what it thinks each replica holds (``policies.routing`` names
them: ``ApproxTree``, ``PodLRU``, ``ApproxTTL``, ``KVEvents``).

Every belief answers one question per request, in one pass over the prompt's blocks
(O(prompt blocks), whatever the number of replicas): ``overlaps(ids, now)``, the believed
cached prefix on each replica, in blocks. Approximate beliefs learn only from
``routed(ids, replica, now)`` (what the router itself sent); the exact one learns only from
the engines' KV events (``stored``/``removed``), each applied ``lag_s`` after it was emitted.
None of them ever reads an engine: the gap between belief and truth is the point
(``sim.fleet.fleet`` measures it at every decision).

The approximate beliefs keep one bit mask of holders per block id (bit r: replica r holds
it), so a prefix scan costs one dict lookup per block for all replicas together; the exact one
keeps its state in ``sim.fleet.eventindex`` (per replica, how deep it holds each run of a
tree of chained ids), since each event changes one replica.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from itertools import groupby, repeat
from typing import Any

import numpy as np
from mypy_extensions import mypyc_attr

from policies.routing import ApproxTree, ApproxTTL, KVEvents, PodLRU
from sim.kvcache.events import BlockRemoved, BlockStored, KVEvent

from .eventindex import COLLECT_FLOOR, BlockIndex, ChainIndex, LinkedIndex


def _bits(mask: int) -> Iterable[int]:
    r = 0
    while mask:
        if mask & 1:
            yield r
        mask >>= 1
        r += 1


def consecutive_prefixes(ids: list[int], holders: dict[int, int], n: int) -> list[int]:
    """Per replica, how many leading ``ids`` it holds (consecutive from the start). The masks
    are read in C and taken in runs of equal masks, so the Python work is per run."""
    out = [0] * n
    alive = (1 << n) - 1
    i = 0
    for m, run in groupby(map(holders.get, ids, repeat(0))):
        m &= alive
        if m != alive:
            for r in _bits(alive & ~m):
                out[r] = i
            alive = m
            if not alive:
                return out
        i += len(list(run))
    for r in _bits(alive):
        out[r] = len(ids)
    return out


@mypyc_attr(allow_interpreted_subclasses=True)
class CacheBelief:
    """One router's cache view over ``n`` replicas (see the module docstring)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def overlaps(self, ids: np.ndarray, now: float) -> list[int]:
        """Believed cached prefix of ``ids`` on each replica, in blocks."""
        raise NotImplementedError

    def sizes(self) -> list[int]:
        """Blocks the view holds per replica."""
        raise NotImplementedError

    def routed(self, ids: np.ndarray, replica: int, now: float) -> None:
        """The router sent a prompt of these blocks to ``replica``."""

    def stored(self, replica: int, ids: np.ndarray, now: float,
               parent: int | None = None) -> None:
        """KV event: ``replica`` made these blocks (a chain) GPU-resident; ``parent`` is the
        block before the first (-1: the root; None: not said)."""

    def removed(self, replica: int, ids: np.ndarray, now: float) -> None:
        """KV event: ``replica`` removed the last GPU copy of these blocks."""

    @property
    def wants_events(self) -> bool:
        return False


class MaskBelief(CacheBelief):
    """A view kept as one bit mask of holders per block id (bit r: replica r), so a prefix
    scan costs one dict lookup per block for all replicas together."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.holders: dict[int, int] = {}  # block id -> replicas believed to hold it (bits)

    def overlaps(self, ids: np.ndarray, now: float) -> list[int]:
        return consecutive_prefixes(ids.tolist(), self.holders, self.n)


class TreeBelief(MaskBelief):
    """SGLang's approximate radix tree (``ApproxTree``). Ids are chained, so a worker's
    part of the tree is the set of block ids routed to it (closed under prefixes); a leaf is
    a block with no child routed to that worker. Each insert stamps the whole path with one
    epoch (SGLang's monotone counter). Every ``eviction_interval_s`` a worker above
    ``max_blocks`` loses its oldest leaves (ties: smaller id) until it fits: SGLang's
    ``evict_tenant_by_size``. Eviction runs lazily before the next decision after each
    interval boundary: the tree changes only at decisions, so the result is the same."""

    def __init__(self, n: int, spec: ApproxTree) -> None:
        super().__init__(n)
        self.max_blocks = spec.max_blocks
        self.interval = float(spec.eviction_interval_s)
        self.next_eviction = self.interval
        self.parent: dict[int, int] = {}  # block id -> the block before it (-1: first)
        self.stamp: list[dict[int, int]] = [{} for _ in range(n)]
        self.children: list[dict[int, int]] = [{} for _ in range(n)]
        self.epoch = 0

    def sizes(self) -> list[int]:
        return [len(s) for s in self.stamp]

    def overlaps(self, ids: np.ndarray, now: float) -> list[int]:
        self._evict_due(now)
        return super().overlaps(ids, now)

    def routed(self, ids: np.ndarray, replica: int, now: float) -> None:
        self._evict_due(now)
        self.epoch += 1
        epoch, bit = self.epoch, 1 << replica
        stamp, children, parent, holders = (self.stamp[replica], self.children[replica],
                                            self.parent, self.holders)
        prev = -1
        for b in ids.tolist():
            if b not in stamp:
                holders[b] = holders.get(b, 0) | bit
                parent.setdefault(b, prev)
                if prev >= 0:
                    children[prev] = children.get(prev, 0) + 1
            stamp[b] = epoch
            prev = b

    def _evict_due(self, now: float) -> None:
        if now < self.next_eviction:
            return
        self.next_eviction = (math.floor(now / self.interval) + 1) * self.interval
        for r in range(self.n):
            if len(self.stamp[r]) > self.max_blocks:
                self._evict_worker(r)

    def _evict_worker(self, r: int) -> None:
        stamp, children, parent, holders = (self.stamp[r], self.children[r], self.parent,
                                            self.holders)
        clear = ~(1 << r)
        heap = [(s, b) for b, s in stamp.items() if not children.get(b)]
        heapq.heapify(heap)
        while len(stamp) > self.max_blocks and heap:
            _, b = heapq.heappop(heap)
            del stamp[b]
            children.pop(b, None)
            m = holders[b] & clear
            if m:
                holders[b] = m
            else:
                del holders[b]
            p = parent[b]
            if p >= 0:
                left = children[p] - 1
                if left:
                    children[p] = left
                else:
                    del children[p]
                    heapq.heappush(heap, (stamp[p], p))


class PodLRUBelief(MaskBelief):
    """llm-d's approximate prefix index (``PodLRU``): per pod an LRU of block hashes; the
    scan counts, per pod, the blocks it holds before the first block no pod holds."""

    def __init__(self, n: int, spec: PodLRU, cache_blocks: list[int] | None = None) -> None:
        super().__init__(n)
        per = spec.capacity_per_cache_block  # the spec checked its own fields
        if per and (cache_blocks is None or len(cache_blocks) != n):
            raise ValueError("PodLRU sized by the replicas' caches needs their sizes")
        self.capacity = ([max(1, int(per * c)) for c in cache_blocks or ()] if per
                         else [spec.capacity_blocks] * n)
        self.max_prefix = spec.max_prefix_blocks
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n)]

    def sizes(self) -> list[int]:
        return [len(x) for x in self.lru]

    def overlaps(self, ids: np.ndarray, now: float) -> list[int]:
        masks = list(map(self.holders.get, ids[: self.max_prefix].tolist(), repeat(0)))
        if 0 in masks:  # the scan stops at the first block no pod holds
            masks = masks[: masks.index(0)]
        out = [0] * self.n
        for m, count in Counter(masks).items():
            for r in _bits(m):
                out[r] += count
        return out

    def routed(self, ids: np.ndarray, replica: int, now: float) -> None:
        lru, holders, bit = self.lru[replica], self.holders, 1 << replica
        for b in ids[: self.max_prefix].tolist():
            if b in lru:
                lru.move_to_end(b)
            else:
                lru[b] = None
                holders[b] = holders.get(b, 0) | bit
        clear = ~bit
        while len(lru) > self.capacity[replica]:
            b, _ = lru.popitem(last=False)
            m = holders[b] & clear
            if m:
                holders[b] = m
            else:
                del holders[b]


class TTLBelief(MaskBelief):
    """Dynamo's approximate index (``ApproxTTL``): routed blocks expire ``ttl_s`` after
    their last routing; above ``max_blocks`` (all workers together; 0: no bound) the entries
    expiring first are pruned to ``prune_ratio * max_blocks``."""

    def __init__(self, n: int, spec: ApproxTTL) -> None:
        super().__init__(n)
        self.ttl, self.max_blocks, self.ratio = spec.ttl_s, spec.max_blocks, spec.prune_ratio
        self.expiry: list[dict[int, float]] = [{} for _ in range(n)]
        self.heap: list[tuple[float, int, int]] = []  # (expiry, block, replica), lazy
        self.total = 0

    def sizes(self) -> list[int]:
        return [len(x) for x in self.expiry]

    def overlaps(self, ids: np.ndarray, now: float) -> list[int]:
        self._expire(now)
        return super().overlaps(ids, now)

    def routed(self, ids: np.ndarray, replica: int, now: float) -> None:
        self._expire(now)
        exp, holders, bit = self.expiry[replica], self.holders, 1 << replica
        until = now + self.ttl
        for b in ids.tolist():
            if b not in exp:
                holders[b] = holders.get(b, 0) | bit
                self.total += 1
            exp[b] = until
            heapq.heappush(self.heap, (until, b, replica))
        if self.max_blocks and self.total > self.max_blocks:
            target = int(self.ratio * self.max_blocks)
            while self.total > target and self.heap:
                self._pop()

    def _expire(self, now: float) -> None:
        while self.heap and self.heap[0][0] <= now:
            self._pop()

    def _pop(self) -> None:
        t, b, r = heapq.heappop(self.heap)
        exp = self.expiry[r]
        if exp.get(b) != t:  # refreshed since: a stale heap entry
            return
        del exp[b]
        self.total -= 1
        m = self.holders[b] & ~(1 << r)
        if m:
            self.holders[b] = m
        else:
            del self.holders[b]


class EventBelief(CacheBelief):
    """An exact index fed by KV events (``KVEvents``), each applied ``lag_s`` after it was
    emitted (in emission order). With ``lag_s = 0`` it equals the engines' GPU contents.
    ``drop_orphans`` (Dynamo 1.6's radix index): a stored chain whose parent the index does
    not hold for that worker is dropped ("Failed to find parent block; skipping store
    operation"), and a removed block takes its descendants with it for that worker.

    The state lives in ``sim.fleet.eventindex``: with ``drop_orphans`` run by run
    (``ChainIndex``) until an event asks for blocks (``LinkedIndex``, the same state handed
    over); without, a set per replica."""

    def __init__(self, n: int, spec: KVEvents, collect_floor: int = COLLECT_FLOOR) -> None:
        super().__init__(n)
        self.lag = float(spec.lag_s)
        self.orphans = bool(spec.drop_orphans)
        # per replica, its events not yet applied (lag_s > 0), oldest first: a replica's
        # blocks change only by its own events, so each replica's queue is drained on its own
        self.pending: list[deque[tuple[float, bool, np.ndarray, int | None]]] = [
            deque() for _ in range(n)]
        self.index: BlockIndex = (ChainIndex(n, collect_floor) if self.orphans
                                  else LinkedIndex(n, orphans=False))

    @property
    def wants_events(self) -> bool:
        return True

    @property
    def dropped(self) -> int:
        """Blocks whose store was skipped (their parent was gone)."""
        return self.index.dropped

    @property
    def holders(self) -> dict[int, int]:
        """Block id -> the replicas holding it (bit r: replica r), built on each call."""
        out: dict[int, int] = {}
        for r in range(self.n):
            bit = 1 << r
            for b in self.index.held(r):
                out[b] = out.get(b, 0) | bit
        return out

    def sizes(self) -> list[int]:
        return self.index.sizes()

    def overlaps(self, ids: np.ndarray, now: float) -> list[int]:
        self._deliver(now)
        return self.index.overlaps(ids)

    def stored(self, replica: int, ids: np.ndarray, now: float,
               parent: int | None = None) -> None:
        self._emit(now, replica, True, ids, parent)

    def removed(self, replica: int, ids: np.ndarray, now: float) -> None:
        self._emit(now, replica, False, ids, None)

    def replica_events(self, replica: int,
                       events: list[tuple[tuple[float, int], KVEvent]]) -> None:
        """``replica``'s KV events in emission order, each ``((time, serial), event)`` as
        ``sim.fleet.kvevents.KVEventFeed`` hands them over: ``stored``/``removed`` for each
        ``BlockStored``/``BlockRemoved`` (the other kinds change no GPU residency)."""
        event: Any  # one of the kinds (their fields differ)
        if self.lag == 0:
            apply = self._apply
            for _stamp, event in events:
                kind = type(event)
                if kind is BlockStored:
                    if len(event.ids):
                        apply(replica, True, event.ids, event.parent)
                elif kind is BlockRemoved and len(event.ids):
                    apply(replica, False, event.ids, None)
            return
        lag, pending = self.lag, self.pending[replica]
        for (at, _serial), event in events:
            kind = type(event)
            if kind is BlockStored:
                if len(event.ids):
                    pending.append((at + lag, True, event.ids, event.parent))
            elif kind is BlockRemoved and len(event.ids):
                pending.append((at + lag, False, event.ids, None))

    def _emit(self, now: float, replica: int, stored: bool, ids: np.ndarray,
              parent: int | None) -> None:
        if not len(ids):
            return
        if self.lag == 0:
            self._apply(replica, stored, ids, parent)
        else:
            self.pending[replica].append((now + self.lag, stored, ids, parent))

    def _deliver(self, now: float) -> None:
        for r, pending in enumerate(self.pending):
            while pending and pending[0][0] <= now:
                _, stored, ids, parent = pending.popleft()
                self._apply(r, stored, ids, parent)

    def _apply(self, r: int, stored: bool, ids: np.ndarray, parent: int | None) -> None:
        if not stored:
            self.index.remove(r, ids)
        elif not self.index.store(r, ids, parent):  # not a chained event: go on by blocks
            self.index = self.index.linked()
            self.index.store(r, ids, parent)
