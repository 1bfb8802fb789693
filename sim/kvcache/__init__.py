"""The radix KV cache over block ids: nodes with GPU / CPU / NONE (hole) / DROPPED state,
locks, a logical clock, an optional CPU tier (unified or HiCache), eviction planned by a
``policies.EvictionPolicy`` (``planner``) and applied by the tree (``tree``, ``appliers``),
context edits over a versioned key space (``versions``, ``edits``), and KV events the caches
(this one and vLLM's block pool, ``blockpool``) queue where they change state for a consumer
to drain (``events``). SGLang's tree for hybrid models (full KV beside SWA KV or recurrent
states: ``hybridtree``) and what a hole costs to refill on one (``refill``) stand beside it.
Its core may run compiled: sim/native.py decides, before the first of its modules loads."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cache import RadixKVCache, as_block_ids
    from .edits import EditResult
    from .errors import CapacityError
    from .node import Node, Tier
    from .planner import Step
    from .results import EvictResult, InsertResult, LoadResult, Match, split_match

# name -> its module: loaded at the first read, so that
# ``import sim`` (whose __init__ installs the core through ``native``) loads no cache, numpy
# or policies: ``kvsim --help`` does not need them (issue 55 start-up).
_EXPORTS = {"RadixKVCache": "cache", "as_block_ids": "cache", "EditResult": "edits",
            "CapacityError": "errors", "Node": "node", "Tier": "node", "Step": "planner",
            "EvictResult": "results", "InsertResult": "results", "LoadResult": "results",
            "Match": "results", "split_match": "results"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value  # the next read is a plain attribute
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
