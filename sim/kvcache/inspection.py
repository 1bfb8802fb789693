"""Read-only views of the cache: its counters and its nodes (a mixin of ``RadixKVCache``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from .node import Node, Tier

if TYPE_CHECKING:
    from .tree import RadixTree

_GPU, _CPU = Tier.GPU, Tier.CPU


class Inspection:
    """Counters (blocks) and node listings; mixed into ``RadixKVCache``."""

    tree: RadixTree
    root: Node

    # ------------------------------------------------------------------ counters (blocks)
    @property
    def capacity_blocks(self) -> int:
        return self.tree.capacity_blocks

    @property
    def cpu_capacity_blocks(self) -> int:
        return self.tree.cpu_capacity_blocks

    @property
    def gpu_blocks(self) -> int:
        """GPU blocks owned by the tree."""
        return self.tree.gpu_blocks

    @property
    def reserved_blocks(self) -> int:
        """GPU blocks owned by running requests outside the tree."""
        return self.tree.reserved_blocks

    @property
    def free_blocks(self) -> int:
        return self.tree.free_blocks

    @property
    def evictable_blocks(self) -> int:
        """GPU blocks in unlocked nodes (all of them can be freed by repeated eviction)."""
        return self.tree.evictable_blocks

    @property
    def protected_blocks(self) -> int:
        """GPU blocks in locked nodes."""
        return self.tree.protected_blocks

    @property
    def cpu_blocks(self) -> int:
        """Blocks resident on CPU: unified = blocks of CPU-only nodes; hicache = host copies
        (host-only nodes and backed-up device nodes)."""
        return self.tree.cpu_blocks

    @property
    def cpu_free_blocks(self) -> int:
        return self.tree.cpu_free_blocks

    @property
    def hole_blocks(self) -> int:
        """Blocks in NONE nodes (ids known, KV freed)."""
        return self.tree.hole_blocks

    @property
    def dropped_blocks(self) -> int:
        """Blocks in DROPPED nodes (context edits: KV dropped on purpose, never refilled)."""
        return self.tree.dropped_blocks

    @property
    def working_peak_blocks(self) -> int:
        """Most GPU blocks running requests held at once (locked paths + reservations)."""
        return self.tree.working_peak_blocks

    @property
    def clock(self) -> int:
        """The logical clock: the tick of the latest stamping operation."""
        return self.tree.clock

    # ------------------------------------------------------------------ inspection
    def cpu_resident_block_ids(self) -> np.ndarray:
        """Block ids with a CPU copy (unified: CPU nodes; hicache: host copies), sorted."""
        runs = [nd.ids for nd in self.iter_nodes() if nd.tier is _CPU or nd.host]
        return np.sort(np.concatenate(runs)) if runs else np.empty(0, dtype=np.int64)

    def resident_block_ids(self) -> np.ndarray:
        """All GPU-resident block ids in the tree, sorted."""
        runs = [nd.ids for nd in self.iter_nodes() if nd.tier is _GPU]
        return np.sort(np.concatenate(runs)) if runs else np.empty(0, dtype=np.int64)

    def iter_nodes(self) -> Iterator[Node]:
        """All nodes except the root, depth first (children in key order)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root:
                yield node
            stack.extend(node.children[k] for k in sorted(node.children, reverse=True))

    def dump(self) -> str:
        """The tree as indented text (debugging, test failure messages)."""
        lines = []

        def walk(node: Node, depth: int) -> None:
            for key in sorted(node.children):
                child = node.children[key]
                ids = child.ids.tolist()
                shown = ids if len(ids) <= 6 else [*ids[:3], "...", *ids[-2:]]
                lines.append(f"{'  ' * depth}{child!r} ids={shown}")
                walk(child, depth + 1)

        walk(self.root, 0)
        return "\n".join(lines)

