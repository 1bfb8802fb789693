"""The radix KV cache over block ids: nodes with GPU / CPU / NONE (hole) state, locks, a
logical clock, and eviction through a ``policies.eviction.EvictionPolicy``; an optional CPU
tier, unified (Penelope) or hicache (SGLang HiCache), in ``tiers``."""

from .cache import CapacityError, RadixKVCache, as_block_ids
from .node import Node, Tier
from .results import EvictResult, InsertResult, LoadResult, Match

__all__ = [
    "CapacityError",
    "EvictResult",
    "InsertResult",
    "LoadResult",
    "Match",
    "Node",
    "RadixKVCache",
    "Tier",
    "as_block_ids",
]
