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
from typing import ClassVar

import numpy as np
import pytest
from conftest import CC_TRACES, needs_cc_traces
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.opstream import OpStream, random_stream, trace_stream
from benchmarks.vllm_ops import (
    ADMIT,
    VOP_NAMES,
    DriverConfig,
    ModelSide,
    RealSide,
    drive,
)
from benchmarks.vllm_ref import VLLM_VERSIONS, use_vllm


@pytest.fixture(params=VLLM_VERSIONS, autouse=True)
def vllm(request) -> str:
    """Every test here runs against each pinned vLLM (the one ``VllmRef`` loads)."""
    return use_vllm(request.param)


def pool_lockstep(stream: OpStream, config: DriverConfig) -> Counter:
    """Drive `stream` through the real manager and the model together; fail at the first
    difference. Returns what happened (ops by kind, evictions, duplicates, lazy hits)."""
    full = config.full_sequence_must_fit
    real = RealSide(stream.capacity_blocks, stream.block_size, full)
    model = ModelSide(stream.capacity_blocks, stream.block_size, "vllm", full, debug=True)
    seen: Counter = Counter()
    prev: dict = {"state": model.observe()}

    def on_op(kind: int, rid: int, k: int, results: list) -> None:
        where = f"{stream.name} op {seen['ops']} {VOP_NAMES[kind]} r{rid} k={k}"
        a, b = results
        assert a == b, f"{where}: vLLM {a} != kvsim {b}"
        ra, rb = real.observe(), model.observe()
        for key in ("block_ids", "refs", "free_queue"):
            assert np.array_equal(ra[key], rb[key]), (
                f"{where}: {key} differ\n vLLM  {ra[key].tolist()}\n kvsim {rb[key].tolist()}"
            )
        assert ra["tables"].keys() == rb["tables"].keys(), f"{where}: running requests differ"
        for r, t in ra["tables"].items():
            assert np.array_equal(t, rb["tables"][r]), f"{where}: table of r{r} differs"
        before = prev["state"]
        seen["ops"] += 1
        seen[VOP_NAMES[kind]] += 1
        evicted = (before["block_ids"] >= 0) & (rb["block_ids"] != before["block_ids"])
        seen["evicted"] += int(evicted.sum())
        ids = rb["block_ids"][rb["block_ids"] >= 0]
        seen["duplicates"] = max(seen["duplicates"], len(ids) - len(np.unique(ids)))
        if kind == ADMIT:
            if a is None:
                seen["refused"] += 1
            elif a:
                hit_blocks = rb["tables"][rid][:a] - 1
                seen["hit"] += a
                seen["lazy_hits"] += int(np.count_nonzero(before["refs"][hit_blocks] == 0))
        prev["state"] = rb

    drive(stream, [real, model], config, on_op)
    return seen


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
    seen = pool_lockstep(*random_pool_case(seed))
    print(f"random-{seed}: {seen['ops']} ops compared")
    assert seen["LOOKUP"] and seen["FREE"]


def test_vllm_diff_random_streams_exercise_every_rule() -> None:
    """The random streams are not vacuous: over a few seeds they evict, hit freed blocks
    (lazy eviction), keep duplicates, refuse admissions and preempt."""
    total: Counter = Counter()
    for seed in (3, 6, 9, 12, 15, 18):
        total += pool_lockstep(*random_pool_case(seed))
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
    pool_lockstep(stream, config)


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
    seen = pool_lockstep(stream, config)
    print(f"{stream.name} bs={bs}: {seen['ops']} ops compared")
    assert seen["ADMIT"] >= stream.n_requests
    assert seen["hit"] > 0 and seen["evicted"] > 0


# --- the vLLM ENGINE against the real manager -------------------------------------------------
class ShadowPool:
    """kvsim's block pool with the real vLLM KVCacheManager beside it: every call the vLLM
    engine (sim/engines/vllm.py) makes is applied to both, and their results and whole states
    (block ids, ref counts, free queue, block tables) must be identical after every call.
    So the engine's protocol (admission with the budget, chunk and decode allocations,
    decode runs allocated at once, preemption and finish frees in schedule order) is what
    the real manager accepts, op for op."""

    made: ClassVar[list[ShadowPool]] = []

    def __init__(self, capacity_blocks: int, block_size: int, free_order: str, *,
                 debug: bool = False) -> None:
        from benchmarks.vllm_ref import VllmRef
        from sim.kvcache.blockpool import BlockPool

        assert free_order == "vllm", "only vLLM's own order exists in the real code"
        self.model = BlockPool(capacity_blocks, block_size, free_order, debug=True)
        self.real = VllmRef(capacity_blocks, block_size)
        self.known: set[int] = set()
        self.ops: Counter = Counter()
        ShadowPool.made.append(self)

    def __getattr__(self, name: str):  # counters and observations: the model's
        return getattr(self.model, name)

    def admit(self, rid: int, ids: np.ndarray, num_tokens: int, k: int) -> int | None:
        if rid not in self.known:
            self.real.new_request(rid, ids, num_tokens)
            self.known.add(rid)
        else:  # resumed after preemption: its sampled tokens so far, as vLLM keeps them
            for _ in range(num_tokens - self.real.num_tokens(rid)):
                self.real.sample(rid)
        got = self.model.admit(rid, ids, num_tokens, k)
        ok, hit = self.real.admit(rid, k)
        assert (got is not None) == ok and (not ok or got == hit), (rid, got, ok, hit)
        self._compare("ADMIT", rid)
        self.ops["refused" if got is None else "hit"] += 0 if got is None else got
        return got

    def extend(self, rid: int, k: int, known: int | None = None) -> bool:
        got = self.model.extend(rid, k, known=known)
        assert got == self.real.extend(rid, k, known=known), (rid, k, got)
        self._compare("EXTEND", rid)
        return got

    def cache_known(self, rid: int, tokens: int) -> None:
        self.model.cache_known(rid, tokens)
        self.real.cache_known(rid, tokens)
        self._compare("CACHE", rid)

    def free(self, rid: int) -> None:
        self.model.free(rid)
        self.real.preempt(rid)  # the manager frees alike for finish and preemption
        self._compare("FREE", rid)

    def _compare(self, op: str, rid: int) -> None:
        self.ops[op] += 1
        self.ops["ops"] += 1
        m, r = self.model, self.real
        where = f"op {self.ops['ops']} {op} r{rid}"
        state = r.blocks()
        assert np.array_equal(m.block_ids(), state[:, 0]), f"{where}: cached ids differ"
        assert np.array_equal(m.ref_counts(), state[:, 1]), f"{where}: ref counts differ"
        queue = np.array([p for p, _ in r.free_queue()], np.int64)
        assert np.array_equal(m.free_queue(), queue), f"{where}: free queues differ"
        assert sorted(m.running()) == sorted(r.running()), f"{where}: running requests differ"
        for x in m.running():
            assert np.array_equal(m.table(x), np.array(r.table(x))), f"{where}: table r{x}"


def engine_pool_lockstep(monkeypatch, cfg, trace) -> Counter:
    import sim.engines.vllm as vllm_engine
    from sim.run import run

    ShadowPool.made = []
    monkeypatch.setattr(vllm_engine, "BlockPool", ShadowPool)
    res = run(cfg, trace)
    ops = sum((p.ops for p in ShadowPool.made), Counter())
    ops["requests"] = res.summary["requests"]
    ops["retractions"] = res.summary["retractions"]
    ops["evicted"] = res.summary["evicted_tokens"]
    return ops


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
        ops = engine_pool_lockstep(monkeypatch, cfg, trace)
        print(f"engine kit {cache}/{budget} async {asynchronous}: {ops['ops']} ops compared")
        assert ops["requests"] == len(trace) and ops["retractions"] > 0 and ops["evicted"] > 0
        assert ops["hit"] > 0


def test_vllm_diff_engine_synthetic(monkeypatch, vllm: str) -> None:
    """The synthetic Claude Code trace at N = 4 in a cache that evicts."""
    from sim.config import RunConfig

    cfg = RunConfig.from_flat(engine="vllm", trace="synthetic:claude-code?sessions=6",
                              max_context=32768, vllm_version=vllm[:4],
                              gpu_cache=49152, sessions=4, gaps="tool").with_preset("vllm")
    ops = engine_pool_lockstep(monkeypatch, cfg, None)
    print(f"engine synthetic: {ops['ops']} ops compared")
    assert ops["evicted"] > 0 and ops["hit"] > 0


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
    ops = engine_pool_lockstep(monkeypatch, cfg, None)
    print(f"engine cc-traces ({'runs' if decode_runs else 'steps'}): {ops['ops']} ops compared")
    assert ops["evicted"] > 0 and ops["hit"] > 0
