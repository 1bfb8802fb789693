"""vLLM's hash map of cached blocks (``BlockHashToBlockMap``) in kvsim ids, for the block pool.

Per id: its cached copies in insertion order (vLLM does not de-duplicate: a block computed
again while a copy is cached becomes a second copy; a lookup returns the FIRST), and, when the
pool's free order needs them, the id's parent (the id before it in its chain; ids are chained,
so an id has one parent for good) and how many distinct cached ids have it as parent.

State: ``first[x]`` first cached copy (physical block, -1 none), ``ncopy[x]`` copies,
``dups[x]`` every copy when there are two or more. Child counts are read only when a request
is freed under a non-reverse order (``children``), so the changes to them are queued and
applied there, in bulk; counts add up, so the order of the queued changes does not matter.
Arrays grow to the largest id seen (ids are dense ranks). Batches of up to ``SMALL`` blocks
are updated one by one in Python: numpy's per-call cost is larger there.
"""

from __future__ import annotations

import numpy as np

MAX_ID = 1 << 40  # ids index arrays: anything larger is a caller bug (use dense ids)
SMALL = 8
# ``a.max()`` without ndarray.max's Python-level wrapper (numpy/_core/_methods.py): every
# admission and every fleet lookup asks for the largest id of a prompt
_umax = np.maximum.reduce


def _grown(a: np.ndarray, m: int, fill: int) -> np.ndarray:
    """``a`` extended to ``m`` entries with ``fill`` (one new array: the arrays grow to the
    largest id seen, hundreds of thousands on a long trace)."""
    out = np.empty(m, a.dtype)
    n = len(a)
    out[:n] = a
    out[n:] = fill
    return out


class CachedIds:
    """Cached copies per id (vLLM's hash map), with child counts when ``children`` is on."""

    def __init__(self, children: bool) -> None:
        self.tracks_children = children
        self._first = np.full(0, -1, np.int64)
        self._ncopy = np.zeros(0, np.int32)
        self._parent = np.full(0, -1, np.int64)
        self._nchild = np.zeros(0, np.int32)
        self._dups: dict[int, list[int]] = {}  # id -> all copies in insertion order (>= 2)
        # queued child-count changes: (ids, parents) that got a first copy; ids that lost
        # their last copy (arrays, or single ints from the one-by-one paths)
        self._born: list[tuple[np.ndarray, np.ndarray]] = []
        self._born_each: list[tuple[int, int]] = []
        self._died: list[np.ndarray] = []
        self._died_each: list[int] = []

    def __len__(self) -> int:
        """Ids the arrays cover (every id seen is below it)."""
        return len(self._first)

    def grow(self, ids: np.ndarray) -> None:
        """Make room for ``ids``; ValueError if any is negative or above MAX_ID."""
        if not len(ids):
            return
        # One reduction: as unsigned, a negative id is larger than any valid one.
        top = int(_umax(ids.view(np.uint64)))
        if top >= MAX_ID:
            raise ValueError(f"block ids must be in [0, {MAX_ID}): got {ids.min()}..{ids.max()}")
        n = len(self._first)
        if top < n:
            return
        m = max(top + 1, 2 * n, 1024)
        self._first = _grown(self._first, m, -1)
        self._ncopy = _grown(self._ncopy, m, 0)
        if self.tracks_children:  # read by nothing else: a pool without them never grows them
            self._parent = _grown(self._parent, m, -1)
            self._nchild = _grown(self._nchild, m, 0)

    # ------------------------------------------------------------------ queries
    def is_cached(self, x: int) -> bool:
        return 0 <= x < len(self._first) and self._first.item(x) >= 0

    def firsts(self, ids: np.ndarray, grown: bool = False) -> np.ndarray:
        """First cached copy of each id (-1: not cached). ``grown``: ids known in range."""
        n = len(self._first)
        if not grown and len(ids) and int(_umax(ids.view(np.uint64))) >= n:
            x = np.where((ids >= 0) & (ids < n), ids, n)
            return np.concatenate([self._first, [-1]])[x]
        return self._first[ids]

    def children(self, ids: np.ndarray) -> np.ndarray:
        """Distinct cached ids whose parent is each of ``ids`` (``children`` on)."""
        if not self.tracks_children:
            raise ValueError("child counts are kept only with children=True")
        self._count_children()
        return self._nchild[ids]

    # ------------------------------------------------------------------ changes
    def add(self, ps: np.ndarray, xs: np.ndarray, prev: int) -> None:
        """Physical blocks ``ps`` now cache ids ``xs`` (one chain; ``prev`` is the id before
        ``xs[0]``, -1 at the root)."""
        if len(ps) <= SMALL:
            self._add_each(ps.tolist(), xs.tolist(), prev)
            return
        counts = self._ncopy[xs]
        new = counts == 0
        if np.count_nonzero(new) == len(new):  # new.all(), without numpy's Python wrapper
            self._first[xs] = ps
        else:
            self._first[xs[new]] = ps[new]
            for p, x in zip(ps[~new].tolist(), xs[~new].tolist(), strict=True):
                copies = self._dups.get(x)
                if copies is None:
                    self._dups[x] = [int(self._first[x]), p]
                else:
                    copies.append(p)
        if self.tracks_children:
            par = np.concatenate([[prev], xs[:-1]])
            self._born.append((xs[new], par[new]))
        self._ncopy[xs] = counts + 1

    def _add_each(self, ps: list[int], xs: list[int], prev: int) -> None:
        first, ncopy = self._first, self._ncopy
        for p, x in zip(ps, xs, strict=True):
            c = int(ncopy[x])
            if c == 0:
                first[x] = p
                if self.tracks_children:
                    self._born_each.append((x, prev))
            else:
                copies = self._dups.get(x)
                if copies is None:
                    self._dups[x] = [int(first[x]), p]
                else:
                    copies.append(p)
            ncopy[x] = c + 1
            prev = x

    def drop(self, ps: np.ndarray, xs: np.ndarray) -> int:
        """Physical blocks ``ps`` no longer cache ``xs`` (their hashes were dropped at
        allocation). Returns how many were their id's last copy."""
        if len(ps) <= SMALL:
            return self._drop_each(ps.tolist(), xs.tolist())
        single = self._ncopy[xs] == 1
        if np.count_nonzero(single) == len(single):  # all single copies: the common case
            self._first[xs] = -1
            self._ncopy[xs] = 0
            if self.tracks_children:
                self._died.append(xs)
            return len(xs)
        gone = xs[single]
        self._first[gone] = -1
        self._ncopy[gone] = 0
        if self.tracks_children:
            self._died.append(gone)
        return len(gone) + self._drop_each(ps[~single].tolist(), xs[~single].tolist())

    def _drop_each(self, ps: list[int], xs: list[int]) -> int:
        first, ncopy = self._first, self._ncopy
        lost = 0
        for p, b in zip(ps, xs, strict=True):
            c = int(ncopy[b])
            if c == 1:  # the last copy (its other one may have gone just before)
                first[b] = -1
                ncopy[b] = 0
                lost += 1
                if self.tracks_children:
                    self._died_each.append(b)
                continue
            copies = self._dups[b]
            copies.remove(p)
            ncopy[b] = c - 1
            first[b] = copies[0]
            if len(copies) == 1:
                del self._dups[b]
        return lost

    def _count_children(self) -> None:
        """Apply the queued child-count changes: a parent gains a child when an id gets its
        first cached copy and loses one when its last copy goes."""
        for x, q in self._born:  # one chain each: distinct parents, a buffered add is exact
            self._parent[x] = q
            self._nchild[q[q >= 0]] += 1
        if self._born_each:  # from several chains: siblings may share a parent
            each = np.array(self._born_each, np.int64)
            self._parent[each[:, 0]] = each[:, 1]
            q = each[:, 1]
            np.add.at(self._nchild, q[q >= 0], 1)
        self._born, self._born_each = [], []
        if self._died or self._died_each:
            x = np.concatenate([*self._died, np.array(self._died_each, np.int64)])
            q = self._parent[x]
            q = q[q >= 0]
            if len(q) > 64:  # siblings may share a parent: count them (a sort beats ufunc.at)
                u, c = np.unique(q, return_counts=True)
                self._nchild[u] -= c.astype(np.int32)
            else:
                np.subtract.at(self._nchild, q, 1)
            self._died, self._died_each = [], []

    def check(self, bid: np.ndarray) -> None:
        """Recount from ``bid`` (per physical block: the id it caches, -1 none)."""
        cached = np.flatnonzero(bid >= 0)
        ids, counts = np.unique(bid[cached], return_counts=True)
        assert np.array_equal(np.flatnonzero(self._ncopy), ids), "ids with copies"
        assert np.array_equal(self._ncopy[ids], counts), "copy counts"
        assert np.all(bid[self._first[ids]] == ids), "first copy holds another id"
        for x, copies in self._dups.items():
            assert len(copies) == self._ncopy[x] >= 2 and copies[0] == self._first[x]
        if self.tracks_children:
            self._count_children()
            nchild = np.zeros_like(self._nchild)
            par = self._parent[ids]
            np.add.at(nchild, par[par >= 0], 1)
            assert np.array_equal(nchild, self._nchild), "children counts"
