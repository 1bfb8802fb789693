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
keeps a set per replica, since each event changes one replica.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from functools import partial
from itertools import accumulate, groupby, islice, repeat, takewhile
from operator import is_not
from typing import Any

import numpy as np
from mypy_extensions import mypyc_attr

from policies.routing import ApproxTree, ApproxTTL, KVEvents, PodLRU
from sim.kvcache.events import BlockRemoved, BlockStored, KVEvent


def _bits(mask: int) -> Iterable[int]:
    r = 0
    while mask:
        if mask & 1:
            yield r
        mask >>= 1
        r += 1


_is_block = partial(is_not, None)  # a child link's target (None: no child)


def _link(first: dict[int, int], more: dict[int, set[int]], parent: int, b: int) -> None:
    """Record ``b`` as a child of ``parent`` (``EventBelief``'s child links)."""
    kid = first.get(parent)
    if kid is None:
        first[parent] = b
    elif kid != b:
        kids = more.get(parent)
        if kids is None:
            more[parent] = {b}
        else:
            kids.add(b)


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

    An event changes one replica, so each replica's blocks are a set of its own: an event is
    a set operation in C (the engines report about a thousand blocks per request under
    pressure), and an overlap scan per replica stops at its first miss."""

    def __init__(self, n: int, spec: KVEvents) -> None:
        super().__init__(n)
        self.lag = float(spec.lag_s)
        self.orphans = bool(spec.drop_orphans)
        # per replica, its events not yet applied (lag_s > 0), oldest first: a replica's
        # blocks change only by its own events, so each replica's queue is drained on its own
        self.pending: list[deque[tuple[float, bool, list[int], int | None]]] = [
            deque() for _ in range(n)]
        self.held: list[set[int]] = [set() for _ in range(n)]
        # drop_orphans: per replica, block -> the first block stored right after it, and the
        # others when a block has more than one (a branch): most blocks have one child
        self.first_child: list[dict[int, int]] = [{} for _ in range(n)]
        self.more_children: list[dict[int, set[int]]] = [{} for _ in range(n)]
        self.dropped = 0  # blocks whose store was skipped (their parent was gone)

    @property
    def wants_events(self) -> bool:
        return True

    @property
    def holders(self) -> dict[int, int]:
        """Block id -> the replicas holding it (bit r: replica r), built on each call."""
        out: dict[int, int] = {}
        for r, held in enumerate(self.held):
            bit = 1 << r
            for b in held:
                out[b] = out.get(b, 0) | bit
        return out

    def sizes(self) -> list[int]:
        return [len(h) for h in self.held]

    def overlaps(self, ids: np.ndarray, now: float) -> list[int]:
        self._deliver(now)
        xs: list[int] = ids.tolist()
        out = []
        for h in self.held:  # each replica's held prefix: the scan stops at its first miss
            k = 0
            for b in xs:
                if b not in h:
                    break
                k += 1
            out.append(k)
        return out

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
                        apply(replica, True, event.ids.tolist(), event.parent)
                elif kind is BlockRemoved and len(event.ids):
                    apply(replica, False, event.ids.tolist(), None)
            return
        lag, pending = self.lag, self.pending[replica]
        for (at, _serial), event in events:
            kind = type(event)
            if kind is BlockStored:
                if len(event.ids):
                    pending.append((at + lag, True, event.ids.tolist(), event.parent))
            elif kind is BlockRemoved and len(event.ids):
                pending.append((at + lag, False, event.ids.tolist(), None))

    def _emit(self, now: float, replica: int, stored: bool, ids: np.ndarray,
              parent: int | None) -> None:
        if not len(ids):
            return
        if self.lag == 0:
            self._apply(replica, stored, ids.tolist(), parent)
        else:
            self.pending[replica].append((now + self.lag, stored, ids.tolist(), parent))

    def _deliver(self, now: float) -> None:
        for r, pending in enumerate(self.pending):
            while pending and pending[0][0] <= now:
                _, stored, ids, parent = pending.popleft()
                self._apply(r, stored, ids, parent)

    def _apply(self, r: int, stored: bool, ids: list[int], parent: int | None) -> None:
        if self.orphans:
            if stored:
                self._store_linked(r, ids, parent)
            else:
                self._forget_subtrees(r, ids)
        elif stored:
            self.held[r].update(ids)
        else:
            self.held[r].difference_update(ids)

    def _store_linked(self, r: int, ids: list[int], parent: int | None) -> None:
        """Store the chain ``ids`` after ``parent`` unless the index lacks that parent (then
        the whole chain is dropped: each block's own parent is the one stored before it, so
        only the first can be missing). Every block is linked from the one before it, held
        before or not."""
        held, first, more = self.held[r], self.first_child[r], self.more_children[r]
        if parent is not None and parent >= 0:
            if parent not in held:
                self.dropped += len(ids)
                return
            prev = parent
        else:
            prev = -1
        size = len(held)
        held.update(ids)
        if len(held) - size == len(ids):
            # distinct and all new (the engines report only changes): a block r did not
            # hold has no links (only held blocks have), so the chain's links are set in C
            first.update(zip(ids, islice(ids, 1, None), strict=False))
            if prev >= 0:
                _link(first, more, prev, ids[0])
            return
        for b in ids:
            if prev >= 0:
                _link(first, more, prev, b)
            prev = b

    def _forget_subtrees(self, r: int, ids: list[int]) -> None:
        """Remove ``ids`` and every block stored below them for ``r``. The blocks removed are
        those reachable from ``ids`` over the child links, whatever the visiting order. Only
        a held block has links (``_store_linked`` links from the parent it checked and the
        blocks it stores; a removal takes the block's links with it), so a block ``r`` does
        not hold ends its branch of the walk."""
        held, first_pop, more = self.held[r], self.first_child[r].pop, self.more_children[r]
        more_pop = more.pop
        # The held ids go first, in C (a block r does not hold has no links: it adds
        # nothing); the walk goes on from their children outside them (a removed block's
        # chain child is usually the next id, already gone)
        if held.isdisjoint(ids):  # most removals: the blocks went with an earlier subtree
            return
        hit = list(filter(held.__contains__, ids))
        kids = list(map(first_pop, hit, repeat(None)))
        held.difference_update(hit)
        if kids[:-1] == hit[1:]:
            stack = [] if kids[-1] is None else [kids[-1]]
        else:
            stack = [k for k in kids if k is not None]
        if more and any(map(more.__contains__, hit)):
            for x in hit:
                extra = more_pop(x, None)
                if extra:
                    stack.extend(extra)
        # Below them the subtrees are mostly long single chains, each followed in C:
        # ``accumulate`` pops each block's first child (a link is followed once, so the walk
        # ends) until one has none; only a held block has links, so the chain is held blocks
        # and at most one last block that is not (removing it is a no-op). The branches
        # (``more``, whose keys are held blocks too) go on the stack: those of the chain are
        # the keys no longer held, found from the smaller of the two.
        while stack:
            x = stack.pop()
            if x not in held:
                continue
            run = list(takewhile(_is_block, accumulate(repeat(None), first_pop,  # type: ignore[misc]
                                                       initial=x)))
            held.difference_update(run)
            if more:
                if len(more) < len(run):
                    gone = [k for k in more if k not in held]
                else:
                    gone = list(filter(more.__contains__, run))
                for k in gone:  # a repeated id may list its block twice
                    extra = more_pop(k, None)
                    if extra:
                        stack.extend(extra)
