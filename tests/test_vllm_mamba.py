"""A Gated DeltaNet hybrid (Qwen3-Next-80B-A3B) on the vLLM engine: its Mamba groups in vLLM's
hybrid KV cache (sim/engines/vllm.py ``vllm_kv_groups``, sim/kvcache/hybridpool.py), pinned by
a golden of a small run under pressure, the run's ids over vLLM's wider block
(``WideBlocks``), and fleets behind the prefix routers. The equality with the real vLLM
coordinator and scheduler is tests/test_vllm_hybrid_diff.py; the decode run's closed form
against one token at a time tests/test_hybridpool.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from sim.config import RunConfig
from sim.kvcache.events import BlockRemoved, BlockStored
from sim.kvcache.hybridpool import FULL, MAMBA, HybridGroup, HybridPool, WideBlocks
from sim.run import run

GOLDEN = Path(__file__).parent / "goldens" / "vllm_mamba.json"
# the fields the golden pins (a run summary gains fields over time; these must not move)
PINNED = ("requests", "dropped_requests", "hit_rate", "ttft_mean_s", "ttft_p99_s",
          "jct_mean_s", "evicted_tokens", "evictions", "retractions", "recomputed_tokens",
          "prompt_tokens", "decode_steps", "preempted_recompute_tokens")
SMALL = dict(engine="vllm", model="qwen3-next-80b-a3b", trace="synthetic:claude-code?sessions=6",
             max_context=32768, gpu_cache=40960, sessions=4, gaps="tool", chunk_size=2048)


def test_a_pressured_mamba_run_is_its_golden() -> None:
    """Sync and async: hits on state checkpoints, evictions and preemption pinned as saved
    (``KVSIM_REGEN_GOLDENS=1`` rewrites it; tests/goldens/CHANGES.md says why)."""
    got = {}
    for mode in ("sync", "async"):
        s = run(RunConfig.from_flat(**SMALL, vllm_async=mode == "async").with_preset(
            "vllm")).summary
        got[mode] = {k: s[k] for k in PINNED}
    if os.environ.get("KVSIM_REGEN_GOLDENS") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert got == want
    for s in got.values():  # under pressure: it evicts, and still hits
        assert s["evicted_tokens"] > 0 and 0 < s["hit_rate"] < 1 and s["dropped_requests"] == 0


def test_wide_blocks_speak_the_runs_ids() -> None:
    """A pool block of 5 run blocks is keyed by the run id of its last one; hits and cached
    blocks come back in run blocks, and KV events name every run id of a pool block."""
    ids = np.arange(100, 140)  # 40 run blocks of 16 tokens: 8 pool blocks of 80
    pool = WideBlocks(HybridPool(12, 80, [HybridGroup(MAMBA), HybridGroup(FULL)]), 5)
    pool.enable_events()
    assert pool.admit(0, ids, 16 * 40, 16 * 40) == 0
    assert pool.cached_of(0) == 40
    stored = [e for _s, e in pool.take_events() if isinstance(e, BlockStored)]
    assert np.array_equal(np.concatenate([e.ids for e in stored]), ids)
    pool.new_step()
    # the state is kept at the prompt's end only: a longer prompt hits all of it, the same
    # prompt (a token left to compute) nothing
    assert pool.lookup(np.arange(100, 150), 16 * 50) == 40
    assert pool.lookup(ids, 16 * 40) == 0
    pool.free(0)
    pool.admit(1, np.arange(500, 540), 16 * 40, 16 * 40)  # evicts the first request's blocks
    removed = [e for _s, e in pool.take_events() if isinstance(e, BlockRemoved)]
    gone = np.concatenate([e.ids for e in removed])
    assert len(gone) and len(gone) % 5 == 0 and set(gone.tolist()) <= set(ids.tolist())
    assert pool.evicted_blocks % 5 == 0 and pool.evicted_blocks > 0


def test_wide_blocks_spell_out_every_call_of_the_pool() -> None:
    """``WideBlocks`` answers every public call of ``HybridPool`` itself (no ``__getattr__``
    forwarding: both are compiled, and the engine makes these calls every step); those in
    tokens or about the pool's own blocks answer as the pool does."""
    public = {n for n in dir(HybridPool) if not n.startswith("_")}
    assert public <= set(dir(WideBlocks)), sorted(public - set(dir(WideBlocks)))
    assert "__getattr__" not in vars(WideBlocks)
    pool = HybridPool(12, 80, [HybridGroup(MAMBA), HybridGroup(FULL)])
    wide = WideBlocks(pool, 5)
    assert wide.admit(0, np.arange(100, 140), 16 * 40, 16 * 30) == 0
    assert (wide.capacity_blocks, wide.block_size, wide.groups) == (12, 80, pool.groups)
    assert wide.extend(0, 16 * 10, known=16 * 40) and wide.computed_tokens(0) == 16 * 40
    assert (wide.free_blocks, wide.used_blocks, wide.cached_blocks) == (
        pool.free_blocks, pool.used_blocks, pool.cached_blocks) == (2, 10, 10)
    assert wide.running() == [0] and wide.blocks_to_grow(0, 16 * 50) == 4
    assert wide.decode_fit([0], 100) == pool.decode_fit([0], 100) > 0
    assert [t.tolist() for t in wide.tables(0)] == [t.tolist() for t in pool.tables(0)]
    assert np.array_equal(wide.block_ids(), pool.block_ids())
    wide.free(0)
    assert wide.free_blocks == 12 and np.array_equal(wide.free_queue(), pool.free_queue())
    wide.check()


@pytest.mark.parametrize("router", ["dynamo-kv", "sglang-cache-aware", "llm-d"])
def test_a_mamba_fleet_behind_each_prefix_router(router: str) -> None:
    """Two vLLM replicas of Qwen3-Next behind a prefix-aware router: every request served,
    and the router's view of the cache (KV events, or the replicas' prefix lookups) finds the
    sessions' histories again (hits)."""
    cfg = RunConfig.from_flat(**dict(SMALL, gpu_cache=65536), replicas=2,
                              router=router).with_preset("vllm")
    s = run(cfg).summary
    assert s["requests"] > 0 and s["dropped_requests"] == 0 and s["hit_rate"] > 0.5


def _engine(**kw):
    """One vLLM replica of ``SMALL`` (with ``kw``) as a run builds it."""
    import simpy

    from costmodel.profile import load_profile
    from costmodel.specs import get_spec
    from sim.run.build import build_replicas
    from sim.run.trace import load_run_trace

    cfg = RunConfig.from_flat(**{**SMALL, **kw}).with_preset("vllm")
    profile = load_profile(cfg.cache.profile, cfg.cache.model)
    spec = get_spec(cfg.cache.model, cfg.cache.kv_dtype, profile.attention_weights)
    engines, _ = build_replicas(simpy.Environment(), cfg, spec, profile, load_run_trace(cfg),
                                [None])
    return cfg, engines[0]


def test_a_replicas_size_in_run_blocks_counts_the_wide_blocks() -> None:
    """What a router's index of a replica holds (llm-d's PodLRU sized by the engine's report:
    sim/fleet/fleet.py) is counted in the run's blocks: on vLLM's wider block of a Mamba
    hybrid each of the pool's blocks is ``ratio`` of them, so the size is the pool's tokens,
    not 1/ratio of them; a full-attention model's pool is in the run's blocks already."""
    cfg, e = _engine()
    pool = e.pool
    assert isinstance(pool, WideBlocks) and pool.ratio > 1
    assert e.capacity_run_blocks() == pool.capacity_blocks * pool.ratio
    assert e.capacity_run_blocks() * cfg.cache.block_size <= cfg.cache.gpu_cache
    assert e.capacity_run_blocks() > cfg.cache.gpu_cache // cfg.cache.block_size // 2
    _cfg, full = _engine(model="qwen3-32b")
    assert full.capacity_run_blocks() == full.pool.capacity_blocks
