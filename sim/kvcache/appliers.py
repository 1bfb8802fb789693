"""The appliers: carry out eviction plans (``planner.Step`` lists) on the tree. A mixin of
``RadixTree``: every change goes through the tree's own KV moves (``delete``,
``truncate_tail``, ``move_to_host``, ``drop_device_copy``, ``split``), which keep the counters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .node import Tier

if TYPE_CHECKING:
    from .node import Node
    from .planner import Step
    from .results import EvictResult

_NONE = Tier.NONE


class Appliers:
    """Plan appliers; mixed into ``RadixTree`` (which provides the KV moves used here)."""

    def apply_delete(self, steps: list[Step], result: EvictResult) -> None:
        """Carry out a deletion plan (GPU-only caches; unified deletions across tiers; HiCache
        host eviction). Holes still in the tree afterwards are counted in ``holes_made``."""
        made: list[Node] = []
        for node, k, head in steps:
            if k == len(node.ids):
                if node.children:
                    made.append(node)
                self.delete(node, result)
            elif head:
                hole = self.split(node, k)
                made.append(hole)
                self.delete(hole, result)
            else:
                self.truncate_tail(node, k, result)
        if made:
            result.holes_made += sum(len(x.ids) for x in made
                                     if x.parent is not None and x.tier is _NONE)

    def _whole(self, step: Step) -> Node:
        """The node carrying exactly the step's blocks (split off when partial)."""
        node, k = step.node, step.blocks
        size = len(node.ids)
        if k == size:
            return node
        if step.head:
            return self.split(node, k)  # the prefix moves
        self.split(node, size - k)  # node keeps its identity
        return node

    def apply_demote(self, steps: list[Step], result: EvictResult) -> None:
        """Carry out a unified demotion plan: each step's blocks move GPU -> CPU."""
        for step in steps:
            self.move_to_host(self._whole(step), result)

    def apply_device_evict(self, steps: list[Step], result: EvictResult,
                           backup=None) -> None:
        """Carry out a HiCache device-eviction plan: a backed-up node is demoted (its device
        copy dropped), any other is deleted. ``backup(node, result)``, when given, is called
        first (write_back copies at eviction time)."""
        for step in steps:
            node = self._whole(step)
            if backup is not None and not node.host:
                backup(node, result)
            if node.host:
                self.drop_device_copy(node, result)
            else:
                assert not node.children, f"a device node with host children: {node!r}"
                self.delete(node, result)
