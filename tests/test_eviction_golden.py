"""Golden tests: exact eviction results for all six start-position x granularity combinations
on hand-built trees, the paper's Figure 3 case, each private-head stop condition, and the
node+leaf-head == node+tail coincidence.

The hand-built tree (block ids; positions in brackets; stamps from the logical clock)::

    root -- A [0,3) ids 1 2 3  t4 -- B [3,11) ids 10..17  t4 -- D [11,14) ids 20 21 22  t3
                               \\
                                `-- E [3,5) ids 30 31  t5

D is the least recently used leaf, then B (once D is gone), then E. A is shared by D's and
E's histories, so D's private history starts at B (8 blocks).
"""

from __future__ import annotations

import numpy as np
import pytest

from policies import BLOCK, PRIVATE_HEAD, EvictionPolicy, get_policy
from sim.kvcache import RadixKVCache, Tier
from tests.chained import freed, joined

A = [1, 2, 3]
B = list(range(10, 18))
D = [20, 21, 22]
E = [30, 31]


def three_leaves(policy: str | EvictionPolicy, capacity: int = 64) -> RadixKVCache:
    cache = RadixKVCache(capacity, policy, debug=True)
    cache.insert(joined(A, B, D))  # tick 1 stamps nothing, new leaf t2
    cache.insert(joined(A, B))  # t3: the whole node, then split into A+B | D
    cache.insert(joined(A, E))  # t4: A+B, split into A | B; new leaf E t5
    return cache


def shape(cache: RadixKVCache) -> list[tuple[int, int, str, list[int]]]:
    """(start, end, tier, ids) of every node, depth first."""
    return [(n.start, n.end, n.tier.name, n.ids.tolist()) for n in cache.iter_nodes()]


def test_hand_built_tree_shape_and_stamps():
    cache = three_leaves("sglang")
    assert shape(cache) == [
        (0, 3, "GPU", A),
        (3, 11, "GPU", B),
        (11, 14, "GPU", D),
        (3, 5, "GPU", E),
    ]
    assert [n.last_access for n in cache.iter_nodes()] == [4, 4, 3, 5]
    assert (cache.gpu_blocks, cache.evictable_blocks, cache.protected_blocks) == (16, 16, 0)


# (start, granularity, n) -> (freed runs in order, holes_made, resulting tree)
GOLDEN = {
    # tail + node (SGLang): the whole LRU leaf, overshooting; then B (t4) before E (t5).
    ("tail", "node", 2): ([D], 0, [(0, 3, "GPU", A), (3, 11, "GPU", B), (3, 5, "GPU", E)]),
    ("tail", "node", 5): ([D, B], 0, [(0, 3, "GPU", A), (3, 5, "GPU", E)]),
    # tail + block (vLLM): exactly n from the end; D gone, then B's tail.
    ("tail", "block", 2): (
        [[21, 22]],
        0,
        [(0, 3, "GPU", A), (3, 11, "GPU", B), (11, 12, "GPU", [20]), (3, 5, "GPU", E)],
    ),
    ("tail", "block", 5): (
        [D, [16, 17]],
        0,
        [(0, 3, "GPU", A), (3, 9, "GPU", B[:6]), (3, 5, "GPU", E)],
    ),
    # leaf-head + node: identical to tail + node (the whole leaf).
    ("leaf-head", "node", 2): ([D], 0, [(0, 3, "GPU", A), (3, 11, "GPU", B), (3, 5, "GPU", E)]),
    ("leaf-head", "node", 5): ([D, B], 0, [(0, 3, "GPU", A), (3, 5, "GPU", E)]),
    # leaf-head + block: the first n blocks of the leaf become a hole.
    ("leaf-head", "block", 2): (
        [[20, 21]],
        2,
        [
            (0, 3, "GPU", A),
            (3, 11, "GPU", B),
            (11, 13, "NONE", [20, 21]),
            (13, 14, "GPU", [22]),
            (3, 5, "GPU", E),
        ],
    ),
    ("leaf-head", "block", 5): (
        [D, [10, 11]],
        2,
        [
            (0, 3, "GPU", A),
            (3, 5, "NONE", [10, 11]),
            (5, 11, "GPU", B[2:]),
            (3, 5, "GPU", E),
        ],
    ),
    # private-head + node: B (start of D's private history) becomes a hole whole.
    ("private-head", "node", 2): (
        [B],
        8,
        [(0, 3, "GPU", A), (3, 11, "NONE", B), (11, 14, "GPU", D), (3, 5, "GPU", E)],
    ),
    # ... not enough: continue into D; the freed chain leaves the tree; next victim E, whose
    # private history now starts at A (A's parent is the root): A becomes a hole.
    ("private-head", "node", 12): (
        [B, D, A],
        3,
        [(0, 3, "NONE", A), (3, 5, "GPU", E)],
    ),
    # private-head + block (Penelope), the paper's Figure 3: need 3, B holds 8 -> split,
    # free the first 3, keep 5.
    ("private-head", "block", 3): (
        [[10, 11, 12]],
        3,
        [
            (0, 3, "GPU", A),
            (3, 6, "NONE", [10, 11, 12]),
            (6, 11, "GPU", B[3:]),
            (11, 14, "GPU", D),
            (3, 5, "GPU", E),
        ],
    ),
    # continuation: all of B is not enough, the next node toward the leaf gives the rest.
    ("private-head", "block", 10): (
        [B, [20, 21]],
        10,
        [
            (0, 3, "GPU", A),
            (3, 11, "NONE", B),
            (11, 13, "NONE", [20, 21]),
            (13, 14, "GPU", [22]),
            (3, 5, "GPU", E),
        ],
    ),
    # the whole private history: it leaves the tree, no hole remains.
    ("private-head", "block", 11): ([B, D], 0, [(0, 3, "GPU", A), (3, 5, "GPU", E)]),
}


@pytest.mark.parametrize(("start", "gran", "n"), list(GOLDEN))
def test_golden_eviction(start: str, gran: str, n: int):
    policy = EvictionPolicy("lru", start, gran)
    cache = three_leaves(policy)
    want_freed, want_holes, want_shape = GOLDEN[(start, gran, n)]
    result = cache.evict(n)
    assert freed(result) == want_freed
    assert result.freed_blocks == sum(map(len, want_freed)) >= n
    assert result.ok
    assert result.holes_made == want_holes == cache.hole_blocks
    assert shape(cache) == want_shape
    assert cache.gpu_blocks == 16 - result.freed_blocks
    # what is left is exactly the GPU part of the tree
    want_resident = sorted(x for s, e, t, run in want_shape if t == "GPU" for x in run)
    assert cache.resident_block_ids().tolist() == want_resident


def test_figure3_penelope_then_parent_is_hole_stop():
    """Figure 3, then the next eviction of the same history stops below the hole."""
    cache = three_leaves("penelope")
    r1 = cache.evict(3)
    assert freed(r1) == [[10, 11, 12]]
    r2 = cache.evict(2)  # D's walk: parent B' = [13..17] passes, B' has a hole parent: stop
    assert freed(r2) == [[13, 14]]
    assert [(s, e, t) for s, e, t, _ in shape(cache)] == [
        (0, 3, "GPU"),
        (3, 6, "NONE"),
        (6, 8, "NONE"),
        (8, 11, "GPU"),
        (11, 14, "GPU"),
        (3, 5, "GPU"),
    ]
    m = cache.match(joined(A, B, D))
    assert (m.matched_blocks, m.hit_blocks, m.hole_blocks) == (14, 3, 5)
    assert m.segments == ((0, 3, Tier.GPU), (3, 8, Tier.NONE), (8, 14, Tier.GPU))


def test_private_head_stop_parent_is_root():
    cache = RadixKVCache(64, "penelope", debug=True)
    cache.insert(joined([1, 2, 3, 4, 5]))
    cache.insert(joined([1, 2, 3]))  # split: P=[1,2,3] -- L=[4,5]
    r = cache.evict(2)
    assert freed(r) == [[1, 2]]  # the head of the history, right below the root
    assert shape(cache) == [
        (0, 2, "NONE", [1, 2]),
        (2, 3, "GPU", [3]),
        (3, 5, "GPU", [4, 5]),
    ]


def test_private_head_stop_parent_has_several_children():
    cache = three_leaves("penelope")  # A has two children (B and E)
    assert freed(cache.evict(1)) == [[10]]


def test_private_head_stop_parent_locked():
    cache = three_leaves("penelope")
    m = cache.match(joined(A, B, [99]))  # ends exactly at B's end: B (and A) get locked
    assert m.matched_blocks == 11 and m.node.ids.tolist() == B
    cache.lock(m.node)
    assert (cache.protected_blocks, cache.evictable_blocks) == (11, 5)
    # B is now the most recent; the LRU leaf is D (t3), whose parent B is locked: start at D.
    r = cache.evict(2)
    assert freed(r) == [[20, 21]]
    assert r.holes_made == 2
    assert shape(cache)[2:4] == [(11, 13, "NONE", [20, 21]), (13, 14, "GPU", [22])]
    # locked blocks survive everything
    r = cache.evict(100)
    assert not r.ok and r.freed_blocks == 3  # [22] then E; A, B locked
    assert cache.gpu_blocks == cache.protected_blocks == 11
    assert shape(cache) == [(0, 3, "GPU", A), (3, 11, "GPU", B)]
    cache.unlock(m.node)
    assert cache.evictable_blocks == 11


def test_private_head_locked_hole_survives_until_unlock():
    """A request that matched into a hole pins it; the hole outlives its subtree until unlock."""
    cache = three_leaves("penelope")
    cache.evict(8)  # B becomes a hole
    m = cache.match(joined(A, B[:4]))  # ends inside the hole: split
    assert (m.matched_blocks, m.hit_blocks) == (7, 3) and m.node.tier == Tier.NONE
    cache.lock(m.node)
    cache.evict(100)  # frees D (the hole below leaves the tree) and E; A stays locked
    assert shape(cache) == [(0, 3, "GPU", A), (3, 7, "NONE", B[:4])]
    cache.unlock(m.node)
    assert shape(cache) == [(0, 3, "GPU", A)]  # the unlocked childless hole is removed


def test_node_leaf_head_equals_node_tail_on_random_stream():
    """node+leaf-head and node+tail are the same policy: identical results on a random stream."""
    rng = np.random.default_rng(7)
    caches = [
        RadixKVCache(40, get_policy("lru+tail+node"), debug=True),
        RadixKVCache(40, get_policy("lru+leaf-head+node"), debug=True),
    ]
    universe: dict[tuple[int, ...], int] = {}
    for _ in range(300):
        path = tuple(int(x) for x in rng.integers(0, 3, size=rng.integers(1, 14)))
        prompt = np.array(
            [universe.setdefault(path[: i + 1], len(universe) + 1) for i in range(len(path))],
            dtype=np.int64,
        )
        outs = []
        for cache in caches:
            m = cache.match(prompt)
            room = cache.make_room(len(prompt) - m.hit_blocks)
            ins = cache.insert(prompt) if room.ok else None
            outs.append(
                (
                    m.matched_blocks,
                    m.hit_blocks,
                    freed(room),
                    ins and (ins.new_blocks, ins.existing_blocks),
                    shape(cache),
                )
            )
        assert outs[0] == outs[1]
    assert caches[0].gpu_blocks > 0


def test_match_splits_and_stamps_like_sglang():
    """A match that ends inside a node splits it and stamps the WHOLE node first (SGLang stamps
    the child, then splits), so the unmatched suffix becomes recent too."""
    cache = RadixKVCache(64, "sglang", debug=True)
    cache.insert(joined([1, 2, 3, 4, 5]))  # leaf X t2
    cache.insert(joined([7, 8]))  # leaf Y t4
    m = cache.match(joined([1, 2, 9]))  # t5: stamps X, splits after 2 blocks
    assert (m.matched_blocks, m.hit_blocks) == (2, 2)
    assert m.node.ids.tolist() == [1, 2] and m.node.end == 2
    assert [(n.ids.tolist(), n.last_access) for n in cache.iter_nodes()] == [
        ([1, 2], 5),
        ([3, 4, 5], 5),
        ([7, 8], 4),
    ]
    assert freed(cache.evict(1)) == [[7, 8]]  # Y is now the LRU leaf, not [3, 4, 5]
    m0 = cache.match(joined([42]))
    assert m0.node is cache.root and m0.matched_blocks == 0 and m0.segments == ()


def test_match_touch_false_splits_without_stamping():
    cache = RadixKVCache(64, "sglang", debug=True)
    cache.insert(joined([1, 2, 3, 4]))
    clock = cache.clock
    m = cache.match(joined([1, 2]), touch=False)
    assert cache.clock == clock and m.node.end == 2
    assert [n.last_access for n in cache.iter_nodes()] == [2, 2]


def test_insert_refills_partial_hole_and_counts():
    cache = three_leaves("penelope")
    cache.evict(3)  # hole [10, 11, 12]
    ins = cache.insert(joined(A, [10, 11]))  # ends inside the hole: split, refill the first part
    assert (ins.new_blocks, ins.filled_blocks, ins.existing_blocks) == (0, 2, 3)
    assert ins.node.ids.tolist() == [10, 11] and ins.node.tier == Tier.GPU
    assert [(s, e, t) for s, e, t, _ in shape(cache)][:4] == [
        (0, 3, "GPU"),
        (3, 5, "GPU"),
        (5, 6, "NONE"),
        (6, 11, "GPU"),
    ]
    ins = cache.insert(joined(A, B, [40, 41]))  # refills [12], new leaf after B's end
    assert (ins.new_blocks, ins.filled_blocks, ins.existing_blocks) == (2, 1, 10)
    assert cache.hole_blocks == 0 and cache.gpu_blocks == 18


def test_capacity_reserve_make_room_and_insert_errors():
    from sim.kvcache import CapacityError

    cache = three_leaves("vllm", capacity=20)  # 16 in the tree
    assert cache.free_blocks == 4
    cache.reserve(4)
    with pytest.raises(CapacityError):
        cache.reserve(1)
    m = cache.match(joined(A, E))
    cache.lock(m.node)  # 5 protected, 11 evictable
    r = cache.make_room(12)  # needs 12 more than the 0 free: impossible -> nothing evicted
    assert not r.ok and r.freed_blocks == 0 and cache.gpu_blocks == 16
    r = cache.make_room(11)
    assert r.ok and r.freed_blocks == 11 and cache.free_blocks == 11
    before = shape(cache)
    with pytest.raises(CapacityError):
        # the tree alone may not exceed capacity (reserved blocks are the caller's business)
        cache.insert(joined(range(100, 116)))  # gpu 5 + 16 new > 20
    assert shape(cache) == before
    cache.release(4)
    cache.unlock(m.node)
    with pytest.raises(ValueError):
        cache.unlock(m.node)
    with pytest.raises(ValueError):
        cache.release(1)


def test_policy_registry_and_names():
    assert get_policy("sglang") == EvictionPolicy()
    assert get_policy("vllm").granularity is BLOCK
    pen = get_policy("penelope")
    assert pen.start is PRIVATE_HEAD and pen.makes_holes
    assert not get_policy("sglang").makes_holes and get_policy("lru+leaf-head+node").makes_holes
    assert get_policy("lru+private-head+block") == pen
    assert pen.label == "penelope" and pen.spec == "lru+private-head+block"
    assert get_policy("lru+leaf-head+block").label == "lru+leaf-head+block"
    assert get_policy("sglang") is not get_policy("sglang")  # fresh per run: policies keep state
    with pytest.raises(ValueError, match="unknown eviction policy"):
        get_policy("lifo")
    with pytest.raises(ValueError, match="unknown start position 'middle'"):
        get_policy("lru+middle+node")
    with pytest.raises(ValueError, match="unknown victim order 'lifo'"):
        get_policy("lifo+tail+node")


def test_block_exact_policies_stamp_only_matched_blocks():
    """vllm/penelope stamp exactly the matched blocks (the unmatched suffix of the split node
    keeps its old stamp), unlike SGLang (see test_match_splits_and_stamps_like_sglang)."""
    cache = RadixKVCache(64, "vllm", debug=True)
    cache.insert(joined([1, 2, 3, 4, 5]))  # t1 (block-exact: the new leaf shares the tick)
    cache.insert(joined([7, 8]))  # t2
    m = cache.match(joined([1, 2, 9]))  # t3
    assert [(n.ids.tolist(), n.last_access) for n in cache.iter_nodes()] == [
        ([1, 2], 3),
        ([3, 4, 5], 1),
        ([7, 8], 2),
    ]
    assert m.node.ids.tolist() == [1, 2]
    assert freed(cache.evict(1)) == [[5]]  # [3, 4, 5] is the LRU history now


def test_penelope_refill_merges_the_path_and_keeps_handles():
    """Refilling holes merges the runs a block-exact policy no longer needs apart; the
    request's lock handle (the deepest node) survives the merge."""
    cache = three_leaves("penelope")
    cache.evict(3)  # Figure 3: A | [10 11 12] hole | [13..17] | D, and E
    m = cache.match(joined(A, B, D))
    assert (m.matched_blocks, m.hit_blocks, m.hole_blocks) == (14, 3, 3)
    cache.lock(m.node)
    ins = cache.insert(joined(A, B, D))
    assert (ins.new_blocks, ins.filled_blocks, ins.existing_blocks) == (0, 3, 11)
    assert ins.node is m.node
    # A has two children (stays apart); hole+rest+D were only children with lock 1: one node
    assert shape(cache) == [(0, 3, "GPU", A), (3, 14, "GPU", B + D), (3, 5, "GPU", E)]
    assert (cache.protected_blocks, cache.evictable_blocks) == (14, 2)
    cache.unlock(m.node)
    assert (cache.protected_blocks, cache.evictable_blocks) == (0, 16)
    # A..D was just used, so E goes first; then A is private to D's history and its head
    # (right below the root) is next
    assert freed(cache.evict(3)) == [[30, 31], [1]]


def test_sglang_preset_never_merges():
    cache = RadixKVCache(64, "sglang", debug=True)
    cache.insert(joined([1, 2, 3]))
    cache.insert(joined([1, 2, 3, 4, 5]))  # a new leaf under [1, 2, 3]: two nodes stay
    assert shape(cache) == [(0, 3, "GPU", [1, 2, 3]), (3, 5, "GPU", [4, 5])]
    pen = RadixKVCache(64, "penelope", debug=True)
    pen.insert(joined([1, 2, 3]))
    pen.insert(joined([1, 2, 3, 4, 5]))  # same tick, one child, no lock: merged
    assert shape(pen) == [(0, 5, "GPU", [1, 2, 3, 4, 5])]


def test_debug_mode_rejects_unchained_ids():
    """Matching compares only a node's last id (ids are chained); debug mode verifies it."""
    cache = RadixKVCache(64, "sglang", debug=True)
    cache.insert(joined([1, 2, 3]))
    with pytest.raises(AssertionError, match="not chained"):
        cache.match(joined([1, 9, 3]))


def test_victim_order_is_a_pluggable_sort_key(monkeypatch):
    """The planner only calls the policy's sort key: an order is one registered function,
    or a ``key`` method of a policy class."""
    from policies import ORDERS, register_order

    monkeypatch.setattr("policies.orders.ORDERS", ORDERS.copy())

    @register_order("newest-first")
    def newest_first(node):
        return -node.last_access

    cache = three_leaves(EvictionPolicy("newest-first", "tail", "node"))
    assert freed(cache.evict(1)) == [E]  # E (t5) is the most recent leaf

    class Oldest(EvictionPolicy):
        name = "oldest-serial"

        def key(self, node):
            return node.serial  # creation order: A was created... split prefixes are newer

    cache = three_leaves(Oldest())
    first = min(cache.evictable_leaves(), key=lambda n: n.serial)
    assert freed(cache.evict(1)) == [first.ids.tolist()]
