"""Eviction policies: three independent choices, and a policy is little more than a sort key.

1. **Victim order** -- which cached history goes first. A history is identified by an
   *evictable leaf* of the radix tree: a node with no children, lock count 0, holding GPU KV.
   (A childless node without KV is removed from the tree, so every leaf holds KV; a GPU block in
   an unlocked node always has an unlocked leaf below it, so repeated eviction can reach every
   evictable block.) An order is a key function over such leaves; smaller keys go first. Keys
   end with the node's serial number so that ties are broken explicitly and deterministically.
2. **Start position** -- where, in the chosen history, freeing begins::

       root -- A -- B ---- C ---- D          D is the victim leaf; B has two children,
                     \\                        so A-B is shared with E's history.
                      E
       tail          frees D from its last block backward      (SGLang, vLLM)
       leaf-head     frees D from its first block forward
       private-head  walks up from D while the parent is private (C: one child, unlocked,
                     not a hole, not the root) and frees from C's first block forward,
                     continuing into D when C is not enough                    (Penelope)

   The private-head walk stops below a parent that is (a) the root, (b) has several children,
   (c) is locked by a running request, or (d) is already a hole.
3. **Granularity** -- ``node`` frees whole nodes (may overshoot the request, as SGLang does);
   ``block`` splits a node at a block boundary and frees exactly what is still needed.

Node boundaries: SGLang stamps the whole node a match ends in and frees whole nodes, so for
node granularity (and the leaf-head start, which begins at a node's first block) the tree's
split history is part of the semantics and the cache reproduces it exactly. Block granularity
from the tail or the private head is *block exact*: its results depend only on per-block state,
so the cache stamps exactly the matched blocks and merges runs it no longer needs apart.

Where two combinations coincide they are the same thing: ``leaf-head`` + ``node`` frees the
whole leaf node, exactly like ``tail`` + ``node`` (pinned in tests/test_eviction_golden.py).

Adding an order (LFU, TTL pinning, cost-aware, oracle) is one class, one enum member and one
``register_order`` line; the cache only ever calls ``order.key(node)``.

This module depends on the cache *interface* only (``EvictionNode``), never on ``sim``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol


class EvictionNode(Protocol):
    """What eviction policies may read from a cache node (sim.kvcache.Node implements it)."""

    parent: EvictionNode | None  # None only for the root
    children: Mapping[int, Any]
    lock: int  # running requests whose matched path includes this node
    last_access: int  # logical clock of the last match/insert that covered the node
    hit_count: int
    serial: int  # creation order, unique: the deterministic tie-break

    @property
    def is_hole(self) -> bool: ...


class OrderName(StrEnum):
    """Registered victim orders (one member per order)."""

    LRU = "lru"


class VictimOrder(ABC):
    """A victim order: ``key(leaf)`` sorts evictable leaves; the smallest key is evicted first.

    Keys must be totally ordered and unique per node (end them with ``node.serial``)."""

    name: OrderName

    @abstractmethod
    def key(self, node: EvictionNode) -> tuple[Any, ...]: ...


class LRUOrder(VictimOrder):
    """Least recently used first (SGLang ``LRUStrategy``: ``last_access_time``)."""

    name = OrderName.LRU

    def key(self, node: EvictionNode) -> tuple[int, int]:
        return (node.last_access, node.serial)


ORDERS: dict[OrderName, VictimOrder] = {}


def register_order(order: VictimOrder) -> VictimOrder:
    """Add an order to the registry under ``order.name``."""
    ORDERS[order.name] = order
    return order


register_order(LRUOrder())


class StartPosition(StrEnum):
    TAIL = "tail"
    LEAF_HEAD = "leaf-head"
    PRIVATE_HEAD = "private-head"


class Granularity(StrEnum):
    NODE = "node"
    BLOCK = "block"


class PolicyError(ValueError):
    """Unknown policy name or component (bad user input: exit status 2)."""

    exit_code = 2


@dataclass(frozen=True)
class EvictionPolicy:
    """One point of order x start position x granularity."""

    order: str = OrderName.LRU
    start: StartPosition = StartPosition.TAIL
    granularity: Granularity = Granularity.NODE

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "order", OrderName(self.order))
            object.__setattr__(self, "start", StartPosition(self.start))
            object.__setattr__(self, "granularity", Granularity(self.granularity))
        except ValueError as e:
            raise PolicyError(f"bad eviction policy component: {e}") from None
        if self.order not in ORDERS:
            raise PolicyError(f"victim order {self.order!r} is not registered")

    @property
    def makes_holes(self) -> bool:
        """True iff freeing can start before the end of a history (leaves NONE nodes behind)."""
        return self.start is not StartPosition.TAIL

    @property
    def block_exact(self) -> bool:
        """True iff results do not depend on where node boundaries fall: block granularity
        from the tail or the private head (a leaf-head start and node granularity both read
        node boundaries). The cache then stamps exactly the matched blocks and merges
        single-child runs of equal state; otherwise it reproduces SGLang's node semantics.
        (Exact for orders that read ``last_access``; a merge keeps the larger ``hit_count``,
        so an LFU order must decide whether that is the per-block count it wants.)"""
        return self.granularity is Granularity.BLOCK and self.start is not StartPosition.LEAF_HEAD

    @property
    def victim_order(self) -> VictimOrder:
        return ORDERS[OrderName(self.order)]

    @property
    def spec(self) -> str:
        """``order+start+granularity``, e.g. ``lru+private-head+block``."""
        return f"{self.order}+{self.start}+{self.granularity}"

    @property
    def name(self) -> str:
        """The preset name when this is a preset, else the spec (for tables)."""
        for preset, policy in PRESETS.items():
            if policy == self:
                return preset
        return self.spec


PRESETS: dict[str, EvictionPolicy] = {
    "sglang": EvictionPolicy(OrderName.LRU, StartPosition.TAIL, Granularity.NODE),
    "vllm": EvictionPolicy(OrderName.LRU, StartPosition.TAIL, Granularity.BLOCK),
    "penelope": EvictionPolicy(OrderName.LRU, StartPosition.PRIVATE_HEAD, Granularity.BLOCK),
}


def get_policy(name: str | EvictionPolicy) -> EvictionPolicy:
    """A preset name (``sglang``, ``vllm``, ``penelope``) or a spec ``lru+tail+block``."""
    if isinstance(name, EvictionPolicy):
        return name
    key = name.strip().lower()
    if key in PRESETS:
        return PRESETS[key]
    parts = key.split("+")
    if len(parts) != 3:
        raise PolicyError(
            f"unknown eviction policy {name!r}: use a preset ({', '.join(PRESETS)}) "
            "or order+start+granularity such as lru+private-head+block"
        )
    return EvictionPolicy(*parts)


def private_head_start(leaf: EvictionNode) -> EvictionNode:
    """The first node of ``leaf``'s private history (Penelope's start position).

    Walk from the leaf toward the root and stop at the node whose parent is the root, has
    several children, is locked, or is already a hole::

        root -- S -- X -- Y -- L      S: several children below? no -> keep walking
                      \\               X has two children -> stop: start = Y
                       Z

    Every node from the returned one down to the leaf has exactly one child (except the leaf),
    is unlocked and holds KV, so the whole chain may be freed front to back.
    """
    node = leaf
    while True:
        parent = node.parent
        if (
            parent is None
            or parent.parent is None  # parent is the root
            or len(parent.children) > 1
            or parent.lock > 0
            or parent.is_hole
        ):
            return node
        node = parent
