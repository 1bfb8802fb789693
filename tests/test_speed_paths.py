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
from hypothesis import strategies as st

from policies import BLOCK, LEAF_HEAD, NODE, PRIVATE_HEAD, TAIL, EvictionPolicy
from policies.orders import lru
from sim.kvcache import CapacityError, RadixKVCache
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


def structure(cache: RadixKVCache) -> list[tuple]:
    """Every node, depth first in key order: position, ids, tier, lock, stamp, hits."""
    out = []
    stack = [cache.root]
    while stack:
        nd = stack.pop()
        out.append((nd.start, tuple(nd.ids.tolist()), int(nd.tier), nd.lock, nd.last_access,
                    nd.hit_count, nd.serial))
        stack.extend(nd.children[k] for k in sorted(nd.children, reverse=True))
    return out


def counters(cache: RadixKVCache) -> tuple[int, ...]:
    return (cache.gpu_blocks, cache.free_blocks, cache.evictable_blocks,
            cache.protected_blocks, cache.hole_blocks, cache.reserved_blocks)


OPS = st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 2), min_size=1,
                                                      max_size=12),
                         st.integers(0, 3), st.booleans(), st.integers(1, 20)),
               min_size=1, max_size=40)


@pytest.mark.parametrize("start,granularity", COMBOS, ids=lambda x: x.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_lru_fast_path_plans_as_the_keyed_reference(start, granularity, ops) -> None:
    fast = RadixKVCache(20, EvictionPolicy(order="lru", start=start, granularity=granularity),
                        debug=True)
    slow = RadixKVCache(20, keyed(start, granularity), debug=True)
    assert fast.policy.sort_key is lru and slow.policy.sort_key is not lru
    universe = Universe()
    history: list[list[int]] = []
    locked: list[tuple] = []
    for kind, more, base, lock, n in ops:
        if kind == 0:  # a prompt: maybe an earlier one cut, plus new blocks; room, insert
            choices = (history[base % len(history)][: n % 8] if history else []) + more
            history.append(choices)
            ids = universe.prompt(choices)
            results, handles = [], []
            for cache in (fast, slow):
                room = cache.make_room(len(ids))
                try:
                    ins = cache.insert(ids)
                except CapacityError:
                    results.append((room.freed_blocks, None))
                    continue
                results.append((room.freed_blocks, room.holes_made,
                                room.freed_ids().tolist(), ins.new_blocks))
                if lock:
                    cache.lock(ins.node)
                    handles.append(ins.node)
            assert results[0] == results[1]
            if len(handles) == 2:
                locked.append(tuple(handles))
        elif kind == 1 and locked:  # a request ends
            a, b = locked.pop(base % len(locked))
            fast.unlock(a)
            slow.unlock(b)
        else:
            got = [(r.ok, r.freed_blocks, r.holes_made, r.freed_ids().tolist())
                   for r in (fast.evict(n), slow.evict(n))]
            assert got[0] == got[1]
        assert counters(fast) == counters(slow)
        assert structure(fast) == structure(slow)


def test_keyed_reference_really_differs_in_path() -> None:
    """The reference must not be the fast path in disguise (else the test above is void)."""
    assert keyed(PRIVATE_HEAD, BLOCK).sort_key is not lru
    assert EvictionPolicy(order="lru").sort_key is lru
