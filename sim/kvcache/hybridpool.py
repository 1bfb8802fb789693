"""vLLM's hybrid KV cache (``HybridKVCacheCoordinator`` over per-group managers), block for
block: full-attention, sliding-window and Mamba (state) groups sharing one block pool.

The full-attention path (one group) is ``blockpool.BlockPool``; this module is used only when
a model has several KV cache groups (docs/hybrid.md). It models vLLM 0.33/0.34's
``vllm/v1/core/kv_cache_coordinator.py`` (``HybridKVCacheCoordinator``),
``single_type_kv_cache_manager.py`` (``FullAttentionManager``, ``SlidingWindowManager``,
``MambaManager`` in ``mamba_cache_mode="align"``: the Mamba rules are docs/hybrid.md's) and
``block_pool.py`` with the same state, so every observable (hits, admission, which physical
block each group gets, the free-queue order, what a lookup evicts) equals the real code's,
proven op by op by tests/test_vllm_hybrid_diff.py (benchmarks/vllm_hybrid_ref.py drives the
real coordinator). docs/hybrid.md ("vLLM's hybrid cache in kvsim") explains it for users.

State::

    physical blocks 1..capacity, shared by every group (0 is vLLM's null block)
      bid[p]  kvsim id of the block's hash (-1: none), grp[p] the group that hash is for
      ref[p]  holds by running requests
    free queue   one for all groups (``freequeue.FreeQueue``): unhashed front, hashed tail
    hash maps    one ``CachedIds`` per group: vLLM keys a cached block by (hash, group id)
    request      per group a block table (0 = null: a sliding group's blocks outside the
                 window), its cached count (vLLM's ``num_cached_block``), computed tokens

Protocol, as vLLM's ``KVCacheManager`` runs it for a hybrid model (hash block = block size =
scheduler block size, no EAGLE, dense retention):

``lookup``  ``find_longest_cache_hit``: the groups of one spec are looked up together (a
            block hits only if cached in each); full attention first (the longest run of
            cached blocks from the start), then every other spec with the candidate length as
            its bound, until the length stops shrinking (one pass when the model is full +
            one other spec). A sliding group of window ``w`` hits at block ``i`` when the
            ``cdiv(w - 1, bs)`` blocks ending there are cached (searched from the right); the
            blocks before them are null. With fewer than that, only a run from the start hits.
``admit``   ``allocate_slots`` for a waiting request: capacity (per group ``cdiv(tokens, bs)``
            minus ``max(skipped, hit)`` blocks, plus the hit's blocks in the free queue;
            ``full_sequence_must_fit`` checks the whole prompt first, a sliding group capped at
            ``cdiv(w - 1 + max_in_flight_tokens, bs) + 1`` blocks), then per group in order:
            touch the hit past the window, pad with nulls, then per group in order pop new
            blocks, then cache each group's newly full blocks (nulls skipped).
``extend``  ``allocate_slots`` for a running request: first each sliding group frees the
            blocks wholly outside the window of the tokens computed so far (from the last
            one back to the first null: ``remove_skipped_blocks``; this happens even when the
            allocation is then refused), then capacity, then blocks per group, then caching.
``admit_remote``  a KV connector's load (a disaggregated decode worker): ``allocate_slots``
            with the tokens past the local hit external and caching delayed to
            ``cache_known``; each group allocates only what it keeps of the loaded tokens (a
            sliding group its window, a Mamba group one block for the last token's state).
``free``    per group in order: its blocks (leading nulls dropped) freed tail first.

Another release order (``free_order``, policies/eviction.py ``ReleaseOrder``; ``penelope``:
the front of the private history first) frees by POSITION: the order ranks the request's block
positions (``shared`` marks those up to the deepest block of the first full-attention group
with two or more cached continuations or another holder, as ``blockpool.BlockPool``), and the
blocks of one position leave together, in group order (nulls skipped), so an eviction opens a
position range missing in every group: a hole (docs/hybrid.md "Penelope on vLLM's hybrid
pool"). vLLM's own order stays group by group, as the real coordinator frees: the order says
which (policies/eviction.py ``ReleaseOrder.release_groups``).

Speed: each operation is a handful of numpy calls per group on the request's blocks (the
sliding lookup is one windowed sum over the bounded prefix); a block edge's few blocks (a
decode step's new block per group, the one its window leaves) are written, hashed and freed
one by one in the tables' buffers, where a numpy call would cost more than the work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from mypy_extensions import mypyc_attr

from policies.eviction import ReleaseOrder, get_free_order

from .blockpool import shared_positions
from .cachedids import CachedIds
from .events import EVENT_KINDS, KVEvent, KVEventQueue
from .freequeue import FreeQueue

# ``a.max()`` without ndarray.max's Python-level wrapper
_umax = np.maximum.reduce
# blocks a block edge moves at most (one per group): handled one by one, where numpy's
# per-call cost is more than the work
_FEW = 8

__all__ = ["FULL", "MAMBA", "SLIDING", "HybridGroup", "HybridPool", "WideBlocks"]

FULL = "full"
SLIDING = "sliding"
MAMBA = "mamba"  # a recurrent state per block edge (MambaManager, mamba_cache_mode "align")


@dataclass(frozen=True)
class HybridGroup:
    """One KV cache group as vLLM's coordinator sees it: its kind and (sliding) window."""

    kind: str
    window: int = 0

    def __post_init__(self) -> None:
        if self.kind not in (FULL, SLIDING, MAMBA):
            raise ValueError(f"KV cache group kind must be {FULL!r}, {SLIDING!r} or {MAMBA!r},"
                             f" got {self.kind!r}")
        if self.kind == SLIDING and self.window < 1:
            raise ValueError(f"a sliding KV cache group needs a window >= 1, got {self.window}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _HSeq:
    """One request: ids of every full block it will have, per group its table, cached count
    and leading nulls (a table's nulls are always its head: a hit's skipped blocks, then the
    blocks its window left), its computed and known tokens.

    The tables are one length (``length``; a KV connector's load evens them out before it
    returns) and live at the head of per-group buffers sized for every block the request
    can have, zero past ``length``: a block edge writes a block in place instead of
    building a new table, and a Mamba group's nulls before its new state are there
    already."""

    __slots__ = ("allocated", "cached", "computed", "ids", "known", "last_state", "length",
                 "nulls", "pruned", "retired", "states", "tables")

    def __init__(self, ids: np.ndarray, tables: list[np.ndarray], computed: int,
                 nulls: list[int]) -> None:
        size = len(ids) + 1  # a request's tokens end within its ids' blocks and one more
        self.ids = ids
        self.tables: list[np.ndarray] = []
        for t in tables:
            buf = np.zeros(max(size, len(t)), np.int64)
            buf[: len(t)] = t
            self.tables.append(buf)
        self.length = max((len(t) for t in tables), default=0)
        self.computed = computed
        self.known = computed
        self.cached = [len(t) for t in tables]
        self.nulls = nulls
        # Mamba groups (MambaManager, align): allocated once (_allocated_block_reqs), blocks
        # before this retired (_num_retired_blocks), the previous step's state block
        # (last_state_block_idx)
        self.allocated = False
        self.retired: dict[int, int] = {}
        self.last_state: dict[int, int] = {}
        # the block of the last processed token when Mamba states were last retired: until
        # it moves, retiring finds nothing (``_remove_skipped``)
        self.pruned = -1
        # the Mamba groups' held states past the retired ones (``HybridPool._live_states``):
        # their positions and per position each Mamba group's block; None once a Mamba
        # table changed
        self.states: tuple[list[int], list[list[int]]] | None = None

    def reserve(self, length: int) -> None:
        """Room for tables of ``length`` blocks (past the ids' blocks only if a caller
        computes more tokens than the ids cover, which the pool refuses first)."""
        if length > len(self.tables[0]):
            grown = []
            for t in self.tables:
                buf = np.zeros(2 * length, np.int64)
                buf[: len(t)] = t
                grown.append(buf)
            self.tables = grown

    def table(self, g: int) -> np.ndarray:
        """Group ``g``'s table (a view of its buffer)."""
        return self.tables[g][: self.length]


class _Fit:
    """One request of a decode run being fitted (``HybridPool.decode_fit``): its computed
    tokens and table length, its Mamba states still held ({position: block per Mamba
    group}, -1 for one allocated in the run) and the position of the previous step's state
    (-1: none), per sliding group the first position its window still holds and the blocks
    it may leave (``window_blocks[k][j - window_base[k]]`` at position ``j``), and the holds
    on each of these blocks before the run."""

    __slots__ = ("computed", "done", "held", "last", "length", "refs", "window_base",
                 "window_blocks")

    def __init__(self, computed: int, length: int) -> None:
        self.computed = computed
        self.length = length
        self.held: dict[int, list[int]] = {}
        self.last = -1
        self.done: list[int] = []
        self.window_base: list[int] = []
        self.window_blocks: list[list[int]] = []
        self.refs: dict[int, int] = {}


@mypyc_attr(allow_interpreted_subclasses=True)  # tests/diffkit.py shadows it
class HybridPool:
    """vLLM's hybrid KV cache: several groups over one block pool (module doc)."""

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int,
        groups: Sequence[HybridGroup],
        *,
        max_in_flight_tokens: int | None = None,
        free_order: str | ReleaseOrder = "vllm",
        debug: bool = False,
    ) -> None:
        if capacity_blocks < 1 or block_size < 1:
            raise ValueError(f"capacity_blocks and block_size must be >= 1, got "
                             f"{capacity_blocks}, {block_size}")
        if len(groups) < 2:
            raise ValueError("a hybrid pool needs two or more KV cache groups "
                             "(one group: sim.kvcache.blockpool.BlockPool)")
        self.capacity_blocks = int(capacity_blocks)
        self.block_size = bs = int(block_size)
        self.groups = tuple(groups)
        self.debug = debug
        n = self.capacity_blocks + 1
        self._bid = np.full(n, -1, np.int64)
        self._grp = np.full(n, -1, np.int8)
        self._ref = np.zeros(n, np.int32)
        self._queue = FreeQueue(self.capacity_blocks)
        self.free_order = get_free_order(free_order)
        fulls = [g for g, grp in enumerate(self.groups) if grp.kind == FULL]
        if self.free_order.reads_shared and not fulls:
            raise ValueError(f"free order {self.free_order.name!r} reads a full-attention "
                             "group's shared prefix: these KV cache groups have none")
        # KV events and the shared prefix read the first full-attention group: the history
        # itself (a window group's blocks leave with the window anyway)
        self._event_group = fulls[0] if fulls else 0
        self._maps = [CachedIds(children=self.free_order.reads_shared
                                and g == self._event_group) for g in range(len(self.groups))]
        # the last ``_find`` (its ids, bound, the maps' version, its answer): a scheduler's
        # lookup and the admission after it ask the same of the same maps
        self._version = 0
        self._found: tuple[np.ndarray, int, int, Any] | None = None
        self._seqs: dict[int, _HSeq] = {}
        # per group: the window's contiguous blocks a hit needs (0: full attention) and the
        # admission cap (SlidingWindowSpec.max_admission_blocks_per_request; None: no cap)
        self._need = [_cdiv(g.window - 1, bs) if g.kind == SLIDING else 0 for g in self.groups]
        self._cap: list[int | None] = [
            _cdiv(g.window - 1 + max_in_flight_tokens, bs) + 1
            if g.kind == SLIDING and max_in_flight_tokens is not None else None
            for g in self.groups]
        # vLLM's attention groups: groups of one spec looked up together, full first (a
        # stable sort, as verify_and_split_kv_cache_groups)
        specs: dict[HybridGroup, list[int]] = {}
        for i, g in enumerate(self.groups):
            specs.setdefault(g, []).append(i)
        self._specs = sorted(specs.items(), key=lambda s: s[0].kind != FULL)
        self._sliding = [g for g, grp in enumerate(self.groups) if grp.kind == SLIDING]
        self._sliding_windows = [self.groups[g].window for g in self._sliding]
        self._mamba = [g for g, grp in enumerate(self.groups) if grp.kind == MAMBA]
        self._pruned = [g for g, grp in enumerate(self.groups) if grp.kind != FULL]
        # Mamba: ids a request cached this step; a hit on one waits a step (new_step)
        self._this_step: dict[int, set[int]] = {g: set() for g in self._mamba}
        self._simple = len(self._specs) == 2 and self._specs[0][0].kind == FULL
        self._cached = 0
        self._dropped = 0
        self._lost = 0
        self._events: KVEventQueue | None = None

    # ------------------------------------------------------------------ KV events
    def enable_events(self, clock: Callable[[], Any] | None = None,
                      kinds: Iterable[type] | None = None) -> None:
        """Report KV events from now on (``BlockPool.enable_events``): an id cached in the
        first full-attention group is stored (its parent the id before it), an id whose last
        copy there a pop dropped is removed."""
        if self._events is None:
            self._events = KVEventQueue(clock, kinds)
        else:
            self._events.want(EVENT_KINDS if kinds is None else kinds)

    def take_events(self) -> list[tuple[Any, KVEvent]]:
        return self._events.take() if self._events is not None else []

    # ------------------------------------------------------------------ counters
    @property
    def free_blocks(self) -> int:
        return len(self._queue)

    @property
    def cached_blocks(self) -> int:
        return self._cached

    @property
    def used_blocks(self) -> int:
        return self.capacity_blocks - self.free_blocks

    @property
    def evicted_blocks(self) -> int:
        """Cached blocks whose hash allocation dropped so far (any group)."""
        return self._dropped

    @property
    def lost_blocks(self) -> int:
        """Of ``evicted_blocks``, the last cached copy of an id in a full-attention group (the
        history itself; a sliding group's blocks leave with its window anyway)."""
        return self._lost

    def running(self) -> list[int]:
        return list(self._seqs)

    def blocks_for(self, tokens: int) -> int:
        """Blocks one request of ``tokens`` tokens may hold at once over every group: all of
        its blocks in a full group, at most the admission cap in a sliding one, two in a
        Mamba one (its state and the previous step's: ``MambaSpec.max_memory_usage_bytes``
        in align mode)."""
        n = _cdiv(tokens, self.block_size)
        return sum(min(n, 2) if g.kind == MAMBA else n if cap is None else min(n, cap)
                   for g, cap in zip(self.groups, self._cap, strict=True))

    def computed_tokens(self, rid: int) -> int:
        return self._seqs[rid].computed

    def cached_of(self, rid: int) -> int:
        """Blocks of running request ``rid`` cached so far (from its first), in positions."""
        return min(self._seqs[rid].cached)

    def blocks_to_grow(self, rid: int, num_tokens: int) -> int:
        """Blocks request ``rid`` must still allocate, over all groups, to hold ``num_tokens``
        tokens (``get_num_blocks_to_allocate`` for a running request)."""
        need = _cdiv(num_tokens, self.block_size)
        return max(need - self._seqs[rid].length, 0) * len(self.groups)

    # ------------------------------------------------------------------ lookup
    def _firsts(self, gids: list[int], ids: np.ndarray) -> np.ndarray:
        """Per group of ``gids`` (rows): each id's first cached copy (-1: none). ``ids``
        were grown (``_grow``: every lookup grows its ids first), so no map checks them."""
        if len(gids) == 1:  # np.stack's Python-level wrapper costs more than the gather
            return self._maps[gids[0]].firsts(ids, True).reshape(1, -1)
        return np.stack([self._maps[g].firsts(ids, True) for g in gids])

    def _find(self, ids: np.ndarray, max_len: int) -> tuple[list[np.ndarray], int]:
        """``find_longest_cache_hit``: per group its hit blocks (0 = null), the hit tokens.
        Read-only, and asked again of unchanged maps (the same ``ids`` array and bound) it
        answers from the last call (its arrays are never written)."""
        found = self._found
        if (found is not None and found[0] is ids and found[1] == max_len
                and found[2] == self._version):
            return found[3]
        bs = self.block_size
        hit_blocks: list[np.ndarray | None] = [None] * len(self.groups)
        hit_len = [0] * len(self.groups)
        hit_length = max_len
        while True:
            curr = hit_length
            for spec, gids in self._specs:
                g0 = gids[0]
                if spec.kind == FULL and hit_blocks[g0] is not None:
                    curr = min(curr, hit_len[g0])
                    continue
                if spec.kind == FULL:
                    f = self._firsts(gids, ids[: min(len(ids), curr // bs)])
                    ok = cast(np.ndarray, (f >= 0).all(axis=0))
                    n = int(ok.argmin()) if not ok.all() else len(ok)
                    blocks = f[:, :n]
                elif spec.kind == MAMBA:  # the rightmost cached state: nulls before it
                    f = self._firsts(gids, ids[: min(len(ids), curr // bs)])
                    held: np.ndarray = np.flatnonzero((f >= 0).all(axis=0))
                    n = int(held[-1]) + 1 if len(held) else 0
                    blocks = np.zeros((len(gids), n), np.int64)
                    if n:
                        blocks[:, -1] = f[:, n - 1]
                else:
                    blocks, n = self._find_sliding(gids, ids, curr // bs, self._need[g0])
                curr = n * bs
                for row, g in enumerate(gids):
                    hit_blocks[g] = blocks[row]
                    hit_len[g] = curr
            if curr >= hit_length:
                break
            hit_length = curr
            if self._simple:
                break
        keep = _cdiv(hit_length, bs)
        out = [np.zeros(0, np.int64) if b is None else b for b in hit_blocks]
        for spec, gids in self._specs:
            if spec.kind == FULL:
                for g in gids:
                    out[g] = out[g][:keep]
        self._found = (ids, max_len, self._version, (out, hit_length))
        return out, hit_length

    def _find_sliding(self, gids: list[int], ids: np.ndarray, max_blocks: int,
                      need: int) -> tuple[np.ndarray, int]:
        """``SlidingWindowManager.find_longest_cache_hit``: the rightmost run of ``need``
        cached blocks ending within ``max_blocks`` (nulls before it), else the run from the
        start. Returns (blocks per group, hit blocks)."""
        max_blocks = min(max_blocks, len(ids))
        if max_blocks <= 0:
            return np.zeros((len(gids), 0), np.int64), 0
        f = self._firsts(gids, ids[:max_blocks])
        ok = cast(np.ndarray, (f >= 0).all(axis=0))
        need = max(need, 1)  # a one-token window: vLLM matches at the first cached block
        if ok.sum() >= need:
            c = np.concatenate([[0], np.cumsum(ok)])
            starts = np.flatnonzero(c[need:] - c[:-need] == need)
            if len(starts):
                i = int(starts[-1])
                n = i + need
                blocks = np.zeros((len(gids), n), np.int64)
                blocks[:, i:] = f[:, i:n]
                return blocks, n
        n = int(ok.argmin()) if not ok.all() else len(ok)
        return f[:, :n], n

    def lookup(self, ids: np.ndarray, num_tokens: int) -> int:
        """The hit in blocks (every group can serve it), capped at ``num_tokens - 1``
        tokens. Read-only."""
        ids = np.asarray(ids, np.int64)
        self._grow(ids)
        return self._find(ids, num_tokens - 1)[1] // self.block_size

    def gpu_prefix_blocks(self, ids: np.ndarray) -> int:
        """Blocks of ``ids`` a lookup would hit now, with no cap (read only)."""
        ids = np.asarray(ids, np.int64)
        return self.lookup(ids, ids.size * self.block_size + 1)

    def resident_prefix_blocks(self, ids: np.ndarray) -> int:
        return self.gpu_prefix_blocks(ids)

    # ------------------------------------------------------------------ protocol
    def _skipped_blocks(self, g: int, tokens: int) -> int:
        """Whole blocks before group ``g``'s window at ``tokens`` computed tokens
        (``get_num_skipped_tokens // block_size``; Mamba keeps the last token's state)."""
        kind = self.groups[g].kind
        if kind == SLIDING:
            return max(0, tokens - self.groups[g].window + 1) // self.block_size
        if kind == MAMBA:
            return max(0, tokens - 1) // self.block_size
        return 0

    def _leading_nulls(self, g: int, blocks: np.ndarray) -> int:
        """The nulls at the head of group ``g``'s hit ``blocks`` past its skipped ones (a
        full-attention group's hit is cached blocks from the first: none)."""
        if self.groups[g].kind == FULL:
            return 0
        nz = np.flatnonzero(blocks)
        return int(nz[0]) if len(nz) else len(blocks)

    def _hit_taken(self, g: int, hit: np.ndarray, computed: int) -> int:
        """Of group ``g``'s hit past the blocks skipped at ``computed`` tokens, the blocks a
        touch takes out of the free queue (``get_num_blocks_to_allocate``'s evictable hit
        blocks); -1 for a Mamba group whose hit state was cached this step (the hit waits a
        step). What ``_to_allocate`` reads of the pool, read once for its calls."""
        if self.groups[g].kind == MAMBA:  # a Mamba hit is nulls, then its state
            last = int(hit.item(len(hit) - 1)) if len(hit) else 0
            if not last:
                return 0
            if int(self._bid.item(last)) in self._this_step[g]:
                return -1
            return 1 if int(self._ref.item(last)) == 0 else 0
        rest = hit[self._skipped_blocks(g, computed):]
        return int(np.count_nonzero((rest > 0) & (self._ref[rest] == 0)))

    def _to_allocate(self, g: int, num_tokens: int, hit_blocks: int, computed: int,
                     cap: bool, taken: int) -> int:
        """``get_num_blocks_to_allocate`` of group ``g`` for a waiting request whose hit in
        that group is ``hit_blocks`` long, of which ``taken`` leave the free queue
        (``_hit_taken``)."""
        need = _cdiv(num_tokens, self.block_size)
        if self.groups[g].kind == MAMBA:  # one state block a step; a fresh hit waits a step
            if taken < 0:
                return self.capacity_blocks + 2
            return min(need - hit_blocks, 1) + taken
        most = self._cap[g]
        if cap and most is not None:
            need = min(need, most)
        skipped = self._skipped_blocks(g, computed)
        return max(need - max(skipped, hit_blocks), 0) + taken

    def admit(
        self,
        rid: int,
        ids: np.ndarray,
        num_tokens: int,
        num_new_tokens: int,
        *,
        full_sequence_must_fit: bool = True,
    ) -> int | None:
        """Schedule waiting request ``rid``: look up, then allocate slots for
        ``num_new_tokens`` tokens after the hit (module doc). Returns the hit in blocks, or
        None when it does not fit (nothing changed)."""
        if rid in self._seqs:
            raise ValueError(f"request {rid} is already running")
        if num_tokens < 1 or num_new_tokens < 1:
            raise ValueError(f"request {rid}: num_tokens and num_new_tokens must be >= 1")
        ids = np.asarray(ids, np.int64)
        self._grow(ids)
        bs = self.block_size
        hits, hit_tokens = self._find(ids, num_tokens - 1)
        new = min(num_new_tokens, num_tokens - hit_tokens)
        end = hit_tokens + new
        if end // bs > len(ids):
            raise ValueError(f"request {rid}: {end} tokens computed but ids cover only "
                             f"{len(ids)} blocks")
        free = len(self._queue)
        groups = range(len(self.groups))
        taken = [self._hit_taken(g, hits[g], hit_tokens) for g in groups]
        if full_sequence_must_fit and sum(
                self._to_allocate(g, num_tokens, len(hits[g]), hit_tokens, True, taken[g])
                for g in groups) > free:
            return None
        if sum(self._to_allocate(g, end, len(hits[g]), hit_tokens, False, taken[g])
               for g in groups) > free:
            return None
        tables = []
        nulls = []
        for g in groups:  # touch every group's hit before any allocation (vLLM #33775)
            skipped = self._skipped_blocks(g, hit_tokens)
            rest = hits[g][skipped:]
            self._touch(rest)
            tables.append(np.concatenate([np.zeros(skipped, np.int64), rest])
                          if skipped else rest)
            nulls.append(skipped + self._leading_nulls(g, rest))
        seq = _HSeq(ids, tables, end, nulls)
        self._seqs[rid] = seq
        self._allocate(seq, end)
        self._cache(seq)
        if self.debug:
            self.check()
        return hit_tokens // bs

    def extend(self, rid: int, num_new_tokens: int, known: int | None = None,
               in_flight: int = 0) -> bool:
        """Slots for ``num_new_tokens`` more tokens of running request ``rid``: sliding groups
        first free the blocks outside the window of its processed tokens (computed less the
        ``in_flight`` ones of steps not yet processed; even when the allocation is then
        refused), then blocks are allocated and the full ones cached (up to ``known`` tokens
        when given). False when the free queue is too short."""
        seq = self._seqs[rid]
        if num_new_tokens < 1:
            raise ValueError(f"request {rid}: num_new_tokens must be >= 1")
        self._remove_skipped(seq, seq.computed - in_flight)
        computed = seq.computed + num_new_tokens
        if computed // self.block_size > len(seq.ids):
            raise ValueError(f"request {rid}: {computed} tokens computed but ids cover only "
                             f"{len(seq.ids)} blocks")
        need = _cdiv(computed, self.block_size) - seq.length
        if need > 0 and self._grow_blocks(need) > len(self._queue):
            if self.debug:
                self.check()
            return False
        self._allocate(seq, computed)
        seq.computed = computed
        seq.known = computed if known is None else max(seq.known, min(computed, known))
        self._cache(seq)
        if self.debug:
            self.check()
        return True

    # ------------------------------------------------------------------ decode runs
    # A decode run is ``steps`` V1 steps in which every request of ``rids`` (in schedule
    # order) gets one token: per step and request, ``remove_skipped_blocks`` on the processed
    # tokens (``in_flight`` fewer than computed), one slot, and the blocks known full cached
    # (``lag`` tokens behind the computed ones: async scheduling learns a token a step after
    # computing it). Only the steps where a request crosses a block edge change the pool (a
    # block to allocate, one leaving a window, a Mamba state retired, one to cache), so only
    # those are applied, in step and schedule order: per block, not per token.
    def _edges(self, rids: list[int], steps: int, in_flight: int,
               lag: int) -> list[tuple[int, int]]:
        """(step, request index) of every step 1..``steps`` that changes the pool, sorted."""
        bs = self.block_size
        windows = set(self._sliding_windows)
        out: list[tuple[int, int]] = []
        for i, rid in enumerate(rids):
            c0 = self._seqs[rid].computed  # step t allocates token c0 + t - 1
            ts = {1}
            ts.update(range((1 - c0) % bs or bs, steps + 1, bs))  # c0 + t - 1 = 0 mod bs
            ts.update(range((lag - c0) % bs or bs, steps + 1, bs))  # c0 + t - lag = 0 mod bs
            for w in windows:  # processed c0 + t - 1 - in_flight - w + 1 = 0 mod bs
                ts.update(range((w + in_flight - c0) % bs or bs, steps + 1, bs))
            if self._mamba:  # processed c0 + t - 1 - in_flight = 1 mod bs: states retire
                ts.update(range((2 + in_flight - c0) % bs or bs, steps + 1, bs))
            out.extend((t, i) for t in ts if t <= steps)
        out.sort()
        return out

    def decode_fit(self, rids: list[int], steps: int, in_flight: int = 0,
                   ceiling: int | None = None) -> int:
        """The most steps (<= ``steps``) of a decode run of ``rids`` whose allocations all
        succeed (read-only: free blocks counted, window and retired Mamba state frees
        included; a block several requests hold is free after its last holder's) and, with
        a ``ceiling``, after each of which at most ``ceiling`` blocks are free (a refused
        waiting request is retried after each step's running rows: more free blocks than
        its refusal saw may admit it, which only a step of its own can tell)."""
        if steps <= 0:
            return 0
        bs, free, ngroups = self.block_size, len(self._queue), len(self.groups)
        nmamba = len(self._mamba)
        step = 0  # the step whose edges are being counted
        pending: dict[int, int] = {}  # block -> holds the run has released
        fits = [self._fit(self._seqs[rid], steps, in_flight) for rid in rids]
        for t, i in self._edges(rids, steps, in_flight, 0):
            if t != step:
                if ceiling is not None and free > ceiling:
                    return max(step - 1, 0)
                step = t
            fit = fits[i]
            length = fit.length
            c = fit.computed + t - 1
            processed = c - in_flight
            if nmamba:  # ``_remove_skipped``'s state frees, counted
                held = fit.held
                n = min(max(0, processed - 1) // bs, length)
                gone = [j for j in held if j < n]
                last = fit.last
                if last >= n and last < _cdiv(processed, bs) - 1 and last in held:
                    gone.append(last)
                for j in gone:
                    for p in held.pop(j):
                        if p < 0:  # allocated during the run: held by this one only
                            free += 1
                            continue
                        d = pending.get(p, 0) + 1
                        pending[p] = d
                        if fit.refs[p] == d:
                            free += 1
            for k, window in enumerate(self._sliding_windows):
                n = min(max(0, processed - window + 1) // bs, length)
                done = fit.done[k]
                if n <= done:
                    continue
                blocks, base = fit.window_blocks[k], fit.window_base[k]
                for j in range(done, n):
                    if j - base >= len(blocks):  # allocated during the run: this one's only
                        free += 1
                        continue
                    p = blocks[j - base]
                    d = pending.get(p, 0) + 1
                    pending[p] = d
                    if fit.refs[p] == d:
                        free += 1
                fit.done[k] = n
            if c % bs == 0:  # one block per group
                if free < ngroups:
                    return t - 1
                free -= ngroups
                fit.length = length + 1
                if nmamba:  # the new state at the end; the one before is "last"
                    fit.last = length - 1
                    fit.held[length] = [-1] * nmamba
        if ceiling is not None and free > ceiling:
            return max(step - 1, 0)
        return steps

    def _fit(self, seq: _HSeq, steps: int, in_flight: int) -> _Fit:
        """``decode_fit``'s view of ``seq`` at the start of a run of ``steps``: its Mamba
        states held past the retired ones, per sliding group the blocks its window may
        leave in the run, and the holds on each of them now."""
        fit = _Fit(seq.computed, seq.length)
        mine: list[int] = []
        if self._mamba:
            positions, states = self._live_states(seq)
            fit.held = dict(zip(positions, states, strict=True))
            last = seq.last_state.get(self._mamba[0])
            fit.last = -1 if last is None else last
            for state in states:
                mine.extend(state)
        processed = seq.computed + steps - 1 - in_flight  # the run's last
        for g, window in zip(self._sliding, self._sliding_windows, strict=True):
            base = seq.nulls[g]
            table = seq.tables[g]
            hi = min(max(0, processed - window + 1) // self.block_size, seq.length)
            blocks: list[int] = table[base:hi].tolist() if hi > base else []
            fit.done.append(base)
            fit.window_base.append(base)
            fit.window_blocks.append(blocks)
            mine.extend(blocks)
        if mine:
            fit.refs = dict(zip(mine, self._ref[mine].tolist(), strict=True))
        return fit

    def _live_states(self, seq: _HSeq) -> tuple[list[int], list[list[int]]]:
        """``seq``'s held Mamba states past the retired ones (``decode_fit``'s model of
        ``_remove_skipped``): their positions and per position each Mamba group's block.
        The Mamba tables share their nulls and retire together, so the positions are the
        first one's; kept until a Mamba table changes (``seq.states``)."""
        states = seq.states
        if states is None:
            first = seq.tables[self._mamba[0]]
            lo = seq.retired.get(self._mamba[0], 0)
            pos = lo + np.flatnonzero(first[lo : seq.length])
            per_group = [seq.tables[g][pos].tolist() for g in self._mamba]
            states = (pos.tolist(), [list(b) for b in zip(*per_group, strict=True)])
            seq.states = states
        return states

    def decode_run(self, rids: list[int], steps: int, in_flight: int = 0,
                   lag: int = 0) -> None:
        """Apply a decode run of ``steps`` steps to ``rids`` (``decode_fit`` promised them)."""
        if steps <= 0:
            return
        seqs = [self._seqs[rid] for rid in rids]
        c0 = [s.computed for s in seqs]
        for t, i in self._edges(rids, steps, in_flight, lag):
            seq = seqs[i]
            c = c0[i] + t - 1
            self._remove_skipped(seq, c - in_flight)
            need = _cdiv(c + 1, self.block_size)
            if seq.length < need:
                if (need - seq.length) * len(self.groups) > len(self._queue):
                    raise AssertionError(f"decode run: request {rids[i]} step {t} does not fit")
                self._allocate(seq, c + 1)
            seq.computed = c + 1
            seq.known = max(seq.known, c + 1 - lag)
            self._cache(seq)
        for seq, c in zip(seqs, c0, strict=True):
            seq.computed = c + steps
            seq.known = max(seq.known, c + steps - lag)
        if self.debug:
            self.check()

    def admit_remote(self, rid: int, ids: np.ndarray, num_tokens: int,
                     reserved: int = 0) -> int | None:
        """``allocate_slots`` for waiting request ``rid`` whose first ``num_tokens`` tokens a KV
        connector loads (``num_external_computed_tokens``, ``delay_cache_blocks``;
        ``BlockPool.admit_remote``): every group's local hit past its window is touched, then
        each group in order allocates for the loaded tokens: a sliding group only its window's
        blocks (``allocate_external_computed_blocks``), nulls before. A Mamba group keeps only
        the last token's state (``get_num_skipped_tokens``: every local hit block is skipped,
        none touched): nulls, then one block for the loaded state at the prompt's last block,
        which its next new block makes ``last_state``; a local state hit cached this step
        refuses it, as ``admit``. Nothing is cached until ``cache_known``. Fits when the free
        blocks less ``reserved`` hold it; returns the local hit in blocks, or None (nothing
        changed)."""
        if rid in self._seqs:
            raise ValueError(f"request {rid} is already running")
        if num_tokens < 1:
            raise ValueError(f"request {rid}: num_tokens must be >= 1")
        ids = np.asarray(ids, np.int64)
        self._grow(ids)
        bs = self.block_size
        if num_tokens // bs > len(ids):
            raise ValueError(f"request {rid}: {num_tokens} tokens computed but ids cover only "
                             f"{len(ids)} blocks")
        hits, hit_tokens = self._find(ids, num_tokens - 1)
        groups = range(len(self.groups))
        if sum(self._to_allocate(g, num_tokens, len(hits[g]), num_tokens, False,
                                 self._hit_taken(g, hits[g], num_tokens))
               for g in groups) > len(self._queue) - reserved:
            return None
        tables, nulls = [], []
        for g in groups:  # every group's hit touched before any allocation (vLLM #33775)
            skipped = self._skipped_blocks(g, num_tokens)
            rest = hits[g][skipped:]
            self._touch(rest)
            tables.append(np.concatenate([np.zeros(skipped, np.int64), rest]))
            nulls.append(skipped + self._leading_nulls(g, rest))
        cached = [len(t) for t in tables]
        need = _cdiv(num_tokens, bs)
        for g, t in enumerate(tables):  # each group to the prompt's last block
            n = need - len(t)
            if n > 0:
                fresh = self._pop(n)
                self._ref[fresh] = 1
                tables[g] = np.concatenate([t, fresh])
        seq = _HSeq(ids, tables, num_tokens, nulls)
        seq.cached = cached
        seq.known = hit_tokens
        self._seqs[rid] = seq
        if self.debug:
            self.check()
        return hit_tokens // bs

    def forget_free(self) -> None:
        """Drop the hash of every cached block no request holds (``BlockPool.forget_free``: a
        server without prefix caching); they join the queue's unhashed front."""
        hashed = self._queue.hashed_blocks().copy()
        if len(hashed):
            self._queue.remove(hashed)
            self._evict(hashed)
            self._queue.prepend(hashed)
            if self.debug:
                self.check()

    def cache_known(self, rid: int, tokens: int) -> None:
        """The first ``tokens`` tokens of running request ``rid`` are known now: cache the
        blocks they fill (``cache_blocks``)."""
        seq = self._seqs[rid]
        known = min(tokens, seq.computed)
        if known > seq.known:
            seq.known = known
            self._cache(seq)
            if self.debug:
                self.check()

    def new_step(self) -> None:
        """A scheduler step starts (``new_step_starts``): what Mamba groups cached in the
        last one may now be hit."""
        for ids in self._this_step.values():
            ids.clear()

    def free(self, rid: int) -> None:
        """Release request ``rid`` (finished or preempted) in the batches its release order
        gives (``ReleaseOrder.release_groups``): vLLM's, per group in order its blocks after
        the leading nulls, tail first (``SingleTypeKVCacheManager.free``); another, position
        by position in that order, every group's block of a position together (module
        doc)."""
        seq = self._seqs.pop(rid)
        order = self.free_order
        tables = [seq.table(g) for g in range(len(self.groups))]
        shared: np.ndarray | None = None
        if order.reads_shared:  # read in the first full-attention group: the history itself
            g = self._event_group
            shared = shared_positions(self._maps[g], self._ref, seq.ids, tables[g],
                                      seq.cached[g])
        self._free_batches(order.release_groups(tables, shared))
        if self.debug:
            self.check()

    # ------------------------------------------------------------------ observation
    def free_queue(self) -> np.ndarray:
        return self._queue.blocks()

    def block_ids(self) -> np.ndarray:
        """Per physical block 1..capacity: the kvsim id it caches, -1 if none."""
        return self._bid[1:].copy()

    def block_groups(self) -> np.ndarray:
        """Per physical block 1..capacity: the group its cached id is for, -1 if none."""
        return self._grp[1:].astype(np.int64)

    def ref_counts(self) -> np.ndarray:
        return self._ref[1:].astype(np.int64)

    def tables(self, rid: int) -> list[np.ndarray]:
        """Per group: the physical blocks of running request ``rid`` by position (0: null)."""
        seq = self._seqs[rid]
        return [seq.table(g).copy() for g in range(len(self.groups))]

    def table(self, rid: int) -> np.ndarray:
        """The non-null physical blocks of ``rid`` over all groups, in group order."""
        tables = self.tables(rid)
        return np.concatenate([t[t > 0] for t in tables])

    def is_cached(self, block_id: int) -> bool:
        """Whether every group caches ``block_id``."""
        return all(m.is_cached(block_id) for m in self._maps)

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
        assert np.array_equal(self._bid >= 0, self._grp >= 0), "hash without group"
        refs = np.zeros(cap + 1, np.int64)
        for seq in self._seqs.values():
            for g in range(len(self.groups)):
                t = seq.table(g)
                assert not seq.tables[g][seq.length:].any(), "a table's buffer past its end"
                live = t[t > 0]
                np.add.at(refs, live, 1)
                c = seq.cached[g]
                pos = np.flatnonzero(t[:c] > 0)
                assert np.array_equal(self._bid[t[pos]], seq.ids[pos]), "cached id mismatch"
                assert np.all(self._grp[t[pos]] == g), "cached for another group"
        refs[0] = 0
        assert np.array_equal(refs, self._ref), "ref counts != block tables"
        for seq in self._seqs.values():
            masks = [seq.table(g) > 0 for g in self._mamba]
            assert all(np.array_equal(m, masks[0]) for m in masks), "Mamba tables' nulls differ"
        assert np.count_nonzero(self._bid >= 0) == self._cached, "cached counter"
        for g, m in enumerate(self._maps):
            m.check(np.where(self._grp == g, self._bid, -1))

    # ------------------------------------------------------------------ mechanism
    def _grow(self, ids: np.ndarray) -> None:
        """Make room for ``ids`` in every map. The maps always grow together (the same ids,
        the same rule), so one has the length of all: one reduction decides for every
        group (a negative id, as unsigned, is past it, and ``CachedIds.grow`` refuses it)."""
        if len(ids) and int(_umax(ids.view(np.uint64))) >= len(self._maps[0]):
            for m in self._maps:
                m.grow(ids)

    def _touch(self, blocks: np.ndarray) -> None:
        """``BlockPool.touch``: hit blocks (nulls skipped) gain a hold, leaving the queue."""
        live = blocks[blocks > 0]
        if not len(live):
            return
        refs = self._ref[live]
        idle = live[refs == 0]
        if len(idle):
            self._queue.remove(idle)
        self._ref[live] = refs + 1

    def _grow_blocks(self, n: int) -> int:
        """Blocks every group together pops for ``n`` more positions: ``n`` each, a Mamba
        group one (its state at the last; nulls before)."""
        return n * (len(self.groups) - len(self._mamba)) + len(self._mamba)

    def _allocate(self, seq: _HSeq, tokens: int) -> None:
        """``allocate_new_blocks`` per group in order: pop blocks to hold ``tokens``. Every
        table has the same length, and pops take the queue front in order: one pop of all
        groups' blocks, dealt out in group order, is the groups' pops one after the other.
        A Mamba group (align) pads nulls and takes one block for the state at the end; the
        block before it held the previous state (``last_state``)."""
        length = seq.length
        n = _cdiv(tokens, self.block_size) - length
        if n <= 0:
            seq.allocated = True
            return
        seq.reserve(length + n)
        tables = seq.tables
        seq.states = None
        m = self._grow_blocks(n)
        at = 0
        if m <= _FEW:  # a block edge: a few blocks, written one by one
            few = self._pop_few(m)
            for g, t in enumerate(tables):
                if self.groups[g].kind == MAMBA:
                    if seq.allocated or length:
                        seq.last_state[g] = length - 1
                    t[length + n - 1] = few[at]  # the nulls before it are the buffer's
                    at += 1
                else:
                    for j in range(n):
                        t[length + j] = few[at + j]
                    at += n
        else:
            fresh = self._pop(m)
            self._ref[fresh] = 1
            for g, t in enumerate(tables):
                if self.groups[g].kind == MAMBA:
                    if seq.allocated or length:
                        seq.last_state[g] = length - 1
                    t[length + n - 1] = fresh[at]
                    at += 1
                else:
                    t[length : length + n] = fresh[at : at + n]
                    at += n
        seq.length = length + n
        seq.allocated = True

    def _remove_skipped(self, seq: _HSeq, processed: int) -> None:
        """``remove_skipped_blocks`` per group in order: a sliding group frees, from the last
        skipped block back to the first null, the blocks wholly before the window of
        ``processed``; a Mamba group every state but the last token's (nulls skipped), and
        the previous step's state block once a newer one holds the state. Both depend on
        ``processed`` only through ``(processed - 1) // block_size`` (an allocation in the
        same block leaves its previous state block at or past it), so a Mamba group is
        skipped until that moves. A few blocks (a block edge's) are read and freed one by
        one; more (what a prefill's window leaves) as arrays."""
        due = self._mamba and (processed - 1) // self.block_size != seq.pruned
        if due:
            seq.pruned = (processed - 1) // self.block_size
        batches: list[list[int] | np.ndarray] = []  # freed together at the end, in order
        live: list[int] | np.ndarray | None = None  # the retired span's states (Mamba
        # tables share their nulls), last first
        for g in self._pruned:
            kind = self.groups[g].kind
            if not due and kind == MAMBA:
                continue
            t = seq.tables[g]
            n = min(self._skipped_blocks(g, processed), seq.length)
            if kind == SLIDING:
                lo = seq.nulls[g]
                if n <= lo:
                    continue
                if n - lo <= _FEW:
                    leaving: list[int] = []
                    for j in range(n - 1, lo - 1, -1):
                        leaving.append(int(t.item(j)))
                        t[j] = 0
                    batches.append(leaving)
                else:
                    batches.append(t[lo:n][::-1].copy())
                    t[lo:n] = 0
                seq.nulls[g] = n
                continue
            lo = seq.retired.get(g, 0)
            if lo < n:
                if live is None:
                    live = ([j for j in range(n - 1, lo - 1, -1) if t.item(j)]
                            if n - lo <= _FEW else lo + np.flatnonzero(t[lo:n])[::-1])
                if isinstance(live, list):
                    states = [int(t.item(j)) for j in live]
                    for j in live:
                        t[j] = 0
                    if states:
                        batches.append(states)
                elif len(live):
                    batches.append(t[live])
                    t[live] = 0
                seq.retired[g] = n
                seq.states = None
            last = seq.last_state.get(g)
            if last is not None and last < _cdiv(processed, self.block_size) - 1:
                p = int(t.item(last))
                if p:
                    batches.append([p])
                    t[last] = 0
                    seq.states = None
        if not batches:
            return
        few = [b for b in batches if isinstance(b, list)]
        if len(few) == len(batches):
            self._free_few(few)
        else:
            self._free_batches([np.asarray(b, np.int64) for b in batches])

    def _free_few(self, batches: list[list[int]]) -> None:
        """``_free_batches`` of a few blocks given as lists, one by one: each batch's unheld
        hashed blocks join the tail in order, its unheld unhashed ones the front (in front
        of an earlier batch's)."""
        ref, bid, queue = self._ref, self._bid, self._queue
        for batch in batches:
            front: list[int] = []
            for p in batch:
                r = int(ref.item(p)) - 1
                ref[p] = r
                if r == 0:
                    if int(bid.item(p)) >= 0:
                        queue.append_one(p)
                    else:
                        front.append(p)
            if front:
                queue.prepend_list(front)

    def _free_batches(self, batches: list[np.ndarray]) -> None:
        """``_free_blocks`` of each batch in turn (their blocks distinct, as a request's
        blocks of different groups are), in one pass: the unheld hashed blocks join the
        tail in order; the unheld unhashed ones the front, so a later batch's come before
        an earlier one's (each ``prepend`` goes in front of the last)."""
        if len(batches) == 1:
            if len(batches[0]):
                self._free_blocks(batches[0])
            return
        sizes = [len(b) for b in batches]
        if not any(sizes):
            return
        ordered = np.concatenate(batches)
        refs = self._ref[ordered] - 1
        self._ref[ordered] = refs
        zero = refs == 0
        hashed = self._bid[ordered] >= 0
        unhashed = zero & ~hashed
        front = ordered[unhashed]
        if len(front) > 1:
            batch = np.repeat(np.arange(len(batches)), sizes)[unhashed]
            if batch[0] != batch[-1]:  # several batches' unhashed blocks: last batch first
                front = front[np.argsort(-batch, kind="stable")]
        self._queue.prepend(front)
        self._queue.append(ordered[zero & hashed])

    def _free_blocks(self, ordered: np.ndarray) -> None:
        """``BlockPool.free_blocks``: one hold less each; unheld hashed blocks join the tail in
        order, unheld unhashed ones the front."""
        if len(ordered) <= _FEW:  # numpy's per-call cost dominates
            self._free_few([ordered.tolist()])
            return
        refs = self._ref[ordered] - 1
        self._ref[ordered] = refs
        zero = ordered[refs == 0]
        hashed = self._bid[zero] >= 0
        self._queue.prepend(zero[~hashed])
        self._queue.append(zero[hashed])

    def _pop(self, n: int) -> np.ndarray:
        unhashed, hashed = self._queue.pop(n)
        if not len(hashed):
            return unhashed
        self._evict(hashed)
        return np.concatenate([unhashed, hashed]) if len(unhashed) else hashed

    def _pop_few(self, n: int) -> list[int]:
        """``_pop`` of a few blocks (a block edge's), held once each, as a list."""
        unhashed, hashed = self._queue.pop_list(n)
        if hashed:
            self._evict(np.array(hashed, np.int64))
            unhashed += hashed
        ref = self._ref
        for p in unhashed:
            ref[p] = 1
        return unhashed

    def _evict(self, hashed: np.ndarray) -> None:
        """Drop the hashes of blocks ``hashed`` (lazy eviction, at their reuse)."""
        self._version += 1
        xs = self._bid[hashed]
        grp = self._grp[hashed]
        g0 = int(grp.item(0))
        lost = 0
        if len(hashed) <= _FEW:  # a block edge's blocks: per block, no masks
            gs: list[int] = grp.tolist()
            if gs.count(g0) == len(gs):
                lost = self._drop(g0, hashed, xs)
            else:  # each group's blocks in pop order, groups in order
                for g in sorted(set(gs)):
                    sel = [i for i, h in enumerate(gs) if h == g]
                    lost += self._drop(g, hashed[sel], xs[sel])
        elif not (grp != g0).any():  # one group's blocks: the common case
            lost = self._drop(g0, hashed, xs)
        else:  # a window's blocks popped with a full group's: one mask per group
            for g in range(len(self.groups)):
                mask = grp == g
                if mask.any():
                    lost += self._drop(g, hashed[mask], xs[mask])
        self._lost += lost
        if self._events is not None:
            eg = self._event_group
            mine = xs[grp == eg]
            gone = mine[self._maps[eg].firsts(mine, True) < 0]
            if len(gone):
                self._events.removed(gone)
        self._bid[hashed] = -1
        self._grp[hashed] = -1
        self._cached -= len(hashed)
        self._dropped += len(hashed)

    def _drop(self, g: int, hashed: np.ndarray, xs: np.ndarray) -> int:
        """Group ``g``'s map forgets ``hashed`` (caching ``xs``); the last copies of ids
        it lost that count as lost history (a full-attention group's)."""
        lost = self._maps[g].drop(hashed, xs)
        return lost if self.groups[g].kind == FULL else 0

    def _cache(self, seq: _HSeq) -> None:
        """``cache_blocks`` per group: hash the blocks full now (nulls skipped)."""
        full = min(seq.known // self.block_size, len(seq.ids))
        cached = seq.cached
        if full <= min(cached):
            return
        self._version += 1
        ids = seq.ids
        # what the groups share, read once: Mamba tables share their nulls, so one Mamba
        # group's (from, states' positions, their ids as an array and a list, the parent)
        # is every one's; the other groups' (from, ids, parent) while they start alike
        states: tuple[int, np.ndarray, np.ndarray, list[int], int] | None = None
        chain: tuple[int, np.ndarray, int] | None = None
        for g, t in enumerate(seq.tables):
            a = cached[g]
            if full <= a:
                continue
            if self.groups[g].kind == MAMBA:  # states only where a block holds one
                if states is None or states[0] != a:
                    pos = a + np.flatnonzero(t[a:full])
                    xs = ids[pos]
                    first = int(pos.item(0)) if len(pos) else 0
                    states = (a, pos, xs, xs.tolist(),
                              int(ids.item(first - 1)) if first else -1)
                pos, xs = states[1], states[2]
                if len(pos):
                    ps = t[pos]
                    self._bid[ps] = xs
                    self._grp[ps] = g
                    self._cached += len(pos)
                    self._maps[g].add(ps, xs, states[4])
                    self._this_step[g].update(states[3])
                cached[g] = full
                continue
            # nulls are the table's head: past it, every block is a real one
            start = max(a, seq.nulls[g])
            if start < full:
                if chain is None or chain[0] != start:
                    chain = (start, ids[start:full], int(ids.item(start - 1)) if start else -1)
                ps, xs, parent = t[start:full], chain[1], chain[2]
                if full - start <= _FEW:  # a block edge's: written one by one
                    bid, grp = self._bid, self._grp
                    for j in range(start, full):
                        p = int(t.item(j))
                        bid[p] = ids.item(j)
                        grp[p] = g
                else:
                    self._bid[ps] = xs
                    self._grp[ps] = g
                self._cached += full - start
                self._maps[g].add(ps, xs, parent)
                if self._events is not None and g == self._event_group:
                    self._events.stored(xs, parent)
            cached[g] = full


class WideBlocks:
    """A hybrid pool whose block holds ``ratio`` of the run's blocks, driven in the run's.

    vLLM raises a Mamba hybrid's block until an attention page holds a state page
    (``Platform._align_hybrid_block_size``, vllm/platforms/interface.py; ``costmodel.gpus``
    ``_vllm_capacity``): Qwen3-Next's block is hundreds of tokens where the run's trace ids
    are per ``--block-size`` tokens. A run id identifies the whole prefix up to its block's
    last token (traces/blocks.py), so the pool's block ``k`` is the run's block ``(k + 1) x
    ratio - 1``: the pool gets every ``ratio``-th id and its answers in blocks (hits, cached
    blocks, evictions) come back times ``ratio``. KV events report the run's ids of each of
    the pool's blocks (a prefix router hashes the run's blocks). Every other call, in tokens
    or about the pool's own blocks, passes through (each spelled out: the engine calls them
    on every step)."""

    def __init__(self, pool: HybridPool, ratio: int) -> None:
        if ratio < 2:
            raise ValueError(f"a wide block holds two or more run blocks, got {ratio}")
        self.pool = pool
        self.ratio = ratio
        self.capacity_blocks = pool.capacity_blocks
        self.block_size = pool.block_size
        self.groups = pool.groups
        # the run's ids of each of the pool's blocks, kept only while KV events are on
        self._members: dict[int, np.ndarray] | None = None
        self._last: tuple[Any, np.ndarray] = (None, np.zeros(0, np.int64))

    def _wide(self, ids: np.ndarray) -> np.ndarray:
        if ids is self._last[0]:  # a lookup and the admission after it: one view
            return self._last[1]
        src = ids
        ids = np.asarray(ids, np.int64)
        m = self.ratio
        wide = ids[m - 1::m]
        self._last = (src, wide)
        if self._members is not None:
            members = self._members
            for k, x in enumerate(wide.tolist()):
                if x not in members:
                    members[x] = ids[k * m:(k + 1) * m]
        return wide

    def admit(self, rid: int, ids: np.ndarray, num_tokens: int, num_new_tokens: int,
              **kw: Any) -> int | None:
        h = self.pool.admit(rid, self._wide(ids), num_tokens, num_new_tokens, **kw)
        return None if h is None else h * self.ratio

    def admit_remote(self, rid: int, ids: np.ndarray, num_tokens: int,
                     reserved: int = 0) -> int | None:
        h = self.pool.admit_remote(rid, self._wide(ids), num_tokens, reserved)
        return None if h is None else h * self.ratio

    def lookup(self, ids: np.ndarray, num_tokens: int) -> int:
        return self.pool.lookup(self._wide(ids), num_tokens) * self.ratio

    def gpu_prefix_blocks(self, ids: np.ndarray) -> int:
        return self.pool.gpu_prefix_blocks(self._wide(ids)) * self.ratio

    def resident_prefix_blocks(self, ids: np.ndarray) -> int:
        return self.gpu_prefix_blocks(ids)

    def cached_of(self, rid: int) -> int:
        return self.pool.cached_of(rid) * self.ratio

    @property
    def evicted_blocks(self) -> int:
        return self.pool.evicted_blocks * self.ratio

    @property
    def lost_blocks(self) -> int:
        return self.pool.lost_blocks * self.ratio

    def enable_events(self, clock: Callable[[], Any] | None = None,
                      kinds: Iterable[type] | None = None) -> None:
        if self._members is None:
            self._members = {}
            self._last = (None, self._last[1])  # every id from now on joins the members
        self.pool.enable_events(clock, kinds)

    def take_events(self) -> list[tuple[Any, KVEvent]]:
        """The pool's events, each of its blocks as the run's ids it holds (a stored chain's
        parent, the last run id of the pool's block before it, is that block's own id)."""
        members = self._members or {}
        out = []
        for stamp, ev in self.pool.take_events():
            ids = ev.ids
            if len(ids):
                ids = np.concatenate([members[x] for x in ids.tolist()])
            out.append((stamp, type(ev)(ids, *ev[1:])))  # every kind: ids first
        return out

    # ------------------------------------------------------------------ pass-through
    @property
    def free_blocks(self) -> int:
        return self.pool.free_blocks

    @property
    def cached_blocks(self) -> int:
        return self.pool.cached_blocks

    @property
    def used_blocks(self) -> int:
        return self.pool.used_blocks

    @property
    def debug(self) -> bool:
        return self.pool.debug

    @property
    def free_order(self) -> ReleaseOrder:
        return self.pool.free_order

    def running(self) -> list[int]:
        return self.pool.running()

    def blocks_for(self, tokens: int) -> int:
        return self.pool.blocks_for(tokens)

    def computed_tokens(self, rid: int) -> int:
        return self.pool.computed_tokens(rid)

    def blocks_to_grow(self, rid: int, num_tokens: int) -> int:
        return self.pool.blocks_to_grow(rid, num_tokens)

    def extend(self, rid: int, num_new_tokens: int, known: int | None = None,
               in_flight: int = 0) -> bool:
        return self.pool.extend(rid, num_new_tokens, known=known, in_flight=in_flight)

    def decode_fit(self, rids: list[int], steps: int, in_flight: int = 0,
                   ceiling: int | None = None) -> int:
        return self.pool.decode_fit(rids, steps, in_flight, ceiling)

    def decode_run(self, rids: list[int], steps: int, in_flight: int = 0,
                   lag: int = 0) -> None:
        self.pool.decode_run(rids, steps, in_flight, lag)

    def cache_known(self, rid: int, tokens: int) -> None:
        self.pool.cache_known(rid, tokens)

    def new_step(self) -> None:
        self.pool.new_step()

    def free(self, rid: int) -> None:
        self.pool.free(rid)

    def forget_free(self) -> None:
        self.pool.forget_free()

    def free_queue(self) -> np.ndarray:
        return self.pool.free_queue()

    def block_ids(self) -> np.ndarray:
        return self.pool.block_ids()

    def block_groups(self) -> np.ndarray:
        return self.pool.block_groups()

    def ref_counts(self) -> np.ndarray:
        return self.pool.ref_counts()

    def tables(self, rid: int) -> list[np.ndarray]:
        return self.pool.tables(rid)

    def table(self, rid: int) -> np.ndarray:
        return self.pool.table(rid)

    def is_cached(self, block_id: int) -> bool:
        return self.pool.is_cached(block_id)

    def check(self) -> None:
        self.pool.check()
