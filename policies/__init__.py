"""Decisions only: eviction policies (order x start x granularity, pins, events) and
scheduling. The public API users write policies against (see docs/policies.md)."""

from .context import CPU, GPU, HOLE, Arrival, CacheNode, PolicyContext, PolicyError, Reply, TreeView
from .eviction import (
    BLOCK,
    GRANULARITIES,
    LEAF_HEAD,
    NODE,
    PRESETS,
    PRIVATE_HEAD,
    STARTS,
    TAIL,
    Blocks,
    EvictionPolicy,
    Granularity,
    KeepFront,
    LeafHead,
    ObservedStart,
    PrivateHead,
    StartPosition,
    Tail,
    WholeNodes,
    WrappedStart,
)
from .orders import ORDERS, get_order, register_order
from .registry import POLICIES, get_policy, load_policy_class, register_policy

from . import zoo  # last: registers the zoo's policies (policies/zoo/) by name  # isort: skip
from . import routers  # registers the built-in routers (policies/routers/)  # isort: skip

__all__ = [
    "BLOCK",
    "CPU",
    "GPU",
    "GRANULARITIES",
    "HOLE",
    "LEAF_HEAD",
    "NODE",
    "ORDERS",
    "POLICIES",
    "PRESETS",
    "PRIVATE_HEAD",
    "STARTS",
    "TAIL",
    "Arrival",
    "Blocks",
    "CacheNode",
    "EvictionPolicy",
    "Granularity",
    "KeepFront",
    "LeafHead",
    "ObservedStart",
    "PolicyContext",
    "PolicyError",
    "PrivateHead",
    "Reply",
    "StartPosition",
    "Tail",
    "TreeView",
    "WholeNodes",
    "WrappedStart",
    "get_order",
    "get_policy",
    "load_policy_class",
    "register_order",
    "register_policy",
    "routers",
    "zoo",
]
