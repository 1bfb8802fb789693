"""The vLLM engine (sim/engines/vllm.py): one test per vLLM 0.33 rule, on tiny hand-built
traces, with expectations computed by hand from the cost model and the block arithmetic
(blocks of 64 tokens; ``gpu_cache`` in tokens = 64 x blocks).

Every prompt here is given in tokens; a prompt of 640 tokens is 10 full blocks. Sessions are
closed loops (``tests/enginekit.KitTrace``): a session's next request is sent its gap after
the previous reply; all sessions start at t = 0, in order.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import ConfigError, RunConfig, VllmKnobs
from sim.engines import VllmServer
from sim.engines.vllm import VLLM_MAX_NUM_SEQS, free_order_name, steps_fitting
from sim.run import check, run
from tests.enginekit import (
    DECODE_RUN_TRACE,
    PROF,
    KitTrace,
    assert_decode_runs_are_steps,
    instances,
    prefill,
    row,
)

BS = 64


def vllm_cfg(preset: str = "vllm", **kw) -> RunConfig:
    # pinned: the expected times use PROF and vLLM's synchronous Scheduler (the async
    # batch queue has its own tests below)
    base = dict(engine="vllm", gpu_cache=1 << 20, sessions=4, debug_cache=True,
                profile=PROF.name, vllm_async=False)
    base.update(kw)
    return RunConfig.from_flat(**base).with_preset(preset)


def decode_run(batch: int, ctx: int, steps: int) -> float:
    return PROF.decode_run_seconds(batch, ctx, steps)


def steps_done(batch: int, ctx: int, elapsed: float) -> int:
    """Decode steps completed when an arrival lands ``elapsed`` into a run: the step in
    flight completes (the smallest k whose run time reaches ``elapsed``)."""
    k = 1
    while decode_run(batch, ctx, k) < elapsed:
        k += 1
    return k


@pytest.fixture
def servers(monkeypatch) -> list[VllmServer]:
    """The engines the runs of a test build (to look at the block pool afterwards)."""
    return instances(monkeypatch, VllmServer)


# --- memory semantics -----------------------------------------------------------------------
def test_prompt_blocks_are_cached_when_the_prefill_is_scheduled() -> None:
    # A and B arrive together with the same 62 full blocks (4000 tokens). A is admitted
    # first and its prompt blocks are cached right then, so B, admitted next in the SAME
    # step, hits all 62 (its lookup is capped at 3999 tokens) and computes 32 tokens.
    trace = KitTrace([[(4000, 1, 0.0)], [(4000, 1, 0.0)]], shared_blocks=62)
    res = run(vllm_cfg(sessions=2), trace)
    a, b = row(res, "s0", 0), row(res, "s1", 0)
    assert a.hit_gpu_tokens == 0 and b.hit_gpu_tokens == 62 * BS
    step = prefill((0, 4000), (62 * BS, 4000))
    assert a.ttft_s == pytest.approx(step, rel=1e-12)
    assert b.ttft_s == pytest.approx(step, rel=1e-12)
    assert res.summary["prefill_batches"] == 1
    # SGLang inserts a prompt only once its prefill is done: B hits nothing there.
    sg = run(vllm_cfg(sessions=2).with_fields(engine="sglang").with_preset("vllm"), trace)
    assert row(sg, "s1", 0).hit_gpu_tokens == 0


def test_decode_blocks_are_cached_as_they_fill() -> None:
    # A (1000-token prompt, 3000 output tokens) decodes its way through the shared blocks
    # 15..61. B's second request (4000 tokens, the same 62 blocks) arrives G = 5 s after B's
    # first reply, while A decodes: the run is cut after the step in flight (m steps), and at
    # the next step A is scheduled first (its block count grows to (1001 + m) // 64, each
    # cached as it fills), then B is admitted and hits them.
    g = 5.0
    trace = KitTrace([[(1000, 3000, 0.0)], [(50, 1, 0.0), (4000, 1, g)]], shared_blocks=62)
    res = run(vllm_cfg(sessions=2), trace)
    t1 = prefill((0, 1000), (0, 50))  # step 1: A's prompt and B's first request
    m = steps_done(1, 1000, g)
    hit = min(62, (1001 + m) // BS)
    assert hit > 1000 // BS  # more than A's prompt: decode blocks
    b2 = row(res, "s1", 1)
    assert b2.hit_gpu_tokens == hit * BS
    boundary = t1 + decode_run(1, 1000, m)
    mixed = max(prefill((1000 + m, 1001 + m), (hit * BS, 4000)),
                PROF.decode_step_seconds(1, 1000 + m))
    assert b2.ttft_s == pytest.approx(boundary + mixed - (t1 + g), rel=1e-9)
    # SGLang caches A's prompt after its prefill and its decoded tokens only at its finish.
    sg = run(vllm_cfg(sessions=2).with_fields(engine="sglang").with_preset("vllm"), trace)
    assert row(sg, "s1", 1).hit_gpu_tokens == 1000 // BS * BS


def _refused_scenario(with_b: bool) -> tuple[KitTrace, RunConfig]:
    """Step 1: A1, (B1,) C1 (10 blocks each) are cached; A1 (and B1) finish, freed in that
    order, leaving 10 unhashed blocks in front: the free queue is [10 unhashed][A's 10
    (tail first)]([B's 10]). C decodes 1199 tokens (19 more blocks). A2 (1920 tokens = 30
    blocks, 10 of them A's) arrives 1 s later: C holds more than 10 blocks (30 with B), so
    A2 does not fit: it is refused and waits until C ends."""
    sessions = [[(640, 1, 0.0), (1920, 1, 1.0)], [(640, 1200, 0.0)]]
    if with_b:
        sessions.insert(1, [(640, 1, 0.0)])
    trace = KitTrace(sessions)
    return trace, vllm_cfg(gpu_cache=(40 if with_b else 30) * BS, sessions=len(sessions))


def test_lookup_is_read_only() -> None:
    # A2's lookup at arrival sees A's 10 blocks, but looking up pins nothing: while A2 waits,
    # C's decode pops 19 blocks from the queue front (10 unhashed, then A's 9 last blocks:
    # vLLM releases a request tail first). At admission A2 hits only A's first block.
    trace, c = _refused_scenario(with_b=False)
    res = run(c, trace)
    a2, cc = row(res, "s0", 1), row(res, "s1", 0)
    assert a2.send_s < cc.end_s
    assert a2.hit_gpu_tokens == 1 * BS
    assert a2.admit_s == pytest.approx(cc.end_s)
    assert a2.ttft_s == pytest.approx(cc.end_s + prefill((BS, 1920)) - a2.send_s, rel=1e-9)


def test_a_request_not_admitted_touches_nothing(monkeypatch) -> None:
    # B's history was freed after A's, and A2's refused lookup came later still; C's decode
    # nevertheless evicts A's blocks (in the queue first) and none of B's: a request that is
    # not admitted moves nothing in the free queue (SGLang's match would refresh A's path).
    trace, c = _refused_scenario(with_b=True)
    from sim.kvcache.blockpool import BlockPool

    seen: dict[int, list[bool]] = {}

    class Spy(BlockPool):  # the pool just before it admits rid (a patch's pool: its class)
        def admit(self, rid, ids, *args, **kw):
            seen[rid] = [self.is_cached(int(x)) for x in trace.block_ids(2)]
            return super().admit(rid, ids, *args, **kw)

    monkeypatch.setattr(VllmServer, "pool_class", Spy)
    res = run(c, trace)
    b_cached = seen[1]  # when A2 is finally admitted, it hits 1 block: A lost 9, B none
    assert row(res, "s0", 1).hit_gpu_tokens == 1 * BS
    assert b_cached == [True] * 10


def test_the_hit_is_pinned_at_admission() -> None:
    # 40 blocks. A1 caches 10 blocks and ends. G s later A2 (20 blocks: 10 hit) and D
    # (25 new blocks) arrive together. A2 is admitted first: its 10 hit blocks leave the free
    # queue (ref 1) and it takes 10 of the 30 unhashed ones, leaving 20 free: D does not
    # fit (it would, 30 >= 25, if A2's hit were still evictable) and waits for A2's end.
    g = 1.0
    trace = KitTrace([[(640, 1, 0.0), (1280, 1, g)], [(50, 1, 0.0), (1600, 1, g)]])
    res = run(vllm_cfg(gpu_cache=40 * BS, sessions=2), trace)
    a2, d = row(res, "s0", 1), row(res, "s1", 1)
    assert a2.hit_gpu_tokens == 10 * BS
    assert a2.send_s == pytest.approx(d.send_s)
    assert a2.ttft_s == pytest.approx(prefill((10 * BS, 1280)), rel=1e-12)
    assert d.admit_s == pytest.approx(a2.end_s)
    assert d.ttft_s == pytest.approx(prefill((10 * BS, 1280)) + prefill((0, 1600)), rel=1e-12)


def test_freed_blocks_stay_hittable_until_reused() -> None:
    # 30 blocks. A1 caches 10 blocks and ends (queue: [20 unhashed][A's 10, tail first]). C2
    # (25 blocks) takes the 20 unhashed and exactly 5 of A's, the last 5 (lazy eviction: a
    # hash is dropped only when its block is popped). A2 then hits A's first 5 blocks.
    trace = KitTrace([[(640, 1, 0.0), (1280, 1, 4.0)], [(50, 1, 0.0), (1600, 1, 1.0)]])
    res = run(vllm_cfg(gpu_cache=30 * BS, sessions=2), trace)
    a2, c2 = row(res, "s0", 1), row(res, "s1", 1)
    assert c2.end_s < a2.send_s
    assert a2.hit_gpu_tokens == 5 * BS
    assert a2.ttft_s == pytest.approx(prefill((5 * BS, 1280)), rel=1e-12)
    # evicted: A's 5 (by C2), then 15 of C2's freed blocks for A2's 15 new blocks
    assert res.summary["evicted_tokens"] == (5 + 15) * BS


def test_no_deduplication(servers) -> None:
    # A resends its 640-token prompt (10 full blocks). The lookup stops at 639 tokens, so
    # block 9 is computed again and cached a second time: two copies, both taking capacity.
    trace = KitTrace([[(640, 1, 0.0), (640, 1, 1.0)]])
    res = run(vllm_cfg(gpu_cache=40 * BS, sessions=1), trace)
    a2 = row(res, "s0", 1)
    assert a2.hit_gpu_tokens == 9 * BS
    assert a2.ttft_s == pytest.approx(prefill((9 * BS, 640)), rel=1e-12)
    pool = servers[0].pool
    assert pool.cached_blocks == 11
    ids, counts = np.unique(pool.cached_ids(), return_counts=True)
    assert counts.tolist() == [1] * 9 + [2] and ids[-1] == trace.block_ids(0)[-1]


# --- scheduling -----------------------------------------------------------------------------
def test_running_requests_first_then_waiting_fcfs() -> None:
    # A (20000 tokens) is admitted first and chunked: 8192 tokens per step. B (1000 tokens,
    # same arrival) waits while A's chunks, scheduled first each step, use the whole budget;
    # it is admitted in A's last step with the 4576 tokens left.
    trace = KitTrace([[(20000, 1, 0.0)], [(1000, 1, 0.0)]])
    res = run(vllm_cfg(sessions=2), trace)
    a, b = row(res, "s0", 0), row(res, "s1", 0)
    p1, p2 = prefill((0, 8192)), prefill((8192, 16384))
    p3 = prefill((16384, 20000), (0, 1000))
    assert b.admit_s == pytest.approx(p1 + p2)
    assert a.ttft_s == pytest.approx(p1 + p2 + p3, rel=1e-12)
    assert b.ttft_s == pytest.approx(p1 + p2 + p3, rel=1e-12)


def test_the_first_refusal_ends_admission() -> None:
    # 40 blocks. X decodes (10 -> 15 blocks). B (1920 tokens = 30 blocks) arrives first and
    # is refused (X holds > 10); C (320 tokens = 5 blocks) arrives after it and would fit,
    # but FCFS admits nobody behind a refused head: both are admitted at X's end.
    trace = KitTrace([[(640, 300, 0.0)], [(50, 1, 0.0), (1920, 1, 0.5)],
                      [(50, 1, 0.0), (320, 1, 0.6)]])
    res = run(vllm_cfg(gpu_cache=40 * BS, sessions=3), trace)
    x, b, c = row(res, "s0", 0), row(res, "s1", 1), row(res, "s2", 1)
    assert b.send_s < c.send_s < x.end_s
    assert b.admit_s == pytest.approx(x.end_s) and c.admit_s == pytest.approx(x.end_s)
    both = prefill((0, 1920), (0, 320))
    assert c.ttft_s == pytest.approx(x.end_s + both - c.send_s, rel=1e-9)


def test_one_token_budget_shared_by_decode_and_prefill() -> None:
    # A decodes; B2 (10000 tokens) arrives 1 s after B1's reply. Each step's 8192 tokens go
    # first to A's decode token, so B2's chunks are 8191 and 1809 tokens, in MIXED steps
    # priced as the larger of their compute (A's token at its position + the chunk) and the
    # decode step of A alone.
    g = 1.0
    trace = KitTrace([[(1000, 400, 0.0)], [(50, 1, 0.0), (10000, 1, g)]])
    res = run(vllm_cfg(sessions=2), trace)
    t1 = prefill((0, 1000), (0, 50))
    m = steps_done(1, 1000, g)
    pos = 1000 + m  # A's next decode position
    s1 = max(prefill((pos, pos + 1), (0, 8191)), PROF.decode_step_seconds(1, pos))
    s2 = max(prefill((pos + 1, pos + 2), (8191, 10000)), PROF.decode_step_seconds(1, pos + 1))
    b2 = row(res, "s1", 1)
    boundary = t1 + decode_run(1, 1000, m)
    assert b2.admit_s == pytest.approx(boundary)
    assert b2.ttft_s == pytest.approx(boundary + s1 + s2 - (t1 + g), rel=1e-9)
    # A kept decoding through both steps and finished every token.
    assert row(res, "s0", 0).decoded_tokens == 399


def test_max_num_seqs_caps_running_requests() -> None:
    # max_num_seqs = 2: the third request waits until the first two finish (49 decode steps,
    # taken as one run since admission is blocked), then is admitted.
    assert VLLM_MAX_NUM_SEQS == 1024  # the default, vLLM's for an API server on an H100
    trace = KitTrace([[(1000, 50, 0.0)], [(1000, 50, 0.0)], [(1000, 50, 0.0)]])
    res = run(vllm_cfg(sessions=3, max_running=2), trace)
    t1 = prefill((0, 1000), (0, 1000))
    end = t1 + decode_run(2, 2000, 49)
    c = row(res, "s2", 0)
    assert c.admit_s == pytest.approx(end)
    assert c.ttft_s == pytest.approx(end + prefill((0, 1000)), rel=1e-12)


def test_preemption_recomputes_the_most_recently_admitted_request() -> None:
    # 40 blocks; A then B (640 + 1000 tokens each, 26 blocks at their end). Both decode 640
    # steps in one run until the pool is full (20 blocks each); at the next step A (admitted
    # first, scheduled first) needs a block: B, the most recently admitted, is preempted (its
    # 20 cached blocks freed tail first) and A takes B's last block. B waits, refused, while
    # A pops 5 more (B's blocks 18..14) until A ends; B is admitted again with a hit of its 14
    # first blocks, recomputes tokens 896..1281 (prompt + its 641 outputs) and decodes on.
    trace = KitTrace([[(640, 1000, 0.0)], [(640, 1000, 0.0)]])
    res = run(vllm_cfg(gpu_cache=40 * BS, sessions=2), trace)
    a, b = row(res, "s0", 0), row(res, "s1", 0)
    assert res.summary["retractions"] == 1
    assert a.retractions == 0 and b.retractions == 1
    assert a.ttft_s == pytest.approx(prefill((0, 640), (0, 640)), rel=1e-12)
    a_end = (prefill((0, 640), (0, 640)) + decode_run(2, 1280, 640)
             + PROF.decode_step_seconds(1, 1280) + decode_run(1, 1281, 358))
    assert a.end_s == pytest.approx(a_end, rel=1e-9)
    b_end = a_end + prefill((14 * BS, 1281)) + decode_run(1, 1281, 358)
    assert b.end_s == pytest.approx(b_end, rel=1e-9)
    assert b.decoded_tokens == 999  # preemption keeps the outputs
    # the hit is counted at the first admission only, as for SGLang's retractions
    assert b.hit_gpu_tokens == 0


def test_decode_runs_take_one_event() -> None:
    res = run(vllm_cfg(sessions=1), KitTrace([[(4000, 101, 0.0)]]))
    r = res.requests.iloc[0]
    assert r.end_s == pytest.approx(prefill((0, 4000)) + decode_run(1, 4000, 100), rel=1e-12)
    assert res.summary["decode_events"] == 1 and res.summary["decode_steps"] == 100


def test_decode_runs_change_nothing(monkeypatch) -> None:
    # Taking a decode run in one event (cut by memory and arrivals) gives the same run as
    # one event per V1 step: same hits, admissions, preemptions; times equal to rounding.
    trace = KitTrace(DECODE_RUN_TRACE, shared_blocks=12)
    for preset in ("vllm", "penelope"):
        # no invariant recount after every op here: one event per step makes thousands
        c = vllm_cfg(preset, gpu_cache=9000, sessions=3).with_fields(debug_cache=False)
        assert_decode_runs_are_steps(monkeypatch, c, trace, (
            "hit_gpu_tokens", "recomputed_tokens", "retractions", "decoded_tokens",
            "ideal_hit_tokens"))


# --- policies -------------------------------------------------------------------------------
@pytest.mark.parametrize(("preset", "hit_blocks"), [("vllm", 17), ("penelope", 2)])
def test_penelope_is_a_free_order(preset: str, hit_blocks: int) -> None:
    # 60 blocks. A1 and B1 (20 blocks each, sharing blocks 0-1) and C1 finish in step 1.
    # vLLM releases each request tail first (free queue: [22 unhashed][A 19..2][B 19..2]
    # [1][0]); penelope releases the private history FRONT first ([A 2..19][B 2..19][1][0]),
    # the shared prefix last. C2 (27 blocks: the 2 shared ones hit) pops the 22 unhashed
    # and 3 of A's: A's
    # last three under vllm (A2 hits 17 blocks), A's first private three under penelope: A2
    # hits only the shared prefix (blocks 3-19 stay cached but unreachable: vLLM has no
    # phantom request to refill a hole).
    trace = KitTrace([[(1280, 1, 0.0), (1920, 1, 3.0)], [(1280, 1, 0.0)],
                      [(50, 1, 0.0), (1728, 1, 1.0)]], shared_blocks=2)
    res = run(vllm_cfg(preset, gpu_cache=60 * BS, sessions=3), trace)
    assert row(res, "s1", 0).hit_gpu_tokens == 2 * BS  # B hit the prefix A just cached
    a2 = row(res, "s0", 1)
    assert a2.hit_gpu_tokens == hit_blocks * BS
    assert a2.ttft_s == pytest.approx(prefill((hit_blocks * BS, 1920)), rel=1e-12)
    assert a2.hole_tokens == 0


def test_policy_free_orders() -> None:
    from policies import get_policy

    assert free_order_name(get_policy("vllm")) == "vllm"
    assert free_order_name(get_policy("penelope")) == "penelope"
    assert free_order_name(get_policy("lru+tail+block")) == "vllm"


HOLD = "docs/examples/hold_tool_calls.py:HoldToolCalls"


@pytest.mark.parametrize(("policy", "why"), [
    ("sglang", "granularity is 'node'"),
    ("lfu+tail+block", "victim order is 'lfu'"),
    ("lru+leaf-head+block", "start position is 'leaf-head'"),
    (HOLD, "pins histories"),
])
def test_policies_vllm_cannot_express_are_refused(policy: str, why: str) -> None:
    with pytest.raises(ConfigError, match="cannot run on the vllm engine") as e:
        check(RunConfig.from_flat(engine="vllm").with_policy(policy))
    assert why in str(e.value)
    res = CliRunner().invoke(cli, ["run", "--engine", "vllm", "--policy", policy])
    assert res.exit_code == 2
    assert "cannot run on the vllm engine" in res.output and "Traceback" not in res.output


def test_custom_victim_keys_are_refused(tmp_path) -> None:
    f = tmp_path / "mine.py"
    f.write_text("from policies import BLOCK, EvictionPolicy\n"
                 "class Recent(EvictionPolicy):\n"
                 "    name = 'recent'\n"
                 "    granularity = BLOCK\n"
                 "    def key(self, node):\n"
                 "        return -node.last_access\n")
    with pytest.raises(ConfigError, match="'recent' cannot run on the vllm engine: it has its"):
        check(RunConfig.from_flat(engine="vllm").with_policy(f"{f}:Recent"))


@pytest.mark.parametrize(("field", "value", "why"), [
    ("cpu_cache", 65536, "one GPU tier"),
    ("scheduler", "lpm", "fcfs"),
    ("checkpoint_chunks", False, "knob of the sglang engine, not of .vllm."),  # SGLang's tree
])
def test_engine_options_vllm_does_not_have(field: str, value, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        check(vllm_cfg().with_fields(**{field: value}))


def test_default_presets_per_engine() -> None:
    res = CliRunner().invoke(cli, ["run", "--engine", "vllm", "--trace",
                                   "synthetic:claude-code?sessions=3", "--max-context", "32k",
                                   "--gpu-cache", "48k", "--json"])
    assert res.exit_code == 0, res.output
    import json

    runs = json.loads(res.stdout)["runs"]
    assert [r["policy"] for r in runs] == ["vllm", "penelope"]
    assert {r["engine"] for r in runs} == {"vllm"}
    assert {r["summary"]["engine"] for r in runs} == {"vllm"}


def test_steps_fitting_matches_counting() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        starts = rng.integers(1, BS + 1, size=int(rng.integers(1, 5))).tolist()
        room, cap = int(rng.integers(0, 40)), int(rng.integers(1, 400))
        want = 0
        for k in range(1, cap + 1):
            need = sum(0 if k < t else 1 + (k - t) // BS for t in starts)
            if need > room:
                break
            want = k
        assert steps_fitting(starts, BS, room, cap) == want


# --- admission rules only a targeted test exposes -------------------------------------------
@pytest.mark.parametrize(("b_tokens", "admitted_early"), [(641, False), (640, True)])
def test_full_sequence_check_counts_the_partial_last_block(b_tokens: int,
                                                           admitted_early: bool) -> None:
    # 40 blocks, a token budget of 512. X (1860 tokens: 29 blocks and a partial one; 60
    # outputs end at 1919 tokens, still 30 blocks) and B arrive together; X's chunks take
    # the whole budget for 3 steps, and its last chunk (324 tokens) leaves 188 for B, while
    # 10 blocks are free. B's first chunk (188 tokens, 3 blocks) would fit; vLLM's
    # full-sequence check (scheduler_reserve_full_isl) asks for its WHOLE prompt, partial
    # last block included: 641 tokens need 11 blocks (refused until X ends), 640 need 10.
    trace = KitTrace([[(1860, 60, 0.0)], [(b_tokens, 1, 0.0)]])
    res = run(vllm_cfg(gpu_cache=40 * BS, sessions=2, chunk_size=512), trace)
    x, b = row(res, "s0", 0), row(res, "s1", 0)
    chunks = prefill((0, 512)) + prefill((512, 1024)) + prefill((1024, 1536))
    if admitted_early:
        assert b.admit_s == pytest.approx(chunks, rel=1e-12)
        assert b.admit_s < x.end_s
    else:
        assert b.admit_s == pytest.approx(x.end_s)
    assert b.retractions == 0 and x.retractions == 0


# --- async scheduling (vLLM 0.33's default: --vllm-async on) ---------------------------------
def test_async_is_the_default_and_off_is_the_sync_scheduler() -> None:
    assert RunConfig().value("vllm_async") is VllmKnobs().vllm_async is True
    trace = KitTrace([[(640, 1000, 0.0)], [(640, 1000, 0.0)]])
    sync = run(vllm_cfg(gpu_cache=40 * BS, sessions=2), trace)
    assert sync.summary["vllm_async"] is False
    asy = run(vllm_cfg(gpu_cache=40 * BS, sessions=2, vllm_async=True), trace)
    assert asy.summary["vllm_async"] is True


def test_async_a_finish_frees_its_blocks_one_step_later() -> None:
    # 40 blocks. A and C (640 tokens) are admitted together; B (1600 tokens, 25 blocks)
    # arrives while they decode and is refused until A (100 outputs) ends. Sync: the step
    # after A's last one admits B (a mixed step with C's decode). Async: that step was
    # scheduled before A's last output was processed: it runs C alone, and B's prefill
    # rides along the step after it.
    trace = KitTrace([[(640, 100, 0.0)], [(640, 1000, 0.0)], [(50, 1, 0.0), (1600, 1, 0.1)]])
    sync = run(vllm_cfg(gpu_cache=40 * BS, sessions=3), trace)
    asy = run(vllm_cfg(gpu_cache=40 * BS, sessions=3, vllm_async=True), trace)
    a_end = row(sync, "s0", 0).end_s
    assert row(asy, "s0", 0).end_s == pytest.approx(a_end, rel=1e-12)
    p = 640 + 99  # C's next position when A ends
    b_sync, b_async = row(sync, "s2", 1), row(asy, "s2", 1)
    assert b_sync.admit_s == pytest.approx(a_end) and b_async.admit_s == pytest.approx(a_end)
    mixed = max(prefill((p, p + 1), (0, 1600)), PROF.decode_step_seconds(1, p))
    assert b_sync.first_token_s == pytest.approx(a_end + mixed, rel=1e-9)
    later = max(prefill((p + 1, p + 2), (0, 1600)), PROF.decode_step_seconds(1, p + 1))
    assert b_async.first_token_s == pytest.approx(
        a_end + PROF.decode_step_seconds(1, p) + later, rel=1e-9)


def test_async_decode_runs_change_nothing(monkeypatch) -> None:
    # The async pipeline's decode runs (one event for many steps, cut by a last token,
    # memory and arrivals) give the same run as one event per step.
    trace = KitTrace(DECODE_RUN_TRACE, shared_blocks=12)
    for preset in ("vllm", "penelope"):
        c = vllm_cfg(preset, gpu_cache=9000, sessions=3,
                     vllm_async=True).with_fields(debug_cache=False)
        assert_decode_runs_are_steps(monkeypatch, c, trace, (
            "hit_gpu_tokens", "recomputed_tokens", "retractions", "decoded_tokens",
            "ideal_hit_tokens", "preempted_recompute_tokens"))


def test_vllm_async_option_and_sweep_key(tmp_path) -> None:
    import yaml

    assert RunConfig.from_dict(yaml.safe_load("engine: vllm\nvllm_async: off")).engine.vllm_async \
        is False
    with pytest.raises(ConfigError, match="vllm_async"):
        RunConfig.from_dict({"engine": "vllm", "vllm_async": "sometimes"})
    args = ["run", "--trace", "synthetic:claude-code?sessions=3", "--engine", "vllm",
            "--preset", "vllm", "--sessions", "2", "--max-context", "32k", "--json"]
    for flag, want in (("off", False), ("on", True)):
        res = CliRunner().invoke(cli, [*args, "--vllm-async", flag])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["runs"][0]["summary"]["vllm_async"] is want
    res = CliRunner().invoke(cli, [*args, "--vllm-async", "maybe"])
    assert res.exit_code == 2


def test_sweep_point_ids_move_only_for_async_vllm_points() -> None:
    # Sweeps resume by point id: sglang points and sync vLLM points (byte-identical to the
    # engine before async scheduling) keep the ids they had; async vLLM points get new ones.
    import hashlib

    from sim.sweep import point_id

    def old_id(c: RunConfig) -> str:
        d = c.to_dict()
        # fields added since (at their defaults: left out of ids, sim/sweep/identity.py)
        for k in ("extra", "context", "replicas", "router", "router_params", "vllm_async",
                  "vllm_patch", "pool", "pool_bandwidth", "pool_latency_us", "pool_write",
                  "pool_watermark", "pool_evict_fraction", "max_concurrency", "gpu", "tp",
                  "mem_fraction", "gpu_cache_bytes", "trace_seed", "repeats", "slo",
                  "vllm_version", "vllm_cache_aware_window", "vllm_cache_aware_threshold",
                  "kv_dtype", "hybrid_swa_memory"):
            d.pop(k, None)
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]

    sglang = RunConfig().with_preset("sglang")
    sync = RunConfig.from_flat(engine="vllm", vllm_async=False).with_preset("vllm")
    asy = RunConfig.from_flat(engine="vllm").with_preset("vllm")
    assert point_id(sglang) == old_id(sglang) and point_id(sync) == old_id(sync)
    assert point_id(asy) != old_id(asy)
