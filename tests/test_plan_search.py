"""Early stops of a plan's points (sim/sweep/early_stop.py, issue 55 item 4): a stopped
point's verdict is its whole run's."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sim.config import RunConfig
from sim.run import run
from sim.run.repeats import t975
from sim.slo import parse_slo
from sim.sweep.early_stop import MAX_REPEATS, StopRule

TRACE = "synthetic:claude-code?sessions=16"


@pytest.mark.parametrize("q", [50, 90, 99])
def test_a_percentile_is_over_its_limit_once_the_rule_counts_enough(q) -> None:
    """The count that decides ``ttft_pQ`` holds for every n up to the trace's N requests:
    with that many values over the limit (the rest at 0) numpy's percentile is over it."""
    for big in (1, 2, 3, 7, 10, 11, 94, 101, 1000):
        rule = StopRule(big, parse_slo(f"ttft_p{q}=1s"))
        (_key, limit, need), = rule.pct
        for n in range(max(1, need), big + 1):
            v = np.zeros(n)
            v[:need] = limit * (1 + 1e-12) + 1e-12
            assert np.percentile(v, q) > 1.0, (big, n, need)


def test_one_repeat_over_a_target_puts_the_interval_top_over_it() -> None:
    """With up to ``MAX_REPEATS`` repeats the interval's top is at least the largest repeat
    (t(0.975, n-1) >= n-1), so one repeat that misses decides the point."""
    assert all(t975(n - 1) >= n - 1 for n in range(2, MAX_REPEATS + 1))
    assert t975(MAX_REPEATS) < MAX_REPEATS


def test_a_stopped_run_is_a_miss_of_the_whole_run(tmp_path) -> None:
    """``run_or_stop`` on a point that misses writes a stopped summary; the whole run misses
    (at its pessimistic end, as the plan judges); one that meets is written whole."""
    from sim.run.trace import load_run_trace
    from sim.sweep.early_stop import run_or_stop

    flat = dict(trace=TRACE, max_context=32768, gaps="tool", sessions=16, gpu="H100",
                preset="sglang", repeats=2)
    miss = RunConfig.from_flat(**flat, slo="ttft_p90=0.3s")
    trace = load_run_trace(miss)
    run_or_stop(miss, trace, tmp_path / "miss")
    stopped = json.loads((tmp_path / "miss" / "summary.json").read_text())
    assert stopped["stopped_early"] and stopped["slo_met"] is False
    assert stopped["gpus"] == 1 and "ttft_p90_s" not in stopped
    whole = run(miss, trace).summary
    assert whole["slo_met"] is False and whole["ttft_p90_s"] > 0.3
    meet = RunConfig.from_flat(**flat, slo="ttft_p90=5s")
    run_or_stop(meet, trace, tmp_path / "meet")
    met = json.loads((tmp_path / "meet" / "summary.json").read_text())
    assert met["slo_met"] is True and "stopped_early" not in met
    assert met["ttft_p90_s"] == run(meet, trace).summary["ttft_p90_s"]
    # no TTFT target or more repeats than the bound: no rule, the run is whole
    assert StopRule.of(RunConfig.from_flat(**flat, slo="tpot_p90=1s"), len(trace)) is None
    assert StopRule.of(RunConfig.from_flat(**{**flat, "repeats": MAX_REPEATS + 1},
                                           slo="ttft_p90=1s"), len(trace)) is None
    assert not math.isinf(StopRule.of(miss, len(trace)).pct[0][1])
