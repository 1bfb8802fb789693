"""The SGLang engine's fidelity to SGLang 0.5.23 (reference/sglang-scheduler.md,
reference/sglang-radix.md's last section): one test per behaviour, on tiny hand-built traces
with expectations computed by hand from the cost model and SGLang's admission arithmetic
(blocks of 64 tokens, the decode reservation min(max_new - output, 4096) x new_token_ratio
for running requests, full for the candidate, plus one page).
"""

from __future__ import annotations

import pytest

from costmodel.profile import load_profile
from costmodel.specs import get_spec
from costmodel.units import ranges_units
from sim.config import RunConfig
from sim.runner import run
from tests.enginekit import KitTrace

SPEC = get_spec("qwen3-8b")
PROF = load_profile("derived-h100-qwen3-8b")
BS = 64


def cfg(preset: str = "sglang", **kw) -> RunConfig:
    base = dict(gpu_cache=1 << 20, sessions=4, debug_cache=True, profile=PROF.name)
    base.update(kw)
    return RunConfig(**base).with_preset(preset)


def prefill(*ranges: tuple[int, int]) -> float:
    return PROF.prefill_seconds(ranges_units(SPEC, ranges))


def row(res, session: str, turn: int):
    df = res.requests
    return df[(df.session == session) & (df.turn == turn)].iloc[0]


def test_default_scheduler_is_fcfs() -> None:
    # SGLang 0.5.23's schedule_policy default (and vLLM's only order); the paper's runs and
    # kvsim reproduce use lpm explicitly.
    assert RunConfig().scheduler == "fcfs"


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
    res = run(cfg(gpu_cache=16384, sessions=3, max_new_tokens=4096), trace)
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
