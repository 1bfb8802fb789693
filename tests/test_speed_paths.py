"""Fast paths against their slow references: the speed work must not move a result.

A policy whose key is the registered ``lru`` order declares ``by_recency``, and the planner
builds its heap entries straight from the node fields (no key call per leaf); any other key
goes through the policy's ``entries``. A policy whose key RETURNS lru's key through a method call
takes the generic path with the same order, so two caches fed the same operations must stay
identical step by step: every eviction's freed ids and holes, every counter and the whole node
structure. A user's start and granularity are asked as the built-in ones are (``chain``,
``exact``), so copies of Penelope's plan as Penelope; the parts that declare ``leaf_only``
(tail, leaf-head) and ``whole`` (node) are served without their calls and plan as copies
that declare nothing and are asked.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from policies import (
    BLOCK,
    LEAF_HEAD,
    NODE,
    PRIVATE_HEAD,
    TAIL,
    EvictionPolicy,
    Granularity,
    PrivateHead,
    Tail,
    WholeNodes,
)
from policies.orders import lru
from sim.kvcache import RadixKVCache
from tests.cachepair import OPS, drive_pair
from tests.chained import Universe

COMBOS = [(PRIVATE_HEAD, BLOCK), (TAIL, NODE), (TAIL, BLOCK), (LEAF_HEAD, NODE),
          (PRIVATE_HEAD, NODE)]


def keyed(start, granularity) -> EvictionPolicy:
    """LRU through a key method: the planner's generic (reference) path."""

    class KeyedLRU(EvictionPolicy):
        name = "keyed-lru"

        def key(self, node):
            return lru(node)

    return KeyedLRU(start=start, granularity=granularity)


@pytest.mark.parametrize("start,granularity", COMBOS, ids=lambda x: x.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_lru_fast_path_plans_as_the_keyed_reference(start, granularity, ops) -> None:
    fast = RadixKVCache(20, EvictionPolicy(order="lru", start=start, granularity=granularity),
                        debug=True)
    slow = RadixKVCache(20, keyed(start, granularity), debug=True)
    assert fast.policy.by_recency and not slow.policy.by_recency
    drive_pair(fast, slow, ops)

def test_keyed_reference_really_differs_in_path() -> None:
    """The reference must not be the fast path in disguise (else the test above is void)."""
    assert keyed(PRIVATE_HEAD, BLOCK).sort_key is not lru
    assert EvictionPolicy(order="lru").sort_key is lru


class CountingStart(PrivateHead):
    """A user's start: Penelope's walk, counted."""

    name = "counting"

    def __init__(self) -> None:
        self.asked = 0

    def chain(self, leaf, view):
        self.asked += 1
        return super().chain(leaf, view)


class ExactBlocks(Granularity):
    """A user's granularity that declares ``exact``: its ``take`` is never called."""

    name, reads_node_boundaries, exact = "exact-blocks", False, True

    def take(self, blocks: int, need: int) -> int:
        raise AssertionError("an exact granularity is taken without a call")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_a_users_parts_take_the_built_in_path(ops) -> None:
    """The planner asks a user's start through ``chain`` and takes a granularity declaring
    ``exact`` as ``min`` (issue 52 item 2): a copy of Penelope's parts plans as Penelope."""
    start = CountingStart()
    mine = RadixKVCache(20, EvictionPolicy(start=start, granularity=ExactBlocks()), debug=True)
    penelope = RadixKVCache(20, EvictionPolicy(start=PRIVATE_HEAD, granularity=BLOCK),
                            debug=True)
    drive_pair(mine, penelope, ops)


def test_a_users_start_is_asked_once_per_victim() -> None:
    start = CountingStart()
    cache = RadixKVCache(20, EvictionPolicy(start=start, granularity=ExactBlocks()), debug=True)
    cache.insert(Universe().prompt([0, 1, 2]))
    assert cache.evict(2).freed_blocks == 2 and start.asked == 1



class AskedTail(Tail):
    """A user's copy of the tail start that declares nothing: asked through ``chain``,
    counted."""

    name, leaf_only = "asked-tail", False

    def __init__(self) -> None:
        self.asked = 0

    def chain(self, leaf, view):
        self.asked += 1
        return (leaf,)


class AskedNodes(WholeNodes):
    """A user's copy of whole-node granularity that declares nothing: asked through
    ``take``, counted."""

    name, whole = "asked-nodes", False

    def __init__(self) -> None:
        self.asked = 0

    def take(self, blocks: int, need: int) -> int:
        self.asked += 1
        return blocks


@pytest.mark.parametrize("start", [TAIL, LEAF_HEAD], ids=lambda x: x.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_leaf_only_starts_and_whole_nodes_plan_as_when_asked(start, ops) -> None:
    """The built-in starts that declare ``leaf_only`` (tail, leaf-head) and the whole-node
    granularity that declares ``whole`` (SGLang's parts) are served without their calls: the
    same plans as copies that declare nothing and are asked."""
    asked_start = AskedTail()
    asked_start.from_head = start.from_head
    asked_start.makes_holes = start.makes_holes
    asked = RadixKVCache(20, EvictionPolicy(start=asked_start, granularity=AskedNodes()),
                         debug=True)
    served = RadixKVCache(20, EvictionPolicy(start=start, granularity=NODE), debug=True)
    assert start.leaf_only and NODE.whole
    drive_pair(asked, served, ops)


def test_declared_parts_are_not_called_and_undeclared_ones_are(monkeypatch) -> None:
    def never(*_args):
        raise AssertionError("a part declaring leaf_only / whole is served without its call")

    monkeypatch.setattr(Tail, "chain", never)
    monkeypatch.setattr(WholeNodes, "take", never)
    cache = RadixKVCache(20, EvictionPolicy(start=TAIL, granularity=NODE), debug=True)
    cache.insert(Universe().prompt([0, 1, 2]))
    assert cache.evict(2).freed_blocks == 3  # whole nodes: the leaf's 3 blocks
    start, granularity = AskedTail(), AskedNodes()
    mine = RadixKVCache(20, EvictionPolicy(start=start, granularity=granularity), debug=True)
    mine.insert(Universe().prompt([0, 1, 2]))
    assert mine.evict(2).freed_blocks == 3 and start.asked == 1 and granularity.asked == 1
