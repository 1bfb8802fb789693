"""kvsim's SGLang hybrid tree on its own (sim/kvcache/hybridtree.py): every counter, LRU list
and the leaf set recounted from the nodes after every op of random streams (SWA at any window
and pool ratio, Mamba at any slot count), and nothing held once every request is done. The
equality with SGLang's real cache is tests/test_sglang_hybrid_diff.py's."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.opreplay import replay
from benchmarks.opstream import ARRIVE, FINISH, OpStream, random_stream, with_chunks
from benchmarks.sglang_unified_ops import KvsimHybridSide
from sim.kvcache.hybridtree import HybridRadixCache


def run_checked(stream: OpStream, side: Any) -> None:
    live = set()
    cache: HybridRadixCache = side.cache
    for ob in replay(stream, side, observe=False):
        if ob.op == ARRIVE:
            live.add(ob.rid)
        elif ob.op == FINISH:
            live.discard(ob.rid)
        cache.check()
    for rid in live:
        side.finish(rid)
    cache.check()
    assert cache.idle()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), window=st.sampled_from([32, 64, 96, 128, 300, 1024]),
       ratio=st.sampled_from([0.2, 0.5, 0.8, 1.0]), capacity=st.sampled_from([24, 48, 96]))
def test_hybrid_tree_swa_invariants(seed: int, window: int, ratio: float, capacity: int) -> None:
    chunk = (40, 100, 192)[seed % 3]
    stream = with_chunks(random_stream(seed, n_ops=200, capacity_blocks=capacity), chunk, seed)
    run_checked(stream, KvsimHybridSide(capacity, 64, chunk, window=window,
                                        swa_blocks=max(4, int(capacity * ratio))))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), slots=st.integers(10, 24),
       capacity=st.sampled_from([48, 96, 160]))
def test_hybrid_tree_mamba_invariants(seed: int, slots: int, capacity: int) -> None:
    chunk = (5, 7, 13)[seed % 3]
    stream = random_stream(seed, n_ops=200, capacity_blocks=capacity, block_size=1)
    run_checked(with_chunks(stream, chunk, seed), KvsimHybridSide(capacity, 1, chunk,
                                                                   mamba_slots=slots))


def test_hybrid_tree_refuses_what_sglang_has_no_tree_for() -> None:
    with pytest.raises(ValueError, match="SWA \\(window\\) or Mamba"):
        HybridRadixCache(10, 8, 128, state_slots=4)
    with pytest.raises(ValueError, match="window must be positive"):
        HybridRadixCache(10, 8, 0)


@settings(max_examples=200, deadline=None)
@given(a=st.lists(st.integers(-1, 3), max_size=12), b=st.lists(st.integers(-1, 3), max_size=12),
       dtype=st.sampled_from(["int64", "int32"]))
def test_common_prefix_is_the_brute_forces(a: list[int], b: list[int], dtype: str) -> None:
    """The walks' node compare (``_common``, a byte compare in the common case) is the length
    of the common prefix, element by element, for arrays of one dtype or two."""
    import numpy as np

    from sim.kvcache.hybridtree import _common

    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    x, y = np.array(a, np.int64), np.array(b, dtype)
    assert _common(x, y) == n
    assert _common(y, x) == n
    assert _common(x, x) == len(a)
