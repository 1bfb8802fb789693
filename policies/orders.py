"""Victim orders: "a policy is a sort key" (SGLang ``evict_policy.py``).

An order is a named function ``key(node) -> tuple``: the planner evicts the evictable leaf with
the SMALLEST key first. Register one with the decorator::

    @register_order("lfu")
    def lfu(node):
        return (node.hit_count, node.last_access)

Keys need not be unique: the planner breaks ties on ``node.serial`` (creation order), so a run
is deterministic whatever the order returns. A key may read only the node fields of the
``CacheNode`` protocol (``policies.context``); an order that needs more (the time, the cost of
recomputing a block, per-session state) is a method of a policy class instead
(``EvictionPolicy.key``).

Node fields are per node, not per block: under block-exact policies (``vllm``, ``penelope``)
the cache merges runs of equal state (see ``EvictionPolicy.block_exact``), keeping the larger
``hit_count`` of the merged nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from costmodel.registry import Registry

from .context import CacheNode, PolicyError

OrderKey = Callable[[CacheNode], Any]

ORDERS: Registry[OrderKey] = Registry("victim order", PolicyError)


def register_order(name: str) -> Callable[[OrderKey], OrderKey]:
    """Decorator: register ``fn`` as the victim order ``name`` (re-registering replaces)."""
    return ORDERS.register(name)


def get_order(name: str) -> OrderKey:
    return ORDERS.get(name)


@register_order("lru")
def lru(node: CacheNode) -> tuple[int, int]:
    """Least recently used first (SGLang ``LRUStrategy``: ``last_access_time``)."""
    return (node.last_access, node.serial)


@register_order("mru")
def mru(node: CacheNode) -> tuple[int, int]:
    """Most recently used first (SGLang ``MRUStrategy``): a scan-resistant foil for LRU."""
    return (-node.last_access, node.serial)


@register_order("lfu")
def lfu(node: CacheNode) -> tuple[int, int, int]:
    """Least frequently matched first, LRU among equals (SGLang ``LFUStrategy``)."""
    return (node.hit_count, node.last_access, node.serial)


@register_order("fifo")
def fifo(node: CacheNode) -> tuple[int]:
    """Oldest node first by creation order (a split's prefix is a newer node)."""
    return (node.serial,)
