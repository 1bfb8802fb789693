"""vLLM 0.33's prefix-caching block pool (one full-attention KV group), block for block.

Design note for the engine integrator. This is NOT the radix tree (``cache.py``): it models
vLLM's ``KVCacheManager`` + ``BlockPool`` (vllm/v1/core/; docs/engine.md, vLLM engine) with the
same state, so that every observable (hits, admission, which physical block is reused, the
free-queue order) is identical to the real code, proven op by op by tests/test_vllm_diff.py.

State::

    physical blocks 1..capacity (0 is vLLM's null block, never used)
      bid[p]  kvsim block id of the block's hash, -1 = unhashed;  ref[p] = requests holding p
    free queue = [unhashed free blocks (LIFO)] + [hashed free blocks, in the order freed]
      allocation pops the FRONT: unhashed first, then the oldest freed hashed block, whose hash
      is dropped only then (lazy eviction: a freed cached block stays hittable until popped)
    hash map   id -> its cached copies in insertion order (NO de-duplication: a block computed
      again while a copy is cached becomes a second copy and takes capacity; lookup returns
      the first copy): ``cachedids.CachedIds``
    request    block table (physical blocks by position), computed tokens, cached blocks

Protocol (what vLLM's V1 scheduler does, method by method)::

    lookup(ids, num_tokens)          get_computed_blocks: longest run of cached ids from the
                                     start, capped at (num_tokens-1)//bs blocks; READ-ONLY
    admit(rid, ids, num_tokens, k)   allocate_slots for a waiting request: check capacity first
                                     (ref-0 hit blocks count as needing allocation; with
                                     full_sequence_must_fit, the default, the whole prompt must
                                     fit), then touch the hit (ref+1, out of the free queue),
                                     pop new blocks and cache every block now full, i.e. the
                                     prompt's blocks when its prefill is scheduled. A request
                                     not admitted changes nothing.
    extend(rid, k)                   allocate_slots for k more tokens of a running request (next
                                     prefill chunk, or k decode tokens): blocks are cached as
                                     they fill. k tokens at once = k single-token calls that
                                     all succeed.
    free(rid)                        finish or preemption: ref-1 in the free order; blocks
                                     reaching 0 join the queue, hashed ones at the tail (in
                                     order), unhashed ones at the front.

Invariants (``check``): free = unhashed free + hashed free = blocks with ref 0; every cached
copy is in the hash map once; the first copy of an id is the earliest inserted still cached;
an id's child count = distinct cached ids whose parent is that id.

Policy: in vLLM the only freedom an eviction policy has is the ORDER in which a finished
request's blocks join the free queue; the pool frees in the order it is given, as vLLM's
``free_blocks(ordered_blocks)`` (``free_order``: the policy's ``ReleaseOrder``,
policies/eviction.py: given the request's ``shared`` mask, the positions in release order;
released first = evicted first). ``vllm`` releases tail first; ``penelope`` releases the front
of the private history first and the shared prefix last. ``shared`` marks the positions up to
the deepest block that has two or more distinct cached continuations (a branch point: what the
radix tree calls a node with several children) or is still held by another request; the pool
builds it (and keeps the child counts it needs) only for an order that reads it.

KV events (``enable_events``, ``take_events``; ``sim.kvcache.events``): a block hashed (cached)
is stored, with the block before it as parent; an id whose last cached copy a pop dropped is
removed (lazy eviction). Off unless a consumer enables them.

What differs from the radix tree: the cached set is a multiset of blocks, not a tree (with a
non-tail order it need not even be prefix-closed: blocks after an evicted one stay cached but
unreachable until popped); there is no lock at lookup, no split, no touch without admission,
no insert at finish; capacity is physical blocks (a request holds its partial last block too).

Ids must be non-negative and dense enough to index arrays (trace ids are dense ranks; arrays
grow to the largest id seen). Speed: every operation is a handful of numpy calls on the
request's blocks (a few blocks are updated one by one in Python, cheaper than numpy there);
child counts, read only by an order that reads ``shared`` when a request is freed, are
applied in bulk then.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

import numpy as np
from mypy_extensions import mypyc_attr

from policies.eviction import ReleaseOrder, get_free_order

from .cachedids import MAX_ID, CachedIds
from .events import EVENT_KINDS, KVEvent, KVEventQueue
from .freequeue import FreeQueue

__all__ = ["MAX_ID", "BlockPool", "HolePool", "computed_ranges", "reused_runs",
           "shared_positions", "span"]


class _Seq:
    """One request's blocks: ids of every full block it will have, its block table."""

    __slots__ = ("cached", "computed", "ids", "known", "table")

    def __init__(self, ids: np.ndarray, table: np.ndarray, computed: int, cached: int) -> None:
        self.ids = ids
        self.table = table
        self.computed = computed
        self.cached = cached
        # tokens whose ids are final (vLLM's request.num_tokens): blocks are cached up to
        # min(computed, known); async scheduling computes tokens before they are known
        self.known = computed


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@mypyc_attr(allow_interpreted_subclasses=True)  # patches' pools (sim/engines/vllm_*.py)
class BlockPool:
    """vLLM 0.33's KV block pool with automatic prefix caching (see the module doc)."""

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int = 64,
        free_order: str | ReleaseOrder = "vllm",
        *,
        debug: bool = False,
    ) -> None:
        if capacity_blocks < 1 or block_size < 1:
            raise ValueError(f"capacity_blocks and block_size must be >= 1, got "
                             f"{capacity_blocks}, {block_size}")
        self.capacity_blocks = int(capacity_blocks)
        self.block_size = int(block_size)
        self.free_order = get_free_order(free_order)
        self.debug = debug
        n = self.capacity_blocks + 1
        self._bid = np.full(n, -1, np.int64)
        self._ref = np.zeros(n, np.int32)
        self._queue = FreeQueue(self.capacity_blocks)
        # the hash map: cached copies per id (and child counts, which only an order that
        # reads the shared mask needs)
        self._ids = CachedIds(children=self.free_order.reads_shared)
        self._seqs: dict[int, _Seq] = {}
        self._cached = 0
        self._dropped = 0  # hashes dropped at allocation (lazy evictions), copies included
        self._lost = 0  # ... of which the id's last cached copy
        self._events: KVEventQueue | None = None  # off until a consumer enables them

    # ------------------------------------------------------------------ KV events
    def enable_events(self, clock: Callable[[], Any] | None = None,
                      kinds: Iterable[type] | None = None) -> None:
        """Report KV events from now on (module doc), each stamped by ``clock()``; only
        ``kinds`` of them (default: all). A second call adds its kinds, keeping the clock."""
        if self._events is None:
            self._events = KVEventQueue(clock, kinds)
        else:
            self._events.want(EVENT_KINDS if kinds is None else kinds)

    def take_events(self) -> list[tuple[Any, KVEvent]]:
        """The ``(stamp, event)`` pairs since the last call, oldest first (none while events
        are off)."""
        return self._events.take() if self._events is not None else []

    # ------------------------------------------------------------------ counters
    @property
    def free_blocks(self) -> int:
        """Blocks in the free queue (unhashed + cached with ref 0): what allocation may pop."""
        return len(self._queue)

    @property
    def cached_blocks(self) -> int:
        """Physical blocks holding a cached (hashed) block, duplicates included."""
        return self._cached

    @property
    def used_blocks(self) -> int:
        """Blocks held by running requests."""
        return self.capacity_blocks - self.free_blocks

    @property
    def evicted_blocks(self) -> int:
        """Cached blocks whose hash allocation dropped so far (lazy eviction), duplicates
        included."""
        return self._dropped

    @property
    def lost_blocks(self) -> int:
        """Of ``evicted_blocks``, those that were the last cached copy of their id."""
        return self._lost

    def running(self) -> list[int]:
        return list(self._seqs)

    def computed_tokens(self, rid: int) -> int:
        return self._seqs[rid].computed

    def blocks_to_grow(self, rid: int, num_tokens: int) -> int:
        """Blocks request ``rid`` must still allocate to hold ``num_tokens`` tokens (vLLM's
        ``get_num_blocks_to_allocate`` for a running request)."""
        return max(_cdiv(num_tokens, self.block_size) - len(self._seqs[rid].table), 0)

    # ------------------------------------------------------------------ protocol
    def lookup(self, ids: np.ndarray, num_tokens: int) -> int:
        """Cached blocks at the start of ``ids``, capped at ``(num_tokens - 1) // bs`` (the
        last token is always computed). Read-only."""
        return self._lookup(np.asarray(ids, np.int64), num_tokens)[0]

    def _lookup(
        self, ids: np.ndarray, num_tokens: int, grown: bool = False
    ) -> tuple[int, np.ndarray]:
        """(hit blocks, first copies of the hit blocks); ``grown``: ids known in range."""
        cap = min(len(ids), (num_tokens - 1) // self.block_size)
        if cap <= 0 or not self._ids.is_cached(ids.item(0)):
            # most prompts miss at their first block (every fleet routing decision asks each
            # replica): one scalar read instead of a gather and a scan
            return 0, ids[:0]
        f = self._ids.firsts(ids[:cap], grown)
        miss = f < 0
        i = int(miss.argmax())
        if not miss[i]:
            return cap, f
        return i, f[:i]

    def admit(
        self,
        rid: int,
        ids: np.ndarray,
        num_tokens: int,
        num_new_tokens: int,
        *,
        full_sequence_must_fit: bool = True,
    ) -> int | None:
        """Schedule waiting request ``rid`` (``num_tokens``: its prompt, or prompt + outputs
        when resumed after preemption; ``ids``: every full block it will ever have): look up,
        then allocate slots for ``num_new_tokens`` tokens after the hit (capped at what
        remains). Returns the hit in blocks, or None when it does not fit (nothing changed)."""
        if rid in self._seqs:
            raise ValueError(f"request {rid} is already running")
        if num_tokens < 1 or num_new_tokens < 1:
            raise ValueError(f"request {rid}: num_tokens and num_new_tokens must be >= 1")
        ids = np.asarray(ids, np.int64)
        self._ids.grow(ids)  # validates the ids; no semantic change
        bs = self.block_size
        h, hits = self._lookup(ids, num_tokens, grown=True)
        hit_tokens = h * bs
        new = min(num_new_tokens, num_tokens - hit_tokens)
        self._check_ids(rid, hit_tokens + new, ids)
        refs = self._ref[hits] if h else hits  # (no hit, the common case: no numpy call)
        idle = refs == 0 if h else hits
        evictable = int(np.count_nonzero(idle)) if h else 0
        free = len(self._queue)
        if full_sequence_must_fit and max(_cdiv(num_tokens, bs) - h, 0) + evictable > free:
            return None
        n_new = max(_cdiv(hit_tokens + new, bs) - h, 0)
        if n_new + evictable > free:
            return None
        if evictable:  # touch: out of the free queue
            self._queue.remove(hits[idle])
        if h:
            self._ref[hits] = refs + 1  # distinct blocks: one request's chain
        fresh = self._pop(n_new)  # a fresh array (n_new >= 1 without a hit)
        self._ref[fresh] = 1
        seq = _Seq(ids, np.concatenate([hits, fresh]) if h else fresh, hit_tokens + new, h)
        self._seqs[rid] = seq
        self._cache(seq)
        if self.debug:
            self.check()
        return h

    def admit_remote(self, rid: int, ids: np.ndarray, num_tokens: int,
                     reserved: int = 0) -> int | None:
        """``allocate_slots`` for waiting request ``rid`` whose first ``num_tokens`` tokens a
        KV connector loads (``num_external_computed_tokens``: every token past the local
        hit; ``delay_cache_blocks``): the hit is touched, blocks for the rest are popped, all
        ``num_tokens`` count as computed, and none of the new blocks is cached until
        ``cache_known`` (when the load finished). The whole prompt must fit in the free
        blocks less ``reserved`` (vLLM's ``reserved_blocks``: what in-flight prefills still
        need, which an async load must leave them). Returns the local hit in blocks, or None
        when it does not fit (nothing changed)."""
        if rid in self._seqs:
            raise ValueError(f"request {rid} is already running")
        if num_tokens < 1:
            raise ValueError(f"request {rid}: num_tokens must be >= 1")
        ids = np.asarray(ids, np.int64)
        self._ids.grow(ids)
        self._check_ids(rid, num_tokens, ids)
        h, hits = self._lookup(ids, num_tokens, grown=True)
        refs = self._ref[hits]
        idle = refs == 0
        evictable = int(np.count_nonzero(idle))
        n_new = _cdiv(num_tokens, self.block_size) - h
        if n_new + evictable > len(self._queue) - reserved:
            return None
        if evictable:
            self._queue.remove(hits[idle])
        self._ref[hits] = refs + 1
        fresh = self._pop(n_new)
        self._ref[fresh] = 1
        seq = self._loaded_seq(ids, np.concatenate([hits, fresh]), num_tokens, h)
        seq.known = h * self.block_size  # the loaded tokens are known once they arrived
        self._seqs[rid] = seq
        if self.debug:
            self.check()
        return h

    def _loaded_seq(self, ids: np.ndarray, table: np.ndarray, computed: int,
                    cached: int) -> _Seq:
        """The sequence record of a request whose KV a connector loads (a hook: a patched
        pool keeps its own record)."""
        return _Seq(ids, table, computed, cached)

    def forget_free(self) -> None:
        """Drop the hash of every cached block no request holds (a server without prefix
        caching: what a request frees is not kept); they join the queue's unhashed front."""
        hashed = self._queue.hashed_blocks().copy()
        if len(hashed):
            self._queue.remove(hashed)
            self._evict(hashed)
            self._queue.prepend(hashed)
            if self.debug:
                self.check()

    def extend(self, rid: int, num_new_tokens: int, known: int | None = None) -> bool:
        """Slots for ``num_new_tokens`` more tokens of running request ``rid`` (a prefill
        chunk, or decode tokens); blocks that become full are cached, up to ``known``
        tokens when given (vLLM caches min(computed, num_tokens): under async scheduling a
        decode token is computed before its id is known). False (nothing changed) when the
        free queue is too short: the engine preempts or waits."""
        seq = self._seqs[rid]
        if num_new_tokens < 1:
            raise ValueError(f"request {rid}: num_new_tokens must be >= 1")
        computed = seq.computed + num_new_tokens
        seq_known = computed if known is None else max(seq.known, min(computed, known))
        full = computed // self.block_size
        if full > len(seq.ids):
            self._check_ids(rid, computed, seq.ids)
        need = -(-computed // self.block_size) - len(seq.table)
        if need > 0:
            if need > len(self._queue):
                return False
            fresh = self._pop(need)
            self._ref[fresh] = 1
            seq.table = np.concatenate([seq.table, fresh])
        seq.computed = computed
        seq.known = seq_known
        if seq_known // self.block_size > seq.cached:
            self._cache(seq)
        if self.debug:
            self.check()
        return True

    def cache_known(self, rid: int, tokens: int) -> None:
        """The first ``tokens`` tokens of running request ``rid`` are known now: cache the
        blocks they fill (vLLM's ``cache_blocks`` once a step's output is processed)."""
        seq = self._seqs[rid]
        known = min(tokens, seq.computed)
        if known > seq.known:
            seq.known = known
            if known // self.block_size > seq.cached:
                self._cache(seq)
            if self.debug:
                self.check()

    def cached_of(self, rid: int) -> int:
        """Blocks of running request ``rid`` cached so far (from its first)."""
        return self._seqs[rid].cached

    def free(self, rid: int) -> None:
        """Release request ``rid`` (finished or preempted) in the order the policy gives
        (``free_order``; vLLM's ``free_blocks(ordered_blocks)``): each block loses the
        request's hold, and those left unheld join the free queue in that order, hashed ones
        at its tail (still hittable until popped), unhashed ones at its front."""
        seq = self._seqs.pop(rid)
        table = seq.table
        order = self.free_order
        ordered = order.release(table, self._shared(seq) if order.reads_shared else None)
        if self.debug and not np.array_equal(np.sort(ordered), np.sort(table)):
            raise AssertionError(f"free order {order!r} is not a permutation of the request's "
                                 f"{len(table)} blocks: {ordered}")
        self._free_blocks(ordered)
        if self.debug:
            self.check()

    def _free_blocks(self, ordered: np.ndarray) -> None:
        """vLLM's ``free_blocks``: the physical blocks ``ordered`` lose one hold each."""
        refs = self._ref[ordered] - 1
        self._ref[ordered] = refs
        zero = ordered[refs == 0]
        hashed = self._bid[zero] >= 0
        self._queue.append(zero[hashed])
        self._queue.prepend(zero[~hashed])

    def _shared(self, seq: _Seq) -> np.ndarray:
        return shared_positions(self._ids, self._ref, seq.ids, seq.table, seq.cached)

    # ------------------------------------------------------------------ observation
    def is_cached(self, block_id: int) -> bool:
        return self._ids.is_cached(block_id)

    def gpu_prefix_blocks(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` cached now, as stock vLLM's lookup finds them (read
        only; no cap: every block may hit)."""
        ids = np.asarray(ids, np.int64)
        return self._lookup(ids, ids.size * self.block_size + 1)[0]

    def resident_prefix_blocks(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` held in any tier now: the GPU's (one tier)."""
        return self.gpu_prefix_blocks(ids)

    def free_queue(self) -> np.ndarray:
        """Physical blocks in the free queue, front (reused first) to back."""
        return self._queue.blocks()

    def block_ids(self) -> np.ndarray:
        """Per physical block 1..capacity: the kvsim id it caches, -1 if none."""
        return self._bid[1:].copy()

    def ref_counts(self) -> np.ndarray:
        """Per physical block 1..capacity: requests holding it."""
        return self._ref[1:].astype(np.int64)

    def cached_ids(self) -> np.ndarray:
        """Sorted ids of every cached copy (a multiset: duplicates appear twice)."""
        b = self._bid[1:]
        return np.sort(b[b >= 0])

    def table(self, rid: int) -> np.ndarray:
        """Physical blocks of running request ``rid`` by position."""
        return self._seqs[rid].table.copy()

    def check(self) -> None:
        """Recount every invariant from scratch; AssertionError naming the first broken one."""
        cap = self.capacity_blocks
        self._queue.check()
        q = self.free_queue()
        assert len(np.unique(q)) == len(q) and 0 not in q, "queue holds a block twice or null"
        assert np.all(self._ref[q] == 0), "a block in the free queue is referenced"
        held = np.flatnonzero(self._ref[1:] > 0) + 1
        assert len(held) + len(q) == cap, f"held {len(held)} + free {len(q)} != {cap}"
        assert np.all(self._bid[self._queue.unhashed_blocks()] < 0), "unhashed part: a hash"
        assert np.all(self._bid[self._queue.hashed_blocks()] >= 0), "hashed part: no hash"
        refs = np.zeros(cap + 1, np.int64)
        for seq in self._seqs.values():
            np.add.at(refs, seq.table, 1)
            assert seq.known <= seq.computed, "known tokens beyond the computed ones"
            assert seq.cached <= len(seq.table) and seq.cached == min(
                seq.known // self.block_size, len(seq.ids)
            ), "cached blocks != full known computed blocks"
            assert np.array_equal(self._bid[seq.table[: seq.cached]], seq.ids[: seq.cached])
        assert np.array_equal(refs, self._ref), "ref counts != block tables"
        assert np.count_nonzero(self._bid >= 0) == self._cached, "cached counter"
        self._ids.check(self._bid)

    # ------------------------------------------------------------------ mechanism
    def _check_ids(self, rid: int, computed: int, ids: np.ndarray) -> None:
        if computed // self.block_size > len(ids):
            raise ValueError(
                f"request {rid}: {computed} tokens computed but ids cover only {len(ids)} blocks"
            )

    def _pop(self, n: int) -> np.ndarray:
        """Take ``n`` blocks from the queue front (unhashed first) and drop their hashes."""
        unhashed, hashed = self._queue.pop(n)
        if not len(hashed):
            return unhashed
        self._evict(hashed)
        if not len(unhashed):  # both are fresh int64 arrays: no copy needed
            return hashed
        return np.concatenate([unhashed, hashed])

    def _evict(self, ps: np.ndarray) -> None:
        """Drop the hashes of popped blocks ``ps`` (lazy eviction happens here)."""
        xs = self._bid[ps]
        self._bid[ps] = -1
        self._cached -= len(ps)
        self._dropped += len(ps)
        lost = self._ids.drop(ps, xs)
        self._lost += lost
        if self._events is not None and lost:
            # the ids whose last copy went: all of them when each was (an id popped twice
            # has one copy that was not its last), else those no copy is left of
            gone = xs if lost == len(xs) else xs[self._ids.firsts(xs, True) < 0]
            self._events.removed(gone)

    def _cache(self, seq: _Seq) -> None:
        """Hash the request's blocks that became full: [cached, computed // bs)."""
        a = seq.cached
        b = seq.known // self.block_size  # <= len(ids): _check_ids ran before any change
        if b <= a:
            return
        events = self._events
        for x, y in self._unhashed(seq, a, b):
            ps, xs = seq.table[x:y], seq.ids[x:y]
            self._bid[ps] = xs
            self._cached += y - x
            parent = int(seq.ids[x - 1]) if x else -1
            self._ids.add(ps, xs, parent)
            if events is not None:
                events.stored(xs, parent)
        seq.cached = b

    def _unhashed(self, seq: _Seq, a: int, b: int) -> list[tuple[int, int]]:
        """Runs of the request's newly full blocks ``[a, b)`` that get their ids now (a hook:
        ``HolePool`` leaves out the blocks a request reused past a hole)."""
        return [(a, b)]


# ---------------------------------------------------------------------------- Penelope patch
# The pool of ``--vllm-patch penelope`` (sim/engines/vllm_patch.py): vLLM's block pool with
# a lookup that continues past missing blocks.
#
# The hash chain is unchanged (a block's id stands for every token before it), so a cached
# block after a missing one is still the right KV for this request. Stock vLLM stops at the
# first missing block; the patched lookup takes every cached block of the chain up to the cap
# (``(num_tokens - 1) // bs`` blocks). The missing blocks before the last cached one are HOLES:
# they get fresh blocks at admission and are recomputed with the request's new tokens (the
# phantom computation), in position order, as prefill tokens of the same V1 token budget.
#
# State added to ``BlockPool``'s, per request: ``prefix`` (the blocks hit from the start, as
# stock vLLM would) and ``reused`` (runs of cached blocks the request took past its first
# hole, as block ranges). A request's computed frontier (``computed``) still grows from the
# start: a step schedules positions ``[start, start + n)`` and computes only those not in
# ``reused`` (``span``, ``computed_ranges``); blocks that become full are hashed except the
# reused ones, which hold their ids already.
#
# Without holes (every cached block is in the prefix) admission is stock vLLM's exactly.

Runs = list[tuple[int, int]]


class _PatchedSeq(_Seq):
    """A request's blocks plus what it reused past its first hole."""

    __slots__ = ("prefix", "reused")

    def __init__(self, ids: np.ndarray, table: np.ndarray, computed: int, cached: int,
                 reused: Runs) -> None:
        super().__init__(ids, table, computed, cached)
        self.prefix = cached
        self.reused = reused  # block ranges, sorted, after ``prefix``


def shared_positions(ids: CachedIds, ref: np.ndarray, seq_ids: np.ndarray, table: np.ndarray,
                     cached: int) -> np.ndarray:
    """The shared mask a release order reads (policies/eviction.py ``ReleaseOrder``): the
    positions of a request's ``table`` up to the deepest of its first ``cached`` blocks with
    two or more cached continuations (``ids``' child counts) or another holder (``ref``
    counts the request's own hold, hence >= 2). ``BlockPool`` and the hybrid pool's first
    full-attention group (sim/kvcache/hybridpool.py) alike."""
    shared = np.zeros(len(table), bool)
    if cached:
        marks = (ids.children(seq_ids[:cached]) >= 2) | (ref[table[:cached]] >= 2)
        if marks.any():
            shared[: int(np.flatnonzero(marks)[-1]) + 1] = True
    return shared


def reused_runs(hit: np.ndarray) -> Runs:
    """Block ranges where ``hit`` is True, after its first False."""
    miss = np.flatnonzero(~hit)
    if not len(miss):
        return []
    rest = np.concatenate([[False], hit[int(miss[0]):], [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(rest))
    base = int(miss[0])
    return [(base + int(a), base + int(b)) for a, b in zip(edges[::2], edges[1::2],
                                                            strict=True)]


def span(reused: Runs, bs: int, start: int, end: int, budget: int) -> tuple[int, int]:
    """(n, cost): positions ``[start, start + n)`` hold ``cost <= budget`` tokens to compute
    (all of ``[start, end)`` when they fit), reused blocks skipped for free."""
    x = start
    cost = 0
    for a, b in reused:
        a, b = a * bs, b * bs
        if b <= x:
            continue
        gap = a - x if a > x else 0
        if cost + gap >= budget:
            break
        cost += gap
        x = b
    take = min(end - x, budget - cost)
    return x + take - start, cost + take


def computed_ranges(reused: Runs, bs: int, start: int, stop: int) -> Runs:
    """Token ranges of ``[start, stop)`` outside the reused blocks (what a step computes)."""
    out: Runs = []
    x = start
    for a, b in reused:
        a, b = a * bs, b * bs
        if b <= x:
            continue
        if a >= stop:
            break
        if a > x:
            out.append((x, a))
        x = b
    if x < stop:
        out.append((x, stop))
    return out


@mypyc_attr(allow_interpreted_subclasses=True)
class HolePool(BlockPool):
    """``BlockPool`` whose lookup reuses every cached block of a request's chain."""

    def _match(self, ids: np.ndarray, num_tokens: int, grown: bool = False) -> np.ndarray:
        """First cached copy per block up to the last cached one within the cap (-1: a
        hole)."""
        cap = min(len(ids), (num_tokens - 1) // self.block_size)
        if cap <= 0:
            return ids[:0]
        f = self._ids.firsts(ids[:cap], grown)
        hit = np.flatnonzero(f >= 0)
        return f[: int(hit[-1]) + 1] if len(hit) else f[:0]

    def lookup(self, ids: np.ndarray, num_tokens: int) -> int:
        """Cached blocks the request would reuse: every one of its chain up to the cap, past
        holes. Read-only."""
        return int(np.count_nonzero(self._match(np.asarray(ids, np.int64), num_tokens) >= 0))

    def holes(self, ids: np.ndarray, num_tokens: int) -> int:
        """Missing blocks before the request's last cached one (what it would refill)."""
        f = self._match(np.asarray(ids, np.int64), num_tokens)
        return int(np.count_nonzero(f < 0))

    def admit(self, rid: int, ids: np.ndarray, num_tokens: int, num_new_tokens: int, *,
              full_sequence_must_fit: bool = True) -> int | None:
        """``BlockPool.admit`` over the patched lookup. ``num_new_tokens``: tokens this step
        may compute (hole refills first, in position order, then new tokens). Holes get
        fresh blocks now, the reused blocks after them are touched with the prefix. Returns
        the prefix hit in blocks (the request computes from there, skipping what it reused:
        ``span``), or None when it does not fit (nothing changed)."""
        if rid in self._seqs:
            raise ValueError(f"request {rid} is already running")
        if num_tokens < 1 or num_new_tokens < 1:
            raise ValueError(f"request {rid}: num_tokens and num_new_tokens must be >= 1")
        ids = np.asarray(ids, np.int64)
        self._ids.grow(ids)
        bs = self.block_size
        f = self._match(ids, num_tokens, grown=True)
        hit = f >= 0
        hits = f[hit]
        reach = len(f)  # blocks up to the last cached one
        h = int(np.argmin(hit)) if not hit.all() else reach
        reused = reused_runs(hit)
        n, _cost = span(reused, bs, h * bs, num_tokens, num_new_tokens)
        end = h * bs + n
        self._check_ids(rid, end, ids)
        refs = self._ref[hits]
        idle = refs == 0
        evictable = int(np.count_nonzero(idle))
        free = len(self._queue)
        if full_sequence_must_fit and max(_cdiv(num_tokens, bs) - len(hits), 0) + evictable > free:
            return None
        blocks = max(reach, _cdiv(end, bs))
        n_new = blocks - len(hits)
        if n_new + evictable > free:
            return None
        if evictable:  # touch: out of the free queue
            self._queue.remove(hits[idle])
        self._ref[hits] = refs + 1
        fresh = self._pop(n_new)
        self._ref[fresh] = 1
        table = np.empty(blocks, np.int64)
        at = np.zeros(blocks, bool)
        at[:reach] = hit
        table[at] = hits
        table[~at] = fresh
        seq = _PatchedSeq(ids, table, end, h, reused)
        self._seqs[rid] = seq
        self._cache(seq)
        if self.debug:
            self.check()
        return h

    def _loaded_seq(self, ids: np.ndarray, table: np.ndarray, computed: int,
                    cached: int) -> _Seq:
        return _PatchedSeq(ids, table, computed, cached, [])  # loaded: nothing past a hole

    def span(self, rid: int, start: int, end: int, budget: int) -> tuple[int, int]:
        """(positions, tokens to compute) of running request ``rid``'s next chunk from
        ``start`` within ``budget`` (module ``span``)."""
        seq = cast(_PatchedSeq, self._seqs[rid])
        return span(seq.reused, self.block_size, start, end, budget)

    def computed_ranges(self, rid: int, start: int, stop: int) -> Runs:
        """Token ranges of ``[start, stop)`` that request ``rid`` computes (not reused)."""
        seq = cast(_PatchedSeq, self._seqs[rid])
        return computed_ranges(seq.reused, self.block_size, start, stop)

    def reuse_of(self, rid: int) -> tuple[int, Runs]:
        """(prefix hit, reused runs) of running request ``rid`` at its admission, in
        blocks."""
        seq = cast(_PatchedSeq, self._seqs[rid])
        return seq.prefix, list(seq.reused)

    def _unhashed(self, seq: _Seq, a: int, b: int) -> Runs:
        """Blocks ``[a, b)`` except the reused ones (they hold their ids already)."""
        return computed_ranges(getattr(seq, "reused", []), 1, a, b)

    def check(self) -> None:
        super().check()
        for seq in self._seqs.values():
            for a, b in getattr(seq, "reused", ()):
                assert np.array_equal(self._bid[seq.table[a:b]], seq.ids[a:b]), (
                    "a reused block lost its id")
