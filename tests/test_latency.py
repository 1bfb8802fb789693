"""TPOT, inter-token latency and token rates (sim/engines/latency.py, sim/engines/recorder.py),
by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import RunConfig
from sim.engines.latency import TokenGaps
from sim.run import run
from tests.enginekit import PROF, KitTrace, lpm_cfg, prefill


def step(batch: int, ctx: int) -> float:
    return PROF.decode_step_seconds(batch, ctx)


# --- the closed form against the expanded gaps ---------------------------------------------
series = st.tuples(st.floats(1e-4, 1.0), st.sampled_from([0.0, 1e-6, 3e-5, 0.01]),
                   st.integers(1, 40), st.integers(1, 5))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(1e-4, 5.0), max_size=30), st.lists(series, max_size=8))
def test_gaps_mean_and_percentiles_equal_numpy_on_the_expansion(singles, runs) -> None:
    g = TokenGaps()
    every = list(singles)
    for x in singles:
        g.add(x)
    for first, inc, terms, weight in runs:
        g.add_series(first, inc, terms, weight)
        every += [first + inc * i for i in range(terms)] * weight
    if not every:
        assert math.isnan(g.mean()) and all(math.isnan(x) for x in g.percentiles((50,)))
        return
    assert g.count == len(every)
    assert g.mean() == pytest.approx(np.mean(every), rel=1e-9)
    want = np.percentile(every, [0, 10, 50, 90, 99, 100])
    assert g.percentiles((0, 10, 50, 90, 99, 100)) == pytest.approx(want, rel=1e-9, abs=1e-12)



@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(1e-4, 5.0), max_size=30), st.lists(series, max_size=8),
       st.sampled_from([1, 2, 4, 7]), st.sampled_from([0, 3, 40, 4096]))
def test_narrowing_and_settling_never_change_a_percentile(singles, runs, every, few) -> None:
    """The bisection narrows the gaps it counts as its bracket shrinks (``_within``) and
    settles the answer from the few left (``_settle``); the values must be those of the
    plain bisection, to the last bit."""
    from sim.engines import latency
    g = TokenGaps()
    for x in singles:
        g.add(x)
    for first, inc, terms, weight in runs:
        g.add_series(first, inc, terms, weight)
    qs = (0, 10, 50, 90, 99, 99.9, 100)
    knobs = (latency._NARROW_EVERY, latency._SETTLE_TERMS)
    try:
        latency._NARROW_EVERY = latency._BISECTIONS + 1  # neither narrows nor settles
        plain = g.percentiles(qs)
        latency._NARROW_EVERY, latency._SETTLE_TERMS = every, few
        fast = g.percentiles(qs)
    finally:
        latency._NARROW_EVERY, latency._SETTLE_TERMS = knobs
    assert fast == plain or (all(map(math.isnan, plain)) and all(map(math.isnan, fast)))

def _least_with_more_than(arrays, j: int) -> float:
    """The reference order statistic: the least float with more than ``j`` gaps at most it,
    by halving the value between the smallest and the largest gap until the two are adjacent
    floats (no narrowing, no listing, no bit patterns)."""
    from sim.engines import latency
    single, first, inc, terms, _weight = arrays
    lows = [float(single[0])] if single.size else []
    tops = [float(single[-1])] if single.size else []
    if first.size:
        lows.append(float(first.min()))
        tops.append(float((first + inc * (terms - 1)).max()))
    lo, hi = min(lows), max(tops)
    if latency._count_at_most(arrays, lo) > j:
        return float(lo)
    while True:
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            return float(hi)
        if latency._count_at_most(arrays, mid) > j:
            hi = mid
        else:
            lo = mid


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(1e-4, 5.0), max_size=30), st.lists(series, max_size=8),
       st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4))
def test_order_statistics_equal_a_plain_halving_of_the_value(singles, runs, where) -> None:
    """Whatever the search (bit-pattern midpoints, narrowing, settling), an order statistic
    is the least float with more than ``j`` gaps at most it: a halving of the value finds
    the same float."""
    from sim.engines import latency
    g = TokenGaps()
    for x in singles:
        g.add(x)
    for first, inc, terms, weight in runs:
        g.add_series(first, inc, terms, weight)
    if not g.count:
        return
    arrays = g._arrays()
    for w in where:
        j = min(g.count - 1, int(w * g.count))
        assert latency._order_statistic(arrays, j) == _least_with_more_than(arrays, j)


def test_extend_joins_two_runs_of_gaps() -> None:
    a, b = TokenGaps(), TokenGaps()
    a.add(0.5)
    b.add_series(0.01, 0.001, 3, 2)
    a.extend(b)
    assert a.count == 7
    assert a.percentiles((100,)) == pytest.approx([0.5])
    assert a.mean() == pytest.approx((0.5 + 2 * (0.01 + 0.011 + 0.012)) / 7)


# --- one request alone, by hand --------------------------------------------------------------
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_one_request_tpot_and_itl_by_hand(engine: str) -> None:
    kw = (dict(engine=engine, preset="vllm", vllm_async=False, scheduler="fcfs")
          if engine == "vllm" else {})
    res = run(lpm_cfg(**kw), KitTrace([[(4000, 6, 0.0)]]))
    row, s = res.requests.iloc[0], res.summary
    # five gaps after the first token: decode steps of one sequence reading 4000..4004 keys
    gaps = [step(1, 4000 + i) for i in range(5)]
    assert row.ttft_s == pytest.approx(prefill((0, 4000)), rel=1e-12)
    assert row.tpot_s == pytest.approx(sum(gaps) / 5, rel=1e-12)
    assert row.itl_max_s == pytest.approx(gaps[-1], rel=1e-12)
    assert s["tpot_mean_s"] == pytest.approx(sum(gaps) / 5, rel=1e-12)
    assert s["itl_mean_s"] == pytest.approx(np.mean(gaps), rel=1e-12)
    assert [s["itl_p50_s"], s["itl_p90_s"], s["itl_p99_s"]] == pytest.approx(
        np.percentile(gaps, [50, 90, 99]), rel=1e-12)
    end = prefill((0, 4000)) + sum(gaps)
    assert s["e2e_mean_s"] == pytest.approx(end, rel=1e-12)
    assert s["output_tokens"] == 6
    assert s["output_tokens_per_s"] == pytest.approx(6 / end, rel=1e-12)
    assert s["total_tokens_per_s"] == pytest.approx(4006 / end, rel=1e-12)


def test_a_one_token_reply_has_no_tpot() -> None:
    res = run(lpm_cfg(), KitTrace([[(4000, 1, 0.0)]]))
    assert math.isnan(res.requests.iloc[0].tpot_s)
    assert math.isnan(res.summary["tpot_mean_s"]) and math.isnan(res.summary["itl_p50_s"])


def test_a_prefill_between_two_tokens_is_one_long_gap() -> None:
    """Session B arrives while A decodes: A's run is cut after the step in flight, B's
    prefill runs (SGLang: prefill pre-empts decode), then both decode together. A's gap
    across B's prefill is that prefill plus the first two-sequence step."""
    ta = prefill((0, 4000))
    trace = KitTrace([[(4000, 11, 0.0)], [(2000, 3, ta + 2.5 * step(1, 4000))]])
    res = run(lpm_cfg(replay="open"), trace)  # B is sent at its recorded time
    a = res.requests[res.requests.session == "s0"].iloc[0]
    # A: 3 steps (the third in flight at B's arrival), B's prefill, then batch 2
    a_gaps = [step(1, 4000 + i) for i in range(3)]
    t_b = ta + sum(a_gaps) + prefill((0, 2000))
    both = [step(2, (4003) + 2000 + 2 * i) for i in range(2)]  # B's 2 more tokens
    a_gaps += [prefill((0, 2000)) + both[0], both[1]]
    a_gaps += [step(1, 4005 + i) for i in range(5)]  # B done: A alone to its 11th token
    b = res.requests[res.requests.session == "s1"].iloc[0]
    assert b.first_token_s == pytest.approx(t_b, rel=1e-12)
    assert a.itl_max_s == pytest.approx(prefill((0, 2000)) + both[0], rel=1e-12)
    assert a.tpot_s == pytest.approx(sum(a_gaps) / 10, rel=1e-12)
    every = a_gaps + both
    assert res.summary["itl_mean_s"] == pytest.approx(np.mean(every), rel=1e-12)
    assert res.summary["itl_p99_s"] == pytest.approx(np.percentile(every, 99), rel=1e-12)


# --- every engine mode: the gaps add up to each request's decode time ---------------------
@pytest.mark.parametrize("kw", [
    dict(), dict(engine="vllm", preset="vllm", scheduler="fcfs"),
    dict(engine="vllm", preset="vllm", scheduler="fcfs",
                                                     vllm_async=False),
    dict(replicas=2, router="least-load"), dict(gpu_cache=98304, preset="sglang", sessions=6)])
def test_gap_count_and_sum_match_every_request(kw) -> None:
    base = dict(trace="synthetic:claude-code?sessions=6", max_context=65536, gaps="tool",
                sessions=3, debug_cache=False)
    res = run(lpm_cfg(**{**base, **kw}))
    t = res.requests[~res.requests.dropped.astype(bool)]
    s = res.summary
    n = int(t.decoded_tokens.sum())
    total = float((t.tpot_s.fillna(0) * t.decoded_tokens).sum())
    assert n > 0
    assert s["itl_mean_s"] == pytest.approx(total / n, rel=1e-9)
    assert (t.itl_max_s.fillna(0) >= t.tpot_s.fillna(0) * (1 - 1e-12)).all()


# --- goodput against SLOs, by hand -------------------------------------------------------
def test_goodput_counts_requests_and_sessions_within_every_threshold() -> None:
    from sim.slo import parse_slo

    # s0: one request (4000 in, 6 out); s1: two turns 2000 -> 3000 (out 3, then 1). Both
    # first prompts share one prefill batch, so requests 0 and 1 have the same TTFT; the
    # second turn reuses s1's history (a short TTFT, one token: no TPOT).
    trace = KitTrace([[(4000, 6, 0.0)], [(2000, 3, 0.0), (3000, 1, 0.0)]])
    both = prefill((0, 4000), (0, 2000))
    res = run(lpm_cfg(slo=f"ttft={both * 1.0001}s,tpot=10ms"), trace)
    t, s = res.requests.set_index("request"), res.summary
    assert t.ttft_s[0] == pytest.approx(both, rel=1e-12) == t.ttft_s[1]
    # request 0 decodes 2 steps beside request 1, then 3 alone: its TPOT is above 10 ms
    # (each step reads its 4000+ keys); request 1's two steps are below it
    assert t.tpot_s[0] > 0.010 > t.tpot_s[1] and math.isnan(t.tpot_s[2])
    assert s["slo_requests_met"] == 2 and s["slo_attainment"] == pytest.approx(2 / 3)
    assert s["goodput_rps"] == pytest.approx(2 / s["sim_end_s"], rel=1e-12)
    assert s["goodput_rps_per_gpu"] == pytest.approx(s["goodput_rps"] / s["gpus"])
    assert s["slo_sessions_met"] == 1  # s1; s0's only request missed
    assert s["goodput_sessions_per_h"] == pytest.approx(3600 / s["sim_end_s"], rel=1e-12)
    assert s["slo_met"] is False  # 2/3 < the default attainment 0.9
    assert run(lpm_cfg(slo=f"ttft={both * 1.0001}s,tpot=10ms,attain=0.6"), trace
               ).summary["slo_met"] is True
    tight = run(lpm_cfg(slo=f"ttft={both * 0.9999}s"), trace).summary
    assert tight["slo_requests_met"] == 1 and tight["slo_sessions_met"] == 0
    # a run-level percentile target reads the summary's field
    p90 = s["ttft_p90_s"]
    assert run(lpm_cfg(slo=f"ttft_p90={p90 * 1.001}s"), trace).summary["slo_met"] is True
    assert run(lpm_cfg(slo=f"ttft_p90={p90 * 0.999}s"), trace).summary["slo_met"] is False
    assert parse_slo("ttft=2s,tpot=50ms").thresholds == {"ttft": 2.0, "tpot": 0.05}


@pytest.mark.parametrize("bad", ["ttft", "ttft=fast", "ttft_p95=1s", "speed=1s", "attain=2",
                                 "ttft_p90=1s,attain=0.9"])
def test_bad_slo_is_refused_naming_the_field(bad: str) -> None:
    from sim.config import ConfigError

    with pytest.raises(ConfigError, match="'slo'"):
        RunConfig.from_flat(slo=bad).validate()


def test_a_run_that_drops_requests_does_not_meet_the_slo() -> None:
    # a 10,000-token prompt cannot fit a 4,096-token cache: dropped; the other one is served
    trace = KitTrace([[(10_000, 2, 0.0)], [(1000, 2, 0.0)]])
    s = run(lpm_cfg(gpu_cache=4096, max_new_tokens=8, slo="ttft_p90=100s"), trace).summary
    assert s["dropped_requests"] == 1 and s["ttft_p90_s"] < 100
    assert s["slo_met"] is False
