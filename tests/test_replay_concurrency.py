"""The load generators published router comparisons use: an open loop capped at C requests
in flight (``--max-concurrency``; vllm bench serve, inference-perf's workers) and
``synthetic:prefix-groups``'s request orders (SGLang's shuffle and ``--gsp-ordered``,
inference-perf's multi-turn rounds)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import ConfigError, RunConfig
from sim.run import run
from traces.errors import OptionError
from traces.prefix_groups import generate

FAST = RunConfig.from_flat(
    trace="synthetic:prefix-groups?groups=3&users=8&turns=2&qps=60&prefix=1024",
                           replay="open", gpu_cache=65536).with_preset("sglang")


def peak_in_flight(t) -> int:
    """Most requests between send and end at once (an end frees its slot before a send at
    the same instant, as the replay does)."""
    events = sorted([(s, 1) for s in t["send_s"]] + [(e, -1) for e in t["end_s"]],
                    key=lambda x: (x[0], x[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return peak


def test_open_loop_keeps_at_most_c_requests_in_flight():
    free = run(FAST).requests
    assert peak_in_flight(free) > 3
    capped = run(FAST.with_fields(max_concurrency=3)).requests
    assert peak_in_flight(capped) == 3
    assert len(capped) == len(free) and not capped["dropped"].any()
    # a request held back is sent later than its arrival time, never earlier
    due = free.set_index("request")["send_s"]
    sent = capped.set_index("request")["send_s"]
    assert (sent >= due.reindex(sent.index) - 1e-12).all()
    assert (sent > due.reindex(sent.index) + 1e-9).any()
    # a cap above the peak changes nothing
    assert run(FAST.with_fields(max_concurrency=10_000)).requests.equals(free)


def test_cap_in_a_fleet_run_too():
    t = run(FAST.with_fields(replicas=2, router="round-robin", max_concurrency=4)).requests
    assert peak_in_flight(t) == 4


def test_a_cap_on_a_closed_loop_is_refused():
    with pytest.raises(ConfigError, match="max_concurrency"):
        FAST.with_fields(replay="closed", max_concurrency=2).validate()
    with pytest.raises(ConfigError, match="max_concurrency"):
        FAST.with_fields(max_concurrency=-1).validate()
    res = CliRunner().invoke(cli, ["run", "--trace", "synthetic:prefix-groups?groups=1&users=2",
                                   "--replay", "closed", "--max-concurrency", "2", "--preset",
                                   "sglang"])
    assert res.exit_code == 2 and "--max-concurrency does nothing here" in res.output


def senders(order: str) -> list[int]:
    t = generate(f"synthetic:prefix-groups?groups=3&users=2&turns=2&prefix=128&order={order}")
    return [int(t.session[r]) for r in np.argsort(t.send_time_s, kind="stable")]


def test_prefix_groups_orders():
    # grouped: group by group, user by user, each user's two turns in a row
    assert senders("grouped") == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    # rounds: every user once (one random order), then every user again, same order
    r = senders("rounds")
    assert sorted(r[:6]) == list(range(6)) and r[6:] == r[:6]
    # shuffle is the default order
    s = senders("shuffle")
    assert sorted(s) == sorted(r) and s != r
    default = generate("synthetic:prefix-groups?groups=3&users=2&turns=2&prefix=128")
    assert [int(default.session[i]) for i in np.argsort(default.send_time_s,
                                                       kind="stable")] == s
    with pytest.raises(OptionError, match="order"):
        generate("synthetic:prefix-groups?order=random")


# --- issue 51 ----------------------------------------------------------------------------------
CHAT = RunConfig.from_flat(
    trace="synthetic:prefix-groups?groups=4&users=4&turns=3&prefix=2048&question=512&output=512"
          "&qps=40", replay="open", gpu_cache=20480).with_preset("sglang")


def after_previous_reply(t) -> tuple[int, int]:
    """Later turns, and how many of them were sent before their previous turn's reply."""
    t = t.sort_values(["session", "request"])
    prev_end = t.groupby("session")["end_s"].shift()
    later = prev_end.notna()
    return int(later.sum()), int((t["send_s"][later] < prev_end[later]).sum())


@pytest.mark.parametrize("cap", [0, 3])
def test_a_later_chat_turn_waits_for_the_previous_reply(cap):
    """D13: turn k+1's prompt holds turn k's answer, so it goes at max(its arrival time, that
    reply), as a chat client (inference-perf's user sessions) sends it."""
    t = run(CHAT.with_fields(max_concurrency=cap)).requests
    later, early = after_previous_reply(t)
    assert later == 32 and early == 0
    # never before its own arrival time; some later than it (the reply was not in yet)
    trace = generate(CHAT.traffic.trace)
    due = trace.send_time_s[t["request"].to_numpy()] - trace.send_time_s.min()
    assert (t["send_s"].to_numpy() >= due - 1e-9).all()
    assert (t["send_s"].to_numpy() > due + 1e-6).sum() > 4
    if cap:
        assert peak_in_flight(t) == cap
    # resent prompts hold no answer: they go at their own times, replies or not
    resend = run(CHAT.with_fields(trace=CHAT.traffic.trace + "&mode=resend")).requests
    assert after_previous_reply(resend)[1] > 0


def test_a_throttled_open_loop_says_so():
    """A concurrency cap that holds sends back cuts the offered rate: summary.json counts the
    held requests and their wait, and `kvsim run` prints the offered and achieved rates."""
    free = run(FAST).summary
    assert "concurrency_delayed_requests" not in free
    s = run(FAST.with_fields(max_concurrency=3)).summary
    assert s["concurrency_delayed_requests"] > 0 and s["concurrency_delay_mean_s"] > 0
    assert s["achieved_send_rate_per_s"] < s["offered_send_rate_per_s"]
    wide = run(FAST.with_fields(max_concurrency=10_000)).summary
    assert wide["concurrency_delayed_requests"] == 0
    res = CliRunner().invoke(cli, ["run", "--trace", FAST.traffic.trace, "--gpu-cache", "64k",
                                   "--preset", "sglang", "--max-concurrency", "3", "--json"])
    assert res.exit_code == 0, res.output
    note = [ln for ln in res.stderr.splitlines() if "--max-concurrency 3 held back" in ln]
    assert len(note) == 1 and "requests/s, sent at" in note[0], res.stderr


def test_prefix_groups_replay_open_by_default_and_refuse_a_closed_loop_with_rates():
    """Cause Q (S10, S13): the rate ramp was ignored, silently, by the default closed loop."""
    from sim.config import default_replay

    assert default_replay("synthetic:prefix-groups?groups=2") == "open"
    assert default_replay("synthetic:claude-code") == "closed"
    with pytest.raises(ConfigError, match=r"closed loop would ignore its qps.*--replay open"):
        FAST.with_fields(replay="closed").validate()
    # without qps the closed loop is a choice: users as sessions
    FAST.with_fields(replay="closed", trace="synthetic:prefix-groups?groups=3").validate()
    args = ["run", "--trace", "synthetic:prefix-groups?groups=2&users=2&qps=4..32",
            "--gpu-cache", "64k", "--preset", "sglang"]
    res = CliRunner().invoke(cli, [*args, "--replay", "closed"])
    assert res.exit_code == 2 and "add --replay open" in res.output
    res = CliRunner().invoke(cli, [*args, "--json"])
    assert res.exit_code == 0 and "--replay open: synthetic:prefix-groups" in res.stderr


def test_no_saturation_warning_when_the_queue_wait_did_not_grow():
    """The warning said 'grew from 0.0 s to 0.0 s': a few ms more is not a backlog, and a wait
    that did grow is printed with enough digits."""
    import pandas as pd

    from sim.studies.saturation import open_loop_saturation

    n = 40
    send = np.linspace(0.0, 10.0, n)
    table = pd.DataFrame({"request": range(n), "send_s": send, "end_s": send + 3.0,
                          "queue_wait_s": np.linspace(0.0039, 0.0052, n),
                          "prompt_tokens": 100, "dropped": False})
    assert open_loop_saturation(table) is None  # drain 3 s > 10% of 10 s, growth 1.3 ms
    table["queue_wait_s"] = np.r_[np.full(10, 0.004), np.linspace(0.5, 2.5, n - 10)]
    sat = open_loop_saturation(table)
    assert sat is not None and "grew from 0.004 s (first quarter" in sat.message()
