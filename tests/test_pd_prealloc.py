"""Decode-side pre-allocation in a disaggregated fleet (sim/fleet/pd.py, ``--pd-prealloc``):
a request waits in its decode worker's prealloc queue until the worker can hold its KV, by
hand on 1P:1D; vLLM pools (the KV connector path: allocate, WAITING_FOR_REMOTE_KVS, land)."""

from __future__ import annotations

import pytest

from sim.config import RunConfig
from sim.run import run
from tests.enginekit import DEFAULT_PROF, KVB, KitTrace, prefill_s

TRANSFER = 1000 * KVB / 50e9 + 5e-6  # rdma-400: 50 GB/s, 5 us


def prealloc_cfg(**kw) -> RunConfig:
    base = dict(trace="kit", gpu_cache=2048, sessions=2, prefill_replicas=1,
                decode_replicas=1, preset="sglang", max_new_tokens=16, debug_cache=True)
    base.update(kw)
    return RunConfig.from_flat(**base)


TWO = KitTrace([[(1000, 5, 0.0)], [(1000, 5, 0.0)]])


def test_a_request_waits_in_the_prealloc_queue_until_a_running_one_finishes():
    """A 2,048-token decode worker (32 blocks); two 1,000-token prompts arrive at 0. A's
    pre-allocation fits an empty worker: max(16 pages + R, 1000 + 16 decode tokens) = 1,536
    <= 2,048 tokens (R = 512 reserved decode tokens per active request). B's does not: the
    15 blocks A holds (reserved, then landed and locked, then running) leave 17 free, and
    1,088 - R x 1 active = 576 < 1,536; while A runs, 1,024 - max(R, 15) = 512. When A
    finishes its 15 blocks become evictable (32 blocks, no active request): B is
    pre-allocated then, and only then is it prefilled (SGLang's prefill waits for the
    decode side's KV indices), transferred and landed."""
    t = run(prealloc_cfg(), TWO).requests.sort_values("request")
    a, b = t.iloc[0], t.iloc[1]
    first = prefill_s(960, 1000)  # the decode worker's first forward: the partial block
    a_ttft = prefill_s(0, 1000) + TRANSFER + first
    a_end = a_ttft + DEFAULT_PROF.decode_run_seconds(1, 1000, 4)
    assert a["prealloc_wait_s"] == 0.0
    assert a["ttft_s"] == pytest.approx(a_ttft, rel=1e-12)
    assert a["end_s"] == pytest.approx(a_end, rel=1e-12)
    assert b["prealloc_wait_s"] == pytest.approx(a_end, rel=1e-12)
    assert b["prefill_s"] == pytest.approx(prefill_s(0, 1000), rel=1e-12)
    assert b["transfer_queue_s"] == 0.0
    assert b["transfer_s"] == pytest.approx(TRANSFER, rel=1e-12)
    assert b["first_decode_s"] == pytest.approx(first, rel=1e-9)
    assert b["ttft_s"] == pytest.approx(a_end + prefill_s(0, 1000) + TRANSFER + first,
                                        rel=1e-12)
    assert (t["landed_lost_tokens"] == 0).all()


def test_without_prealloc_the_second_lands_at_once_beside_the_first():
    """The same fleet without pre-allocation: B is prefilled right after A on P and lands
    while A runs (its blocks unreserved, exposed to eviction); it is admitted when A ends:
    an earlier TTFT than with pre-allocation, which prefills B only then."""
    on = run(prealloc_cfg(), TWO).requests.sort_values("request")
    off = run(prealloc_cfg(pd_prealloc="off"), TWO).requests.sort_values("request")
    assert off["prealloc_wait_s"].isna().all()
    assert off["prefill_s"].iloc[1] == pytest.approx(2 * prefill_s(0, 1000), rel=1e-12)
    landed = off["ttft_s"].iloc[1] - off["first_decode_s"].iloc[1]
    assert landed < off["end_s"].iloc[0] < off["ttft_s"].iloc[1] < on["ttft_s"].iloc[1]


@pytest.mark.parametrize("async_", [True, False])
def test_one_request_on_vllm_pools_by_hand(async_):
    """vLLM pools: prefill on P, then D allocates the prompt's 16 blocks (its connector
    reports the 1,000 tokens external), the transfer, and D's first forward recomputes
    only the last prompt token (vLLM's _update_waiting_for_remote_kv)."""
    res = run(prealloc_cfg(engine="vllm", preset="vllm", sessions=1, max_new_tokens=None,
                  vllm_async=async_), KitTrace([[(1000, 5, 0.0)]]))
    row = res.requests.iloc[0]
    first = prefill_s(999, 1000)
    assert row["prefill_s"] == pytest.approx(prefill_s(0, 1000), rel=1e-12)
    assert row["prealloc_wait_s"] == 0.0
    assert row["transfer_s"] == pytest.approx(TRANSFER, rel=1e-12)
    assert row["first_decode_s"] == pytest.approx(first, rel=1e-9)
    assert row["ttft_s"] == pytest.approx(prefill_s(0, 1000) + TRANSFER + first, rel=1e-12)
    assert row["decoded_tokens"] == 4 and row["landed_lost_tokens"] == 0


def test_vllm_decode_worker_waits_for_remote_kvs_in_fcfs_order():
    """Two 1,000-token prompts on 1P:1D vLLM pools of 1,536 tokens (24 blocks): P prefills
    them one after the other; D's 16 blocks for B do not fit beside A's 16 until A
    finishes: B waits from its prefill's end to A's end, then its transfer starts."""
    res = run(prealloc_cfg(engine="vllm", preset="vllm", gpu_cache=1536, max_new_tokens=None,
                  vllm_async=False), TWO)
    t = res.requests.sort_values("request")
    a, b = t.iloc[0], t.iloc[1]
    assert a["prealloc_wait_s"] == 0.0
    assert b["prefill_s"] == pytest.approx(2 * prefill_s(0, 1000), rel=1e-12)
    assert a["end_s"] > b["prefill_s"]
    assert b["prealloc_wait_s"] == pytest.approx(a["end_s"] - b["prefill_s"], rel=1e-9)
    assert b["ttft_s"] == pytest.approx(a["end_s"] + TRANSFER + prefill_s(999, 1000),
                                        rel=1e-12)
    assert (t["landed_lost_tokens"] == 0).all() and not t["dropped"].any()
    assert (t["decoded_tokens"] == 4).all()


def test_decode_cache_off_on_vllm_forgets_what_a_finished_request_leaves():
    """--decode-cache off on vLLM pools: a decode worker keeps no cached block once a
    request finished (its hashes are dropped), so turn 2 has no decode-side hit."""
    trace = KitTrace([[(1000, 65, 0.0), (1200, 2, 1.0)]])
    on = run(prealloc_cfg(engine="vllm", preset="vllm", gpu_cache=16384, sessions=1,
                 max_new_tokens=None, pd_local_threshold=512), trace).requests
    off = run(prealloc_cfg(engine="vllm", preset="vllm", gpu_cache=16384, sessions=1,
                  max_new_tokens=None, pd_local_threshold=512, decode_cache="off"),
              trace).requests
    assert on["prefilled_locally"].tolist() == [False, True]
    assert on["hit_gpu_tokens"].iloc[1] == 1024
    assert off["prefilled_locally"].tolist() == [False, False]


def test_block_pool_admit_remote_caches_only_when_the_load_finished():
    """``BlockPool.admit_remote``: the local hit is touched, the rest popped, nothing new is
    hashed until ``cache_known`` (vLLM's delay_cache_blocks); a request that does not fit
    changes nothing; ``forget_free`` drops every free cached block's hash."""
    import numpy as np

    from sim.kvcache.blockpool import BlockPool

    pool = BlockPool(8, 4, debug=True)
    assert pool.admit(0, np.arange(3), 12, 12) == 0  # 3 blocks cached by a local request
    pool.free(0)
    ids = np.asarray([0, 1, 7, 8])  # shares 2 blocks, then its own
    assert pool.admit_remote(1, ids, 18) == 2  # 5 blocks: 2 hit + 3 popped
    assert pool.cached_of(1) == 2 and not pool.is_cached(7)
    before = (pool.free_queue().tolist(), pool.cached_ids().tolist())
    assert pool.admit_remote(2, np.arange(10, 15), 20) is None  # 5 more: only 3 free
    assert (pool.free_queue().tolist(), pool.cached_ids().tolist()) == before
    pool.cache_known(1, 18)
    assert pool.cached_of(1) == 4 and pool.is_cached(8)
    pool.free(1)
    assert len(pool.cached_ids()) == 5
    pool.forget_free()
    assert len(pool.cached_ids()) == 0 and pool.free_blocks == 8



RULE = '''
from policies.pd_rules import PDChoice, PDRule


class OnlyRequestOneRemote(PDRule):
    name = "only-1-remote"

    def decide(self, request, workers):
        return PDChoice(0, local=request.rid != 1)
'''


def test_a_prealloc_arriving_during_a_full_batch_decode_run_is_served_at_the_next_step(
        tmp_path):
    """SGLang polls its prealloc queue before every decode step (process_decode_queue),
    also while batch_is_full holds the waiting queue. On a 4,096-token decode worker A
    (500 tokens, 200 out) runs alone: W (3,700 tokens, local) does not fit beside it, so
    the batch is full and A's decode run has no arrival cut. C's second turn (remote, 200
    tokens) arrives during that run and fits at once (room 56 pages less R x 2 active =
    2,560 >= its 3 pages + R): it is pre-allocated after the step in flight, not when A
    finishes (it waited out A's whole run before). (Its landing still waits for A's end:
    kvsim admits a landed request through the prefill pass that batch_is_full stops.)"""
    rule = tmp_path / "rule.py"
    rule.write_text(RULE)
    trace = KitTrace([[(100, 2, 0.0), (200, 2, 0.3)], [(500, 200, 0.0)], [(3700, 2, 0.0)]])
    t = run(prealloc_cfg(gpu_cache=4096, sessions=3, pd_rule=f"{rule}:OnlyRequestOneRemote"),
            trace).requests.set_index("request")
    a, c2 = t.loc[2], t.loc[1]
    assert not c2["prefilled_locally"] and a["prefilled_locally"]
    step = DEFAULT_PROF.decode_run_seconds(1, 700, 1)
    assert 0.0 <= c2["prealloc_wait_s"] <= step
    # its prefill ran during A's run (it waited for A's end before)
    assert c2["send_s"] + c2["prealloc_wait_s"] + c2["prefill_s"] < a["end_s"] - 0.5


def test_a_waiting_prealloc_ends_the_decode_run_at_the_first_step_it_fits(tmp_path,
                                                                        monkeypatch):
    """The prealloc head's test changes during a decode run: with one running request A
    (500 tokens, 3,000 out, max_new_tokens unset: 4,096 clipped decode tokens), the room
    loses what A's single finish needs beyond what retraction frees (4,096 - its
    generated tokens), and C's need falls by what retraction would free: every step the
    margin grows by 2 tokens and shrinks by a page per 64 steps. C's second turn (600
    tokens, remote) is 612 tokens short when it arrives and is pre-allocated about 600
    steps later, where a decode run polled at every step admits it (here: runs cut to one
    step), not when A finishes 2,400 steps later."""
    rule = tmp_path / "rule.py"
    rule.write_text(RULE)
    trace = KitTrace([[(100, 2, 0.0), (600, 2, 0.2)], [(500, 3000, 0.0)]])
    kw = dict(gpu_cache=8192, sessions=2, max_new_tokens=None,
              pd_rule=f"{rule}:OnlyRequestOneRemote")
    t = run(prealloc_cfg(**kw), trace).requests.set_index("request")
    from sim.engines.sglang import SGLangServer

    steps = SGLangServer._decode_steps
    monkeypatch.setattr(SGLangServer, "_decode_steps", lambda self: min(1, steps(self)))
    ref = run(prealloc_cfg(**kw), trace).requests.set_index("request")
    a, c2 = t.loc[2], t.loc[1]
    assert c2["prealloc_wait_s"] == pytest.approx(ref.loc[1, "prealloc_wait_s"], rel=1e-9)
    assert c2["send_s"] + c2["prealloc_wait_s"] < a["end_s"] - 10.0


@pytest.mark.parametrize("async_", [True, False])
def test_vllm_decode_worker_allocates_a_remote_request_at_the_next_step(tmp_path, async_):
    """vLLM's decode side: a remote request joins the waiting queue when its prefill ended
    and the scheduler allocates its blocks at the next step (free blocks only shrink during
    a decode run, so only an arrival can change what fits: it cuts the run). A (500
    tokens, 200 out, local) decodes alone; C's second turn (200 tokens, remote) is
    allocated within a step of its prefill's end, not when A finishes."""
    rule = tmp_path / "rule.py"
    rule.write_text(RULE)
    trace = KitTrace([[(100, 2, 0.0), (200, 2, 0.3)], [(500, 200, 0.0)]])
    t = run(prealloc_cfg(engine="vllm", preset="vllm", gpu_cache=4096, sessions=2,
                         max_new_tokens=None, vllm_async=async_,
                         pd_rule=f"{rule}:OnlyRequestOneRemote"),
            trace).requests.set_index("request")
    a, c2 = t.loc[2], t.loc[1]
    assert not c2["prefilled_locally"] and a["prefilled_locally"]
    assert 0.0 <= c2["prealloc_wait_s"] <= 2 * DEFAULT_PROF.decode_run_seconds(1, 800, 1)
    assert c2["send_s"] + c2["ttft_s"] < a["end_s"] - 0.5
