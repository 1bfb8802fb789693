"""Recomputation is priced as the prefill prices it: with the keys each token attends.

A recomputed range is part of what the request computes, so under every context strategy,
engine and policy a request's ``recompute_units`` never exceed its ``prefill_units`` (under
``drop``/``budget`` a token does not attend the keys its history dropped; pricing the
recomputed part with every key made it up to 1.67x the prefill)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sim.config import RunConfig
from sim.run import run

STRATEGIES = ["full", "trim:4", "summarize:32k:1024", "drop:4", "drop:4+repos", "splice:4",
              "budget:16k", "full@vllm"]


def _run_context(context: str, seed: int, cache: int, preset: str, sessions: int):
    engine = "sglang"
    if context.endswith("@vllm"):
        context, engine = context.removesuffix("@vllm"), "vllm"
        preset = "vllm" if preset == "sglang" else preset
    cfg = RunConfig.from_flat(trace=f"synthetic:claude-code?sessions=6&seed={seed}",
                              max_context=65536,
                              gaps="tool", gpu_cache=cache, sessions=sessions, model="qwen3-8b",
                              profile="derived-h100-qwen3-8b", context=context, engine=engine,
                              scheduler="fcfs").with_policy(preset)
    return run(cfg).requests


@pytest.mark.parametrize("context", STRATEGIES)
@settings(max_examples=4, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 3), cache=st.sampled_from([32768, 65536, 98304]),
       preset=st.sampled_from(["sglang", "penelope"]), sessions=st.integers(2, 4))
@example(seed=0, cache=98304, preset="penelope", sessions=3)  # drop:4 priced 1.2x before
@example(seed=0, cache=32768, preset="penelope", sessions=3)  # budget:16k likewise
def test_recompute_units_never_exceed_prefill_units(context, seed, cache, preset,
                                                    sessions) -> None:
    df = _run_context(context, seed, cache, preset, sessions)
    ok = df[~df.dropped.astype(bool)]
    assert len(ok)
    over = ok[ok.recompute_units > ok.prefill_units * (1 + 1e-12)]
    assert over.empty, over[["request", "kind", "recompute_units", "prefill_units"]]
    assert (ok.recompute_units >= 0).all()


@given(a=st.integers(0, 100_000), n=st.integers(0, 100_000))
@settings(max_examples=60, deadline=None)
def test_one_recompute_price_the_prefill_less_an_empty_batch(a: int, n: int) -> None:
    """``Profile.recompute_seconds``: what policies, the shared pool and Continuum's pins pay
    for recomputing a range: its prefill seconds without the batch's fixed cost, to the bit
    (an empty range costs nothing)."""
    from costmodel.profile import load_profile
    from costmodel.specs import get_spec
    from costmodel.units import Units, range_units

    profile, spec = load_profile("derived-h100-qwen3-8b", "qwen3-8b"), get_spec("qwen3-8b")
    units = range_units(spec, a, a + n)
    assert profile.recompute_seconds(units) == (profile.prefill_seconds(units)
                                                - profile.prefill_seconds(Units()))
    assert profile.recompute_seconds(Units()) == 0.0
