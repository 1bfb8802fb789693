"""What a new user of the CLI sees: --help text for every option, drops said out loud,
--lenient counts in every output, the npz trace cache on by default and never stale, a
progress bar's numbers, plots written once each, figure1 within 100 columns."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import click
import pandas as pd

from sim.cli.main import cli
from tests.clikit import invoke_result
from tests.enginekit import write_cc_traces


def test_every_option_has_help_text() -> None:
    missing = []

    def walk(cmd: click.Command, path: str) -> None:
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip():
                missing.append(f"{path} {p.opts[0]}")
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                walk(sub, f"{path} {name}")

    walk(cli, "kvsim")
    assert not missing, missing


def test_reproduce_figure1_fits_100_columns_with_units() -> None:
    res = invoke_result("reproduce", "figure1")
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert max(len(ln.rstrip()) for ln in lines) <= 100
    assert "(tokens)" in res.stdout and "(units)" in res.stdout and "(s)" in res.stdout


def test_drops_are_said_and_dropping_everything_is_an_error(trace) -> None:
    res = invoke_result("run", "--trace", trace, "--gpu-cache", "1.5k", "--sessions", "2",
                 "--preset", "penelope")
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("kvsim: error")]
    assert res.exit_code == 2 and len(lines) == 1, res.stderr
    assert "every request (15) was dropped" in lines[0] and "cannot fit" in lines[0]
    res = invoke_result("run", "--trace", trace, "--gpu-cache", "10k", "--sessions", "2",
                 "--preset", "penelope", "--json")
    assert res.exit_code == 0, res.stderr
    s = json.loads(res.stdout)["runs"][0]["summary"]
    assert 0 < s["dropped_requests"] == s["dropped_cache_too_small"] < 15
    assert f"warning: penelope: dropped {s['dropped_requests']} requests" in res.stderr
    # the timing line counts the simulation only; loading has its own line
    assert "requests loaded in" in res.stderr and "requests simulated in" in res.stderr


def _lenient_folder(tmp: Path, trace: Path) -> Path:
    d = tmp / "mixed"
    d.mkdir()
    for f in trace.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    good = (trace / "trace_0000.json").read_bytes()
    (d / "trace_0100.json").write_bytes(good[: len(good) // 2])  # truncated JSON
    (d / "trace_0101.json").write_text("")  # empty
    (d / "trace_0102.json.gz").write_bytes(gzip.compress(good)[:40])  # truncated gzip
    (d / "trace_0103.json.gz").write_bytes(b"not gzip at all")  # unreadable
    return d


def test_lenient_counts_skipped_files_and_records_everywhere(tmp_path, trace) -> None:
    d = _lenient_folder(tmp_path, trace)
    res = invoke_result("run", "--trace", d, "--gpu-cache", "16k", "--sessions", "2")
    assert res.exit_code == 2 and "trace_0100.json" in res.stderr  # strict: named, no run
    res = invoke_result("run", "--trace", d, "--gpu-cache", "16k", "--sessions", "2", "--lenient",
                 "--preset", "penelope", "--out", tmp_path / "o")
    assert res.exit_code == 0, res.stderr
    assert "trace_skipped_files" in res.stdout  # a table row
    summary = json.loads((tmp_path / "o" / "penelope" / "summary.json").read_text())
    assert summary["trace_skipped_files"] == 4 and summary["trace_skipped_records"] == 0
    assert summary["requests"] == 15  # the three good sessions, all of them
    res = invoke_result("run", "--trace", d, "--gpu-cache", "16k", "--sessions", "2", "--lenient",
                 "--preset", "penelope", "--json")
    assert json.loads(res.stdout)["runs"][0]["summary"]["trace_skipped_files"] == 4
    res = invoke_result("trace", "stats", d, "--lenient", "--json")
    assert json.loads(res.stdout)["options"]["skipped_files"] == 4
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"base: {{trace: {d}, lenient: true, sessions: 2, gpu_cache: 16k}}\n")
    res = invoke_result("sweep", cfg, "--out", tmp_path / "sw")
    assert res.exit_code == 0, res.stderr
    assert "trace_skipped_files" in res.stdout
    df = pd.read_csv(tmp_path / "sw" / "results.csv")
    assert df["trace_skipped_files"].tolist() == [4]


def test_trace_cache_is_on_by_default_and_never_stale(tmp_path, monkeypatch) -> None:
    import traces.cache as cache
    from traces import load_trace

    src = tmp_path / "cc"
    write_cc_traces(src, sessions=2, turns=3)
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "kc"))
    res = invoke_result("trace", "stats", src, "--json")
    assert res.exit_code == 0, res.stderr
    assert len(list((tmp_path / "kc").glob("parsed-*.npz"))) == 1
    before = json.loads(res.stdout)["requests"]
    write_cc_traces(src, sessions=2, turns=5)  # the files change: never served stale
    after = json.loads(invoke_result("trace", "stats", src, "--json").stdout)["requests"]
    assert (before, after) == (6, 10)
    assert len(list((tmp_path / "kc").glob("parsed-*.npz"))) == 2
    key = cache.cache_key([str(src)], "cc-traces", 64, False, {})
    monkeypatch.setattr(cache, "CACHE_VERSION", cache.CACHE_VERSION + 1)
    assert cache.cache_key([str(src)], "cc-traces", 64, False, {}) != key
    monkeypatch.setenv("KVSIM_CACHE_DIR", "off")
    assert cache.resolve_cache_dir(None) is None
    assert cache.resolve_cache_dir(str(tmp_path / "x")) == str(tmp_path / "x")
    assert len(load_trace(str(src), cache_dir=cache.resolve_cache_dir(None))) == 10


def test_progress_reports_bytes_up_to_the_total(trace) -> None:
    from traces import load_trace
    from traces.files import report_progress

    seen: list[tuple[int, int]] = []
    with report_progress(lambda done, total: seen.append((done, total))):
        load_trace(str(trace))
    total = sum(f.stat().st_size for f in trace.iterdir())
    assert len(seen) == 3 and seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_plot_prints_each_path_once(tmp_path, trace) -> None:
    res = invoke_result("run", "--trace", trace, "--gpu-cache", "16k", "--sessions", "2",
                 "--out", tmp_path / "r")
    assert res.exit_code == 0, res.stderr
    res = invoke_result("plot", tmp_path / "r", "--out", tmp_path / "png")
    assert res.exit_code == 0, res.stderr
    paths = res.stdout.split()
    assert sorted(paths) == sorted(set(paths)) and len(paths) == 2
    assert str(tmp_path / "r") not in res.stderr
    for p in paths:
        assert Path(p).read_bytes()[:4] == b"\x89PNG"
        assert Path(p).stat().st_mode & 0o777 == 0o644
