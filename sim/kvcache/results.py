"""Plain results of cache operations (all sizes in blocks)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .node import Node, Tier


@dataclass(frozen=True, slots=True)
class Match:
    """Result of ``RadixKVCache.match``.

    node: deepest matched node, the handle to ``lock``/``unlock`` (the root when nothing
      matched); the match ends exactly at ``node.end`` because match splits the node it ends in.
    matched_blocks: length of the matched path, holes included.
    hit_blocks: GPU-resident blocks before the first non-GPU block (SGLang's hit length).
    segments: runs ``(start_block, end_block, tier)`` covering ``[0, matched_blocks)`` in
      order, adjacent runs of one tier merged: GPU = reuse, CPU = load, NONE = recompute.
    """

    node: Node
    matched_blocks: int
    hit_blocks: int
    segments: tuple[tuple[int, int, Tier], ...]

    def blocks_in(self, tier: Tier) -> int:
        return sum(e - s for s, e, t in self.segments if t == tier)

    @property
    def hole_blocks(self) -> int:
        """Matched blocks whose KV must be recomputed (a phantom prefill)."""
        return self.blocks_in(Tier.NONE)


@dataclass(slots=True)
class EvictResult:
    """Result of ``evict``/``make_room``.

    ok: the request was met (``evict``: at least n freed; ``make_room``: free_blocks >= n).
    freed_blocks: GPU blocks freed; freed: their ids, one array per freed run in the order
      the runs were freed (each run in ascending position); holes_made: freed blocks still in
      the tree as NONE when the call returns (the rest left the tree).
    """

    ok: bool
    freed_blocks: int = 0
    freed: list[np.ndarray] = field(default_factory=list)
    holes_made: int = 0

    def freed_ids(self) -> np.ndarray:
        """All freed ids, concatenated in the order freed."""
        if not self.freed:
            return np.empty(0, dtype=np.int64)
        return np.concatenate(self.freed)


@dataclass(frozen=True, slots=True)
class InsertResult:
    """Result of ``insert``: node holds ids[-1] (root for empty ids); new_blocks became a new
    leaf, filled_blocks were holes refilled, existing_blocks were GPU already."""

    node: Node
    new_blocks: int
    filled_blocks: int
    existing_blocks: int

    @property
    def added_blocks(self) -> int:
        """GPU blocks the tree gained (new + filled)."""
        return self.new_blocks + self.filled_blocks
