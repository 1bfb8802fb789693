"""SLO, goodput and counting answers (issue 51: code review D1, D2, D4, D14; new-user review
cause U and D1). Each test failed before its fix."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import ConfigError, RunConfig
from sim.run import run
from sim.slo import SLOError, job_of, met_mask, parse_slo
from tests.enginekit import KitTrace


def sglang(**kw) -> RunConfig:
    return RunConfig.from_flat(**kw).with_preset("sglang")


# --- D1: an aborted request is not served ---------------------------------------------------
def aborting_run(slo: str):
    """Request 0 (5,000 + 8,000 tokens) cannot grow in a 12K cache: SGLang aborts it when it
    runs alone (sim/engines/sglang.py); request 1 is served after it."""
    trace = KitTrace([[(5000, 8000, 0.0)], [(1000, 4, 0.0)]])
    return run(sglang(gpu_cache=12288, sessions=2, max_new_tokens=8000, slo=slo), trace)


def test_an_aborted_request_is_flagged_and_not_served() -> None:
    res = aborting_run("ttft=60s,tpot=100ms")
    t, s = res.requests.set_index("request"), res.summary
    assert bool(t.aborted[0]) and not bool(t.aborted[1]) and not t.dropped.any()
    assert 0 < t.decoded_tokens[0] < 8000 - 1  # its reply was cut short
    # the count is the flagged rows; requests, latency and output count the served one only
    assert s["aborted"] == int(t.aborted.sum()) == 1
    assert s["requests"] == 1 and s["dropped_requests"] == 0
    assert s["output_tokens"] == t.decoded_tokens[1] + 1
    assert s["tpot_mean_s"] == t.tpot_s[1]
    assert s["e2e_mean_s"] == t.end_s[1] - t.send_s[1]
    assert s["ttft_mean_s"] == t.ttft_s[1]
    # the work it made the server do still counts
    assert s["decoded_tokens"] == t.decoded_tokens.sum()
    # it never meets an SLO, and a run that aborts does not meet (as one that drops)
    assert t.ttft_s[0] < 60 and t.tpot_s[0] < 0.1
    assert list(met_mask(res.requests.sort_values("request"), parse_slo("ttft=60s"))) == [
        False, True]
    assert s["slo_requests_met"] == 1 and s["slo_attainment"] == 0.5
    assert s["slo_met"] is False
    assert aborting_run("ttft=60s,attain=0.5").summary["slo_met"] is False


def test_a_run_whose_every_request_aborted_meets_nothing() -> None:
    """The review's case: both requests aborted, and ``slo_met`` was True."""
    trace = KitTrace([[(5000, 8000, 0.0)], [(5000, 8000, 0.0)]])
    s = run(sglang(gpu_cache=12288, sessions=2, max_new_tokens=8000,
                   slo="ttft=60s,tpot=100ms"), trace).summary
    assert s["aborted"] == 2 and s["requests"] == 0 and s["output_tokens"] == 0
    assert s["slo_requests_met"] == 0 and s["goodput_rps"] == 0 and s["slo_met"] is False


def test_run_says_that_requests_were_aborted() -> None:
    """The review's command: the run's table shows the aborts and stderr warns of them."""
    res = CliRunner().invoke(cli, [
        "run", "--trace", "synthetic:prefix-groups?groups=1&users=2&prefix=4096&question=1000"
        "&output=8000&qps=1", "--replay", "open", "--gpu-cache", "12k", "--preset", "sglang",
        "--slo", "ttft=60s,tpot=100ms"])
    assert res.exit_code == 0, res.stderr
    assert "the server aborted 2 requests before their output was complete" in res.stderr
    row = next(ln for ln in res.stdout.splitlines() if " aborted " in ln)
    assert row.split("│")[-2].strip() == "2"
    assert next(ln for ln in res.stdout.splitlines() if " slo_met " in ln).split(
        "│")[-2].strip() == "False"


# --- D2: one drop per request in a disaggregated run -----------------------------------------
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_pd_counts_each_dropped_request_once(engine: str) -> None:
    """A prompt that cannot fit is dropped by the prefill worker, then by the decode worker:
    one request, one drop (the summed counters of both said 2)."""
    trace = KitTrace([[(20000, 4, 0.0)], [(1000, 4, 0.0)]])
    kw = dict(engine="vllm") if engine == "vllm" else dict(pd_prealloc="off")
    cfg = RunConfig.from_flat(trace="kit", gpu_cache=16384, sessions=2, prefill_replicas=1,
                              decode_replicas=1, **kw).with_preset(engine)
    res = run(cfg, trace)
    t, s = res.requests, res.summary
    assert len(t) == 2 and int(t.dropped.sum()) == 1
    assert s["dropped_requests"] == 1 and s["dropped_cache_too_small"] == 1
    assert s["dropped_over_context"] == 0 and s["requests"] == 1


# --- D4: sessions met are jobs, sub-agents inside them ---------------------------------------
def test_sessions_met_count_jobs_with_their_subagents() -> None:
    # job 0 (a long prompt: slow first token) with sub-agent 1 (fast); job 2 (fast)
    trace = KitTrace([[(1000, 4, 0.0), (30000, 4, 1.0)], [(1000, 4, 0.0)], [(1000, 4, 0.0)]])
    sub = trace.sessions[1]
    sub.parent, sub.after_request, sub.start_offset_s = 0, 0, 0.5
    base = dict(sessions=2, gpu_cache=65536, max_new_tokens=16)
    t = run(sglang(**base), trace).requests
    slow = float(t.ttft_s.max())
    assert slow == t[t.session_index == 0].ttft_s.max()  # only job 0 misses below it
    s = run(sglang(**base, slo=f"ttft={slow * 0.999}s"), trace).summary
    assert s["sessions_completed"] == 2 and s["subagents_completed"] == 1
    assert s["slo_requests_met"] == len(t) - 1
    assert s["slo_sessions_met"] == 1  # job 2; sub-agent 1 met but its job did not
    assert s["goodput_sessions_per_h"] == pytest.approx(3600 / s["sim_end_s"])


def test_job_of_follows_parents_to_the_top() -> None:
    assert job_of([-1, 0, 1, -1, 3]).tolist() == [0, 0, 0, 3, 3]


# --- D14 / new-user D1: a key given twice is refused -----------------------------------------
@pytest.mark.parametrize("text", ["ttft=2s,ttft=1s", "ttft_p90=1s,ttft_p90=2s",
                                  "ttft=2s,ttft_p90=1s,TTFT=3s", "attain=0.9,ttft=1s,attain=0.8"])
def test_a_repeated_slo_key_is_refused(text: str) -> None:
    with pytest.raises(SLOError, match="given twice"):
        parse_slo(text)
    with pytest.raises(ConfigError, match="'slo'"):
        RunConfig.from_flat(slo=text).validate()


@pytest.mark.parametrize("command", [["run", "--trace", "synthetic:claude-code?sessions=2"],
                                     ["plan", "synthetic:claude-code?sessions=2", "--out",
                                      "unused"]])
def test_cli_refuses_a_repeated_key_in_one_line_naming_slo(command: list[str]) -> None:
    res = CliRunner().invoke(cli, [*command, "--slo", "ttft=2s,TTFT=3s"])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2, res.stderr
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), res.stderr
    assert "'--slo'" in lines[0] and "'ttft' is given twice" in lines[0]


# --- cause U: a bare number is milliseconds, as vllm bench serve --goodput reads it ----------
def test_a_bare_number_is_milliseconds_and_said_so() -> None:
    slo = parse_slo("ttft=2,tpot=50,e2e_p90=1500,itl=80ms")
    assert slo.thresholds == {"ttft": 0.002, "tpot": 0.05, "itl": 0.08}
    assert slo.targets == {"e2e_p90_s": 1.5}
    assert parse_slo(slo.text) == slo  # the text written to summary.json has units
    line = slo.describe()
    assert line.startswith("SLO: ttft <= 2 ms, tpot <= 50 ms, itl <= 80 ms, attainment >= 90%")
    assert "e2e_p90 <= 1.5 s" in line and "read ttft=2, tpot=50, e2e_p90=1500 as milliseconds" \
        in line and "vllm bench serve --goodput" in line
    assert "milliseconds" not in parse_slo("ttft=2s,tpot=50ms").describe()
    assert parse_slo("ttft=1e+3ms").thresholds == {"ttft": 1.0}  # (as _fmt may write it)
    assert math.isclose(parse_slo("tpot=2.5e-1s").thresholds["tpot"], 0.25)


def test_run_echoes_the_slo_reading_on_stderr_not_in_json() -> None:
    res = CliRunner().invoke(cli, ["run", "--trace", "synthetic:claude-code?sessions=2",
                                   "--max-context", "32k", "--sessions", "1", "--gpu-cache",
                                   "64k", "--preset", "sglang", "--slo", "tpot=50", "--json"])
    assert res.exit_code == 0, res.stderr
    assert "SLO: tpot <= 50 ms, attainment >= 90% (read tpot=50 as milliseconds" in res.stderr
    assert "SLO:" not in res.stdout
    import json

    assert json.loads(res.stdout)["runs"][0]["summary"]["slo"] == "tpot=50ms,attain=0.9"
