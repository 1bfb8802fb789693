"""Decisions only: eviction (victim order x start position x granularity), scheduling, tiering."""

from .eviction import (
    ORDERS,
    PRESETS,
    EvictionNode,
    EvictionPolicy,
    Granularity,
    LRUOrder,
    OrderName,
    PolicyError,
    StartPosition,
    VictimOrder,
    get_policy,
    private_head_start,
    register_order,
)

__all__ = [
    "ORDERS",
    "PRESETS",
    "EvictionNode",
    "EvictionPolicy",
    "Granularity",
    "LRUOrder",
    "OrderName",
    "PolicyError",
    "StartPosition",
    "VictimOrder",
    "get_policy",
    "private_head_start",
    "register_order",
]
