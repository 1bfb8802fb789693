"""Dropped KV in the cache: AKV's three trajectories (its Figure 5) as goldens, and the rules
of the DROPPED state and of context edits one by one.

Blocks are one token (block size 1). Raw ids: A=1, B=2, C=3, D=4 (one chain), B'=12, C'=13
(B alone at position 0: another chain). Regions make the strategies act: A and C are tool
results, B and D assistant text.
"""

from __future__ import annotations

import numpy as np
import pytest

from sim.context.session import SessionState
from sim.context.strategies import parse_context
from sim.kvcache import RadixKVCache, Tier
from sim.kvcache.versions import VersionSpace, encode, is_dropped, raw_of
from tests.contextkit import serve, tree_rows

TOOL, ASST = 4, 3  # traces.REGION_NAMES codes
A, B, C, D, B2, C2 = 1, 2, 3, 4, 12, 13
REGION = {A: TOOL, B: ASST, C: TOOL, D: ASST, B2: ASST, C2: TOOL}


def turn(state: SessionState, rid: int, blocks: list[int], regions: dict | None = None):
    raw = np.array(blocks, np.int64)
    reg = np.array([(regions or REGION)[b] for b in blocks], np.uint8)
    (view,) = state.turn(rid, raw, reg, raw, reg, len(blocks), 1, 0)
    return view


def trajectory_1(cache, space) -> list:
    """Append C to A B, then drop A (AKV's rolling drop keeping 1 tool result: C's arrival
    triggers it, after C), then D."""
    s = SessionState(parse_context("drop:1"), space, 1, 1)
    return [serve(cache, turn(s, 0, [A, B])), serve(cache, turn(s, 1, [A, B, C])),
            serve(cache, turn(s, 2, [A, B, C, D]))]


def trajectory_2(cache, space) -> list:
    """Drop A before appending C: a 1-block budget drops A when B arrives (after B), then C.
    B is labelled system here so that the budget pins it (only A is ever dropped)."""
    s = SessionState(parse_context("budget:1"), space, 1, 2)
    reg = {A: TOOL, B: 0, C: ASST}
    return [serve(cache, turn(s, 0, [A], reg)), serve(cache, turn(s, 1, [A, B], reg)),
            serve(cache, turn(s, 2, [A, B, C], reg))]


def trajectory_3(cache, space) -> list:
    """Start from B alone (at position 0), then C."""
    s = SessionState(parse_context("drop:1"), space, 1, 3)
    return [serve(cache, turn(s, 0, [B2])), serve(cache, turn(s, 1, [B2, C2]))]


def new_cache() -> RadixKVCache:
    return RadixKVCache(64, "sglang", debug=True, versioned=True, block_size=1)


# --- goldens -------------------------------------------------------------------------------------
def test_trajectory_1_append_then_drop() -> None:
    cache, space = new_cache(), VersionSpace()
    served = trajectory_1(cache, space)
    # turn 2 reuses A B; turn 3 reuses B C (made with A visible, before the drop) and skips A
    assert (served[1].reused, served[1].computed) == ([0, 1], [2])
    assert (served[2].reused, served[2].computed) == ([1, 2], [3])
    assert tree_rows(cache) == [
        (0, 0, 1, "DROPPED", [A], True),
        (1, 1, 2, "GPU", [B], False),
        (2, 2, 3, "GPU", [C], False),
        (3, 3, 4, "GPU", [D], False),
    ]
    assert (cache.gpu_blocks, cache.dropped_blocks, cache.hole_blocks) == (3, 1, 0)


def test_trajectory_2_drop_then_append() -> None:
    cache, space = new_cache(), VersionSpace()
    served = trajectory_2(cache, space)
    assert (served[2].reused, served[2].computed) == ([1], [2])  # C computed without A
    assert tree_rows(cache) == [
        (0, 0, 1, "DROPPED", [A], True),
        (1, 1, 2, "GPU", [B], False),
        (2, 2, 3, "GPU", [C], False),
    ]


def test_trajectory_3_starts_from_b() -> None:
    cache, space = new_cache(), VersionSpace()
    trajectory_3(cache, space)
    assert tree_rows(cache) == [(0, 0, 1, "GPU", [B2], False), (1, 1, 2, "GPU", [C2], False)]


def test_three_trajectories_share_a_b_and_branch_by_drop_timing() -> None:
    """AKV's Figure 5(c): (1) and (2) share the A-B prefix (A dropped by both, B made with A
    visible before either drop), then branch: C made before the drop (1) differs from C made
    after it (2). (3) shares nothing."""
    cache, space = new_cache(), VersionSpace()
    trajectory_1(cache, space)
    served = trajectory_2(cache, space)
    trajectory_3(cache, space)
    # (2) recomputed A and B for itself (its A was not dropped yet), then, dropping A, found
    # (1)'s ~A -> B already cached: its own copy is garbage; its C reuses (1)'s B
    assert (served[2].reused, served[2].computed) == ([1], [2])
    rows = tree_rows(cache)
    assert [r[1:] for r in rows] == [
        (0, 1, "DROPPED", [A], True),
        (1, 2, "GPU", [B], False),
        (2, 3, "GPU", [C], False),
        (3, 4, "GPU", [D], False),
        (2, 3, "GPU", [C], False),
        (0, 1, "GPU", [B2], False),
        (1, 2, "GPU", [C2], False),
    ]
    assert [r[0] for r in rows] == [0, 1, 2, 3, 2, 0, 1]
    # the two C nodes are different versions of the same raw block
    b = cache.root.children[int(encode(np.array([A]), 0, True)[0])].children
    (b_node,) = b.values()
    c_keys = sorted(int(k) for k in b_node.children)
    assert len(c_keys) == 2 and set(raw_of(np.array(c_keys)).tolist()) == {C}
    assert (cache.gpu_blocks, cache.dropped_blocks) == (6, 1)


# --- the DROPPED state, rule by rule -------------------------------------------------------------
def keys(raw: list[int], vid: int = 0, dropped=False) -> np.ndarray:
    return encode(np.array(raw, np.int64), vid, dropped)


def test_drop_frees_kv_and_keeps_the_prefix_walkable() -> None:
    cache = RadixKVCache(16, "penelope", debug=True, versioned=True, block_size=1)
    cache.insert(keys([1, 2, 3, 4]))
    new = np.concatenate([keys([1]), keys([2, 3], 0, True), keys([4], 7)])
    res = cache.edit(keys([1, 2, 3, 4]), new, np.arange(4))
    assert res.applied and res.dropped_blocks == 2 and res.freed.freed_blocks == 2
    assert (cache.gpu_blocks, cache.dropped_blocks, cache.evictable_blocks) == (2, 2, 2)
    m = cache.match(new)
    assert m.matched_blocks == 4
    assert [(s, e, t) for s, e, t in m.segments] == [(0, 1, Tier.GPU), (1, 3, Tier.DROPPED),
                                                    (3, 4, Tier.GPU)]


def test_dropped_is_never_refilled_and_never_shared_with_a_plain_history() -> None:
    cache = RadixKVCache(16, "penelope", debug=True, versioned=True, block_size=1)
    cache.insert(keys([1, 2, 3]))
    cache.edit(keys([1, 2, 3]), np.concatenate([keys([1]), keys([2], 0, True), keys([3], 5)]),
               np.arange(3))
    # a history that did not drop block 2 misses there and gets its own copy
    m = cache.match(keys([1, 2, 3]))
    assert m.matched_blocks == 1
    ins = cache.insert(keys([1, 2, 3]))
    assert (ins.new_blocks, ins.filled_blocks) == (2, 0)
    dropped = [n for n in cache.iter_nodes() if n.tier is Tier.DROPPED]
    assert len(dropped) == 1 and is_dropped(dropped[0].ids).all()
    # inserting the dropping history again refills nothing
    again = cache.insert(np.concatenate([keys([1]), keys([2], 0, True), keys([3], 5)]))
    assert (again.new_blocks, again.filled_blocks) == (0, 0)
    assert dropped[0].tier is Tier.DROPPED


def test_dropped_nodes_are_not_victims_and_go_with_their_last_child() -> None:
    cache = RadixKVCache(16, "sglang", debug=True, versioned=True, block_size=1)
    ids = np.concatenate([keys([1]), keys([2, 3], 0, True), keys([4, 5], 3)])
    cache.insert(ids)  # the dropped run becomes a DROPPED node: it holds no KV
    assert (cache.gpu_blocks, cache.dropped_blocks) == (3, 2)
    r = cache.evict(3)
    assert r.freed_blocks == 3 and cache.gpu_blocks == 0
    assert cache.dropped_blocks == 0 and not list(cache.iter_nodes())


def test_trailing_dropped_keys_are_not_inserted() -> None:
    cache = RadixKVCache(16, "sglang", debug=True, versioned=True, block_size=1)
    ins = cache.insert(np.concatenate([keys([1, 2]), keys([3], 0, True)]))
    assert ins.new_blocks == 2 and cache.dropped_blocks == 0


def test_an_edit_of_a_locked_path_changes_nothing() -> None:
    cache = RadixKVCache(16, "sglang", debug=True, versioned=True, block_size=1)
    cache.insert(keys([1, 2, 3]))
    m = cache.match(keys([1, 2, 3]))
    cache.lock(m.node)
    res = cache.edit(keys([1, 2, 3]), np.concatenate([keys([1]), keys([2], 0, True),
                                                      keys([3], 4)]), np.arange(3))
    assert not res.applied and cache.dropped_blocks == 0 and cache.gpu_blocks == 3
    cache.unlock(m.node)


def test_an_undropped_block_stops_the_edit() -> None:
    """A history that no longer drops a block needs its KV: the DROPPED node stays and the
    edit goes no further."""
    cache = RadixKVCache(16, "sglang", debug=True, versioned=True, block_size=1)
    old = np.concatenate([keys([1]), keys([2], 0, True), keys([3], 4)])
    cache.insert(old)
    res = cache.edit(old, np.concatenate([keys([1]), keys([2, 3], 9)]), np.arange(3))
    assert res.matched_blocks == 1 and cache.dropped_blocks == 1 and cache.gpu_blocks == 2


def test_reposition_rekeys_and_counts_rotated_kv() -> None:
    cache = RadixKVCache(16, "sglang", debug=True, versioned=True, block_size=1)
    cache.insert(keys([1, 2, 3, 4]))
    new = np.concatenate([keys([1]), keys([2], 0, True), keys([3, 4], 6)])
    res = cache.edit(keys([1, 2, 3, 4]), new, np.arange(4),
                     rotates=np.array([False, False, True, True]))
    assert (res.dropped_blocks, res.rotated_blocks) == (1, 2)
    assert cache.match(new).matched_blocks == 4
    assert cache.match(keys([1, 2, 3, 4])).matched_blocks == 1  # the old version is gone


def test_splice_removes_the_span_and_moves_what_follows() -> None:
    cache = RadixKVCache(16, "penelope", debug=True, versioned=True, block_size=1)
    cache.insert(keys([1, 2, 3, 4, 5]))
    new = np.concatenate([keys([1]), keys([4, 5], 8)])  # blocks 2, 3 leave the text
    dest = np.array([0, -1, -1, 1, 2])
    res = cache.edit(keys([1, 2, 3, 4, 5]), new, dest, rotates=dest > 0)
    assert (res.removed_blocks, res.rotated_blocks, res.freed.freed_blocks) == (2, 2, 2)
    assert cache.gpu_blocks == 3 and cache.match(new).matched_blocks == 3
    assert [(n.start, n.end) for n in cache.iter_nodes()] == [(0, 3)] or \
        [(n.start, n.end) for n in cache.iter_nodes()] == [(0, 1), (1, 3)]


def test_edit_stale_branches_are_freed() -> None:
    """Branches below an edited node hold keys no history produces again: they go."""
    cache = RadixKVCache(16, "sglang", debug=True, versioned=True, block_size=1)
    cache.insert(keys([1, 2, 3]))
    cache.insert(keys([1, 2, 9]))  # another branch below block 2
    new = np.concatenate([keys([1]), keys([2], 0, True), keys([3], 4)])
    res = cache.edit(keys([1, 2, 3]), new, np.arange(3))
    assert res.freed.freed_blocks == 2  # block 2's KV and the other branch (block 9)
    assert cache.gpu_blocks == 2


@pytest.mark.parametrize("policy", ["sglang", "penelope", "lru+leaf-head+node"])
def test_eviction_policies_walk_around_dropped_nodes(policy) -> None:
    cache = RadixKVCache(8, policy, debug=True, versioned=True, block_size=1)
    cache.insert(np.concatenate([keys([1]), keys([2, 3], 0, True), keys([4, 5], 3)]))
    cache.insert(np.concatenate([keys([1]), keys([2, 3], 0, True), keys([4, 6], 3)]))
    assert cache.gpu_blocks == 4
    r = cache.evict(4)
    assert r.freed_blocks == 4 and cache.gpu_blocks == 0 and cache.dropped_blocks == 0
