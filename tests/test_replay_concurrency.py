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
                                   "--max-concurrency", "2", "--preset", "sglang"])
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
