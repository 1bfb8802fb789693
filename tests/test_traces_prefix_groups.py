"""``synthetic:prefix-groups``: shared prefixes per group, a ramped Poisson arrival process,
deterministic by seed, compact storage, one-line errors for bad parameters."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from traces import OptionError, load_trace
from traces.prefix_groups import AFTER_REPLY, ramp_arrivals

SPEC = "synthetic:prefix-groups?groups=3&prefix=1000&users=4&question=100&qps=2..8"


def test_prompts_share_their_groups_prefix_and_nothing_else():
    t = load_trace(SPEC + "&turns=3&output=50")
    assert len(t) == 3 * 4 * 3 and len(t.sessions) == 12
    bs = t.block_size
    shared = 1000 // bs  # 15 full blocks; the straddling block is each user's own
    first = [t.block_ids(s.first) for s in t.sessions]
    for i, a in enumerate(first):
        for j, b in enumerate(first[:i]):
            common = int(np.argmax(np.r_[a[:shared + 2] != b[:shared + 2], True]))
            assert common == (shared if i // 4 == j // 4 else 0), (i, j)
    for s in t.sessions:  # turn k = prefix + k * (question + output) + question
        prompts = t.prompt_tokens[s.first:s.first + s.count]
        assert prompts.tolist() == [1100, 1250, 1400]
        for r in range(s.first + 1, s.first + s.count):  # each turn extends the previous one
            prev, cur = t.block_ids(r - 1), t.block_ids(r)
            assert np.array_equal(cur[:prev.shape[0]], prev)
        times = t.send_time_s[s.first:s.first + s.count]
        assert np.all(np.diff(times) >= 0)  # a user's turns are sent in order
    assert np.all(t.output_tokens == 50)


def test_deterministic_by_seed_and_seed_parameter():
    a, b = load_trace(SPEC, seed=4), load_trace(SPEC + "&seed=4")
    c = load_trace(SPEC, seed=5)
    assert np.array_equal(a.send_time_s, b.send_time_s)
    assert all(np.array_equal(a.block_ids(r), b.block_ids(r)) for r in range(len(a)))
    assert not np.array_equal(a.send_time_s, c.send_time_s)


def test_arrivals_ramp_from_a_to_b():
    rng = np.random.default_rng(0)
    n, a, b = 200_000, 2.0, 18.0
    t = ramp_arrivals(rng, n, a, b)
    end = 2 * n / (a + b)
    assert np.all(np.diff(t) >= 0) and t[-1] <= end
    # arrivals per second in the first and last tenth: the rate at 5% and 95% of the ramp
    head = np.count_nonzero(t < end / 10) / (end / 10)
    tail = np.count_nonzero(t > end * 9 / 10) / (end / 10)
    assert head == pytest.approx(a + (b - a) * 0.05, rel=0.03)
    assert tail == pytest.approx(a + (b - a) * 0.95, rel=0.03)
    # a constant rate is the plain case: times uniform over n / a seconds
    flat = ramp_arrivals(np.random.default_rng(1), n, 5.0, 5.0)
    assert flat[-1] <= n / 5.0 and np.mean(flat) == pytest.approx(n / 10.0, rel=0.01)
    # a downward ramp is allowed
    down = ramp_arrivals(np.random.default_rng(2), n, b, a)
    assert np.count_nonzero(down < end / 10) > np.count_nonzero(down > end * 9 / 10)


def test_trace_replays_open_loop_in_time_order():
    t = load_trace("synthetic:prefix-groups?groups=4&users=8&qps=4..4")
    assert len(t) == 32
    assert t.options["duration_s"] == pytest.approx(8.0)
    assert 0 <= t.send_time_s.min() and t.send_time_s.max() <= 8.0
    assert int(t.prompt_tokens[0]) == 2048 + 128  # SGLang's gsp defaults


def test_storage_scales_with_distinct_blocks():
    t = load_trace("synthetic:prefix-groups?groups=2&prefix=6400&users=50&question=64&turns=4")
    # the pool holds each request's new ids only: a turn stores its question and the answer
    # before it, not the 100 prefix blocks and the history again
    assert t._pool.shape[0] < sum(t.block_ids(r).shape[0] for r in range(len(t))) / 3


@pytest.mark.parametrize("bad", [
    "groups=0", "users=x", "question=0", "qps=0..3", "qps=a..b", "qps=1..inf", "turns=0",
    "speed=3", "prefix=-1", "groups=100000&users=1000000"])
def test_bad_parameters_raise_one_line_errors(bad):
    with pytest.raises(OptionError) as e:
        load_trace(f"synthetic:prefix-groups?{bad}")
    assert "\n" not in str(e.value) and "synthetic:prefix-groups" in str(e.value)


def test_cli_names_the_bad_parameter_and_exits_2():
    from sim.cli.main import cli

    res = CliRunner().invoke(cli, ["trace", "stats", "synthetic:prefix-groups?groups=0"])
    assert res.exit_code == 2
    assert "'groups'" in res.output


# --- issue 51: duplicate keys, sizes, inference-perf's shared_prefix as its users run it ------
@pytest.mark.parametrize("spec,needle", [
    ("synthetic:prefix-groups?groups=4&groups=8", "'groups' is given twice"),
    ("synthetic:prefix-groups?groups=4&num_groups=8", "'num_groups' repeats 'groups'"),
    ("synthetic:prefix-groups?mode=chat&enable_multi_turn_chat=false", "repeats 'mode'"),
])
def test_a_key_given_twice_is_refused_in_one_line(spec, needle):
    with pytest.raises(OptionError) as e:
        load_trace(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_sizes_are_written_as_everywhere_else():
    a = load_trace("synthetic:prefix-groups?groups=2&users=2&prefix=2k&question=1e2&output=0.5k")
    b = load_trace("synthetic:prefix-groups?groups=2&users=2&prefix=2048&question=100&output=512")
    assert a.prompt_tokens.tolist() == b.prompt_tokens.tolist()
    assert a.output_tokens.tolist() == b.output_tokens.tolist() == [512] * 4
    with pytest.raises(OptionError, match="parameter 'prefix': expected a size in tokens"):
        load_trace("synthetic:prefix-groups?prefix=2q")


def test_resend_mode_sends_the_same_prompt_again():
    """inference-perf's shared_prefix without enable_multi_turn_chat: each user's prompt (the
    group's system prompt + the user's question) re-sent verbatim; with it, the history grows."""
    spec = "synthetic:prefix-groups?groups=2&users=3&prefix=1000&question=100&turns=3"
    t = load_trace(spec + "&mode=resend")
    for s in t.sessions:
        ids = [t.block_ids(r) for r in range(s.first, s.first + s.count)]
        assert all(np.array_equal(x, ids[0]) for x in ids)
        assert t.prompt_tokens[s.first:s.first + s.count].tolist() == [1100] * 3
    assert t.options["mode"] == "resend" and AFTER_REPLY not in t.options
    chat = load_trace(spec)
    assert chat.prompt_tokens[:3].tolist() == [1100, 1456, 1812] and chat.options[AFTER_REPLY]
    # inference-perf's own names are the same parameters
    ip = ("synthetic:prefix-groups?num_groups=2&num_prompts_per_group=3&system_prompt_len=1000"
          "&question_len=100&turns=3&enable_multi_turn_chat=false")
    t2 = load_trace(ip)
    assert np.array_equal(t2.send_time_s, t.send_time_s)
    assert all(np.array_equal(t2.block_ids(r), t.block_ids(r)) for r in range(len(t)))
    with pytest.raises(OptionError, match="'mode' must be chat or resend"):
        load_trace(spec + "&mode=verbatim")
