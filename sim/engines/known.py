"""The block ids a server ever inserted (``EngineBase``'s unlimited cache), stored compactly.

A run inserts tens of ids per request, a million-request run tens of millions: as a Python
``set[int]`` that is about 70 bytes an id. Trace ids are dense: ``traces.builder`` numbers
the prompt blocks from 0 up, scope by scope, and ``traces.model.Trace`` the output blocks
after them, so the ids a server sees fill a range from 0. ``KnownBlocks`` keeps those in a
flag array (one byte an id: a vectorized store to insert, one index to test) and every other
id (the versioned and dropped keys of sim/kvcache/versions.py, ids past the flags' reach) in
an exact overflow set. The flags grow by doubling, but only while they stay dense: at most
``DENSITY`` flags per id inserted (plus a small floor), so sparse ids cannot blow them up;
they go to the overflow set, as they would have before.

Membership is exact either way; ``known_prefix`` answers what the engines ask (how many
leading ids of a chained prompt are known) by bisection, since chained ids make the known
ids prefix-closed.
"""

from __future__ import annotations

from typing import Final

import numpy as np

FLOOR_IDS = 1 << 22  # the flags may always reach 4M ids (4 MiB)
DENSITY: Final = 4  # beyond the floor, at most this many flags (bytes) per id inserted
SMALL: Final = 64  # inserts of up to this many ids run in Python


class KnownBlocks:
    """An exact, insert-only set of int64 block ids: flags over ``[0, covered)`` and a set
    for the rest."""

    def __init__(self) -> None:
        self._flags = bytearray()  # byte x is 1: id x is known
        self._nflags = 0
        # A uint8 view of the flags for vectorized stores, made once per size: a live view
        # pins the buffer, so ``_grow`` lets it go before resizing.
        self._view: np.ndarray | None = None
        self._other: set[int] = set()  # ids outside the flags when they came
        self._added = 0  # ids stored (duplicates included): bounds the flags
        # Inserts not stored yet: the next query stores them at once (a chunked prefill
        # adds a few ids per chunk, and queries come once per admission).
        self._pending: list[np.ndarray] = []

    @property
    def covered(self) -> int:
        """The flags cover ids ``[0, covered)``; every other id is in the overflow set."""
        if self._pending:
            self._flush()
        return self._nflags

    def __len__(self) -> int:
        return len(self.to_array())

    def __contains__(self, x: int) -> bool:
        return self.has(x)

    def add(self, ids: np.ndarray) -> None:
        """Insert ``ids`` (any int array; repeats and known ids are fine). Held until the
        next query, which stores every insert held so far in one batch: callers do not
        change arrays they passed (the cache's contract, sim/kvcache/node.py)."""
        ids = np.asarray(ids, dtype=np.int64).ravel()
        if ids.size:
            self._pending.append(ids)

    def _flush(self) -> None:
        """Store the inserts held (before any query reads the set)."""
        pending = self._pending
        self._pending = []
        self._store(pending[0] if len(pending) == 1 else np.concatenate(pending))

    def _store(self, ids: np.ndarray) -> None:
        n = ids.size
        if not n:
            return
        self._added += n
        if n <= SMALL:  # a few ids (most inserts): Python ints beat numpy's call overhead
            xs = ids.tolist()
            lo, hi = min(xs), max(xs)
            if lo >= 0 and hi < self._nflags:
                flags = self._flags
                for x in xs:
                    flags[x] = 1
                return
        else:
            # Every id inside the flags (most inserts): one store, whose bounds check refuses
            # an id past them (the stores it made stay: those ids are known). (No local holds
            # the view: a grow below must be free to let it go.)
            if self._view is not None and int(ids.min()) >= 0:
                try:
                    self._view[ids] = 1
                    return
                except IndexError:
                    pass
            lo, hi = int(ids.min()), int(ids.max())
        if hi >= self._nflags and lo >= 0:
            self._grow(hi + 1)
        if lo < 0 or hi >= self._nflags:
            inside = (ids >= 0) & (ids < self._nflags)
            self._other.update(ids[~inside].tolist())
            ids = ids[inside]
        if self._view is None:
            self._view = np.frombuffer(self._flags, dtype=np.uint8)
        self._view[ids] = 1

    def _grow(self, want: int) -> None:
        """Extend the flags to cover ``[0, want)`` when that keeps them dense; else as far as
        they may (the ids beyond go to the overflow set)."""
        limit = max(FLOOR_IDS, DENSITY * self._added)
        want = min(want, limit)
        if want <= self._nflags:
            return
        n = max(want, min(2 * self._nflags, limit))
        self._view = None
        self._flags.extend(bytes(n - self._nflags))
        self._nflags = n

    def known_prefix(self, ids: np.ndarray) -> int:
        """How many leading ids of ``ids`` are known, assuming the known ones among them are
        a prefix (chained ids): ``traces.model.longest_known_prefix``'s bisection, with the
        membership test inlined (the engines ask it at every admission)."""
        if self._pending:
            self._flush()
        n = int(ids.size)
        item = ids.item
        if n and self.has(item(n - 1)):
            return n
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.has(item(mid - 1)):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def has(self, x: int) -> bool:
        """Whether id ``x`` is known."""
        if self._pending:
            self._flush()
        if 0 <= x < self._nflags and self._flags[x]:
            return True
        return x in self._other

    def to_array(self) -> np.ndarray:
        """Every known id, sorted (int64)."""
        if self._pending:
            self._flush()
        dense = np.flatnonzero(np.frombuffer(self._flags, dtype=np.uint8)).astype(np.int64)
        rest = np.fromiter(self._other, dtype=np.int64, count=len(self._other))
        return np.union1d(dense, rest)
