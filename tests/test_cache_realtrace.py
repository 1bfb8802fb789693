"""Real cc-traces sessions through every policy with debug recounts after every operation.

Uses the benchmark's op stream (match + lock, evict the shortfall + reserve, insert + release
+ unlock, fcfs touches) on a few sessions under a small capacity, so eviction, holes, refills
and merges all happen on real prompts. Skipped when ../shared/data is absent."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CC_TRACES

from policies import EvictionPolicy

pytestmark = [
    pytest.mark.shared_data,
    pytest.mark.skipif(not CC_TRACES.is_dir(), reason="../shared/data/cc-traces not present"),
]

POLICIES = [
    EvictionPolicy("lru", s, g)
    for s in ("tail", "leaf-head", "private-head")
    for g in ("node", "block")
]


@pytest.fixture(scope="module")
def stream():
    from benchmarks.opstream import trace_stream

    return trace_stream(
        CC_TRACES, sessions=12, active=3, capacity_blocks=1024, max_requests_per_session=40
    )


def replay_policy(stream, policy: EvictionPolicy, debug: bool = True):
    from benchmarks.opreplay import OursSide, replay
    from benchmarks.opstream import ALLOC, ARRIVE

    side = OursSide(1024, policy.spec, debug=debug)
    hits, freed = [], []
    for ob in replay(stream, side, observe=False):
        cache = side.cache
        assert cache.gpu_blocks + cache.reserved_blocks <= cache.capacity_blocks
        if ob.op == ARRIVE:
            hits.append(ob.hit)
        elif ob.op == ALLOC:
            freed.append(len(ob.freed))
    return side.cache, hits, freed


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_real_sessions_keep_every_invariant(stream, policy: EvictionPolicy):
    cache, hits, freed = replay_policy(stream, policy)
    assert sum(hits) > 0 and sum(freed) > 0  # reuse and eviction both happened
    cache.check()
    assert cache.protected_blocks == 0 and cache.reserved_blocks == 0  # all requests done
    if not policy.makes_holes:
        assert cache.hole_blocks == 0


def test_node_leaf_head_is_node_tail_on_real_sessions(stream):
    tail = replay_policy(stream, POLICIES[0])
    head = replay_policy(stream, POLICIES[2])
    assert tail[1] == head[1] and tail[2] == head[2]
    assert np.array_equal(tail[0].resident_block_ids(), head[0].resident_block_ids())


def test_replay_is_deterministic(stream):
    a = replay_policy(stream, POLICIES[5], debug=False)
    b = replay_policy(stream, POLICIES[5], debug=False)
    assert a[1] == b[1] and a[2] == b[2]
    assert np.array_equal(a[0].resident_block_ids(), b[0].resident_block_ids())
