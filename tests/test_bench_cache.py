"""The cache benchmark (benchmarks/bench_cache.py) and the `make bench` runner, kept tiny."""

from __future__ import annotations

import json
import sys
import types

import pytest
from conftest import CC_TRACES, needs_cc_traces

from benchmarks import bench_cache, run_all


@needs_cc_traces
@pytest.mark.shared_data
def test_bench_cache_small_run_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = bench_cache.main(
        ["--trace-dir", str(CC_TRACES), "--sessions", "3", "--max-requests", "12", "--json"]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    rows = {r["side"]: r for r in summary["rows"]}
    assert list(rows) == ["SGLang RadixCache", "kvsim sglang", "kvsim vllm", "kvsim penelope"]
    theirs, ours = rows["SGLang RadixCache"], rows["kvsim sglang"]
    # the same stream under the same semantics: identical hits and aborts
    assert (theirs["hit_blocks"], theirs["aborted"]) == (ours["hit_blocks"], ours["aborted"])
    assert theirs["requests"] == 36 and theirs["vs_sglang_radixcache"] == 1.0
    assert ours["vs_kvsim_sglang"] == 1.0
    assert {"kvsim_sglang_speedup", "penelope_slowdown_vs_kvsim_sglang"} <= set(summary)
    table = bench_cache.format_table(summary)
    assert "kvsim penelope" in table and "target >= 5.0x" in table


def test_bench_cache_skips_without_traces(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_cache.main(["--trace-dir", str(tmp_path / "absent")]) == 0
    assert "skipped" in capsys.readouterr().err


def test_run_all_runs_every_main_and_reports_failures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = []

    def module(name: str, main) -> None:
        mod = types.ModuleType(name)
        if main is not None:
            mod.main = main
        monkeypatch.setitem(sys.modules, name, mod)

    module("benchmarks.bench_fake_ok", lambda argv=None: calls.append(("ok", argv)) or 0)
    module("benchmarks.bench_fake_bare", lambda: calls.append(("bare", None)) or 0)
    module("benchmarks.bench_fake_fail", lambda argv=None: 1 / 0)
    module("benchmarks.bench_fake_nomain", None)
    names = [
        "benchmarks.bench_fake_bare",
        "benchmarks.bench_fake_fail",
        "benchmarks.bench_fake_nomain",
        "benchmarks.bench_fake_ok",
    ]
    monkeypatch.setattr(run_all, "bench_modules", lambda: names)
    assert run_all.main([]) == 1
    assert calls == [("bare", None), ("ok", [])]
    captured = capsys.readouterr()
    assert "failed: benchmarks.bench_fake_fail" in captured.err
    assert "ZeroDivisionError" in captured.err


def test_run_all_finds_the_cache_benchmark() -> None:
    assert "benchmarks.bench_cache" in run_all.bench_modules()
