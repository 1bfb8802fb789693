"""Engine tests with hand-computed expectations from the cost model."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.units import range_units
from sim.run import run
from tests.enginekit import PROF, SPEC, KitTrace, lpm_cfg, prefill, same_summary


def test_one_session_alone_ttft_is_its_prefill() -> None:
    res = run(lpm_cfg(), KitTrace([[(4000, 1, 0.0)]]))
    row = res.requests.iloc[0]
    assert row.ttft_s == pytest.approx(prefill((0, 4000)), rel=1e-12)
    assert row.end_s == pytest.approx(row.ttft_s)  # one output token: done at prefill
    assert row.hit_gpu_tokens == 0 and row.new_tokens == 4000


def test_decode_time_is_closed_form() -> None:
    res = run(lpm_cfg(), KitTrace([[(4000, 101, 0.0)]]))
    row = res.requests.iloc[0]
    decode = PROF.decode_run_seconds(1, 4000, 100)
    assert row.end_s == pytest.approx(prefill((0, 4000)) + decode, rel=1e-12)
    assert row.decoded_tokens == 100
    # Events do not scale with output tokens: one decode event for 100 steps.
    assert res.summary["decode_events"] == 1 and res.summary["decode_steps"] == 100


def test_second_turn_reuses_history_after_gap() -> None:
    # Turn 2 extends turn 1 (4000 prompt + 200 output) to 6000 tokens after a 5 s gap.
    res = run(lpm_cfg(), KitTrace([[(4000, 200, 0.0), (6000, 1, 5.0)]]))
    r1, r2 = res.requests.iloc[0], res.requests.iloc[1]
    assert r2.send_s == pytest.approx(r1.end_s + 5.0)
    cached = (4000 + 200 - 1) // 64 * 64  # SGLang inserts prompt + output minus one token
    assert r2.hit_gpu_tokens == cached
    assert r2.ttft_s == pytest.approx(prefill((cached, 6000)), rel=1e-12)
    assert res.summary["jct_mean_s"] == pytest.approx(r2.end_s)


def test_chunked_prefill_prices_each_chunk() -> None:
    res = run(lpm_cfg(), KitTrace([[(20000, 1, 0.0)]]))
    want = prefill((0, 8192)) + prefill((8192, 16384)) + prefill((16384, 20000))
    assert res.requests.iloc[0].ttft_s == pytest.approx(want, rel=1e-12)
    assert res.summary["prefill_batches"] == 3


def test_two_sessions_share_one_batch() -> None:
    res = run(lpm_cfg(), KitTrace([[(3000, 1, 0.0)], [(3000, 1, 0.0)]]))
    both = PROF.prefill_seconds(range_units(SPEC, 0, 3000) + range_units(SPEC, 0, 3000))
    assert list(res.requests.ttft_s) == pytest.approx([both, both], rel=1e-12)


def test_two_sessions_contend_for_the_chunk_budget() -> None:
    # 6000 + 6000 tokens > 8192: the second request is chunked after the first.
    res = run(lpm_cfg(), KitTrace([[(6000, 1, 0.0)], [(6000, 1, 0.0)]]))
    first = PROF.prefill_seconds(range_units(SPEC, 0, 6000) + range_units(SPEC, 0, 2176))
    second = first + prefill((2176, 6000))
    assert sorted(res.requests.ttft_s) == pytest.approx([first, second], rel=1e-12)


def test_same_config_twice_is_identical() -> None:
    trace = KitTrace([[(3000 + 700 * k, 50, 1.0) for k in range(6)] for _ in range(3)])
    a = run(lpm_cfg(gpu_cache=16384, sessions=2), trace)
    b = run(lpm_cfg(gpu_cache=16384, sessions=2), trace)
    assert a.requests.equals(b.requests)
    assert same_summary(a.summary, b.summary)
    assert a.summary["evicted_tokens"] > 0


@pytest.mark.parametrize("preset", ["sglang", "vllm", "penelope"])
def test_pressure_runs_keep_invariants(preset: str) -> None:
    trace = KitTrace([[(2000 + 900 * k, 300, 2.0) for k in range(8)] for _ in range(4)],
                     shared_blocks=16)
    res = run(lpm_cfg(gpu_cache=20000, sessions=3, preset=preset), trace)
    s = res.summary
    assert s["requests"] == len(trace)
    assert 0 < s["hit_rate"] < s["ideal_hit_rate"] <= 1
    df = res.requests
    assert (df.hit_gpu_tokens + df.recomputed_tokens + df.new_tokens == df.prompt_tokens).all()
    assert np.isfinite(df.ttft_s).all()


def test_hole_is_restored_in_the_same_batch_as_the_new_tokens() -> None:
    # A's history (62 blocks) is cached; B's second turn needs room while A waits, so
    # penelope frees A's history from its FRONT (A has no shared prefix: the private head is
    # the first node under the root). A's second turn then recomputes the hole (phantom) and
    # its new tokens in ONE prefill batch, each at its original positions.
    trace = KitTrace([[(4000, 1, 0.0), (6000, 1, 10.0)], [(100, 1, 0.0), (5000, 1, 1.0)]])
    res = run(lpm_cfg(gpu_cache=8192, sessions=2), trace)
    a2 = res.requests[(res.requests.session == "s0") & (res.requests.turn == 1)].iloc[0]
    assert a2.hole_tokens > 0
    assert a2.hit_gpu_tokens > 0  # the kept suffix behind the hole is reused
    hole, kept = int(a2.hole_tokens), int(a2.hit_gpu_tokens)
    assert hole + kept == 62 * 64
    assert a2.ttft_s == pytest.approx(prefill((0, hole), (hole + kept, 6000)), rel=1e-12)
    assert a2.recomputed_tokens == hole


def test_sglang_evicts_the_tail_instead() -> None:
    trace = KitTrace([[(4000, 1, 0.0), (6000, 1, 10.0)], [(100, 1, 0.0), (5000, 1, 1.0)]])
    res = run(lpm_cfg(gpu_cache=8192, sessions=2, preset="sglang"), trace)
    a2 = res.requests[(res.requests.session == "s0") & (res.requests.turn == 1)].iloc[0]
    assert a2.hole_tokens == 0
    assert a2.ttft_s == pytest.approx(prefill((int(a2.hit_gpu_tokens), 6000)), rel=1e-12)


def test_prompt_nodes_whole_prices_the_same_but_evicts_whole_prompts() -> None:
    # A's 20000-token prompt is one tree node when inserted whole, ~3 nodes when chunked.
    # B's second turn needs room while A waits: SGLang's whole-node tail eviction then frees
    # all of A's prompt (whole) or only its last chunk nodes (chunked).
    trace = KitTrace([[(20000, 1, 0.0), (21000, 1, 10.0)], [(100, 1, 0.0), (9000, 1, 1.0)]])
    runs = {}
    for chunked in (True, False):
        c = lpm_cfg(gpu_cache=28 * 1024, sessions=2,
                preset="sglang").with_fields(checkpoint_chunks=chunked)
        runs[chunked] = run(c, trace).requests.set_index(["session", "turn"])
    assert runs[True].loc[("s0", 0)].ttft_s == pytest.approx(runs[False].loc[("s0", 0)].ttft_s)
    assert runs[False].loc[("s0", 1)].hit_gpu_tokens == 0
    assert runs[True].loc[("s0", 1)].hit_gpu_tokens >= 8192


def test_decode_memory_shortfall_retracts_and_recovers() -> None:
    # max_new_tokens=64 makes admission optimistic; decoding 3000 tokens each then outgrows
    # an 8K cache: SGLang retracts one request (to the queue's tail) and re-prefills it later.
    trace = KitTrace([[(3000, 3000, 0.0)], [(3000, 3000, 0.0)]])
    res = run(lpm_cfg(gpu_cache=8192, sessions=2), trace)
    s = res.summary
    assert s["retractions"] >= 1 and s["aborted"] == 0 and s["dropped_requests"] == 0
    df = res.requests
    assert (df.decoded_tokens == 2999).all()
    assert df.retractions.sum() == s["retractions"]
    # The retracted request finishes after the other one.
    assert df.sort_values("end_s").retractions.iloc[-1] >= 1


def test_unified_tiers_demote_instead_of_delete_and_load_back() -> None:
    # The scenario of the hole test, with a large CPU tier: A's history is demoted to the CPU
    # instead of deleted, and A's second turn loads it back (h2d charged to its batch).
    trace = KitTrace([[(4000, 1, 0.0), (6000, 1, 10.0)], [(100, 1, 0.0), (5000, 1, 1.0)]])
    res = run(lpm_cfg(gpu_cache=8192, sessions=2).with_fields(cpu_cache=65536, tiering="unified"),
              trace)
    a2 = res.requests[(res.requests.session == "s0") & (res.requests.turn == 1)].iloc[0]
    assert a2.loaded_cpu_tokens > 0
    assert a2.recomputed_tokens == 0 and a2.hole_tokens == 0
    cached = 62 * 64
    assert a2.hit_gpu_tokens + a2.loaded_cpu_tokens == cached
    h2d = PROF.transfer_seconds(a2.loaded_cpu_tokens * SPEC.kv_bytes_per_token, "h2d")
    assert a2.ttft_s >= prefill((cached, 6000)) + h2d - 1e-12
    s = res.summary
    assert s["bytes_h2d"] == a2.loaded_cpu_tokens * SPEC.kv_bytes_per_token
    assert s["bytes_d2h"] >= s["bytes_h2d"] and s["cpu_hit_rate"] > 0
    # Without the CPU tier the same history is recomputed.
    gpu_only = run(lpm_cfg(gpu_cache=8192, sessions=2), trace).requests
    assert gpu_only.recomputed_tokens.sum() > 0


@pytest.mark.parametrize("tiering", ["unified", "hicache"])
def test_tiered_runs_are_deterministic_and_consistent(tiering: str) -> None:
    trace = KitTrace([[(2000 + 900 * k, 300, 2.0) for k in range(8)] for _ in range(4)],
                     shared_blocks=16)
    c = lpm_cfg(gpu_cache=16384, sessions=3, preset="penelope" if tiering == "unified"
                    else "sglang").with_fields(cpu_cache=16384, tiering=tiering,
                                               scheduler="lpm-cpu")
    a, b = run(c, trace), run(c, trace)
    assert a.requests.equals(b.requests) and same_summary(a.summary, b.summary)
    df = a.requests
    assert (df.hit_gpu_tokens + df.loaded_cpu_tokens + df.recomputed_tokens + df.new_tokens
            == df.prompt_tokens).all()
    assert a.summary["cpu_loads"] > 0


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_open_loop_sends_at_recorded_times_scaled(scale: float) -> None:
    trace = KitTrace([[(3000, 1, 0.0), (3500, 1, 40.0)], [(2000, 1, 10.0)]])
    res = run(lpm_cfg().with_fields(replay="open", time_scale=scale), trace)
    sent = res.requests.set_index("request").send_s.sort_index().to_numpy()
    want = (trace.send_time_s - trace.send_time_s.min()) * scale
    assert sent == pytest.approx(want)
    # Open loop does not wait for replies: each TTFT is its own prefill here.
    assert res.requests.ttft_s.max() < 1.0
