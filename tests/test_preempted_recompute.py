"""Work redone after a preemption (vLLM, recompute) or a retraction (SGLang): positions a
request had computed before it lost them, computed again when it resumes
(``preempted_recompute_tokens`` / ``_units``, per request and per run). Not part of
``recomputed_tokens``, which counts the first admission only."""

from __future__ import annotations

import pytest

from costmodel.profile import load_profile
from costmodel.specs import get_spec
from costmodel.units import range_units
from sim.config import RunConfig
from sim.run import run
from tests.enginekit import KitTrace

SPEC = get_spec("qwen3-8b")
PROF = load_profile("derived-h100-qwen3-8b")
BS = 64


def _row(res, session: str):
    df = res.requests
    return df[df.session == session].iloc[0]


def test_one_vllm_preemption_shows_up() -> None:
    # The scenario of test_engine_vllm.py's preemption test: B (640-token prompt) had 1280
    # tokens with KV when it was preempted; it resumes with a hit of its first 14 blocks and
    # computes positions 896..1281: 896..1280 are redone, 1280 (its last output) is new.
    trace = KitTrace([[(640, 1000, 0.0)], [(640, 1000, 0.0)]])
    c = RunConfig.from_flat(engine="vllm", gpu_cache=40 * BS, sessions=2, debug_cache=True,
                            profile=PROF.name).with_preset("vllm")
    res = run(c, trace)
    a, b = _row(res, "s0"), _row(res, "s1")
    assert b.retractions == 1 and a.retractions == 0
    assert b.preempted_recompute_tokens == 1280 - 14 * BS
    assert b.preempted_recompute_units == pytest.approx(
        range_units(SPEC, 14 * BS, 1280).total, rel=1e-12)
    assert a.preempted_recompute_tokens == 0 and a.preempted_recompute_units == 0
    # invisible to the first-admission metrics
    assert b.recomputed_tokens == 0 and b.hit_gpu_tokens == 0
    s = res.summary
    assert s["preempted_recompute_tokens"] == 1280 - 14 * BS
    assert s["preempted_recompute_units"] == pytest.approx(b.preempted_recompute_units)


def test_one_sglang_retraction_shows_up() -> None:
    # test_engine_sglang.py's retraction scenario: s7 is retracted after 88 decode steps
    # (1000 + 88 tokens with KV); its prompt node is evicted with it, so its re-prefill
    # computes every one of those positions again.
    trace = KitTrace([[(1000, 200, 0.0)] for _ in range(8)])
    c = RunConfig.from_flat(gpu_cache=136 * BS, sessions=8, debug_cache=True, profile=PROF.name,
                            max_new_tokens=1).with_preset("sglang")
    res = run(c, trace)
    s7 = _row(res, "s7")
    assert s7.retractions >= 1
    assert s7.preempted_recompute_tokens == 1088
    assert s7.preempted_recompute_units == pytest.approx(range_units(SPEC, 0, 1088).total,
                                                         rel=1e-12)
    df = res.requests
    assert (df.preempted_recompute_tokens[df.retractions == 0] == 0).all()
    assert res.summary["preempted_recompute_tokens"] == int(df.preempted_recompute_tokens.sum())
