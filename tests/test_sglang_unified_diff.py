"""Differential test: kvsim's `sglang` preset against SGLang 0.5.23's DEFAULT cache, the
`UnifiedRadixCache` with its pure-Python tree core (benchmarks/sglang_unified_ref.py), through
kvsim's public cache API only (match, insert, lock, unlock, make_room, reserve, release).

The protocol is 0.5.23's (benchmarks/sglang_unified_ops.py): match + lock at admission, the
shortfall evicted before allocation, a checkpoint into the tree after every finished prefill
chunk (insert, free duplicates, move the lock), and at finish the insert of prompt + output - 1
tokens with the extra insert that splits the leaf at the prompt boundary. After EVERY op both
must agree on the hit, the admission, the freed block ids, the tree/held/evictable/protected
sizes and the exact set of resident blocks. The legacy `RadixCache` has its own test
(tests/test_sglang_diff.py).
"""

from __future__ import annotations

from collections import Counter

import pytest
from conftest import CC_TRACES, needs_cc_traces

from benchmarks.opstream import OpStream, random_stream, trace_stream, with_chunks
from benchmarks.sglang_unified_ops import KvsimChunkSide, UnifiedSide
from benchmarks.sglang_unified_ref import UnifiedRef
from tests.chained import ids
from tests.diffkit import sglang_lockstep

BS = 64


# ---- SGLang's own behaviour, pinned -------------------------------------------------------------


def test_sglang_diff_unified_pins_split_and_whole_leaf_eviction() -> None:
    ref = UnifiedRef(100, BS)
    hit, node = ref.match(ids(1, 2, 3))
    assert hit == 0
    ref.admit(0, ids(1, 2, 3, 4), node, 0)
    ref.allocator.used += 6
    ref.checkpoint(0, ids(1, 2), finished=False)  # a chunk: [1, 2] in the tree, locked
    assert (ref.tree_blocks, ref.protected_blocks) == (2, 2)
    ref.checkpoint(0, ids(1, 2, 3, 4, 5, 6), finished=True)  # finish: + output, split at 4
    ref.release(0)
    assert ref.resident_block_ids().tolist() == [1, 2, 3, 4, 5, 6]
    # the chunk node [1,2], the prompt tail [3,4] and the output [5,6] are three nodes: one
    # block asked, the output leaf (2 blocks) goes whole; then the prompt tail
    assert ref.evict(1) == 2
    assert ref.allocator.take_freed().tolist() == [5, 6]
    assert ref.evict(1) == 2
    assert ref.allocator.take_freed().tolist() == [3, 4]


# ---- the differential test ----------------------------------------------------------------------


def unified_lockstep(stream: OpStream, chunk: int) -> Counter:
    """SGLang's UnifiedRadixCache and kvsim's ``sglang`` preset in lockstep (tests/diffkit.py)."""
    cap, bs = stream.capacity_blocks, stream.block_size
    return sglang_lockstep(stream, UnifiedSide(cap, bs, chunk), KvsimChunkSide(cap, bs, chunk),
                           {("tree_blocks", "reserved"): cap})


@pytest.mark.parametrize("seed", range(16))
def test_sglang_diff_unified_random_stream(seed: int) -> None:
    capacity = (24, 48, 96)[seed % 3]
    chunk = (100, 192, 40)[seed % 3]
    stream = with_chunks(random_stream(seed, n_ops=300, capacity_blocks=capacity), chunk, seed)
    seen = unified_lockstep(stream, chunk)
    print(f"{stream.name}: {seen['ops']} ops compared")
    assert seen["ARRIVE"] and seen["FINISH"]


def test_sglang_diff_unified_streams_exercise_every_path() -> None:
    total: Counter = Counter()
    for seed in range(6):
        chunk = (100, 192, 40)[seed % 3]
        stream = random_stream(seed, n_ops=300, capacity_blocks=(24, 48, 96)[seed % 3])
        total += unified_lockstep(with_chunks(stream, chunk, seed), chunk)
    assert total["freed"] > 100 and total["hit"] > 100 and total["CHUNK"] > 50
    assert total["TOUCH"] > 20 and total["aborted"] > 0 and total["duplicates_freed"] > 0


@needs_cc_traces
@pytest.mark.shared_data
def test_sglang_diff_unified_cc_traces() -> None:
    """First sessions of the real traces (48K-token context cut, 96K-token cache), 8192-token
    chunks (SGLang's default on an H100): eviction, chunk nodes and shared prefixes."""
    stream = trace_stream(
        CC_TRACES,
        sessions=24,
        active=4,
        in_flight=2,
        capacity_blocks=1536,
        max_requests_per_session=30,
        max_context=49152,
    )
    stream = with_chunks(stream, 8192, 0)
    seen = unified_lockstep(stream, 8192)
    print(f"{stream.name}: {seen['ops']} ops compared")
    assert seen["ARRIVE"] == stream.n_requests and seen["CHUNK"] > 0 and seen["freed"] > 0
