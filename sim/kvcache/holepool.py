"""vLLM's block pool with the Penelope patch: a lookup that continues past missing blocks.

The hash chain is unchanged (a block's id stands for every token before it), so a cached
block after a missing one is still the right KV for this request. Stock vLLM stops at the
first missing block; the patched lookup takes every cached block of the chain up to the cap
(``(num_tokens - 1) // bs`` blocks). The missing blocks before the last cached one are HOLES:
they get fresh blocks at admission and are recomputed with the request's new tokens (the
phantom computation), in position order, as prefill tokens of the same V1 token budget.

State added to ``BlockPool``'s, per request: ``prefix`` (the blocks hit from the start, as
stock vLLM would) and ``reused`` (runs of cached blocks the request took past its first
hole, as block ranges). A request's computed frontier (``computed``) still grows from the
start: a step schedules positions ``[start, start + n)`` and computes only those not in
``reused`` (``span``, ``computed_ranges``); blocks that become full are hashed except the
reused ones, which hold their ids already.

Without holes (every cached block is in the prefix) admission is stock vLLM's exactly.
"""

from __future__ import annotations

import numpy as np

from .blockpool import BlockPool, _cdiv, _Seq

Runs = list[tuple[int, int]]


class _PatchedSeq(_Seq):
    """A request's blocks plus what it reused past its first hole."""

    __slots__ = ("prefix", "reused")

    def __init__(self, ids: np.ndarray, table: np.ndarray, computed: int, cached: int,
                 reused: Runs) -> None:
        super().__init__(ids, table, computed, cached)
        self.prefix = cached
        self.reused = reused  # block ranges, sorted, after ``prefix``


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


class HolePool(BlockPool):
    """``BlockPool`` whose lookup reuses every cached block of a request's chain."""

    def __init__(self, capacity_blocks: int, block_size: int = 64, free_order="vllm", *,
                 debug: bool = False) -> None:
        super().__init__(capacity_blocks, block_size, free_order, debug=debug)
        # A request preempted mid-prefill may hold hashed (reused) blocks past its cached
        # frontier: release through the general path, which looks at each block's hash.
        self._reverse = False

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

    def span(self, rid: int, start: int, end: int, budget: int) -> tuple[int, int]:
        """(positions, tokens to compute) of running request ``rid``'s next chunk from
        ``start`` within ``budget`` (module ``span``)."""
        seq = self._seqs[rid]
        return span(seq.reused, self.block_size, start, end, budget)

    def computed_ranges(self, rid: int, start: int, stop: int) -> Runs:
        """Token ranges of ``[start, stop)`` that request ``rid`` computes (not reused)."""
        return computed_ranges(self._seqs[rid].reused, self.block_size, start, stop)

    def reuse_plan(self, rid: int) -> tuple[int, Runs]:
        """(prefix hit, reused runs) of running request ``rid`` at its admission, in
        blocks."""
        seq = self._seqs[rid]
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
