"""Progress on every long command (sim/report/progress.py): a line with done/total and an ETA on
stderr, under --json too, while stdout stays exactly one JSON document; and progress only
observes (a run is the same with or without it)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.report.progress import Tracker, current, progress
from tests.enginekit import same_summary

SWEEP_YAML = """\
base:
  trace: "synthetic:chat?sessions=3"
  gpu_cache: 64k
grid:
  preset: [sglang, penelope]
  sessions: [1, 2]
baseline: {preset: sglang}
"""


def _case(name: str, tmp_path: Path) -> tuple[list[str], str, str]:
    """(arguments, progress label, unit) of one long command on tiny inputs."""
    if name == "run":
        return (["run", "--trace", "synthetic:chat?sessions=3", "--gpu-cache", "64k"],
                "kvsim run", "requests")
    if name == "sweep":
        cfg = tmp_path / "sweep.yaml"
        cfg.write_text(SWEEP_YAML)
        return (["sweep", str(cfg), "--out", str(tmp_path / "out")], "kvsim sweep", "points")
    if name == "sweep-j2":  # two worker processes: the parent counts each finished point
        cfg = tmp_path / "sweep.yaml"
        cfg.write_text(SWEEP_YAML)
        return (["sweep", str(cfg), "--out", str(tmp_path / "out"), "-j", "2"],
                "kvsim sweep", "points")
    if name == "reproduce":
        return (["reproduce", "two-tier", "--quick", "--trace",
                 "synthetic:claude-code?sessions=2"], "kvsim reproduce two-tier", "runs")
    pytest.importorskip("torch")
    return (["calibrate", "--device", "cpu", "--quick", "--rounds", "1", "--warmup", "0"],
            "kvsim calibrate", "timed calls")


@pytest.mark.parametrize("name", ["run", "sweep", "sweep-j2", "reproduce", "calibrate"])
def test_long_commands_show_progress_on_stderr_under_json(name: str, tmp_path: Path) -> None:
    args, label, unit = _case(name, tmp_path)
    res = CliRunner().invoke(cli, [*args, "--json"])
    assert res.exit_code == 0, res.output
    json.loads(res.stdout)  # exactly one JSON document: progress never reaches stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith(label)]
    assert lines, res.stderr
    last = re.search(rf": ([\d,]+)/([\d,]+) {unit} \(100%\), \d+:\d\d:\d\d elapsed, "
                     r"ETA 0:00:00$", lines[-1])
    assert last and last.group(1) == last.group(2) != "0", lines[-1]


@pytest.mark.parametrize("replay", ["closed", "open"])
def test_run_counts_every_trace_request_of_every_policy(replay: str) -> None:
    res = CliRunner().invoke(cli, ["run", "--trace", "synthetic:chat?sessions=3",
                                   "--gpu-cache", "8k", "--replay", replay,
                                   "--json"])  # some requests dropped
    assert res.exit_code == 0, res.output
    runs = json.loads(res.stdout)["runs"]
    total = sum(r["summary"]["trace_requests"] for r in runs)
    assert any(r["summary"]["dropped_requests"] for r in runs)
    assert f"{total:,}/{total:,} requests (100%)" in res.stderr


@pytest.mark.parametrize("replay, replicas", [("closed", 1), ("open", 1), ("closed", 3)])
def test_progress_only_observes_a_run(replay: str, replicas: int) -> None:
    """... and counts every reply, a fleet's too."""
    from sim.config import RunConfig
    from sim.run import run

    cfg = RunConfig.from_flat(trace="synthetic:chat?sessions=4", gpu_cache=16384, replay=replay,
                              replicas=replicas, router="round-robin" if replicas > 1 else None
                              ).with_preset("penelope")
    plain = run(cfg)
    with progress("test", "requests", 0) as bar:
        bar.add_total(len(plain.requests))
        watched = run(cfg, on_reply=bar.advance)
    assert bar.done == bar.total > 0
    assert same_summary(watched.summary, plain.summary)
    assert watched.requests.equals(plain.requests)


def test_tracker_eta_is_the_pace_since_the_first_report(monkeypatch) -> None:
    from rich.console import Console

    now = [100.0]
    monkeypatch.setattr("sim.report.progress.time.monotonic", lambda: now[0])
    t = Tracker("t", "points", 10, Console(file=io.StringIO()))
    now[0] = 160.0
    t.resume(4)  # finished before this command: not part of the pace
    assert t.eta_s() is None
    now[0] = 190.0
    t.advance(2)  # 2 points in 30 s: 4 left take 60 s
    assert t.eta_s() == pytest.approx(60.0)
    assert t.status() == "6/10 points (60%), 0:01:30 elapsed, ETA 0:01:00"


def test_no_tracker_counts_nothing() -> None:
    assert not current().counts("requests")
    with progress("x", "runs"):
        assert current().counts("runs") and not current().counts("requests")
    assert not current().counts("runs")


def test_trace_stats_shows_loading_progress_under_json(tmp_path: Path, monkeypatch) -> None:
    from tests.enginekit import write_cc_traces

    monkeypatch.setattr("sim.cli.common.TRACE_LOAD_QUIET_S", 0.0)  # a tiny trace loads at once

    write_cc_traces(tmp_path, sessions=3, turns=5)
    res = CliRunner().invoke(cli, ["trace", "stats", str(tmp_path), "--cache-dir", "off",
                                   "--json"])
    assert res.exit_code == 0, res.output
    json.loads(res.stdout)
    last = [ln for ln in res.stderr.splitlines() if ln.startswith("loading trace")][-1]
    m = re.search(r": ([\d.]+)/([\d.]+) kB \(100%\), .* ETA 0:00:00$", last)
    assert m and m.group(1) == m.group(2), last


def test_a_failure_leaves_no_last_line_and_a_quiet_tracker_prints_nothing_early() -> None:
    from rich.console import Console

    out = io.StringIO()
    with pytest.raises(ValueError), progress("x", "runs", 4, Console(file=out)) as bar:
        bar.advance()
        raise ValueError("bad input")
    assert out.getvalue().count("x: ") == 1  # the first report only, no last line
    out = io.StringIO()
    quiet = Tracker("q", "runs", 2, Console(file=out), quiet_s=60.0)
    quiet.start()
    quiet.advance(2)
    quiet.stop()
    assert out.getvalue() == ""
