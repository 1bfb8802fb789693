"""Differential test: kvsim's SGLang cache for a sliding-window hybrid (sim/kvcache/hybridtree.py)
against SGLang 0.5.23's DEFAULT cache with its SWA component, the real `UnifiedRadixCache`
with `tree_components=(FULL, SWA)` and its pure-Python tree core
(benchmarks/sglang_unified_ref.py HybridRef), issue 54 item 3.

The protocol is the scheduler's (benchmarks/sglang_unified_ops.py): match + lock at admission,
both pools' shortfalls evicted by one evict_for_alloc, chunk checkpoints (which free the
request's out-of-window SWA KV), the decode steps' out-of-window free, the finish checkpoint
and the row's release. After EVERY op both must agree on the hit, the SWA branching point,
the admission, the full and SWA block ids freed, both pools' used pages, the evictable and
protected sizes of both components and the exact resident full and SWA block ids.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import CC_TRACES, needs_cc_traces

from benchmarks.opstream import OpStream, random_stream, trace_stream, with_chunks
from benchmarks.sglang_unified_ops import KvsimHybridSide, RealHybridSide
from benchmarks.sglang_unified_ref import HybridRef
from sim.kvcache.hybridtree import Freed, HybridRadixCache
from tests.chained import ids
from tests.diffkit import sglang_lockstep

BS = 64


# ---- SGLang's own behaviour, pinned -------------------------------------------------------------


def test_sglang_hybrid_pins_windowed_retention_and_tombstones() -> None:
    """A 10-block request (window 128 tokens = 2 blocks): its first chunk frees its SWA KV
    older than the window, the finish keeps SWA only for the last window, leaves are capped at
    one window, a match needs a window of SWA before its end, SWA eviction tombstones."""
    ref = HybridRef(40, BS, swa_blocks=20, window=128)
    assert ref.admit(0, ids(1, 2, 3, 4, 5, 6, 7, 8)) == (0, None)
    assert ref.allocate(0, np.arange(1, 11), 10)
    ref.checkpoint(0, 4, finished=False)  # a chunk of 4 blocks
    full, swa = ref.allocator.take_freed()
    assert (full.tolist(), swa.tolist()) == ([], [1])  # block 1 left the window
    ref.decode_to(0, 10 * BS)
    ref.checkpoint(0, 10, finished=True)
    ref.release(0)
    full, swa = ref.allocator.take_freed()
    assert (full.tolist(), swa.tolist()) == ([], [5, 6, 7])
    st = ref.state()
    assert st["full"].tolist() == list(range(1, 11))
    assert st["swa"].tolist() == [2, 3, 4, 8, 9, 10]  # 5-7: tombstones (decode freed them)
    assert ref.match(np.arange(1, 11))[0] == 10
    assert ref.match(np.arange(1, 8))[:3:2] == (4, 7 * BS)  # full KV to 7, a window to 4
    ref.evict(0, 3)  # the SWA LRU: the leaf [9, 10] goes whole, then [8] is tombstoned
    full, swa = ref.allocator.take_freed()
    assert (full.tolist(), swa.tolist()) == ([9, 10], [8, 9, 10])
    assert ref.match(np.arange(1, 9))[:3:2] == (4, 8 * BS)


def test_sglang_hybrid_kvsim_pins_the_same() -> None:
    """kvsim's cache on the same scenario (the pinned numbers above)."""
    c = HybridRadixCache(40, 20, 128, BS)
    f = Freed()
    r = c.admit(ids(1, 2, 3, 4, 5, 6, 7, 8), np.arange(1, 11))
    assert c.allocate(r, 10, f)
    c.checkpoint(r, 4, False, f)
    assert [x.tolist() for x in f.ids()] == [[], [1]]
    c.decode_to(r, 10 * BS, f)
    c.checkpoint(r, 10, True, f)
    c.release(r, f)
    assert [x.tolist() for x in f.ids()] == [[], [1, 5, 6, 7]]
    assert [x.tolist() for x in c.resident()[:2]] == [list(range(1, 11)), [2, 3, 4, 8, 9, 10]]
    assert c.match(np.arange(1, 8))[0::2] == (4, 7)
    f = Freed()
    c.evict(0, 3, f)
    assert [x.tolist() for x in f.ids()] == [[9, 10], [8, 9, 10]]
    assert c.tombstoned_blocks == 1


# ---- the differential test ----------------------------------------------------------------------


def lockstep(stream: OpStream, chunk: int, window: int, ratio: float,
             kvsim_side: type = KvsimHybridSide) -> Counter:
    """FULL + SWA in lockstep (tests/diffkit.py), an SWA pool of ``ratio`` x the full pool;
    kvsim's SWA tombstones and their refills counted."""
    cap, bs = stream.capacity_blocks, stream.block_size
    tree = {"swa_blocks": max(4, int(cap * ratio)), "window": window}
    ours = kvsim_side(cap, bs, chunk, **tree)
    seen = sglang_lockstep(stream, RealHybridSide(cap, bs, chunk, **tree), ours,
                           {("full_used",): cap, ("swa_used",): tree["swa_blocks"]},
                           f" w{window}")
    seen["tombstoned"] = ours.cache.tombstoned_blocks
    seen["recovered"] = ours.cache.recovered_blocks
    return seen


# (seed, window tokens, SWA pool / full pool): gpt-oss's 128, a window across pages (96),
# Gemma 3's 1024 and a one-page window; SGLang's default ratio 0.8 and tighter SWA pools.
CASES = [(0, 128, 0.8), (1, 128, 0.5), (2, 96, 0.5), (3, 1024, 0.8), (4, 64, 0.3),
         (5, 128, 0.3), (6, 200, 0.5), (7, 96, 0.8), (8, 1024, 0.3)]


@pytest.mark.parametrize(("seed", "window", "ratio"), CASES)
def test_sglang_hybrid_random_stream(seed: int, window: int, ratio: float) -> None:
    capacity = (24, 48, 96)[seed % 3]
    chunk = (100, 192, 40)[seed % 3]
    stream = with_chunks(random_stream(seed, n_ops=300, capacity_blocks=capacity), chunk, seed)
    seen = lockstep(stream, chunk, window, ratio)
    assert seen["ARRIVE"] and seen["FINISH"]


def test_sglang_hybrid_streams_exercise_every_path() -> None:
    total: Counter = Counter()
    for seed, window, ratio in CASES[:4]:
        chunk = (100, 192, 40)[seed % 3]
        stream = random_stream(seed, n_ops=300, capacity_blocks=(24, 48, 96)[seed % 3])
        total += lockstep(with_chunks(stream, chunk, seed), chunk, window, ratio)
    assert total["hit"] > 100 and total["CHUNK"] > 50 and total["aborted"] > 0
    assert total["branching"] > 0  # full KV past the last window: the branch insert
    assert total["tombstoned"] > 0 and total["recovered"] > 0  # SWA tombstones, refilled
    assert total["swa_only_freed"] > 0 and total["freed"] > 100


class _NoPageSlack(KvsimHybridSide):
    """A wrong model: the SWA LRU refresh spans the window alone (SGLang's: window + page)."""

    def __init__(self, *args: int, **tree: int) -> None:
        super().__init__(*args, **tree)
        cache = self.cache

        def refresh(node: object, c: HybridRadixCache = cache) -> None:
            prev, acc = c.swa_lru.head, 0
            while node is not c.root and acc < c.window:
                if node.swa:  # type: ignore[attr-defined]
                    c.swa_lru.remove(node)
                    c.swa_lru.insert_after(prev, node)
                    prev = node
                acc += len(node) * c.bs  # type: ignore[arg-type]
                node = node.parent  # type: ignore[attr-defined]

        cache._refresh_window = refresh  # type: ignore[method-assign]


@pytest.mark.pure_path("it replaces a method of the compiled tree")
def test_sglang_hybrid_negative_control() -> None:
    """The test sees a one-page difference in the SWA LRU refresh (it diverges)."""
    found = False
    for seed, window, ratio in ((1, 128, 0.5), (5, 128, 0.3), (4, 64, 0.3)):
        chunk = (100, 192, 40)[seed % 3]
        stream = with_chunks(random_stream(seed, n_ops=300,
                                           capacity_blocks=(24, 48, 96)[seed % 3]), chunk, seed)
        try:
            lockstep(stream, chunk, window, ratio, _NoPageSlack)
        except AssertionError:
            found = True
            break
    assert found, "a wrong SWA LRU refresh went unnoticed"


@needs_cc_traces
@pytest.mark.shared_data
@pytest.mark.parametrize(("window", "ratio"), [(128, 0.8), (1024, 0.3)])
def test_sglang_hybrid_cc_traces(window: int, ratio: float) -> None:
    """Agent sessions that evict: the first sessions of the real Claude Code traces (48K-token
    context cut, 96K-token full pool), 8192-token chunks, gpt-oss's window at SGLang's default
    ratio and Gemma 3's with a tight SWA pool."""
    stream = trace_stream(CC_TRACES, sessions=24, active=4, in_flight=2, capacity_blocks=1536,
                          max_requests_per_session=30, max_context=49152)
    stream = with_chunks(stream, 8192, 0)
    seen = lockstep(stream, 8192, window, ratio)
    assert seen["ARRIVE"] == stream.n_requests and seen["freed"] > 0
    assert seen["branching"] > 0 and seen["swa_freed"] > 0


# ---- Mamba (a Gated DeltaNet hybrid: Qwen3-Next) -------------------------------------------------


def lockstep_mamba(stream: OpStream, chunk: int, slots: int,
                   kvsim_side: type = KvsimHybridSide) -> Counter:
    """FULL + MAMBA without the extra buffer (page = token) in lockstep (tests/diffkit.py):
    the state slots freed are compared as a count, the states in the tree by the last token
    of their nodes."""
    cap = stream.capacity_blocks
    ours = kvsim_side(cap, 1, chunk, mamba_slots=slots)
    seen = sglang_lockstep(stream, RealHybridSide(cap, 1, chunk, mamba_slots=slots), ours,
                           {("full_used",): cap, ("state_used",): slots}, " mamba")
    seen["dropped_states"] = ours.cache.dropped_states
    return seen


@pytest.mark.parametrize(("seed", "slots"), [(0, 10), (1, 16), (2, 10), (3, 12), (4, 16),
                                             (5, 10)])
def test_sglang_hybrid_mamba_random_stream(seed: int, slots: int) -> None:
    capacity = (48, 96, 160)[seed % 3]
    chunk = (7, 13, 5)[seed % 3]
    stream = random_stream(seed, n_ops=300, capacity_blocks=capacity, block_size=1)
    seen = lockstep_mamba(with_chunks(stream, chunk, seed), chunk, slots)
    assert seen["ARRIVE"] and seen["FINISH"]


def test_sglang_hybrid_mamba_streams_exercise_every_path() -> None:
    total: Counter = Counter()
    for seed in range(3):
        chunk = (7, 13, 5)[seed % 3]
        stream = random_stream(seed, n_ops=300, capacity_blocks=(48, 96, 160)[seed % 3],
                               block_size=1)
        total += lockstep_mamba(with_chunks(stream, chunk, seed), chunk, 10)
    assert total["hit"] > 100 and total["CHUNK"] > 50 and total["aborted"] > 0
    assert total["states_freed"] > 100 and total["dropped_states"] > 0
    assert total["freed"] > 100


class _StaleStates(KvsimHybridSide):
    """A wrong model: a reused state is never moved to the Mamba LRU's front."""

    def __init__(self, *args: int, **tree: int) -> None:
        super().__init__(*args, **tree)
        self.cache.mamba_lru.to_front = lambda node: None  # type: ignore[method-assign]


@pytest.mark.pure_path("it replaces a method of the compiled tree's LRU")
def test_sglang_hybrid_mamba_negative_control() -> None:
    """The Mamba test sees a missing LRU refresh of reused states (it diverges)."""
    stream = random_stream(0, n_ops=300, capacity_blocks=48, block_size=1)
    with pytest.raises(AssertionError):
        lockstep_mamba(with_chunks(stream, 7, 0), 7, 10, _StaleStates)


@needs_cc_traces
@pytest.mark.shared_data
def test_sglang_hybrid_mamba_cc_traces() -> None:
    """Agent sessions that evict, Qwen3-Next's cache: the first Claude Code sessions at token
    granularity (32K-token context cut, a 64K-token full pool, 12 state slots), 8192-token
    chunks: states at chunk and turn ends, hits only where a state is."""
    stream = trace_stream(CC_TRACES, sessions=12, active=4, in_flight=2, capacity_blocks=65536,
                          block_size=1, max_requests_per_session=30, max_context=32768)
    seen = lockstep_mamba(with_chunks(stream, 8192, 0), 8192, 12)
    assert seen["ARRIVE"] == stream.n_requests and seen["freed"] > 0
    assert seen["hit"] > 0 and seen["states_freed"] > 0 and seen["branching"] > 0


# ---- pools as SGLang sizes them ----------------------------------------------------------------


def test_hybrid_cache_pools_from_sglang_capacity() -> None:
    """HybridRadixCache.for_capacity takes SGLang's pools (costmodel.gpus.kv_capacity: the
    full pool, the SWA pool at --swa-full-tokens-ratio 0.8, the mamba slots; the table of
    docs/hybrid.md, Capacity in bytes, 40 GiB per GPU)."""
    from costmodel.gpus import kv_capacity
    from costmodel.specs import get_spec

    gib = 1 << 30
    gpt = get_spec("gpt-oss-120b")
    c = HybridRadixCache.for_capacity(gpt.name, gpt.groups, kv_capacity(gpt, 40 * gib, 1,
                                                                         "sglang", BS))
    assert (c.full_capacity * BS, c.swa_capacity * BS, c.window) == (647_232, 517_760, 128)
    nxt = get_spec("qwen3-next-80b-a3b")
    c = HybridRadixCache.for_capacity(nxt.name, nxt.groups, kv_capacity(nxt, 40 * gib, 4,
                                                                        "sglang", BS))
    assert (c.full_capacity * BS, c.state_capacity, c.has_swa) == (1_839_936, 1_052, False)
    q = get_spec("qwen3-8b")
    with pytest.raises(ValueError, match="qwen3-8b: groups"):
        HybridRadixCache.for_capacity(q.name, q.groups, kv_capacity(q, 40 * gib, 1, "sglang"))
