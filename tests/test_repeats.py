"""Repeats with 95% intervals (sim/run/repeats.py); the trace seed apart from the decision seed."""

from __future__ import annotations

import math
import statistics

import pytest

from sim.config import RunConfig
from sim.run import load_run_trace, run
from sim.run.repeats import combine, mean_ci, t975
from tests.enginekit import same_summary

FLEET = dict(trace="synthetic:claude-code?sessions=8", max_context=65536, gaps="tool",
             gpu_cache=98304, sessions=3, preset="sglang", replicas=2, router="random")


def test_student_t_interval_by_hand() -> None:
    # 3 values 1, 2, 6: mean 3, sd sqrt(7), t(0.975, 2) = 4.302653 (a table's value)
    mean, ci = mean_ci([1.0, 2.0, 6.0])
    assert mean == 3.0
    assert ci == pytest.approx(4.302652730 * math.sqrt(7) / math.sqrt(3), rel=1e-12)
    assert t975(30) == pytest.approx(2.042272456) and t975(120) == pytest.approx(1.97993, abs=2e-5)
    assert math.isnan(mean_ci([5.0])[1])
    s = combine([{"a": 1, "b": 2, "name": "x"}, {"a": 1, "b": 4, "name": "x"}])
    assert s["a"] == 1 and s["a_ci95"] == 0.0 and isinstance(s["a"], int)
    assert s["b"] == 3.0 and s["b_ci95"] == pytest.approx(12.706204736 * statistics.stdev(
        [2, 4]) / math.sqrt(2)) and s["name"] == "x"


def test_repeats_are_the_mean_of_runs_with_seeds_seed_to_seed_plus_n() -> None:
    cfg = RunConfig.from_flat(**FLEET, seed=5)
    one = [run(RunConfig.from_flat(**FLEET, seed=s, trace_seed=5)).summary for s in (5, 6, 7)]
    rep = run(RunConfig.from_flat(**FLEET, seed=5, repeats=3))
    want, ci = mean_ci([s["ttft_mean_s"] for s in one])
    assert rep.summary["ttft_mean_s"] == pytest.approx(want, rel=1e-12)
    assert rep.summary["ttft_mean_s_ci95"] == pytest.approx(ci, rel=1e-12)
    assert rep.summary["repeat_seeds"] == [5, 6, 7] and rep.summary["repeats"] == 3
    assert sorted(set(rep.requests["repeat"])) == [0, 1, 2]
    # the random router differs between seeds, the trace does not
    assert len({s["ttft_mean_s"] for s in one}) == 3
    assert len({s["trace_requests"] for s in one}) == 1
    again = run(cfg.__class__.from_flat(**FLEET, seed=5, repeats=3))
    assert same_summary(again.summary, rep.summary)  # identical seeds: identical results


def test_trace_seed_keeps_the_trace_while_the_decision_seed_moves() -> None:
    synth = "synthetic:claude-code?sessions=6"
    base = RunConfig.from_flat(trace=synth)
    a = load_run_trace(base)
    # memo: same key
    assert load_run_trace(RunConfig.from_flat(trace=synth, seed=3, trace_seed=0)) is a
    b = load_run_trace(RunConfig.from_flat(trace=synth, seed=3))  # seed alone: a new draw
    assert len(b) != len(a) or (b.prompt_tokens != a.prompt_tokens).any()
    # default trace_seed = seed: results from before the split stay the same
    assert RunConfig.from_flat(trace=synth, seed=3).trace_draw_seed == 3


def test_slo_met_with_repeats_reads_the_pessimistic_end() -> None:
    probe = run(RunConfig.from_flat(**FLEET, repeats=3)).summary
    mean, ci = probe["ttft_p90_s"], probe["ttft_p90_s_ci95"]
    assert ci > 0
    inside = run(RunConfig.from_flat(**FLEET, repeats=3, slo=f"ttft_p90={mean + ci / 2}s")).summary
    assert inside["slo_met"] is False  # the mean meets it, the interval's top does not
    above = run(RunConfig.from_flat(**FLEET, repeats=3,
                                    slo=f"ttft_p90={(mean + ci) * 1.001}s")).summary
    assert above["slo_met"] is True


def test_tables_mark_differences_inside_the_interval() -> None:
    from sim.report.runs import within_interval

    a = {"x": 1.0, "x_ci95": 0.3}
    assert within_interval(a, {"x": 1.5, "x_ci95": 0.2}, "x")
    assert not within_interval(a, {"x": 1.6, "x_ci95": 0.2}, "x")
    assert not within_interval({"x": 1.0}, {"x": 1.0}, "x")  # no repeats: no marks


def test_repeats_show_counts_as_counts_and_no_zero_interval() -> None:
    """A mean reads to its interval's second significant digit, and an interval of 0 (every
    repeat agrees, or float noise) shows no ``±`` (issue 51: ``125,312.000 ±35,165.486``,
    ``gpus 4 ±0.000``)."""
    from sim.report.tables import fmt_mean

    assert fmt_mean("recomputed_tokens", 125312.0, 35165.486) == "125,312 ±35,165"
    assert fmt_mean("gpus", 4, 0.0) == "4"
    assert fmt_mean("output_tokens_per_s", 113.117, 1e-14) == "113.117"
    assert fmt_mean("requests", 40.333, 1.434) == "40.3 ±1.4"
    assert fmt_mean("ttft_mean_s", 0.1444, 0.0161) == "0.144 ±0.016"
    assert fmt_mean("hit_rate", 0.816, 0.025) == "81.6% ±2.5%"
    assert fmt_mean("tpot_mean_s", 0.00726, 1e-9) == "7.26 ms"
    assert fmt_mean("tpot_mean_s", 0.00726, 0.0005) == "7.26 ms ±0.50"
    assert fmt_mean("ttft_mean_s", 0.5, None) == "0.500"


def _wide_runs(n: int, repeats: int) -> list[dict]:
    """Runs of a fleet with --slo and a CPU tier, their figures as wide as they come: counts
    in millions with intervals, every change marked."""
    from sim.report import runs as report

    keys = (*report.COMPARED, *report.THROUGHPUT_ROWS, *report.GOODPUT_ROWS,
            *report.FLEET_ROWS, *report.POOL_ROWS, *report.WHEN_NONZERO, "cpu_hit_rate",
            "bytes_h2d", "requests", "retractions", "evicted_tokens")
    def value(k: str) -> tuple[float, float]:  # (mean, interval) in the metric's range
        if any(p in k for p in ("rate", "share", "reuse_", "affinity", "attainment",
                                "utilization")):
            return 0.512, 0.123
        if k.startswith(("tpot", "itl")):
            return 0.1234, 0.0123
        if k.endswith("_s") or "per_s" in k or "per_h" in k:
            return 12_345.678, 1_234.567
        return 14_837_973.333, 1_861_291.425

    out = []
    for i in range(n):
        s = {k: value(k)[0] * (1 + i / 10) for k in keys}
        s.update(hit_rate=0.5 + i / 100, cpu_cache_tokens=1, replicas=4, slo={"ttft": 1},
                 slo_met=True, repeats=repeats)
        if repeats > 1:
            s.update({f"{k}_ci95": value(k)[1] for k in keys})
        out.append({"policy": f"policy-{i}-with-a-long-name", "summary": s,
                    "change_vs_first": {k: 0.123 * i for k in report.COMPARED}})
    return out


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("repeats", [1, 3])
def test_run_tables_fit_100_columns_on_any_terminal(n: int, repeats: int) -> None:
    """README: tables fit 100 columns, also piped (a 200-column console) and with repeats,
    where a fleet with --slo once took 104."""
    import io

    from rich.console import Console

    from sim.report.runs import run_tables

    for width in (100, 200):
        con = Console(file=io.StringIO(), width=200)
        for t in run_tables(_wide_runs(n, repeats), "t" * 150, width):
            con.print(t)
        lines = con.file.getvalue().splitlines()
        assert max(len(x.rstrip()) for x in lines) <= min(width, 100), width
        assert not any("…" in x for x in lines)  # nothing cut


def test_what_draws_from_the_seed_decides_whether_repeats_differ() -> None:
    """Repeats vary the decision seed only (the trace is fixed): one server under a built-in
    deterministic policy repeats identically; a fleet's router, random victims and a user's
    policy file may draw from it (issue 51, R04)."""
    from sim.run.repeats import seed_users

    base = dict(trace="synthetic:claude-code?sessions=4")
    assert seed_users(RunConfig.from_flat(**base, preset="sglang")) == []
    assert seed_users(RunConfig.from_flat(**base, preset="vllm", engine="vllm")) == []
    assert seed_users(RunConfig.from_flat(**base, policy="random")) == ["policy random"]
    assert seed_users(RunConfig.from_flat(**FLEET)) == ["the router"]
    user = RunConfig.from_flat(**base, policy="docs/examples/hold_tool_calls.py:HoldToolCalls")
    assert seed_users(user)  # a user's file: assumed to draw


def test_repeats_of_a_deterministic_run_run_once_and_say_so(tmp_path) -> None:
    """``--repeats 10000`` on one deterministic server once ran 10,000 identical runs."""
    import json

    from click.testing import CliRunner

    from sim.cli.main import cli

    args = ["run", "--trace", "synthetic:claude-code?sessions=4", "--max-context", "32k",
            "--gaps", "tool", "--sessions", "2", "--preset", "sglang", "--out",
            str(tmp_path / "o")]
    res = CliRunner().invoke(cli, [*args, "--repeats", "10000"])
    assert res.exit_code == 0, res.stderr
    assert "--repeats 10000: nothing in this run draws from the seed" in " ".join(
        res.stderr.split())
    assert "running it once" in res.stderr
    summary = json.loads((tmp_path / "o" / "sglang" / "summary.json").read_text())
    assert "repeats" not in summary and "ttft_mean_s_ci95" not in summary
    res = CliRunner().invoke(cli, [*args[:-2], "--policy", "random", "--repeats", "2",
                                   "--json"])
    assert res.exit_code == 0 and "draws from the seed" not in res.stderr
    assert json.loads(res.stdout)["runs"][0]["summary"]["repeats"] == 2


def test_sweep_tables_fit_100_columns_with_numbers_whole() -> None:
    """``kvsim sweep``'s narrow tables on a piped (200-column) console: a grid of several
    text fields folds its text columns, never a number (README: 100 columns)."""
    import io

    import pandas as pd
    from rich.console import Console

    from sim.report.sweeps import sweep_tables

    row = dict(policy="penelope-with-params", sessions=4, gpu_cache="256k",
               router="sglang-cache-aware", replicas=8, scheduler="lpm",
               ttft_mean_s=1234.5678, ttft_p90_s=2345.678, jct_mean_s=12345.678, hit_rate=0.9,
               tpot_mean_s=0.0123, itl_p99_s=0.1, output_tokens_per_s_per_gpu=12345.0,
               gpus=16, slo_attainment=0.5, goodput_rps_per_gpu=1.234,
               ttft_mean_s_change=-0.123, jct_mean_s_change=0.01, hit_rate_change=0.1,
               dropped_requests=1234, idle_replicas=2)
    con = Console(file=io.StringIO(), width=200)
    for t in sweep_tables(pd.DataFrame([row, row]), ["sessions", "gpu_cache", "router",
                                                     "replicas", "scheduler"], "title"):
        con.print(t)
    out = con.file.getvalue()
    assert max(len(x.rstrip()) for x in out.splitlines()) <= 100
    for number in ("1234.568", "12345.678", "12,345", "-12.3%", "1,234"):
        assert number in out  # on one line, uncut
    assert "…" not in out


@pytest.mark.parametrize("router,drawn", [("session-affinity", False), ("random", True)])
def test_repeats_that_draw_nothing_reuse_the_first_run_with_identical_results(
        monkeypatch, router, drawn) -> None:
    """A repeat that differs from the first only in a seed nothing draws from is the first run
    again (issue 55, item 4): it is not run, and the results equal running it."""
    from sim.run import repeats as rep

    cfg = RunConfig.from_flat(**{**FLEET, "router": router}, repeats=2)
    calls = []
    real = rep.run_repeats

    def counting(cfg, trace, run_one, reuse=True):
        def one(c, t, k):
            calls.append(k)
            return run_one(c, t, k)
        return real(cfg, trace, one, reuse)

    monkeypatch.setattr("sim.run.driver.run_repeats", counting)
    fast = run(cfg)
    assert calls == ([0, 1] if drawn else [0])
    assert run(cfg.with_fields(repeats=1)).seed_drawn is drawn
    calls.clear()
    full = real(cfg, None, lambda c, t, k: (calls.append(k), run(c, t))[1], reuse=False)
    assert calls == [0, 1]
    assert same_summary(fast.summary, full.summary)
    assert fast.requests.equals(full.requests)
