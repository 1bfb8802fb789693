"""The radix KV cache over block ids: nodes with GPU / CPU / NONE (hole) / DROPPED state,
locks, a logical clock, an optional CPU tier (unified or HiCache), eviction planned by a
``policies.EvictionPolicy`` (``planner``) and applied by the tree (``tree``, ``appliers``),
context edits over a versioned key space (``versions``, ``edits``), and KV events the caches
(this one and vLLM's block pool, ``blockpool``) queue where they change state for a consumer
to drain (``events``). Its core may run compiled: ``native`` decides, before the first of
its modules loads."""

from . import native

native.install()

from .cache import RadixKVCache, as_block_ids  # noqa: E402 (after the path is decided)
from .edits import EditResult  # noqa: E402
from .errors import CapacityError  # noqa: E402
from .node import Node, Tier  # noqa: E402
from .planner import Step  # noqa: E402
from .results import EvictResult, InsertResult, LoadResult, Match, split_match  # noqa: E402

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
