"""Differential test: kvsim's hybrid KV cache (sim.kvcache.hybridpool) against the REAL vLLM
``HybridKVCacheCoordinator`` with its ``FullAttentionManager`` and ``SlidingWindowManager``,
0.33.0 and 0.34.0 alike (benchmarks/vllm_hybrid_ref.py; installed by `make test` like the
full-attention harness, so nothing here is skipped).

Both caches are driven through vLLM's V1 protocol by the same driver as the full-attention
test (benchmarks/vllm_ops.py: lookups, admissions with the hit, chunked prefill, decode growth,
preemption, frees) on random op streams and on synthetic Claude Code sessions under pressure.
After EVERY op both must agree on the op's result (hit blocks, admitted or refused) and on the
whole state: the kvsim id and group cached in each physical block, each block's ref count, the
free queue front to back (which block the next allocation evicts), and every running request's
block table in every group (null blocks where a window dropped them).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.opstream import OpStream, make_request, random_stream
from benchmarks.vllm_ops import DriverConfig
from sim.kvcache.hybridpool import FULL, MAMBA, SLIDING, HybridGroup
from tests.diffkit import engine_lockstep, vllm_lockstep

SW, FA, MB = SLIDING, FULL, MAMBA
# group layouts: gpt-oss (sliding first, as its layer 0), full first, two windows (the
# coordinator's fixed point runs past one pass), two groups of one spec (looked up together)
LAYOUTS = {
    "sw-full": [(SW, 128), (FA, 0)],
    "full-sw": [(FA, 0), (SW, 100)],
    "sw-sw-full": [(SW, 64), (SW, 64), (FA, 0)],
    "two-windows": [(SW, 40), (FA, 0), (SW, 200)],
    "windows-only": [(SW, 33), (SW, 150)],
    "mamba-full": [(MB, 0), (FA, 0)],
    "full-mamba-mamba": [(FA, 0), (MB, 0), (MB, 0)],
    "mamba-sw-full": [(MB, 0), (SW, 64), (FA, 0)],
}


pytestmark = pytest.mark.usefixtures("vllm")  # each pinned vLLM (tests/conftest.py)


def groups_of(layout: list[tuple[str, int]]) -> list[HybridGroup]:
    return [HybridGroup(k, w) for k, w in layout]


def random_case(seed: int) -> tuple[OpStream, DriverConfig]:
    bs = (16, 32)[seed % 2]
    cap = (24, 40, 64, 128)[(seed // 2) % 4]
    stream = random_stream(seed, n_ops=200, capacity_blocks=cap, block_size=bs, aligned=0.3,
                           resend=0.15)
    config = DriverConfig(max_running=1 + seed % 4, active=2 + seed % 5,
                          chunk=(None, 3 * bs, 50)[seed % 3], decode=(1, bs, 2 * bs)[seed % 3],
                          seed=seed, full_sequence_must_fit=seed % 5 != 4)
    return stream, config


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("seed", range(8))
def test_hybrid_diff_random_stream(layout: str, seed: int) -> None:
    stream, config = random_case(seed)
    seen = vllm_lockstep(stream, config, groups_of(LAYOUTS[layout]),
                         in_flight=(None, 64, 256)[seed % 3])
    print(f"{layout} random-{seed}: {seen['ops']} ops compared")
    assert seen["LOOKUP"] and seen["FREE"]


def test_hybrid_diff_random_streams_exercise_every_rule() -> None:
    """Not vacuous: windows null blocks, hits past them, evictions, refusals, preemption."""
    total: Counter = Counter()
    for seed in (1, 3, 5, 6, 10):
        for layout in ("sw-full", "two-windows"):
            stream, config = random_case(seed)
            total += vllm_lockstep(stream, config, groups_of(LAYOUTS[layout]))
    print(f"exercise: {total['ops']} ops compared")
    assert total["nulls"] > 100 and total["hit"] > 50 and total["evicted"] > 50
    assert total["refused"] > 0


@pytest.mark.parametrize("full", [False, True], ids=["chunk-fit", "full-fit"])
@pytest.mark.parametrize("layout", ["sw-full", "two-windows", "sw-sw-full", "mamba-full",
                                    "mamba-sw-full"])
@pytest.mark.parametrize("seed", range(3))
def test_hybrid_diff_tight_pool_preempts(layout: str, seed: int, full: bool) -> None:
    """A pool just above one request's need (full group + each window's admission cap):
    chunked prefill, many running, preemptions and refusals under vLLM's recycling-aware
    admission cap (``max_in_flight_tokens`` = the chunk)."""
    bs, cap, chunk = 16, 40, 32
    groups = groups_of(LAYOUTS[layout])
    stream = random_stream(seed, n_ops=200, capacity_blocks=cap, block_size=bs, aligned=0.3,
                           resend=0.15)
    config = DriverConfig(max_running=4, active=6, chunk=chunk, decode=bs, seed=seed,
                          full_sequence_must_fit=full)
    seen = vllm_lockstep(stream, config, groups, in_flight=chunk,
                         pool_blocks=tight_pool(groups, cap, chunk, bs))
    print(f"{layout} tight-{seed}: {seen['ops']} ops compared, {seen['PREEMPT']} preempted")
    assert seen["PREEMPT"] > 0 and seen["refused"] > 0 and seen["evicted"] > 0


def tight_pool(groups: list[HybridGroup], cap: int, chunk: int, bs: int) -> int:
    """Blocks for one request of ``cap`` blocks: ``cap`` per full group, each window's
    admission cap (``max_in_flight_tokens`` = ``chunk``)."""
    return sum(cap if g.kind == FA else 2 if g.kind == MB else -(-(g.window - 1 + chunk) // bs) + 1
               for g in groups)


def synthetic_stream(sessions: int, capacity_blocks: int, block_size: int,
                     max_context: int, per_session: int) -> OpStream:
    """Synthetic Claude Code sessions (shared system prefix, growing histories) as an op
    stream for the driver (top-level sessions, as benchmarks/opstream.trace_stream)."""
    from traces import load_trace

    trace = load_trace(f"synthetic:claude-code?sessions={sessions}", block_size=block_size,
                       max_context=max_context, shared_prefix="auto", cache_dir=None)
    per = [list(range(s.first, s.first + min(s.count, per_session)))
           for s in trace.sessions if s.parent < 0]
    session_of = {r: i for i, rids in enumerate(per) for r in rids}

    def source(rid: int):
        prompt = trace.block_ids(rid)
        finish = trace.finish_block_ids(rid)
        return make_request(rid, session_of[rid], prompt, finish[len(prompt):],
                            int(trace.prompt_tokens[rid]), max(int(trace.output_tokens[rid]), 1),
                            block_size)

    return OpStream(f"synthetic-cc-{sessions}", block_size, capacity_blocks, [],
                    len(session_of), source, per)


@pytest.mark.parametrize("layout", ["sw-full", "sw-sw-full", "mamba-full"])
def test_hybrid_diff_agent_sessions_evict(layout: str) -> None:
    """Claude Code sessions (32K cut, 15-25K-token prompts) in a cache of about two
    contexts: chunked prefill of 2048 tokens, 64-token decode steps, eviction, window 128 as
    gpt-oss."""
    groups = [HybridGroup(k, 128 if k == SW else 0) for k, _ in LAYOUTS[layout]]
    cap = 800
    stream = synthetic_stream(6, capacity_blocks=cap, block_size=64, max_context=32768,
                              per_session=6)
    config = DriverConfig(max_running=3, active=4, chunk=2048, decode=64, seed=1)
    seen = vllm_lockstep(stream, config, groups, in_flight=2048,
                         pool_blocks=tight_pool(groups, cap, 2048, 64))
    print(f"{stream.name} {layout}: {seen['ops']} ops compared")
    assert seen["hit"] > 0 and seen["evicted"] > 0 and seen["nulls"] > 0


@pytest.mark.parametrize(("model", "real"), [(128, 192), (100, 64)])
def test_hybrid_diff_catches_a_wrong_window(model: int, real: int) -> None:
    """Negative control: kvsim with another window than the real one must diverge."""
    stream, config = random_case(3)
    with pytest.raises(AssertionError, match=r"differ|!="):
        vllm_lockstep(stream, config, [HybridGroup(SW, model), HybridGroup(FA)],
                      [HybridGroup(SW, real), HybridGroup(FA)])


def test_hybrid_diff_catches_a_window_for_a_state() -> None:
    """Negative control: a Mamba group modelled as a sliding window must diverge."""
    stream, config = random_case(2)
    with pytest.raises(AssertionError, match=r"differ|!="):
        vllm_lockstep(stream, config, [HybridGroup(SW, 32), HybridGroup(FA)],
                      [HybridGroup(MB), HybridGroup(FA)])


def test_hybrid_diff_catches_a_wrong_group_order() -> None:
    """Negative control: the group order decides which group's blocks are freed and popped
    first; kvsim with the groups swapped must diverge."""
    stream, config = random_case(1)
    with pytest.raises(AssertionError, match=r"differ|!="):
        vllm_lockstep(stream, config, [HybridGroup(FA), HybridGroup(SW, 64)],
                      [HybridGroup(SW, 64), HybridGroup(FA)])


# --- KV connector loads (a disaggregated decode worker) on the pool, against the real one ---
def _branch_ids(family: int, branch: int, shared: int, blocks: int) -> np.ndarray:
    """Block ids of a sequence: ``shared`` blocks of its family's prefix, then its own (an id
    names the whole prefix before it, so ids after a divergence are the branch's)."""
    j = np.arange(blocks, dtype=np.int64)
    return np.where(j < shared, family * 100_000 + j, family * 100_000 + branch * 1000 + j)


@settings(max_examples=60, deadline=None)
@given(layout=st.sampled_from(["mamba-full", "full-mamba-mamba", "mamba-sw-full", "sw-full"]),
       seed=st.integers(0, 2**31 - 1))
def test_hybrid_diff_remote_loads(layout: str, seed: int) -> None:
    """Connector loads (``admit_remote``: ``allocate_slots`` with external tokens and
    ``delay_cache_blocks``; ``cache_known`` when the load ends) mixed with local prefills,
    decode steps, step starts and frees, on prompts sharing prefixes (local hits beside the
    load, Mamba states cached this step) in a small pool that evicts and refuses: after every
    op the pool equals the real coordinator (``ShadowHybrid``), Mamba groups included."""
    from tests.diffkit import ShadowHybrid

    rng = np.random.default_rng(seed)
    bs, cap = 4, int(rng.integers(12, 40))
    pool = ShadowHybrid(cap, bs, groups_of(LAYOUTS[layout]), max_in_flight_tokens=16)
    loading: dict[int, int] = {}  # rid -> prompt tokens, blocks held, not landed
    running: dict[int, int] = {}  # rid -> computed tokens
    ids_of: dict[int, np.ndarray] = {}
    for rid in range(60):
        pool.new_step()
        op = rng.integers(5)
        if op <= 1:  # a new request: its prompt loaded remotely or prefilled here
            prompt = int(rng.integers(1, 13 * bs))
            ids = _branch_ids(int(rng.integers(3)), rid, int(rng.integers(0, 14)),
                              prompt // bs + 8)
            ids_of[rid] = ids
            if op == 0 and pool.admit_remote(rid, ids, prompt, int(rng.integers(0, 3))) \
                    is not None:
                loading[rid] = prompt
            elif op == 1 and pool.admit(rid, ids, prompt, prompt) is not None:
                running[rid] = prompt
        elif op == 2 and loading:  # a load ends: its blocks are cached
            r = sorted(loading)[int(rng.integers(len(loading)))]
            pool.cache_known(r, loading[r])
            running[r] = loading.pop(r)
        elif op == 3 and running:  # one decode step of a running request
            r = sorted(running)[int(rng.integers(len(running)))]
            if running[r] // bs + 1 < len(ids_of[r]) and pool.extend(
                    r, 1, known=running[r] + 1):
                running[r] += 1
        elif running or loading:  # a finish (or a cancelled load)
            held = sorted([*running, *loading])
            r = held[int(rng.integers(len(held)))]
            pool.free(r)
            running.pop(r, None)
            loading.pop(r, None)
    assert pool.ops["ops"] > 0


# --- the vLLM ENGINE on a hybrid model against the real coordinator (diffkit ShadowHybrid) ---
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_hybrid_diff_engine_kit_trace(monkeypatch, asynchronous: bool) -> None:
    """gpt-oss-120b (window 128 + full) on the vLLM engine in tight memory: chunked prefills,
    mixed steps, decode runs, preemptions, async in-flight window frees."""
    from sim.config import RunConfig
    from tests.enginekit import KitTrace

    trace = KitTrace([[(1500 + 700 * k, 400 + 150 * k, 1.0 + 0.3 * k) for k in range(6)]
                      for _ in range(4)], shared_blocks=12)
    retractions = 0
    for cache, budget in ((13000, 8192), (10500, 2048)):  # a prompt fits, several do not
        cfg = RunConfig.from_flat(engine="vllm", model="gpt-oss-120b", gpu_cache=cache,
                                  sessions=3, chunk_size=budget, vllm_async=asynchronous,
                                  profile="derived-h100-gpt-oss-120b").with_preset("vllm")
        ops, summary = engine_lockstep(monkeypatch, cfg, trace, hybrid=True)
        print(f"engine kit {cache}/{budget}: {ops['ops']} ops compared, {ops['run_steps']} run "
              f"steps, {summary['retractions']} retractions")
        assert summary["requests"] == len(trace) and ops["hit"] > 0 and ops["run_steps"] > 0
        retractions += summary["retractions"]
    assert retractions > 0


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_hybrid_diff_engine_pd(monkeypatch, asynchronous: bool) -> None:
    """gpt-oss-120b disaggregated on vLLM: each decode worker allocates a landed prompt's
    blocks (a window group only its window) beside its local hits, caches them when the load
    ends, then decodes; the real coordinator takes the same calls."""
    from sim.config import RunConfig

    cfg = RunConfig.from_flat(engine="vllm", model="gpt-oss-120b",
                              trace="synthetic:claude-code?sessions=6", max_context=32768,
                              gpu_cache=40960, sessions=4, gaps="tool", chunk_size=2048,
                              prefill_replicas=1, decode_replicas=1,
                              vllm_async=asynchronous).with_preset("vllm")
    ops, summary = engine_lockstep(monkeypatch, cfg, None, hybrid=True)
    print(f"engine pd: {ops['ops']} ops compared, {ops['remote']} remote loads")
    assert ops["remote"] > 0 and summary["requests"] > 0


@pytest.mark.parametrize(("model", "asynchronous"), [
    ("qwen3-next-80b-a3b", False), ("qwen3-next-80b-a3b", True), ("qwen3.5-27b", False)])
def test_hybrid_diff_engine_pd_mamba(monkeypatch, model: str, asynchronous: bool) -> None:
    """A Gated DeltaNet hybrid (Qwen3-Next-80B-A3B, Qwen3.5-27B) disaggregated on vLLM: each
    decode worker allocates a landed prompt's blocks beside its local hits (every Mamba group
    nulls and one block for the loaded state, the full group every block), caches them when
    the load ends, then decodes, retiring states as its own prefills do; the real coordinator
    takes the same calls."""
    from sim.config import RunConfig

    cfg = RunConfig.from_flat(engine="vllm", model=model,
                              trace="synthetic:claude-code?sessions=6", max_context=32768,
                              gpu_cache=49152, sessions=4, gaps="tool", chunk_size=2048,
                              prefill_replicas=1, decode_replicas=1,
                              vllm_async=asynchronous).with_preset("vllm")
    ops, summary = engine_lockstep(monkeypatch, cfg, None, hybrid=True)
    print(f"engine pd mamba: {ops['ops']} ops compared, {ops['remote']} remote loads, "
          f"{ops['hit']} hit blocks, {ops['run_steps']} run steps")
    assert ops["remote"] > 0 and ops["run_steps"] > 0 and summary["requests"] > 0


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_hybrid_diff_engine_synthetic(monkeypatch, asynchronous: bool) -> None:
    """The synthetic Claude Code trace at N = 4 in a cache that evicts."""
    from sim.config import RunConfig

    cfg = RunConfig.from_flat(engine="vllm", model="gpt-oss-120b",
                              trace="synthetic:claude-code?sessions=6", max_context=32768,
                              gpu_cache=40960, sessions=4, gaps="tool", chunk_size=2048,
                              vllm_async=asynchronous).with_preset("vllm")
    ops, summary = engine_lockstep(monkeypatch, cfg, None, hybrid=True)
    print(f"engine synthetic: {ops['ops']} ops compared, {ops['run_steps']} run steps")
    assert ops["hit"] > 0 and ops["run_steps"] > 0 and summary["evicted_tokens"] > 0


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_hybrid_diff_engine_mamba_sessions(monkeypatch, asynchronous: bool) -> None:
    """Qwen3-Next-80B-A3B (three Mamba groups of Gated DeltaNet state, one full group; vLLM's
    block raised to hold a state page, the run's ids every fifth) on the vLLM engine: agent
    sessions in a cache that evicts, prefill chunks split at block edges (align mode), state
    hits, decode runs retiring states; the real coordinator takes the same calls."""
    from sim.config import RunConfig
    from tests.diffkit import ShadowPool

    cfg = RunConfig.from_flat(engine="vllm", model="qwen3-next-80b-a3b",
                              trace="synthetic:claude-code?sessions=6", max_context=32768,
                              gpu_cache=49152, sessions=4, gaps="tool", chunk_size=2048,
                              vllm_async=asynchronous).with_preset("vllm")
    ops, summary = engine_lockstep(monkeypatch, cfg, None, hybrid=True)
    print(f"engine mamba: {ops['ops']} ops compared, {ops['run_steps']} run steps, "
          f"{summary['evicted_tokens']} evicted tokens")
    pool = ShadowPool.made[0]  # its block wider than the run's: the engine wraps it
    assert [g.kind for g in pool.groups] == [MB, MB, MB, FA]
    assert pool.block_size > cfg.cache.block_size
    assert ops["hit"] > 0 and ops["run_steps"] > 0 and summary["evicted_tokens"] > 0


@settings(max_examples=300, deadline=None)
@given(block=st.sampled_from([16, 64, 320, 1024]), prompt=st.integers(1, 5000),
       generated=st.integers(0, 60), start=st.integers(0, 5100), n=st.integers(1, 9000),
       budget=st.sampled_from([256, 512, 2048, 8192]))
def test_mamba_aligned_chunk_is_vllms_split(block: int, prompt: int, generated: int,
                                            start: int, n: int, budget: int) -> None:
    """The engine's prefill chunk in align mode (sim/engines/vllm.py ``mamba_aligned_chunk``) equals
    the real ``Scheduler._mamba_block_aligned_split`` of the pinned vLLM (its defaults: no
    EAGLE, hash block = block, no backend prefill checkpoints, no long-prefill threshold)."""
    from types import SimpleNamespace

    from benchmarks.vllm_sched_ref import load_vllm_scheduler
    from sim.engines.vllm import mamba_aligned_chunk

    num_tokens = prompt + generated
    start = min(start, num_tokens - 1)
    n = min(n, budget, num_tokens - start)
    real = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=block), block_size=block, hash_block_size=block,
        mamba_partial_cache_hit=False, use_eagle_block_drop=False,
        num_hash_lookahead_tokens=0, mamba_has_prefill_checkpoint_blocks=False,
        mamba_prefill_checkpoint_alignment=None, max_num_scheduled_tokens=budget,
        scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
        mamba_shared_prefix_checkpoint=False)
    request = SimpleNamespace(num_computed_tokens=start, num_prompt_tokens=prompt,
                              num_tokens=num_tokens, shared_prefix_boundary=0)
    split = load_vllm_scheduler()["Scheduler"]._mamba_block_aligned_split
    assert mamba_aligned_chunk(block, budget, prompt, generated, start, n) == split(real,
                                                                                 request, n)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_vllm_block_of_qwen3_next_is_the_real_pages(tp: int) -> None:
    """vLLM's block for Qwen3-Next (``Platform._align_hybrid_block_size``: the least multiple
    of the kernel alignment, max(16, --block-size) = 64, whose attention page holds a Mamba
    page) from the pinned vLLM's own ``MambaSpec`` and ``FullAttentionSpec`` page bytes of
    one layer, with Gated DeltaNet's state shapes (``MambaStateShapeCalculator.
    gated_delta_net_state_shape``; bf16: ``--mamba-ssm-cache-dtype auto``)."""
    import torch

    from benchmarks.vllm_ref import load_vllm_core
    from costmodel.specs import get_spec
    from sim.engines.vllm import vllm_block_size

    iface = load_vllm_core()["interface"]
    s = get_spec("qwen3-next-80b-a3b")
    conv_dim = s.linear_key_dim * s.linear_key_heads * 2 + s.linear_value_dim * (
        s.linear_value_heads)
    mamba = iface.MambaSpec(block_size=1, shapes=(
        (conv_dim // tp, s.linear_conv_kernel - 1),
        (s.linear_value_heads // tp, s.linear_value_dim, s.linear_key_dim)),
        dtypes=(torch.bfloat16, torch.bfloat16), mamba_cache_mode="align").page_size_bytes
    attn = iface.FullAttentionSpec(block_size=1, num_kv_heads=max(1, s.kv_heads // tp),
                                   head_size=s.head_dim, dtype=torch.bfloat16).page_size_bytes
    align = 64
    assert vllm_block_size(s, tp, 64) == align * -(-mamba // (align * attn))


# --- the vLLM ENGINE's steps on a hybrid cache against the REAL Scheduler ---------------------
# (benchmarks/vllm_sched_ref.py with a KVCacheConfig of several groups: vLLM's own scheduler
# over its HybridKVCacheCoordinator; compared after every schedule() and every update)
SCHED_LAYOUTS = {"sw-full": [(SW, 128), (FA, 0)],
                 "sw-sw-full": [(SW, 40), (FA, 0), (SW, 200)]}


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("layout", list(SCHED_LAYOUTS))
def test_hybrid_sched_diff_steps(layout: str, asynchronous: bool) -> None:
    """Multi-turn sessions under preemption, chunked prefill, a max_num_seqs cap: kvsim's
    step logic on its hybrid pool schedules the same rows, preempts and frees the same
    requests, and holds the same block tables in every group as vLLM's Scheduler and
    AsyncScheduler on a window group beside a full one."""
    from benchmarks.vllm_sched_ref import drive, workload
    from tests.test_vllm_sched_diff import WORKLOADS

    steps = preemptions = 0
    for name, w, d in [WORKLOADS[i] for i in (0, 3, 5, 8)]:
        res = drive(workload(block_size=16, **w), block_size=16, asynchronous=asynchronous,
                    groups=groups_of(SCHED_LAYOUTS[layout]), **d)
        assert not res.divergences, f"{name}: {res.divergences[0]}"
        steps += res.steps
        preemptions += res.preemptions
    assert steps > 500 and preemptions > 0


@pytest.mark.parametrize("layout", list(SCHED_LAYOUTS))
def test_hybrid_sched_diff_decode_runs(layout: str) -> None:
    """Where kvsim's engine takes a decode run while a refused request waits
    (``VllmServer.decode_run_steps``), vLLM's Scheduler schedules every step of it the same
    way: the same requests, one token each, nobody admitted. Blocks leaving a window free
    room inside a run and vLLM retries the waiting head after every step's running rows, so
    the run ends before the step after which more blocks are free than its refusal saw.
    One-turn sessions sharing a prefix: a waiting request's hit cannot grow while others
    decode (a follow-up whose prompt holds a running request's output could)."""
    from benchmarks.vllm_sched_ref import drive, workload

    run_steps = 0
    for seed in range(4):
        for cap in (40, 64):
            w = dict(seed=40 + seed, sessions=14, turns=1, prompt=400, output=300,
                     shared_blocks=2, spread=30)
            res = drive(workload(block_size=16, **w), capacity_blocks=cap, block_size=16,
                        budget=8192, asynchronous=False, groups=groups_of(
                            SCHED_LAYOUTS[layout]), runs=True)
            assert not res.divergences, f"seed {seed} cap {cap}: {res.divergences[0]}"
            run_steps += res.run_steps
    assert run_steps > 500
