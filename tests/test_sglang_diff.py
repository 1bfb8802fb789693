"""Differential test: our `sglang` preset against the REAL SGLang RadixCache (sglang==0.5.23).

SGLang is loaded from the installed wheel with its heavy imports stubbed and a logical clock
(benchmarks/sglang_ref.py); CI installs it (`make test`), so nothing here is skipped there.
Random op streams always run; streams cut from real cc-traces sessions run when
../shared/data/cc-traces is present. After EVERY op both caches must agree on: the hit length,
whether the allocation succeeded, the multiset of freed block ids, blocks in the tree, held
by running requests, evictable and protected, and the exact set of resident block ids.

The first tests pin SGLang's own behaviour on hand-built cases (the reference's "gotchas"),
so a changed SGLang is caught here rather than as a mysterious diff.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import CC_TRACES, needs_cc_traces
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.opreplay import OursSide, SglangSide, replay
from benchmarks.opstream import (
    ALLOC,
    ARRIVE,
    FINISH,
    TOUCH,
    OpStream,
    closed_loop_ops,
    make_request,
    random_stream,
    trace_stream,
)
from benchmarks.sglang_ref import SglangRef, block_tokens
from tests.chained import ids
from tests.diffkit import sglang_lockstep

BS = 64


@pytest.fixture
def ref() -> SglangRef:
    return SglangRef(BS)


# ---- SGLang's own behaviour, pinned ------------------------------------------------------------


def test_block_tokens_roundtrip() -> None:
    toks = block_tokens(ids(3, 7), BS)
    assert toks.tolist() == [*range(192, 256), *range(448, 512)]
    assert np.array_equal(np.unique(toks // BS), ids(3, 7))


def test_match_splits_and_whole_leaf_eviction_overshoots(ref: SglangRef) -> None:
    a = np.arange(1, 11)
    assert ref.insert(ref.key(a), ref.value(a)) == 0
    hit, _ = ref.match(ref.key(ids(1, 2, 3, 99)))
    assert hit == 3
    # the match split [1..10] into [1,2,3] -> [4..10]; one block asked, a whole leaf freed
    assert ref.evict(1) == 7
    assert ref.allocator.take_freed().tolist() == list(range(4, 11))
    assert ref.resident_block_ids().tolist() == [1, 2, 3]


def test_lru_leaf_order_and_parent_repush(ref: SglangRef) -> None:
    for path in (ids(1, 2, 3), ids(1, 2, 5)):
        ref.insert(ref.key(path), ref.value(path))
    ref.match(ref.key(ids(1, 2, 3)))  # [3] is now more recent than [5]
    assert ref.evict(1) == 1
    assert ref.allocator.take_freed().tolist() == [5]
    # [3] goes, then its parent [1,2] becomes an unlocked childless leaf and goes too
    assert ref.evict(2) == 3
    assert ref.allocator.take_freed().tolist() == [1, 2, 3]
    assert ref.tree_blocks == 0


def test_locked_path_survives_and_sizes_move(ref: SglangRef) -> None:
    for path in (ids(1, 2, 3), ids(1, 2, 5), ids(8, 9)):
        ref.insert(ref.key(path), ref.value(path))
    hit, node = ref.match(ref.key(ids(1, 2, 3, 4)))
    assert hit == 3
    ref.lock(node)
    assert (ref.evictable_blocks, ref.protected_blocks) == (3, 3)
    assert ref.evict(100) == 3
    assert ref.allocator.take_freed().tolist() == [5, 8, 9]
    ref.unlock(node)
    assert (ref.evictable_blocks, ref.protected_blocks) == (3, 0)


def test_keys_are_page_rounded(ref: SglangRef) -> None:
    radix = ref._radix
    from array import array

    toks = array("q", block_tokens(ids(4, 5, 6), BS)[: 2 * BS + 10].tolist())
    key = radix.RadixKey(toks)
    assert ref.insert(key, ref.value(ids(4, 5, 6))[: len(toks)]) == 0
    assert ref.resident_block_ids().tolist() == [4, 5]


def test_logical_clock_stamps_path_once_and_split_is_newer(ref: SglangRef) -> None:
    a = np.arange(1, 6)
    ref.insert(ref.key(a), ref.value(a))
    ref.match(ref.key(ids(1, 2, 9)))
    upper = next(iter(ref.tree.root_node.children.values()))
    lower = next(iter(upper.children.values()))
    # the whole matched path got one tick; the node the split created is newer
    assert upper.last_access_time > lower.last_access_time
    assert lower.last_access_time == ref.tree.root_node.last_access_time
    assert float(lower.last_access_time).is_integer()


# ---- stream builders ---------------------------------------------------------------------------


def test_make_request_arithmetic() -> None:
    # 130 prompt tokens (2 full blocks), 70 output tokens: KV for 199 tokens
    r = make_request(0, 0, ids(1, 2), ids(3, 4), 130, 70, BS)
    assert r.match_ids.tolist() == [1, 2]  # (130-1)//64 = 2
    assert r.finish_ids.tolist() == [1, 2, 3]  # 199//64 = 3
    assert r.need_blocks == 4  # ceil(199/64)
    # prompt of exactly 128 tokens: the hit is capped at len-1, so only 1 block matches
    r = make_request(1, 0, ids(1, 2), ids(), 128, 1, BS)
    assert (r.match_ids.tolist(), r.finish_ids.tolist(), r.need_blocks) == ([1], [1, 2], 2)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=7),
    active=st.integers(1, 4),
    in_flight=st.integers(1, 4),
    touch_every=st.sampled_from([0, 1, 3]),
)
def test_closed_loop_ops_properties(
    lengths: list[int], active: int, in_flight: int, touch_every: int
) -> None:
    sessions, rid = [], 0
    for n in lengths:
        sessions.append(list(range(rid, rid + n)))
        rid += n
    session_of = {r: i for i, s in enumerate(sessions) for r in s}
    ops = closed_loop_ops(sessions, active, in_flight, touch_every)
    seen: dict[int, list[int]] = {}
    running: set[int] = set()
    next_turn = [0] * len(sessions)
    for op, r in ops:
        if op == TOUCH:
            assert r not in seen or r in running  # a waiting (or just admitted) request
            continue
        seen.setdefault(r, []).append(op)
        if op == ARRIVE:
            s = session_of[r]
            assert sessions[s][next_turn[s]] == r  # sessions keep their order
            next_turn[s] += 1
            assert all(session_of[x] != s for x in running)  # closed loop per session
            running.add(r)
            assert len(running) <= max(in_flight, 1)
        elif op == FINISH:
            running.remove(r)
    assert sorted(seen) == list(range(rid))
    assert all(v == [ARRIVE, ALLOC, FINISH] for v in seen.values())


def test_random_stream_is_well_formed_and_deterministic() -> None:
    a, b = random_stream(7), random_stream(7)
    assert a.ops == b.ops
    assert all(
        np.array_equal(a.request(i).finish_ids, b.request(i).finish_ids)
        for i in range(a.n_requests)
    )
    counts = Counter(op for op, _ in a.ops)
    assert counts[ARRIVE] == counts[ALLOC] == counts[FINISH] == a.n_requests
    for i in range(a.n_requests):
        r = a.request(i)
        assert np.array_equal(r.finish_ids[: len(r.match_ids)], r.match_ids)
        assert r.need_blocks >= len(r.finish_ids)


# ---- the differential test ---------------------------------------------------------------------


def radix_lockstep(stream: OpStream, preset: str = "sglang") -> Counter:
    """Replay `stream` through SGLang and our cache together; fail at the first difference
    (tests/diffkit.py)."""
    cap = stream.capacity_blocks
    return sglang_lockstep(stream, SglangSide(cap, stream.block_size),
                           OursSide(cap, preset, debug=True), {("tree_blocks", "reserved"): cap})


@pytest.mark.parametrize("seed", range(24))
def test_random_stream_matches_sglang(seed: int) -> None:
    capacity = (24, 48, 96)[seed % 3]
    stream = random_stream(seed, n_ops=300, capacity_blocks=capacity)
    seen = radix_lockstep(stream)
    assert seen["ARRIVE"] and seen["FINISH"]


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    capacity=st.sampled_from([6, 16, 40, 128]),
    sessions=st.integers(1, 8),
    in_flight=st.integers(1, 5),
)
def test_random_stream_matches_sglang_any_shape(
    seed: int, capacity: int, sessions: int, in_flight: int
) -> None:
    stream = random_stream(
        seed,
        n_ops=200,
        capacity_blocks=capacity,
        n_sessions=sessions,
        max_in_flight=in_flight,
    )
    radix_lockstep(stream)


def test_random_streams_exercise_every_path() -> None:
    """The random streams are not vacuous: they evict, hit, abort, touch and free duplicates."""
    total: Counter = Counter()
    for seed in range(6):
        total += radix_lockstep(random_stream(seed, n_ops=300,
                                              capacity_blocks=(24, 48, 96)[seed % 3]))
    assert total["freed"] > 100 and total["hit"] > 100
    assert total["TOUCH"] > 20 and total["aborted"] > 0 and total["duplicates_freed"] > 0


@pytest.mark.parametrize("preset", ["vllm", "penelope"])
def test_other_presets_replay_within_capacity(preset: str) -> None:
    """The same streams drive the vllm and penelope presets (the benchmark does): debug
    recounts after every op, capacity holds, every request ends and nothing stays locked."""
    for seed in range(6):
        stream = random_stream(seed, n_ops=300, capacity_blocks=(24, 48, 96)[seed % 3])
        side = OursSide(stream.capacity_blocks, preset, debug=True)
        for ob in replay(stream, side):
            assert ob.state["tree_blocks"] + ob.state["reserved"] <= stream.capacity_blocks
        assert ob.state["reserved"] == 0 and ob.state["protected"] == 0
        assert ob.state["evictable"] == ob.state["tree_blocks"]


@needs_cc_traces
@pytest.mark.shared_data
@pytest.mark.parametrize(
    ("capacity", "sessions", "per_session"), [(4096, 12, 60), (2048, 8, 30)], ids=["256K", "128K"]
)
def test_cc_traces_stream_matches_sglang(capacity: int, sessions: int, per_session: int) -> None:
    """First sessions of the real traces, 4 active, 2 in flight (the benchmark's loop)."""
    stream = trace_stream(
        CC_TRACES,
        sessions=sessions,
        active=4,
        in_flight=2,
        capacity_blocks=capacity,
        max_requests_per_session=per_session,
    )
    seen = radix_lockstep(stream)
    assert seen["ARRIVE"] == stream.n_requests
    assert seen["freed"] > 0 and seen["hit"] > 0
