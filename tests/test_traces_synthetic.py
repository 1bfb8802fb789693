"""Synthetic generators: deterministic by seed, parameters, fitted to the real statistics."""

from __future__ import annotations

import numpy as np
import pytest

from traces import OptionError, load_trace

# The real set's statistics (``kvsim trace stats ../shared/data/cc-traces --json``); the
# shared-data test checks these pins against the data whenever it is present.
REAL_CC = {"prompt_median": 107694.0, "requests_per_session_median": 41.0,
           "output_median": 214.0, "tool_gap_median": 9.0, "append_only": 0.93286}


def fitted(s: dict) -> dict:
    return {"prompt_median": s["prompt_tokens"]["median"],
            "requests_per_session_median": s["requests_per_session"]["median"],
            "output_median": s["output_tokens"]["median"],
            "tool_gap_median": s["gap_s"]["tool_median"],
            "append_only": s["append_only_fraction"]}


def within(a: dict, b: dict, tol: float = 0.15) -> dict:
    """The statistics of a that differ from b by more than tol (relative)."""
    return {k: (a[k], b[k]) for k in b if abs(a[k] / b[k] - 1) > tol}


@pytest.mark.parametrize("seed", [0, 1])
def test_claude_code_generator_matches_the_real_set(seed):
    s = load_trace("synthetic:claude-code?sessions=360", seed=seed).stats()
    assert within(fitted(s), REAL_CC) == {}
    assert s["sessions"] == 360 and s["subagent_sessions"] > 0


def test_deterministic_by_seed_and_spec_parameters():
    a = load_trace("synthetic:claude-code?sessions=6", seed=5)
    b = load_trace("synthetic:claude-code?sessions=6&seed=5")
    c = load_trace("synthetic:claude-code?sessions=6", seed=6)
    assert len(a) == len(b) and a.sessions == b.sessions
    for col in ("prompt_tokens", "output_tokens", "gap_s", "gap_kind", "prefix_blocks"):
        assert np.array_equal(getattr(a, col), getattr(b, col))
    assert all(np.array_equal(a.block_ids(r), b.block_ids(r)) for r in range(len(a)))
    assert len(a) != len(c) or not np.array_equal(a.prompt_tokens, c.prompt_tokens)
    m = load_trace("synthetic:claude-code?sessions=6&max_requests=3&subagents=0")
    assert max(s.count for s in m.sessions) <= 3 and all(s.parent < 0 for s in m.sessions)
    for bad in ["synthetic:claude-code?sessions=0", "synthetic:claude-code?sessions=x",
                "synthetic:claude-code?speed=3", "synthetic:gpt"]:
        with pytest.raises(OptionError):
            load_trace(bad)


def test_demo_default_is_small_and_well_formed():
    t = load_trace("synthetic:claude-code")
    top = [s for s in t.sessions if s.parent < 0]
    assert len(top) == 16 and len(t) < 3000
    # ids chained and consistent: each request's prefix_blocks equals the common prefix
    for r in range(1, len(t)):
        if t.session[r] == t.session[r - 1]:
            a, b = t.block_ids(r - 1), t.block_ids(r)
            k = int(t.prefix_blocks[r])
            assert np.array_equal(a[:k], b[:k]) and (k == min(len(a), len(b)) or a[k] != b[k])
    for s in t.sessions:
        if s.parent >= 0:
            assert t.sessions[s.parent].first <= s.after_request < (
                t.sessions[s.parent].first + t.sessions[s.parent].count)
    sp = load_trace("synthetic:claude-code", shared_prefix="auto")
    assert all(s.shared_prefix_blocks > 0 for s in sp.sessions if s.parent < 0)


@pytest.mark.parametrize("name", ["codex", "chat"])
def test_other_generators(name):
    s = load_trace(f"synthetic:{name}?sessions=40", seed=2).stats()
    assert s["sessions"] == 40 and s["requests"] > 40
    if name == "chat":
        assert s["gap_s"]["tool_fraction"] == 0 and s["append_only_fraction"] == 1.0


@pytest.mark.parametrize("spec,key", [("synthetic:claude-code?sessions=2&sessions=3", "sessions"),
                                      ("synthetic:chat?seed=1&subagents=0&seed=2", "seed")])
def test_a_key_given_twice_is_refused(spec, key):
    """The last would win silently (issue 51, new-user S07): one line naming the key."""
    with pytest.raises(OptionError) as e:
        load_trace(spec)
    assert f"parameter {key!r} is given twice" in str(e.value) and "\n" not in str(e.value)
