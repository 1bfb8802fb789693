"""vLLM's free block queue (``FreeKVCacheBlockQueue``) as two numpy structures.

vLLM keeps free blocks in one doubly linked list: allocation pops the front, a block whose
hash is cached joins the tail when freed, an unhashed one the front, and a hit takes a cached
block out of the middle. Since unhashed blocks only ever join the front and hashed ones only the
tail (and a block loses its hash only when popped), the list is always::

    front [unhashed blocks, last freed first] [hashed blocks, in the order freed] back

so it is kept as a stack of unhashed blocks (top = front; vLLM's initial order 1..capacity)
plus an append-only log of hashed blocks with a live flag per entry: ``remove`` (a hit) kills
the entry, ``pop`` skips dead ones, the log is compacted when full. Every operation is a few
numpy calls on the blocks it moves. Blocks are physical block numbers 1..capacity.
"""

from __future__ import annotations

import numpy as np

_NONE = np.empty(0, np.int64)  # no unhashed blocks popped (never written: empty)


class FreeQueue:
    """Free physical blocks in vLLM's eviction order (front = reused first)."""

    def __init__(self, capacity_blocks: int) -> None:
        n = capacity_blocks + 1
        self._stack = np.arange(n - 1, 0, -1, dtype=np.int64)  # top (end) = front: block 1
        self._nu = capacity_blocks
        self._log = np.zeros(4 * n + 64, np.int64)
        self._alive = np.zeros(4 * n + 64, bool)
        self._pos = np.full(n, -1, np.int64)  # log index of a hashed free block, else -1
        self._head = self._tail = 0
        self._nq = 0

    def __len__(self) -> int:
        return self._nu + self._nq

    @property
    def hashed(self) -> int:
        """Hashed (cached) blocks in the queue."""
        return self._nq

    def pop(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Take ``n`` blocks from the front: (unhashed ones, hashed ones), each in pop order
        (unhashed come first). The caller drops the hashed ones' hashes (lazy eviction)."""
        k = min(n, self._nu)
        unhashed = self._stack[self._nu - k : self._nu][::-1].copy() if k else _NONE
        self._nu -= k
        need = n - k
        if need == 0:
            return unhashed, unhashed[:0]
        if need > self._nq:
            raise AssertionError(f"pop({n}) from a queue of {len(self) + k}")
        h = self._head
        # no dead entries (count_nonzero: .all() without numpy's Python wrapper)
        if h + need <= self._tail and np.count_nonzero(self._alive[h : h + need]) == need:
            hashed = self._log[h : h + need].copy()
            self._alive[h : h + need] = False
            self._head = h + need
            self._pos[hashed] = -1
            self._nq -= need
            return unhashed, hashed
        taken: list[np.ndarray] = []
        w = max(2 * need, 64)
        while need:
            end = min(h + w, self._tail)
            pos = np.flatnonzero(self._alive[h:end])
            if len(pos) >= need:
                taken.append(self._log[h:end][pos[:need]])
                h += int(pos[need - 1]) + 1
                need = 0
            else:
                taken.append(self._log[h:end][pos])
                need -= len(pos)
                h, w = end, 2 * w
        self._alive[self._head : h] = False
        self._head = h
        hashed = taken[0] if len(taken) == 1 else np.concatenate(taken)
        self._pos[hashed] = -1
        self._nq -= len(hashed)
        return unhashed, hashed

    def remove(self, hashed: np.ndarray) -> None:
        """Take hashed blocks (all in the queue) out of the middle: a hit touched them."""
        self._alive[self._pos[hashed]] = False
        self._pos[hashed] = -1
        self._nq -= len(hashed)

    def append(self, hashed: np.ndarray) -> None:
        """Hashed blocks join the back, in order (the first is reused first among them)."""
        m = len(hashed)
        if not m:
            return
        if self._tail + m > len(self._log):
            self._compact(m)
        self._log[self._tail : self._tail + m] = hashed
        self._alive[self._tail : self._tail + m] = True
        self._pos[hashed] = np.arange(self._tail, self._tail + m)
        self._tail += m
        self._nq += m

    def prepend(self, unhashed: np.ndarray) -> None:
        """Unhashed blocks join the front, in order (``unhashed[0]`` ends up first)."""
        u = len(unhashed)
        if u:
            self._stack[self._nu : self._nu + u] = unhashed[::-1]
            self._nu += u

    def blocks(self) -> np.ndarray:
        """All blocks, front to back."""
        return np.concatenate([self._stack[: self._nu][::-1], self.hashed_blocks()])

    def hashed_blocks(self) -> np.ndarray:
        return self._log[self._head : self._tail][self._alive[self._head : self._tail]]

    def unhashed_blocks(self) -> np.ndarray:
        return self._stack[: self._nu][::-1]

    def check(self) -> None:
        live = self.hashed_blocks()
        assert len(live) == self._nq, "hashed count != live log entries"
        assert np.all(self._pos[live] >= 0), "a live log entry lost its position"
        assert np.all(self._log[self._pos[live]] == live), "log positions out of sync"
        assert np.count_nonzero(self._pos >= 0) == self._nq, "stale positions"

    def _compact(self, extra: int) -> None:
        live = self.hashed_blocks()
        size = max(len(self._log), 2 * (len(live) + extra) + 64)
        self._log = np.zeros(size, np.int64)
        self._log[: len(live)] = live
        self._alive = np.zeros(size, bool)
        self._alive[: len(live)] = True
        self._pos[live] = np.arange(len(live))
        self._head, self._tail = 0, len(live)
