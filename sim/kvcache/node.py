"""Radix tree nodes over block ids.

A node is a run of blocks at absolute block positions ``[start, end)`` with ONE KV state::

    root (no blocks)
     |-- [0, 4)  GPU   ids a0 a1 a2 a3        children keyed by the child's first block id
     |     |-- [4, 9)  NONE  b4 .. b8         a hole: ids known, KV freed
     |     |     `-- [9, 12) GPU c9 c10 c11   a leaf (leaves always hold KV)
     |     |-- [4, 6)  GPU   d4 d5
     |     `-- [4, 5)  DROPPED ~f4            dropped on purpose: no KV, never refilled
     |           `-- [5, 7) GPU g5 g6         KV made while f4 was visible (see versions.py)
     `-- [0, 2)  GPU   e0 e1

Invariants (checked by ``sim.kvcache.invariants.recount``):
- ``child.start == parent.end``; ``parent.children[child.ids[0]] is child``;
- a node is homogeneous: one tier for all its blocks; splits happen only at block boundaries;
- ``lock`` = number of running requests whose matched path ends at or below this node, so
  ``node.lock >= sum(child.lock)``; a locked node is never freed;
- a childless, unlocked node without KV (tier NONE or DROPPED) does not exist: it is removed
  at once, cascading upward through KV-less ancestors that become childless;
- a node is DROPPED exactly when its ids are dropped keys (negative, ``versions.is_dropped``):
  the drop is part of the key, so only a history that dropped those blocks reaches the node,
  and no operation turns a DROPPED node back into KV.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from policies.context import Tier  # one enum: the tiers policies see are the cache's


class Node:
    """One radix node. ``ids`` is a view into the caller's array (no copy); callers must not
    mutate arrays they pass to the cache."""

    __slots__ = (
        "children",
        "hit_count",
        "host",
        "ids",
        "keyed",
        "last",
        "last_access",
        "lock",
        "parent",
        "serial",
        "start",
        "tier",
    )

    def __init__(
        self,
        ids: np.ndarray,
        start: int,
        parent: Node | None,
        tier: Tier,
        serial: int,
        last_access: int = 0,
    ) -> None:
        self.ids = ids
        self.last = ids.item(-1) if len(ids) else None  # ids[-1] as an int: the fast match test
        self.start = start
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.tier = tier
        self.lock = 0
        self.last_access = last_access
        self.hit_count = 0
        self.host = False  # hicache only: a host (CPU) copy exists (always True for tier CPU)
        self.serial = serial
        self.keyed = 0  # the tree's epoch when a context edit last gave the node new keys

    @property
    def num_blocks(self) -> int:
        return len(self.ids)

    @property
    def end(self) -> int:
        return self.start + len(self.ids)

    @property
    def is_hole(self) -> bool:
        return self.tier == Tier.NONE

    @property
    def has_kv(self) -> bool:
        """GPU or CPU KV (a hole or a dropped node holds none)."""
        return self.tier == Tier.GPU or self.tier == Tier.CPU

    @property
    def is_root(self) -> bool:
        return self.parent is None and self.start == 0 and len(self.ids) == 0

    def __repr__(self) -> str:
        return (
            f"Node(#{self.serial} [{self.start},{self.end}) {self.tier.name}"
            f"{'+host' if self.host and self.tier == Tier.GPU else ''} lock={self.lock} "
            f"t={self.last_access} children={len(self.children)})"
        )


def prune_upward(node: Node, root: Node, kvless: Callable[[Node], bool],
                 live_children: Callable[[Node], int], detach: Callable[[Node], None]) -> Node:
    """Remove ``node`` and then each ancestor while it is KV-less, childless and unlocked
    (``detach`` takes one out); return the first node that stays. The rule that no childless,
    unlocked node without KV exists. ``RadixTree.delete`` and the planner's virtual state
    (``planner.HistoryView.release``) apply the same rule to a node just freed whole, with
    their reads inlined (every eviction of a leaf runs it)."""
    while node is not root and kvless(node) and not live_children(node):
        if node.lock:
            return node
        parent = node.parent
        assert parent is not None
        detach(node)
        node = parent
    return node

