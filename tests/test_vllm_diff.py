"""Differential test: kvsim's vLLM model (sim.kvcache.blockpool) against the REAL vLLM
KVCacheManager, 0.33.0 and 0.34.0 alike (benchmarks/vllm_ref.py: each pinned install with
--no-deps, heavy imports stubbed; CI installs both in `make test`, so nothing here is skipped
there, and a missing one fails).

Both caches are driven through vLLM's V1 protocol by one driver (benchmarks/vllm_ops.py:
lookups at arrival, admission with the hit, chunked prefill, decode growth, preemption of the
last running request, frees). After EVERY op both must agree on the op's result (hit blocks,
admitted or not, allocated or not) and on the whole cache state: the kvsim id cached in each
physical block, each block's ref count, the free queue (physical blocks, front to back) and
every running request's block table. Equal physical blocks is stronger than equal cached sets:
it pins which duplicate a lookup returns and which block the next allocation evicts.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from conftest import CC_TRACES, needs_cc_traces
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.opstream import OpStream, random_stream, trace_stream
from benchmarks.vllm_ops import DriverConfig
from tests.diffkit import engine_lockstep, vllm_lockstep

pytestmark = pytest.mark.usefixtures("vllm")  # each pinned vLLM (tests/conftest.py)


def random_pool_case(seed: int) -> tuple[OpStream, DriverConfig]:
    """Block sizes 16 and 64, 1-4 running, capacities that force eviction and preemption,
    prompts that are (30%) and are not multiples of the block size, resends (15%), chunked
    and whole prefills, decode 1 or many tokens a step, full-sequence admission on and off."""
    bs = (16, 64)[seed % 2]
    cap = (16, 24, 48, 96)[(seed // 2) % 4]
    stream = random_stream(
        seed, n_ops=240, capacity_blocks=cap, block_size=bs, aligned=0.3, resend=0.15
    )
    config = DriverConfig(
        max_running=1 + seed % 4,
        active=2 + seed % 5,
        chunk=(None, 3 * bs, 50)[seed % 3],
        decode=(1, bs, 2 * bs)[(seed // 3) % 3],
        seed=seed,
        full_sequence_must_fit=seed % 5 != 4,
    )
    return stream, config


@pytest.mark.parametrize("seed", range(32))
def test_vllm_diff_random_stream(seed: int) -> None:
    seen = vllm_lockstep(*random_pool_case(seed))
    print(f"random-{seed}: {seen['ops']} ops compared")
    assert seen["LOOKUP"] and seen["FREE"]


def test_vllm_diff_random_streams_exercise_every_rule() -> None:
    """The random streams are not vacuous: over a few seeds they evict, hit freed blocks
    (lazy eviction), keep duplicates, refuse admissions and preempt."""
    total: Counter = Counter()
    for seed in (3, 6, 9, 12, 15, 18):
        total += vllm_lockstep(*random_pool_case(seed))
    print(f"exercise: {total['ops']} ops compared")
    assert total["evicted"] > 50 and total["hit"] > 50 and total["lazy_hits"] > 10
    assert total["duplicates"] > 0 and total["refused"] > 0 and total["PREEMPT"] > 0


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    bs=st.sampled_from([16, 64]),
    capacity=st.sampled_from([8, 20, 40, 128]),
    running=st.integers(1, 4),
    chunk=st.sampled_from([None, 16, 100]),
    decode=st.sampled_from([1, 7, 64]),
    full=st.booleans(),
)
def test_vllm_diff_any_shape(
    seed: int, bs: int, capacity: int, running: int, chunk: int | None, decode: int, full: bool
) -> None:
    stream = random_stream(
        seed,
        n_ops=150,
        capacity_blocks=capacity,
        block_size=bs,
        n_sessions=5,
        aligned=0.3,
        resend=0.2,
    )
    config = DriverConfig(running, 3, chunk, decode, seed % 1000, full)
    vllm_lockstep(stream, config)


@needs_cc_traces
@pytest.mark.shared_data
@pytest.mark.parametrize(
    ("bs", "capacity", "sessions", "per_session", "running"),
    [(64, 768, 32, 60, 3), (16, 2560, 12, 40, 2)],
    ids=["bs64-48K", "bs16-40K"],
)
def test_vllm_diff_cc_traces(
    bs: int, capacity: int, sessions: int, per_session: int, running: int
) -> None:
    """First sessions of the real traces (shared system prefix, 32K-token context cut),
    chunked prefill of 2048 tokens, 64-token decode steps, eviction and preemption."""
    stream = trace_stream(
        CC_TRACES,
        sessions=sessions,
        capacity_blocks=capacity,
        block_size=bs,
        max_requests_per_session=per_session,
        max_context=32768,
    )
    config = DriverConfig(max_running=running, active=4, chunk=2048, decode=64, seed=1)
    seen = vllm_lockstep(stream, config)
    print(f"{stream.name} bs={bs}: {seen['ops']} ops compared")
    assert seen["ADMIT"] >= stream.n_requests
    assert seen["hit"] > 0 and seen["evicted"] > 0


# --- the vLLM ENGINE against the real manager (tests/diffkit.py ShadowPool) ----------------
def test_vllm_diff_engine_kit_trace(monkeypatch, vllm: str) -> None:
    """Tight memory: chunked prefills, mixed steps, decode runs, preemptions, lazy hits."""
    from sim.config import RunConfig
    from tests.enginekit import KitTrace

    trace = KitTrace([[(1500 + 700 * k, 400 + 150 * k, 1.0 + 0.3 * k) for k in range(6)]
                      for _ in range(4)], shared_blocks=12)
    for (cache, budget), asynchronous in itertools.product(((8000, 8192), (9000, 2048)),
                                                          (False, True)):
        cfg = RunConfig.from_flat(engine="vllm", gpu_cache=cache, sessions=3, chunk_size=budget,
                                  profile="derived-h100-qwen3-8b", vllm_version=vllm[:4],
                                  vllm_async=asynchronous).with_preset("vllm")
        ops, summary = engine_lockstep(monkeypatch, cfg, trace)
        print(f"engine kit {cache}/{budget} async {asynchronous}: {ops['ops']} ops compared")
        assert summary["requests"] == len(trace) and summary["retractions"] > 0
        assert summary["evicted_tokens"] > 0 and ops["hit"] > 0


def test_vllm_diff_engine_synthetic(monkeypatch, vllm: str) -> None:
    """The synthetic Claude Code trace at N = 4 in a cache that evicts."""
    from sim.config import RunConfig

    cfg = RunConfig.from_flat(engine="vllm", trace="synthetic:claude-code?sessions=6",
                              max_context=32768, vllm_version=vllm[:4],
                              gpu_cache=49152, sessions=4, gaps="tool").with_preset("vllm")
    ops, summary = engine_lockstep(monkeypatch, cfg, None)
    print(f"engine synthetic: {ops['ops']} ops compared")
    assert summary["evicted_tokens"] > 0 and ops["hit"] > 0


@needs_cc_traces
@pytest.mark.shared_data
@pytest.mark.parametrize(("decode_runs", "select"), [(True, 6), (False, 2)],
                         ids=["runs", "steps"])
def test_vllm_diff_engine_cc_traces(monkeypatch, vllm: str, decode_runs: bool,
                                    select: int) -> None:
    """Real Claude Code sessions (15.6K shared prefix, 32K cut) through the engine, with
    decode runs, and with one event per V1 step (every decode token an allocation)."""
    from sim.config import RunConfig
    from sim.engines import VllmServer

    monkeypatch.setattr(VllmServer, "decode_runs", decode_runs)
    cfg = RunConfig.from_flat(engine="vllm", trace=str(CC_TRACES), select=f"top-requests:{select}",
                              shared_prefix=15974, max_context=32768, gpu_cache=65536 // 6 * select,
                              sessions=min(4, select), gaps="cap:10", vllm_version=vllm[:4],
                              chunk_size=4096).with_preset("vllm")
    ops, summary = engine_lockstep(monkeypatch, cfg, None)
    print(f"engine cc-traces ({'runs' if decode_runs else 'steps'}): {ops['ops']} ops compared")
    assert summary["evicted_tokens"] > 0 and ops["hit"] > 0
