"""Eviction mechanism: the six start-position x granularity variants over the radix tree.

The victim loop is SGLang's ``RadixCache.evict``: a heap of the evictable leaves keyed by the
policy's order (ties impossible: keys end with the node serial); pop the first leaf, free from
it according to the start position and granularity; when a leaf leaves the tree and its parent
becomes an unlocked childless GPU node, push the parent. Stop once ``n`` blocks are freed.

What one victim frees (``need`` = blocks still wanted; ``|`` = block boundary)::

    history of leaf D:   root -- [A A A] -- [B B B B B B B B] -- [D D D]      (A shared)

    tail + node          frees D D D (whole leaf, may overshoot), then the parent B becomes a
                         leaf and competes in the heap with its own key       (SGLang)
    tail + block         need=2: [D] stays, frees D D from the end            (vLLM)
    leaf-head + node     = tail + node: the whole leaf (the same thing, pinned in a test)
    leaf-head + block    need=2: splits D into [D D] hole + [D], frees the hole
    private-head + node  start = B (A is shared): B becomes a hole whole; D next if needed
    private-head + block need=3: splits B into [B B B] hole + [B B B B B]: frees 3, keeps 5
                         (the paper's Figure 3); need=10: frees all of B, then 2 of D

Head-first freeing leaves NONE nodes (holes) in front of GPU nodes; a chain freed to its end
leaves the tree, together with NONE ancestors that become childless.

Under ``tiering="unified"`` the same loop is the one deletion order across both tiers: leaves
and chains may hold CPU nodes, which are deleted like GPU ones (``sim.kvcache.tiers``).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from policies.eviction import Granularity, StartPosition, private_head_start

from .node import Node, Tier
from .results import EvictResult

if TYPE_CHECKING:
    from .cache import RadixKVCache


def evict(cache: RadixKVCache, n: int, result: EvictResult | None = None) -> EvictResult:
    """Delete at least n blocks (exactly n at block granularity when possible). Without a CPU
    tier every leaf is a GPU leaf: n GPU blocks freed. Under ``tiering="unified"`` the leaves
    of both tiers compete: the one deletion order across tiers (``sim.kvcache.tiers``).
    Counts add to ``result`` when given."""
    if result is None:
        result = EvictResult(ok=n <= 0)
    if n <= 0:
        return result
    n += result.deleted_blocks
    key = cache.policy.victim_order.key
    heap = [(key(leaf), leaf) for leaf in cache._leaves]
    heapq.heapify(heap)
    made: list[Node] = []  # nodes turned into holes by this call
    while result.deleted_blocks < n and heap:
        _, leaf = heapq.heappop(heap)
        if leaf not in cache._leaves:  # defensive: never happens (leaves gain no children)
            continue
        survivor = _evict_history(cache, leaf, n - result.deleted_blocks, result, made)
        if survivor is not None:
            heapq.heappush(heap, (key(survivor), survivor))
    result.ok = result.deleted_blocks >= n
    result.holes_made += sum(
        len(x.ids) for x in made if x.parent is not None and x.tier == Tier.NONE
    )
    return result


def chain_from(first: Node, leaf: Node) -> list[Node]:
    """The nodes from ``first`` (an ancestor of ``leaf``, or ``leaf``) down to ``leaf``."""
    chain = [leaf]
    while chain[-1] is not first:
        chain.append(chain[-1].parent)  # type: ignore[arg-type]
    chain.reverse()
    return chain


def _evict_history(
    cache: RadixKVCache, leaf: Node, need: int, result: EvictResult, made: list[Node]
) -> Node | None:
    """Free up to ``need`` blocks (more at node granularity) from the history ending at the
    evictable ``leaf``. Returns an ancestor that just became an evictable leaf, if any."""
    policy = cache.policy
    whole_nodes = policy.granularity is Granularity.NODE
    start = policy.start
    if start is StartPosition.TAIL or (whole_nodes and start is StartPosition.LEAF_HEAD):
        size = len(leaf.ids)
        if whole_nodes or need >= size:
            return cache._free(leaf, result)
        cache._truncate_tail(leaf, need, result)
        return None
    chain = ([leaf] if start is StartPosition.LEAF_HEAD
             else chain_from(private_head_start(leaf), leaf))
    survivor = None
    for node in chain:
        if need <= 0:
            break
        size = len(node.ids)
        if whole_nodes or need >= size:
            if node.children:
                made.append(node)
            survivor = cache._free(node, result)
            need -= size
        else:
            hole = cache._split(node, need)
            made.append(hole)
            cache._free(hole, result)
            need = 0
    return survivor
