"""`kvsim run`, `kvsim sweep`, `kvsim plot` as a user runs them: JSON contract, outputs on disk,
determinism across executors, resumability, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.clikit import invoke
from tests.enginekit import write_cc_traces


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cc")
    write_cc_traces(d, sessions=4, turns=6)
    return d


def test_run_json_contract_and_outputs(trace_dir: Path, tmp_path: Path) -> None:
    code, out, err = invoke("run", "--trace", trace_dir, "--gpu-cache", "24k", "--sessions", 2,
                            "--preset", "sglang,vllm,penelope", "--gaps", "tool",
                            "--out", tmp_path / "o", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [r["policy"] for r in doc["runs"]] == ["sglang", "vllm", "penelope"]
    for r in doc["runs"]:
        s = r["summary"]
        for k in ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "jct_mean_s",
                  "hit_rate", "recomputed_tokens", "requests"):
            assert k in s
        assert s["requests"] == 24 and s["gaps"] == "tool"
    assert doc["runs"][0]["change_vs_first"]["ttft_mean_s"] == 0.0
    for p in ("sglang", "vllm", "penelope"):
        d = tmp_path / "o" / p
        df = pd.read_parquet(d / "requests.parquet")
        assert len(df) == 24
        assert json.loads((d / "config.json").read_text())["policy_label"] == p
        assert json.loads((d / "summary.json").read_text())["requests"] == 24
    code, out, err = invoke("plot", tmp_path / "o")
    assert code == 0, err
    for png in ("ttft_cdf.png", "change_vs_first.png"):
        assert (tmp_path / "o" / png).read_bytes()[:4] == b"\x89PNG"


def test_run_table_output(trace_dir: Path) -> None:
    code, out, _ = invoke("run", "--trace", trace_dir, "--gpu-cache", "24k", "--sessions", 2,
                          "--evict", "private-head", "--granularity", "node")
    assert code == 0
    assert "lru+private-head+node" in out and "ttft_mean_s" in out


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--gpu-cache", "lots"], "--gpu-cache"),
     (["--preset", "magic"], "unknown preset 'magic'"),
     (["--gaps", "sometimes"], "gap"),
     (["--model", "gpt-17"], "unknown model")],
)
def test_run_bad_input_exit_2(trace_dir: Path, args: list[str], needle: str) -> None:
    code, out, err = invoke("run", "--trace", trace_dir, *args)
    assert code == 2
    assert needle in err + out


SWEEP = """
base:
  trace: {trace}
  gaps: tool
  max_new_tokens: 256
grid:
  preset: [sglang, penelope]
  gpu_cache: [8k, 16k]
  sessions: [2]
baseline: {{preset: sglang}}
"""


def test_sweep_parallel_equals_serial_and_resumes(trace_dir: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(SWEEP.format(trace=trace_dir))
    code, _, err = invoke("sweep", cfg, "--out", tmp_path / "a", "-j", 1)
    assert code == 0, err
    code, _, err = invoke("sweep", cfg, "--out", tmp_path / "b", "-j", 2)
    assert code == 0, err
    a = pd.read_parquet(tmp_path / "a" / "results.parquet")
    b = pd.read_parquet(tmp_path / "b" / "results.parquet")
    assert len(a) == 4
    pd.testing.assert_frame_equal(a, b)
    for pid in a["point"]:
        ra = (tmp_path / "a" / "points" / pid / "requests.parquet").read_bytes()
        rb = (tmp_path / "b" / "points" / pid / "requests.parquet").read_bytes()
        assert ra == rb
    base = a[a["policy"] == "sglang"]
    assert (base["ttft_mean_s_change"].abs() < 1e-12).all()
    # Resumable: finished points are not run again.
    stamp = {p: (tmp_path / "a" / "points" / p / "summary.json").stat().st_mtime_ns
             for p in a["point"]}
    code, _, _ = invoke("sweep", cfg, "--out", tmp_path / "a", "-j", 1)
    assert code == 0
    for p, t in stamp.items():
        assert (tmp_path / "a" / "points" / p / "summary.json").stat().st_mtime_ns == t
    code, _out, err = invoke("plot", tmp_path / "a")
    assert code == 0, err


@pytest.mark.parametrize(
    ("text", "field"),
    [("grid: {preset: [sglang]}\nbase: {bogus: 1}\n", "bogus"),
     ("grid: {gpu_cache: [lots]}\n", "gpu_cache"),
     ("grid: {scheduler: [random]}\n", "scheduler"),
     ("grid: [1, 2]\n", "grid"),
     ("base: {trace: x\n", "line 2, column 1: not valid YAML")],
)
def test_sweep_bad_config_exit_2(tmp_path: Path, text: str, field: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    code, _out, err = invoke("sweep", cfg, "--out", tmp_path / "o")
    assert code == 2
    assert str(cfg) in err and field in err
