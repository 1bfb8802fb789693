"""``kvsim plan --search up`` and its early stops (sim/sweep/plan.py, sim/sweep/early_stop.py,
issue 55 item 4): the same answers and pick as ``--search full``, and a stopped point's
verdict is its whole run's."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import RunConfig
from sim.run import run
from sim.run.repeats import t975
from sim.slo import parse_slo
from sim.sweep.early_stop import MAX_REPEATS, StopRule

# 16 sessions at once on 1..4 replicas: least-load's TTFT p90 is not monotone in the size
# (0.94 s at 1, 1.39 / 1.36 / 1.22 s at 2 / 3 / 4 at the interval's top), session-affinity's
# is (0.94, 0.64, 0.62, 0.62 s)
TRACE = "synthetic:claude-code?sessions=16"
BASE = ["plan", TRACE, "--max-context", "32k", "--gaps", "tool", "--sessions", "16",
        "--replicas", "1..4", "--routers", "session-affinity,least-load", "--policies",
        "sglang", "--repeats", "2", "--json"]


def plan_doc(tmp_path, slo: str, search: str) -> tuple[dict, dict[str, dict]]:
    """The plan document and every point's summary by point id."""
    out = tmp_path / f"{search}-{slo}"
    res = CliRunner().invoke(cli, [*BASE, "--slo", slo, "--search", search, "--out", str(out)])
    assert res.exit_code == 0, res.output
    points = {p.name: json.loads((p / "summary.json").read_text())
              for p in (out / "points").iterdir()}
    return json.loads((out / "plan.json").read_text()), points


@pytest.mark.parametrize(("slo", "stops"), [
    ("ttft_p90=0.7s", True),  # session-affinity meets at 2, least-load at no size
    ("ttft_p90=1.3s", False),  # not monotone: least-load meets at 1 and 4 (bisect: 4)
    ("ttft_p90=0.65s,ttft=1s", True),  # the attainment decides too
    ("ttft_p90=0.3s,ttft=1s", True),  # nothing meets
    ("ttft_mean=0.4s", True),
])
def test_up_with_early_stops_answers_and_picks_as_full_does(tmp_path, slo, stops) -> None:
    up, up_points = plan_doc(tmp_path, slo, "up")
    full, full_points = plan_doc(tmp_path, slo, "full")
    assert [a.get("size") for a in up["answers"]] == [a.get("size") for a in full["answers"]]
    assert up["chosen"] == full["chosen"]
    if up["chosen"] is not None:
        assert up["one_smaller"] == full["one_smaller"]  # run whole again where it stopped
    # every point up ran: the verdict of the whole run; a point it did not stop, that run
    # (one replica is one point for every router: the questions share it)
    assert set(up_points) <= set(full_points)
    stopped = 0
    for pid, s in up_points.items():
        whole = full_points[pid]
        assert s["slo_met"] == whole["slo_met"], pid
        if s.get("stopped_early"):
            stopped += 1
            assert not whole["slo_met"] and "ttft" in s["stopped_early"]
        else:
            assert s == whole
    assert (stopped > 0) == (up["points_stopped"] > 0) == stops
    # a stopped row in the tables (a router x policy at the chosen size) is said to be
    from sim.report.plan import plan_notes

    said = any(x.startswith("-: stopped once it could no longer meet") for x in plan_notes(up))
    assert said == any(b.get("stopped_early") for b in up["buys"])
    assert up["points_run"] <= full["points_run"]


def test_bisection_can_miss_what_up_finds_on_a_non_monotone_curve(tmp_path) -> None:
    """Why ``up`` is the default: least-load meets at 1 and 4 but not at 2 or 3; bisection
    (4, then 2, then 3: monotone among those) answers 4, ``up`` and ``full`` answer 1."""
    doc, _ = plan_doc(tmp_path, "ttft_p90=1.3s", "bisect")
    up, _ = plan_doc(tmp_path, "ttft_p90=1.3s", "up")
    sizes = {a["router"]: a["size"] for a in doc["answers"]}
    assert sizes["least-load"] == 4
    assert {a["router"]: a["size"] for a in up["answers"]}["least-load"] == 1


def test_up_with_fake_curves_runs_from_below_and_answers_as_full(tmp_path, monkeypatch) -> None:
    from test_plan import fake_plan

    curves = {"monotone": {n: 8.0 / n for n in range(1, 9)},
              "bumpy": {1: 9.0, 2: 2.0, 3: 2.9, 4: 2.5, 5: 2.8, 6: 2.6, 7: 2.7, 8: 1.0},
              "dip": {1: 9.0, 2: 3.5, 3: 2.9, 4: 3.2, 5: 3.1, 6: 4.0, 7: 2.0, 8: 1.0},
              "never": dict.fromkeys(range(1, 9), 4.0)}
    up, asked = fake_plan(tmp_path / "u", monkeypatch, curves, search="up", replicas=(1, 8))
    full, _ = fake_plan(tmp_path / "f", monkeypatch, curves, search="full", replicas=(1, 8))
    assert [a.get("size") for a in up["answers"]] == [a.get("size") for a in full["answers"]]
    assert [a.get("size") for a in up["answers"]] == [3, 2, 3, None]
    assert up["chosen"] == full["chosen"]
    assert asked == {"monotone": [1, 2, 3], "bumpy": [1, 2], "dip": [1, 2, 3],
                     "never": list(range(1, 9))}


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
