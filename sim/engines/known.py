"""The block ids a server ever inserted (``EngineBase``'s unlimited cache), stored compactly.

A run inserts tens of ids per request, a million-request run tens of millions: as a Python
``set[int]`` that is about 70 bytes an id. Trace ids are dense: ``traces.model.Trace`` numbers
prompt blocks from 0 in order of first use and output blocks after them, so the ids a server
sees fill a range from 0. ``KnownBlocks`` keeps those in a bitmap (one bit an id) and every
other id (the versioned and dropped keys of sim/kvcache/versions.py, ids past the bitmap's
reach) in an exact overflow set. The bitmap grows by doubling, but only while it stays dense:
at most ``DENSITY`` bits per id inserted (plus a small floor), so sparse ids cannot blow it
up; they go to the overflow set, as they would have before.

Membership is exact either way; ``known_prefix`` answers what the engines ask (how many
leading ids of a chained prompt are known) by bisection, since chained ids make the known
ids prefix-closed.
"""

from __future__ import annotations

import numpy as np

FLOOR_BITS = 1 << 23  # the bitmap may always reach 8M ids (1 MiB)
DENSITY = 16  # beyond the floor, at most this many bits per id inserted


class KnownBlocks:
    """An exact, insert-only set of int64 block ids: a bitmap over ``[0, bits)`` and a set
    for the rest."""

    def __init__(self) -> None:
        self._bits = bytearray()  # bit x % 8 of byte x // 8: id x is known
        self._nbits = 0
        self._other: set[int] = set()  # ids outside the bitmap when they came
        self._added = 0  # ids passed to add (duplicates included): bounds the bitmap

    @property
    def covered(self) -> int:
        """The bitmap covers ids ``[0, covered)``; every other id is in the overflow set."""
        return self._nbits

    def __len__(self) -> int:
        return len(self.to_array())

    def __contains__(self, x: int) -> bool:
        if 0 <= x < self._nbits and self._bits[x >> 3] >> (x & 7) & 1:
            return True
        return x in self._other

    def add(self, ids: np.ndarray) -> None:
        """Insert ``ids`` (any int array; repeats and known ids are fine)."""
        ids = np.asarray(ids, dtype=np.int64).ravel()
        if not ids.size:
            return
        self._added += int(ids.size)
        hi = int(ids.max())
        if hi >= self._nbits and int(ids.min()) >= 0:
            self._grow(hi + 1)
        if int(ids.min()) >= 0 and hi < self._nbits:
            inside = ids
        else:
            mask = (ids >= 0) & (ids < self._nbits)
            inside = ids[mask]
            self._other.update(ids[~mask].tolist())
        if inside.size:
            view = np.frombuffer(self._bits, dtype=np.uint8)
            np.bitwise_or.at(view, inside >> 3,
                             np.left_shift(1, inside & 7).astype(np.uint8))
            del view  # (a live view would pin the buffer: the next grow resizes it)

    def _grow(self, want: int) -> None:
        """Extend the bitmap to cover ``[0, want)`` when that keeps it dense; else leave it
        (the ids beyond go to the overflow set)."""
        limit = max(FLOOR_BITS, DENSITY * self._added)
        if want > limit:
            want = limit
        if want <= self._nbits:
            return
        nbits = max(want, min(2 * self._nbits, limit))
        nbytes = -(-nbits // 8)
        self._bits.extend(bytes(nbytes - len(self._bits)))
        self._nbits = nbytes * 8

    def known_prefix(self, ids: np.ndarray) -> int:
        """How many leading ids of ``ids`` are known, assuming the known ones among them are
        a prefix (chained ids): a bisection on membership."""
        lo, hi = 0, ids.size
        bits, nbits, other = self._bits, self._nbits, self._other
        item = ids.item
        while lo < hi:
            mid = (lo + hi + 1) // 2
            x = item(mid - 1)
            if (0 <= x < nbits and bits[x >> 3] >> (x & 7) & 1) or x in other:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def to_array(self) -> np.ndarray:
        """Every known id, sorted (int64)."""
        if self._nbits:
            flags = np.unpackbits(np.frombuffer(self._bits, dtype=np.uint8),
                                  bitorder="little")
            dense = np.flatnonzero(flags).astype(np.int64)
        else:
            dense = np.zeros(0, np.int64)
        rest = np.fromiter(self._other, dtype=np.int64, count=len(self._other))
        return np.union1d(dense, rest)
