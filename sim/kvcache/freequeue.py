"""vLLM's free block queue (``FreeKVCacheBlockQueue``) as two numpy structures.

vLLM keeps free blocks in one doubly linked list: allocation pops the front, a block whose
hash is cached joins the tail when freed, an unhashed one the front, and a hit takes a cached
block out of the middle. Since unhashed blocks only ever join the front and hashed ones only the
tail (and a block loses its hash only when popped), the list is always::

    front [unhashed blocks, last freed first] [hashed blocks, in the order freed] back

so it is kept as a stack of unhashed blocks (top = front; vLLM's initial order 1..capacity)
plus an append-only log of hashed blocks: ``pos[p]`` is the log index of hashed free block
``p`` (-1: not in the queue), so a log entry ``i`` is live iff ``pos[log[i]] == i``. ``remove``
(a hit) only clears ``pos``, leaving a dead entry that ``pop`` skips; the log is compacted when
full. Dead entries are rare (hits on free blocks), so the queue keeps the index of its first
one: a pop that ends before it takes a slice of the log without looking at liveness. Every
operation is a few numpy calls on the blocks it moves. Blocks are physical block numbers
1..capacity.
"""

from __future__ import annotations

import numpy as np

_NONE = np.empty(0, np.int64)  # nothing popped from one part (never written: empty)
_NO_DEAD = 1 << 62  # the first dead log entry's index while there is none
# ``a.min()`` without ndarray.min's Python-level wrapper
_umin = np.minimum.reduce


class FreeQueue:
    """Free physical blocks in vLLM's eviction order (front = reused first)."""

    def __init__(self, capacity_blocks: int) -> None:
        n = capacity_blocks + 1
        # unhashed free blocks are ``_stack[_top:]``, front first (vLLM's initial order
        # 1..capacity); the front grows downward, so neither end is ever reversed
        self._stack = np.arange(1, n, dtype=np.int64)
        self._top = 0
        self._log = np.zeros(4 * n + 64, np.int64)
        self._pos = np.full(n, -1, np.int64)  # log index of a hashed free block, else -1
        self._head = self._tail = 0
        self._nq = 0
        self._dead = _NO_DEAD  # index of the first dead entry in [head, tail)

    def __len__(self) -> int:
        return len(self._stack) - self._top + self._nq

    @property
    def hashed(self) -> int:
        """Hashed (cached) blocks in the queue."""
        return self._nq

    def pop(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Take ``n`` blocks from the front: (unhashed ones, hashed ones), each in pop order
        (unhashed come first). The caller drops the hashed ones' hashes (lazy eviction)."""
        top = self._top
        k = min(n, len(self._stack) - top)
        unhashed = self._stack[top : top + k].copy() if k else _NONE
        self._top = top + k
        need = n - k
        if need == 0:
            return unhashed, _NONE
        if need > self._nq:
            raise AssertionError(f"pop({n}) from a queue of {len(self) + k}")
        h = self._head
        if h + need <= self._dead:  # every entry before the first dead one is live
            hashed = self._log[h : h + need].copy()
            self._head = h + need
        else:
            hashed = self._pop_past_dead(h, need)
        self._pos[hashed] = -1
        self._nq -= need
        return unhashed, hashed

    def pop_list(self, n: int) -> tuple[list[int], list[int]]:
        """``pop`` as lists: a few blocks at a block edge (a decode step's new blocks), where
        two arrays and their copies cost more than the blocks they hold."""
        top = self._top
        k = min(n, len(self._stack) - top)
        unhashed: list[int] = self._stack[top : top + k].tolist() if k else []
        self._top = top + k
        need = n - k
        if need == 0:
            return unhashed, []
        if need > self._nq:
            raise AssertionError(f"pop({n}) from a queue of {len(self) + k}")
        h = self._head
        if h + need <= self._dead:  # every entry before the first dead one is live
            hashed: list[int] = self._log[h : h + need].tolist()
            self._head = h + need
        else:
            hashed = self._pop_past_dead(h, need).tolist()
        pos = self._pos
        for p in hashed:
            pos[p] = -1
        self._nq -= need
        return unhashed, hashed

    def _pop_past_dead(self, h: int, need: int) -> np.ndarray:
        """The first ``need`` live log entries from ``h`` (some are dead): scanned in windows
        that double; the head moves past them and the first dead entry is found again."""
        taken: list[np.ndarray] = []
        w = max(2 * need, 64)
        while need:
            end = min(h + w, self._tail)
            seg = self._log[h:end]
            live = np.flatnonzero(self._pos[seg] == np.arange(h, end))
            if len(live) >= need:
                taken.append(seg[live[:need]])
                h += int(live[need - 1]) + 1
                need = 0
            else:
                taken.append(seg[live])
                need -= len(live)
                h, w = end, 2 * w
        self._head = h
        hashed = taken[0] if len(taken) == 1 else np.concatenate(taken)
        # the entries taken are still live here (their positions are cleared by the caller)
        self._dead = self._first_dead(h, len(hashed))
        return hashed

    def _first_dead(self, h: int, taking: int) -> int:
        """Index of the first dead entry in ``[h, tail)`` (``_NO_DEAD``: none), while
        ``taking`` live entries before ``h`` still count in ``_nq``."""
        t = self._tail
        if t - h == self._nq - taking:
            return _NO_DEAD
        seg = self._log[h:t]
        return h + int(np.flatnonzero(self._pos[seg] != np.arange(h, t))[0])

    def remove(self, hashed: np.ndarray) -> None:
        """Take hashed blocks (all in the queue) out of the middle: a hit touched them."""
        if not len(hashed):
            return
        at = self._pos[hashed]
        self._pos[hashed] = -1
        self._nq -= len(hashed)
        if self._nq == 0:  # nothing live is left: forget the dead entries
            self._head = self._tail
            self._dead = _NO_DEAD
        else:
            self._dead = min(self._dead, int(_umin(at)))

    def append(self, hashed: np.ndarray) -> None:
        """Hashed blocks join the back, in order (the first is reused first among them)."""
        m = len(hashed)
        if not m:
            return
        if self._tail + m > len(self._log):
            self._compact(m)
        t = self._tail
        self._log[t : t + m] = hashed
        self._pos[hashed] = np.arange(t, t + m)
        self._tail = t + m
        self._nq += m

    def append_one(self, block: int) -> None:
        """``append`` of one hashed block (a window's block leaving, freed on its own)."""
        t = self._tail
        if t == len(self._log):
            self._compact(1)
            t = self._tail
        self._log[t] = block
        self._pos[block] = t
        self._tail = t + 1
        self._nq += 1

    def prepend_list(self, unhashed: list[int]) -> None:
        """``prepend`` of a few blocks given as a list (``unhashed[0]`` ends up first)."""
        top = self._top
        stack = self._stack
        for i, p in enumerate(unhashed, top - len(unhashed)):
            stack[i] = p
        self._top = top - len(unhashed)

    def prepend(self, unhashed: np.ndarray) -> None:
        """Unhashed blocks join the front, in order (``unhashed[0]`` ends up first)."""
        u = len(unhashed)
        if u:
            self._top -= u
            self._stack[self._top : self._top + u] = unhashed

    def blocks(self) -> np.ndarray:
        """All blocks, front to back."""
        return np.concatenate([self.unhashed_blocks(), self.hashed_blocks()])

    def hashed_blocks(self) -> np.ndarray:
        """The hashed blocks, front to back (a new array)."""
        h, t = self._head, self._tail
        seg = self._log[h:t]
        if t - h == self._nq:
            return seg.copy()
        return seg[self._pos[seg] == np.arange(h, t)]

    def unhashed_blocks(self) -> np.ndarray:
        return self._stack[self._top :].copy()

    def check(self) -> None:
        live = self.hashed_blocks()
        assert len(live) == self._nq, "hashed count != live log entries"
        at = self._pos[live]
        assert np.all((at >= self._head) & (at < self._tail)), "a live entry outside the log"
        assert np.all(self._log[at] == live), "log positions out of sync"
        assert np.count_nonzero(self._pos >= 0) == self._nq, "stale positions"
        before = min(self._dead, self._tail)
        seg = self._log[self._head : before]
        assert np.array_equal(self._pos[seg], np.arange(self._head, before)), (
            "a dead entry before the first dead one")
        assert self._top >= 0, "unhashed stack overflow"

    def _compact(self, extra: int) -> None:
        live = self.hashed_blocks()
        size = max(len(self._log), 2 * (len(live) + extra) + 64)
        self._log = np.zeros(size, np.int64)
        self._log[: len(live)] = live
        self._pos[live] = np.arange(len(live))
        self._head, self._tail = 0, len(live)
        self._dead = _NO_DEAD
