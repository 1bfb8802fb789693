"""The server is never idle while a waiting request could be admitted, under every engine,
eviction policy (the presets and the zoo) and context strategy.

With nothing running, memory is freed only by a finish: a waiting request either fits now
(it must be admitted) or never (it must be dropped). Debug runs (``debug_cache``) check it
every time the server process sleeps (``EngineBase._sleep``); a run that left a request
waiting with no event left would also end in SimPy's "No scheduled events left" error.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from policies import PRESETS
from policies.registry import POLICIES
from sim.config import ConfigError, RunConfig
from sim.run import check, run

POLICY_NAMES = sorted({*PRESETS, *POLICIES})
CONTEXTS = ["full", "trim:2", "summarize:12k:2k", "drop:2", "drop:2+repos", "splice:2",
            "budget:8k", "budget:16k"]


def idle_run(engine: str, policy: str, context: str, seed: int, cache_k: int,
             concurrency: int, max_new: int | None):
    cfg = RunConfig.from_flat(trace=f"synthetic:claude-code?sessions=6&max_requests=10&seed={seed}",
                              gaps="tool", max_context=65536, engine=engine, context=context,
                              profile="derived-h100-qwen3-8b", gpu_cache=cache_k * 1024,
                              sessions=concurrency, max_new_tokens=max_new, debug_cache=True,
                              ).with_policy(policy)
    try:
        check(cfg)
    except ConfigError:
        return None  # a combination the engine refuses (one line, exit 2, before any work)
    return run(cfg)


def test_the_issue_run_drops_what_never_fits_at_submit_and_finishes() -> None:
    # The run of the report: with the budget strategy on a 24K cache a queue head that could
    # never fit (its plan restores dropped keys) was dropped by the pass, which then stopped
    # and slept with the requests behind it waiting: SimPy's "No scheduled events left".
    cfg = RunConfig.from_flat(trace="synthetic:claude-code?sessions=12&max_requests=30&seed=5",
                              gaps="tool", max_context=65536, profile="derived-h100-qwen3-8b",
                              gpu_cache=24 * 1024, sessions=8, context="budget:16k",
                              debug_cache=True).with_preset("penelope")
    df = run(cfg).requests
    dropped = df[df.dropped]
    assert 0 < len(dropped) < len(df)
    # Dropped at submit (the empty-cache plan, restores included): never admitted, never
    # holding the queue.
    assert dropped.admit_s.isna().all()
    assert np.array_equal(dropped.end_s.to_numpy(), dropped.send_s.to_numpy())
    served = df[~df.dropped]
    assert served.first_token_s.notna().all() and served.end_s.notna().all()


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(engine=st.sampled_from(["sglang", "vllm"]), policy=st.sampled_from(POLICY_NAMES),
       context=st.sampled_from(CONTEXTS), seed=st.integers(0, 50),
       cache_k=st.sampled_from([12, 24, 48, 96]), concurrency=st.sampled_from([1, 3, 8]),
       max_new=st.sampled_from([None, 256]))
# A queue head whose plan restores dropped keys and never fits, with requests behind it.
@example(engine="sglang", policy="penelope", context="budget:8k", seed=7, cache_k=24,
         concurrency=8, max_new=None)
def test_never_idle_with_work_queued(engine, policy, context, seed, cache_k, concurrency,
                                     max_new) -> None:
    res = idle_run(engine, policy, context, seed, cache_k, concurrency, max_new)
    if res is None:
        return
    df = res.requests
    # Every request ended: served (first token and end) or dropped at once.
    served = df[~df.dropped]
    assert served.first_token_s.notna().all() and served.end_s.notna().all()
    assert (df[df.dropped].end_s >= df[df.dropped].send_s).all()
