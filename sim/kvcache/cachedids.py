"""vLLM's hash map of cached blocks (``BlockHashToBlockMap``) in kvsim ids, for the block pool.

Per id: its cached copies in insertion order (vLLM does not de-duplicate: a block computed
again while a copy is cached becomes a second copy; a lookup returns the FIRST), and, when the
pool's free order needs them, the id's parent (the id before it in its chain; ids are chained,
so an id has one parent for good) and how many distinct cached ids have it as parent.

State: ``first[x]`` first cached copy (physical block, -1 none) and ``dups[x]`` every copy of
an id that has two or more (rare: a block computed again while a copy is cached), so an id's
copies are ``dups[x]`` if it is there, else one (``first[x] >= 0``) or none. While ``dups`` is
empty every cached id has a single copy and a drop is one array write. Child counts are read
only when a request is freed under a non-reverse order (``children``), so the changes to them
are queued (the chains that got first copies, the ids that lost their last) and applied there
in one batch; counts add up, so the order of the queued changes does not matter. Arrays grow
to the largest id seen (ids are dense ranks). Batches of up to ``SMALL`` blocks are updated
one by one in Python: numpy's per-call cost is larger there.
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
        self._parent = np.full(0, -1, np.int64)
        self._nchild = np.zeros(0, np.int32)
        self._dups: dict[int, list[int]] = {}  # id -> all copies in insertion order (>= 2)
        # queued child-count changes. Got a first copy: whole chains (ids, the id before the
        # first), (ids, parents) pairs of chains that got some, and id, parent, id, parent...
        # from the one-by-one path; lost their last copy: arrays, and single ids
        self._born: list[tuple[np.ndarray, int]] = []
        self._born_some: list[tuple[np.ndarray, np.ndarray]] = []
        self._born_each: list[int] = []
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
        """Physical blocks ``ps`` now cache ids ``xs`` (one chain, so distinct ids; ``prev``
        is the id before ``xs[0]``, -1 at the root). ``xs`` is kept until the child counts
        are next applied: the caller never writes it."""
        if len(ps) <= SMALL:
            self._add_each(ps.tolist(), xs.tolist(), prev)
            return
        f = self._first[xs]
        if int(_umax(f)) < 0:  # none cached yet: the common case
            self._first[xs] = ps
            if self.tracks_children:
                self._born.append((xs, prev))
            return
        new = f < 0
        self._first[xs[new]] = ps[new]
        old = ~new
        for p, x, q in zip(ps[old].tolist(), xs[old].tolist(), f[old].tolist(), strict=True):
            copies = self._dups.get(x)
            if copies is None:
                self._dups[x] = [q, p]
            else:
                copies.append(p)
        if self.tracks_children:
            par = np.concatenate([[prev], xs[:-1]])
            self._born_some.append((xs[new], par[new]))

    def _add_each(self, ps: list[int], xs: list[int], prev: int) -> None:
        first = self._first
        for p, x in zip(ps, xs, strict=True):
            q = int(first.item(x))
            if q < 0:
                first[x] = p
                if self.tracks_children:
                    self._born_each += (x, prev)
            else:
                copies = self._dups.get(x)
                if copies is None:
                    self._dups[x] = [q, p]
                else:
                    copies.append(p)
            prev = x

    def drop(self, ps: np.ndarray, xs: np.ndarray) -> int:
        """Physical blocks ``ps`` no longer cache ``xs`` (their hashes were dropped at
        allocation). Returns how many were their id's last copy."""
        if self._dups:
            xl = xs.tolist()
            if not self._dups.keys().isdisjoint(xl):
                return self._drop_each(ps.tolist(), xl)
        # every id has a single copy (so ``xs`` are distinct): each was its id's last
        self._first[xs] = -1
        if self.tracks_children:
            self._died.append(xs)
        return len(xs)

    def _drop_each(self, ps: list[int], xs: list[int]) -> int:
        first = self._first
        lost = 0
        for p, b in zip(ps, xs, strict=True):
            copies = self._dups.get(b)
            if copies is None:  # the last copy (its other one may have gone just before)
                first[b] = -1
                lost += 1
                if self.tracks_children:
                    self._died_each.append(b)
                continue
            copies.remove(p)
            first[b] = copies[0]
            if len(copies) == 1:
                del self._dups[b]
        return lost

    def _count_children(self) -> None:
        """Apply the queued child-count changes in one batch: a parent gains a child when an
        id gets its first cached copy and loses one when its last copy goes (parents are
        written first: an id born and dropped in one batch finds its parent)."""
        ids: list[np.ndarray] = []
        parents: list[np.ndarray] = []
        if self._born:
            chains = self._born
            x = chains[0][0] if len(chains) == 1 else np.concatenate([c for c, _ in chains])
            q = np.empty(len(x), np.int64)
            q[1:] = x[:-1]  # within a chain the parent is the id before; fix each chain's first
            starts: list[int] = []
            prevs: list[int] = []
            at = 0
            for c, prev in chains:
                starts.append(at)
                prevs.append(prev)
                at += len(c)
            q[starts] = prevs
            ids.append(x)
            parents.append(q)
        for x, q in self._born_some:
            ids.append(x)
            parents.append(q)
        if self._born_each:
            each = np.array(self._born_each, np.int64)
            ids.append(each[0::2])
            parents.append(each[1::2])
        dead = self._died
        if self._died_each:
            dead = [*dead, np.array(self._died_each, np.int64)]
        if not ids and not dead:
            return
        keys: list[np.ndarray] = []
        if ids:
            x = ids[0] if len(ids) == 1 else np.concatenate(ids)
            q = parents[0] if len(parents) == 1 else np.concatenate(parents)
            self._parent[x] = q
            keys.append(q[q >= 0])
        gained = len(keys[0]) if keys else 0
        if dead:
            q = self._parent[dead[0] if len(dead) == 1 else np.concatenate(dead)]
            keys.append(q[q >= 0])
        weight = np.ones(sum(len(k) for k in keys), np.int32)
        weight[gained:] = -1
        # siblings may share a parent: ufunc.at adds repeats (with weights of the array's
        # dtype it takes numpy's fast indexed loop)
        np.add.at(self._nchild, keys[0] if len(keys) == 1 else np.concatenate(keys), weight)
        self._born, self._born_some, self._born_each = [], [], []
        self._died, self._died_each = [], []

    def check(self, bid: np.ndarray) -> None:
        """Recount from ``bid`` (per physical block: the id it caches, -1 none)."""
        cached = np.flatnonzero(bid >= 0)
        ids, counts = np.unique(bid[cached], return_counts=True)
        assert np.array_equal(np.flatnonzero(self._first >= 0), ids), "ids with copies"
        assert np.all(bid[self._first[ids]] == ids), "first copy holds another id"
        multi = ids[counts >= 2].tolist()
        assert sorted(self._dups) == multi, "ids with several copies"
        for x, copies in self._dups.items():
            assert len(copies) == int(counts[np.searchsorted(ids, x)]), "copy counts"
            assert copies[0] == self._first[x] and np.all(bid[copies] == x), "copies"
        if self.tracks_children:
            self._count_children()
            nchild = np.zeros_like(self._nchild)
            par = self._parent[ids]
            np.add.at(nchild, par[par >= 0], 1)
            assert np.array_equal(nchild, self._nchild), "children counts"
