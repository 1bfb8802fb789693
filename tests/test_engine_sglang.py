"""The SGLang engine's fidelity to SGLang 0.5.23 (reference/sglang-scheduler.md,
reference/sglang-radix.md's last section): one test per behaviour, on tiny hand-built traces
with expectations computed by hand from the cost model and SGLang's admission arithmetic
(blocks of 64 tokens, the decode reservation min(max_new - output, 4096) x new_token_ratio
for running requests, full for the candidate, plus one page).
"""

from __future__ import annotations

import pytest

from sim.config import RunConfig
from sim.engines import StepObserver
from sim.run import run
from tests.enginekit import PROF, KitTrace, prefill, row

BS = 64


def sglang_cfg(preset: str = "sglang", **kw) -> RunConfig:
    base = dict(gpu_cache=1 << 20, sessions=4, debug_cache=True, profile=PROF.name)
    base.update(kw)
    return RunConfig.from_flat(**base).with_preset(preset)


def test_default_scheduler_is_fcfs() -> None:
    # SGLang 0.5.23's schedule_policy default (and vLLM's only order); the paper's runs and
    # kvsim reproduce use lpm explicitly.
    assert RunConfig().policy.scheduler == "fcfs"


def test_batch_is_full_holds_admission_until_the_running_batch_shrinks() -> None:
    # 16K-token cache, max_new_tokens 4096 (every reservation is the 4096 clip).
    # Pass 1: A (4000 tokens: needs 4000 + 4096 + 64) and B1 (50) are admitted; C1 (50:
    # needs 4210) no longer fits the headroom 16384 - 4032 - 64 - 2 x (64 + 4096) = 3968:
    # refused, batch_is_full. B1 finishes in that prefill (the batch shrinks: cleared), so
    # C1 is admitted in pass 2, alone. Then A decodes (3000 output tokens).
    # B2 (6000 tokens) arrives 0.05 s after B1's reply: it needs 6000 + 4096 + 64 = 10160
    # but the headroom is 16384 - (4000 + g) - (4096 - g) x ratio, ratio ~0.69 after g ~ 6
    # decode steps: about 9560. Refused while A runs: batch_is_full. When C2 arrives (6 s
    # after C1's reply) the ratio has decayed to its floor and B2 would fit (about 11200), but
    # SGLang tries no admission until the running batch shrinks: B2 and C2 are admitted
    # together when A finishes.
    trace = KitTrace([[(4000, 3000, 0.0)], [(50, 1, 0.0), (6000, 1, 0.05)],
                      [(50, 1, 0.0), (100, 1, 6.0)]])
    res = run(sglang_cfg(gpu_cache=16384, sessions=3, max_new_tokens=4096), trace)
    a, b2, c1, c2 = (row(res, "s0", 0), row(res, "s1", 1), row(res, "s2", 0),
                     row(res, "s2", 1))
    t1 = prefill((0, 4000), (0, 50))
    assert a.ttft_s == pytest.approx(t1, rel=1e-12)
    assert c1.admit_s == pytest.approx(t1)
    t2 = t1 + prefill((0, 50))
    assert c1.ttft_s == pytest.approx(t2, rel=1e-12)
    a_end = t2 + PROF.decode_run_seconds(1, 4000, 2999)
    assert a.end_s == pytest.approx(a_end, rel=1e-9)
    assert b2.send_s < c2.send_s < a_end
    assert b2.admit_s == pytest.approx(a_end) and c2.admit_s == pytest.approx(a_end)
    both = prefill((0, 6000), (0, 100))
    assert b2.ttft_s == pytest.approx(a_end + both - b2.send_s, rel=1e-9)
    assert c2.ttft_s == pytest.approx(a_end + both - c2.send_s, rel=1e-9)


def test_chunk_continuation_shrinks_to_the_headroom() -> None:
    # 400 blocks (25600 tokens), max_new_tokens 4096, new_token_ratio 4.0 (SGLang's
    # SGLANG_INIT_NEW_TOKEN_RATIO: above 1, a running request reserves more than it was
    # charged when admitted, so the headroom can shrink between two chunk passes). Pass 1:
    # B (100 tokens) is charged 128 + 64 + 4096 and A (16000 tokens) takes the rest of the
    # chunk budget, 8192 - 128 = 8064. Pass 2: B runs, reserving (4096 - 1) x 4.0 = 16380
    # tokens; free = 400 - 2 (B) - 126 (A) = 272 blocks = 17408 tokens, so the headroom is
    # 1028 and the continuation is min(8192, 1028): 8064..9092. Pass 3 has no headroom left
    # (A holds 143 blocks: 255 free = 16320 - 16380 < 0): then the chunk is the full budget,
    # here the last 6908 tokens.
    class Chunks(StepObserver):
        def __init__(self) -> None:
            self.of_a: list[list[tuple[int, int]]] = []

        def scheduled(self, engine, batch) -> None:
            self.of_a += [ranges for req, ranges in batch if req.session == 1]

    chunks = Chunks()
    res = run(sglang_cfg(gpu_cache=400 * BS, sessions=2, max_new_tokens=4096, new_token_ratio=4.0),
              KitTrace([[(100, 200, 0.0)], [(16000, 1, 0.0)]]), steps=chunks)
    assert chunks.of_a == [[(0, 8064)], [(8064, 9092)], [(9092, 16000)]]
    a = row(res, "s1", 0)
    want = prefill((0, 100), (0, 8064)) + prefill((8064, 9092)) + prefill((9092, 16000))
    assert a.ttft_s == pytest.approx(want, rel=1e-12)
    assert res.summary["prefill_batches"] == 3


def test_final_chunk_reserves_its_decode_tokens() -> None:
    # 32K cache, max_new_tokens 4096. A (12000 tokens, 100 output) is chunked: 8192, then
    # 3808 in pass 2, which also looks at B (14000 tokens, waiting since t = 0). A's final
    # chunk charges one page and its decode reservation (64 + 4096) to the pass: B needs
    # 14000 + 4096 + 64 = 18160, the headroom is 512 blocks - A's 188 = 20736 tokens - 4160
    # = 16576: refused, batch_is_full (without the charge B would fit). B is admitted when
    # A finishes.
    trace = KitTrace([[(12000, 100, 0.0)], [(14000, 1, 0.0)]])
    res = run(sglang_cfg(gpu_cache=32768, sessions=2, max_new_tokens=4096), trace)
    a, b = row(res, "s0", 0), row(res, "s1", 0)
    a_ttft = prefill((0, 8192)) + prefill((8192, 12000))
    assert a.ttft_s == pytest.approx(a_ttft, rel=1e-12)
    a_end = a_ttft + PROF.decode_run_seconds(1, 12000, 99)
    assert a.end_s == pytest.approx(a_end, rel=1e-9)
    assert b.admit_s == pytest.approx(a_end)


def test_retraction_evicts_twenty_tokens_per_remaining_request() -> None:
    # Eight requests of 1000 tokens (15 cached blocks + 40 own tokens each) fill a cache of
    # 8 x 16 + 8 = 136 blocks; max_new_tokens 1 makes admission optimistic. They decode 88
    # steps together (the 8 free blocks: one each at step 25, when 64 - 40 + 1 own slots are
    # used) until every one holds 2 full own blocks and none is free. Then SGLang retracts
    # one: all tie on outputs and prompt, so the LAST in the running batch (session s7). Its
    # 2 own blocks are freed and its 15 prompt blocks unlocked; release_req then evicts until
    # 20 x 7 = 140 tokens (3 blocks) are free: 1 block is missing, and whole-node eviction
    # (sglang) frees its 15-block prompt node: 17 blocks free before the survivors go on.
    seen: list[tuple[list[str], int]] = []

    class Retractions(StepObserver):
        def retracted(self, engine, victims) -> None:
            seen.append(([f"s{r.session}" for r in victims], engine.cache.free_blocks))

    trace = KitTrace([[(1000, 200, 0.0)] for _ in range(8)])
    res = run(sglang_cfg(gpu_cache=136 * BS, sessions=8, max_new_tokens=1), trace,
              steps=Retractions())
    assert res.summary["prefill_batches"] >= 1
    first_ttft = prefill(*[(0, 1000)] * 8)
    assert res.requests.ttft_s.tolist() == pytest.approx([first_ttft] * 8, rel=1e-12)
    assert seen[0] == (["s7"], 17)


@pytest.mark.parametrize("scheduler", ["lpm", "fcfs"])
def test_in_batch_prefix_caching_defers_requests_sharing_an_uncached_prefix(
        scheduler: str) -> None:
    # Nothing cached. A and B (4000 tokens) share their first 50 blocks; D (4192 tokens)
    # shares nothing; they arrive together in the order A, B, D. lpm sees no cached prefix
    # anywhere, but B shares an uncached prefix with A, which is ahead of it: B goes to the
    # back (SGLang's in-batch prefix caching). Pass 1 = A + D's first 4160 tokens (the chunk
    # budget charges A's page-ceiled 4032); pass 2 = D's last 32 tokens and B, which now hits
    # A's 50 blocks. fcfs has no such check: A + B (hit 0, 4032 charged each) + D's first
    # 128 tokens in pass 1.
    trace = KitTrace([[(4000, 1, 0.0)], [(4000, 1, 0.0)], [(4192, 1, 0.0)]],
                     shared_blocks=[50, 50, 0])
    res = run(sglang_cfg(sessions=3, scheduler=scheduler), trace)
    a, b, d = row(res, "s0", 0), row(res, "s1", 0), row(res, "s2", 0)
    if scheduler == "lpm":
        p1 = prefill((0, 4000), (0, 4160))
        p2 = prefill((4160, 4192), (50 * BS, 4000))
        assert a.ttft_s == pytest.approx(p1, rel=1e-12)
        assert d.ttft_s == pytest.approx(p1 + p2, rel=1e-12)
        assert b.hit_gpu_tokens == 50 * BS
        assert b.ttft_s == pytest.approx(p1 + p2, rel=1e-12)
    else:
        p1 = prefill((0, 4000), (0, 4000), (0, 128))
        assert b.hit_gpu_tokens == 0
        assert b.ttft_s == pytest.approx(p1, rel=1e-12)


def test_lpm_matches_the_queue_before_the_chunk_continues() -> None:
    # 360 blocks. Pass 1 caches X1's and Y1's 46 blocks (X's first: X is older). A2 (20000
    # tokens, max_new_tokens 64) is chunked 8192 / 8192 / 3616; X2 (3500 tokens, extends X1)
    # arrives during A2's first chunk and waits. SGLang's calc_priority runs before each
    # chunk continues, so lpm matches X2 (stamping X's blocks) in every chunk pass: when A2's
    # last chunk needs 45 more blocks, Y's history is the least recently used and goes, and
    # X2 later hits all of X's 46 blocks. (Matching only after the chunk would evict X.)
    g = 1.0
    trace = KitTrace([[(3000, 1, 0.0), (3500, 1, g + 0.1)], [(3000, 1, 0.0)],
                      [(50, 1, 0.0), (20000, 1, g)]])
    res = run(sglang_cfg(gpu_cache=360 * BS, sessions=3, scheduler="lpm", max_new_tokens=64), trace)
    p1 = prefill((0, 3000), (0, 3000), (0, 50))
    chunks = prefill((0, 8192)) + prefill((8192, 16384)) + prefill((16384, 20000))
    a2, x2 = row(res, "s2", 1), row(res, "s0", 1)
    assert a2.ttft_s == pytest.approx(chunks, rel=1e-12)
    assert p1 + g < x2.send_s < p1 + g + prefill((0, 8192))
    assert x2.hit_gpu_tokens == 46 * BS
    a2_end = p1 + g + chunks
    assert x2.ttft_s == pytest.approx(a2_end + prefill((46 * BS, 3500)) - x2.send_s,
                                      rel=1e-9)


def test_the_decode_step_that_retracts_does_not_decay_the_ratio() -> None:
    # SGLang's update_running_batch either retracts (and SETS new_token_ratio) or decays it,
    # once per decode iteration: the iteration that retracted runs its decode step without a
    # decay, so a run of k steps that starts with a retraction decays k - 1 times.
    seen: list[list[float]] = []

    class Ratio(StepObserver):
        def retracted(self, engine, victims) -> None:
            seen.append([engine.ratio])

        def decoded(self, engine, steps) -> None:
            if seen and len(seen[-1]) == 1:
                seen[-1] += [steps, engine.ratio]

    trace = KitTrace([[(1000, 200, 0.0)] for _ in range(8)])
    c = sglang_cfg(gpu_cache=136 * BS, sessions=8, max_new_tokens=1)
    run(c, trace, steps=Ratio())
    k = c.engine
    decay = (k.new_token_ratio - k.new_token_ratio_min) / k.new_token_ratio_decay_steps
    assert seen and all(len(x) == 3 for x in seen)
    for after, steps, ratio in seen:
        want = after if steps == 1 else max(after - (steps - 1) * decay,
                                            c.engine.new_token_ratio_min)
        assert ratio == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_a_pass_matches_every_candidate_before_it_allocates() -> None:
    # 182 blocks, max_new_tokens 64. Pass 1 (A1 50, X1 3000, Y1 3000 tokens, one output each)
    # leaves X's and Y's 46-block histories cached, X's the least recently used (X1 finishes
    # before Y1). A2 (7000 new tokens) and X2 (3200 tokens: X1 + 200) arrive together, A2
    # first. SGLang's adder matches and locks both, then allocates the batch: A2 needs 110
    # blocks, X2 4; 90 are free, so 24 are evicted from Y's history, the only unlocked one,
    # and X2 hits all 46 blocks. Allocating A2 before matching X2 evicted X's history (the
    # least recent) and X2 hit nothing.
    g = 1.0
    trace = KitTrace([[(50, 1, 0.0), (7000, 1, g)], [(3000, 1, 0.0), (3200, 1, g)],
                      [(3000, 1, 0.0)]])
    res = run(sglang_cfg(gpu_cache=182 * BS, sessions=3, max_new_tokens=64), trace)
    a2, x2 = row(res, "s0", 1), row(res, "s1", 1)
    p1 = prefill((0, 50), (0, 3000), (0, 3000))
    assert a2.send_s == pytest.approx(p1 + g) and x2.send_s == pytest.approx(p1 + g)
    assert x2.hit_gpu_tokens == 46 * BS
    both = prefill((0, 7000), (46 * BS, 3200))
    assert a2.ttft_s == pytest.approx(both, rel=1e-12)
    assert x2.ttft_s == pytest.approx(both, rel=1e-12)


def test_a_retracted_request_re_prefills_every_output_token_and_samples() -> None:
    # The retraction of test_retraction_evicts_twenty_tokens_per_remaining_request: SGLang
    # re-prefills the victim's prompt AND all g outputs it kept (fill_ids = origin_input_ids +
    # output_ids: KV for 1000 + g tokens) and the prefill samples output g + 1.
    seen: list[tuple[int, int, int]] = []

    class Reprefills(StepObserver):
        def __init__(self) -> None:
            self.pending: dict[int, tuple[int, int]] = {}  # rid -> (generated, end)

        def scheduled(self, engine, batch) -> None:
            for req, ranges in batch:
                if req.record is not None and req.record.retractions and not req.ranges:
                    self.pending[req.rid] = (req.generated, ranges[-1][1])

        def completed(self, engine, batch) -> None:
            for req, _ranges in batch:
                if req.rid in self.pending:
                    generated, end = self.pending.pop(req.rid)
                    seen.append((generated, end, req.generated - generated))

    trace = KitTrace([[(1000, 200, 0.0)] for _ in range(8)])
    res = run(sglang_cfg(gpu_cache=136 * BS, sessions=8, max_new_tokens=1), trace,
              steps=Reprefills())
    assert res.summary["retractions"] >= 1 and seen
    for generated, end, sampled in seen:
        assert generated > 0
        assert end == 1000 + generated  # prompt + every output token so far
        assert sampled == 1


def test_a_context_strategy_record_sees_the_whole_plan() -> None:
    # Under a context strategy the record prices what the request's plan recomputes inside
    # its ideal prefix (RunRecorder.open reads the plan). Opened after the pass took its
    # tokens, a chunked request's record saw only the chunks left: with nothing dropped,
    # everything between the hit and the ideal prefix is recomputed.
    base = dict(trace="synthetic:claude-code?sessions=6&max_requests=12&seed=3", gaps="tool",
                max_context=65536, gpu_cache=32 * 1024, sessions=4, profile=PROF.name,
                debug_cache=True)
    df = run(RunConfig.from_flat(**base, context="drop:2").with_preset("sglang")).requests
    kept = df[~df.dropped & (df.dropped_tokens == 0)]
    assert (kept.ideal_hit_tokens - kept.hit_gpu_tokens > 8192).sum() >= 5  # chunked misses
    assert (kept.recomputed_tokens == kept.ideal_hit_tokens - kept.hit_gpu_tokens).all()
