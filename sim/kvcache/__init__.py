"""The radix KV cache over block ids: nodes with GPU / CPU / NONE (hole) / DROPPED state,
locks, a logical clock, an optional CPU tier (unified or HiCache), eviction planned by a
``policies.EvictionPolicy`` (``planner``) and applied by the tree (``tree``, ``appliers``),
context edits over a versioned key space (``versions``, ``edits``), and KV events the caches
(this one and vLLM's block pool, ``blockpool``) queue where they change state for a consumer
to drain (``events``)."""

from .cache import CapacityError, RadixKVCache, as_block_ids
from .edits import EditResult
from .node import Node, Tier
from .planner import Step
from .results import EvictResult, InsertResult, LoadResult, Match, split_match

__all__ = [
    "CapacityError",
    "EditResult",
    "EvictResult",
    "InsertResult",
    "LoadResult",
    "Match",
    "Node",
    "RadixKVCache",
    "Step",
    "Tier",
    "as_block_ids",
    "split_match",
]
