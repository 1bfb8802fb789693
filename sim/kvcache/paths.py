"""Walk hints: where a caller's last walk of the radix tree (``RadixTree.walk``) ended, so
that the next walk of the same prompt climbs from there instead of descending from the root.
"""

from __future__ import annotations

from .node import Node


class WalkHint:
    """Where a caller's last walk of the same prompt ended (``RadixKVCache.match``/``insert``
    take one per request, the replay one per session): a later walk of that prompt, or of a
    prefix or extension of it, climbs from there to the root by parent links instead of
    looking up every node again. Valid while the node is in the tree, no node on its path got
    new keys since (``Node.keyed`` against the tree's ``epoch`` when the hint was taken), and
    the node's last key is the prompt's there (keys are chained: then the whole prefix is).
    Splits, merges and evictions keep the keys of a path, so they keep a hint valid."""

    __slots__ = ("epoch", "node")

    def __init__(self) -> None:
        self.node: Node | None = None
        self.epoch = -1

    def point_at(self, node: Node | None, epoch: int) -> None:
        self.node, self.epoch = node, epoch
