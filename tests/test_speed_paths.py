"""Fast paths against their slow references: the speed work must not move a result.

The eviction planner builds LRU heap entries straight from the node fields when the policy's
key is the registered ``lru`` order (no key call per leaf); any other key goes through the
generic path. A policy whose key RETURNS lru's key through a method call takes the generic
path with the same order, so two caches fed the same operations must stay identical step by
step: every eviction's freed ids and holes, every counter and the whole node structure.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from policies import BLOCK, LEAF_HEAD, NODE, PRIVATE_HEAD, TAIL, EvictionPolicy
from policies.orders import lru
from sim.kvcache import RadixKVCache
from tests.cachepair import OPS, drive_pair

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
    assert fast.policy.sort_key is lru and slow.policy.sort_key is not lru
    drive_pair(fast, slow, ops)

def test_keyed_reference_really_differs_in_path() -> None:
    """The reference must not be the fast path in disguise (else the test above is void)."""
    assert keyed(PRIVATE_HEAD, BLOCK).sort_key is not lru
    assert EvictionPolicy(order="lru").sort_key is lru
