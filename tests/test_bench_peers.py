"""benchmarks/bench_peers.py: every peer comparison in one table, from each benchmark's JSON
(both bench_dynamo layouts: with and without whole-process seconds), peers missing named."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_peers, run_all

AROUND = {"load_before": 1.5, "load_after": 2.0, "wall_s": 9.0, "rc": 0}
DYNAMO = {"rows": [{"router": "dynamo-kv", "requests": 4000, "kvsim_core": "compiled",
                    "kvsim-64": {"wall_s": 0.6, "cpu_s": 0.6, "process_s": 1.2},
                    "dynamo-64": {"wall_s": 0.8, "cpu_s": 0.8, "process_s": 1.0},
                    "kvsim-vllm-64": {"wall_s": 0.5, "cpu_s": 0.5},  # no process_s
                    "dynamo-vllm-64": {"wall_s": 1.0, "cpu_s": 1.0},
                    "kvsim-512": {"wall_s": 0.2, "cpu_s": 0.2},  # Dynamo's side skipped
                    "wall_ratio_64": 0.75}]}
CAPACITY = {"results": [{"trace": "mooncake", "requests": 3993,
                         "wall_s": {"kvsim": 0.5, "kvsim --cache-dir off": 0.9,
                                    "kvcache-simulator": 0.6},
                         "sim_s": {"kvsim": 0.03, "kvcache-simulator": 0.2}}]}


def test_rows_from_each_benchmark() -> None:
    rows = bench_peers.dynamo_rows(DYNAMO, AROUND)
    assert [r["comparison"] for r in rows] == [
        "Dynamo replay, dynamo-kv, kvsim sglang (compiled), 64-token blocks",
        "Dynamo replay, dynamo-kv, kvsim vllm (compiled), 64-token blocks"]
    assert (rows[0]["process_ratio"], rows[0]["sim_ratio"]) == pytest.approx((1.2, 0.75))
    assert rows[1]["process_ratio"] is None and rows[1]["sim_ratio"] == pytest.approx(0.5)
    warm, cold = bench_peers.capacity_rows(CAPACITY, AROUND)
    assert warm["comparison"].endswith("trace cache warm") and cold["comparison"].endswith("off")
    assert (warm["process_ratio"], cold["process_ratio"]) == pytest.approx((0.5 / 0.6, 1.5))
    assert warm["sim_ratio"] == cold["sim_ratio"] == pytest.approx(0.15)
    text = bench_peers.table([*rows, warm, cold])
    assert "1.5-2.0" in text and " - " in text  # the load, and a figure not reported


def test_main_runs_both_and_names_a_missing_peer(monkeypatch, capsys) -> None:
    calls = []

    def fake(name, args):
        calls.append((name, args))
        if name == "capacity":
            return None, "the peer is not installed: make bench installs it", AROUND
        return DYNAMO, "", AROUND

    monkeypatch.setattr(bench_peers, "run_bench", fake)
    assert bench_peers.main(["--repeat", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert calls == [("dynamo", ["--repeat", "2"]),
                     ("capacity", ["--runs", "2", "--scale", "3"])]
    assert len(doc["rows"]) == 2 and doc["notes"] == [
        "capacity: the peer is not installed: make bench installs it"]
    with pytest.raises(SystemExit):
        bench_peers.main(["--only", "plan"])
    assert "benchmarks.bench_peers" not in run_all.bench_modules()  # not run twice by make bench


def test_run_bench_reads_the_json_after_what_a_benchmark_says(monkeypatch) -> None:
    class Done:
        returncode, stderr = 0, ""
        stdout = "dynamo.replay is not importable: skipped\n" + json.dumps(DYNAMO, indent=1)

    monkeypatch.setattr(bench_peers.subprocess, "run", lambda *a, **k: Done())
    doc, said, around = bench_peers.run_bench("dynamo", [])
    assert doc == DYNAMO and said.startswith("dynamo.replay") and around["rc"] == 0
