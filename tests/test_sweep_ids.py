"""Sweep point ids are the names of result folders users keep: they must not move.

The ids below were computed by kvsim before its sweep code was reorganized: every point of the
shipped sweep files (docs/sweeps/*.yaml, tests/snapshot_sweep.yaml; the ids are in
tests/goldens/sweep_point_ids.json) and one config per way a field can enter or leave an id
(vLLM async on and off, patches, context strategies, fleets with and without a router or its
parameters, pools with default and other knobs, a pool knob without a pool, scratch data).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.config import RunConfig
from sim.sweep import load_sweep, point_id

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "goldens" / "sweep_point_ids.json"
CC_TRACES = REPO.parent / "shared" / "data" / "cc-traces"

CASES = [
    ({}, "bf420daeeaa4"),
    ({"preset": "sglang"}, "32b6a4110287"),
    ({"engine": "vllm", "preset": "vllm"}, "5874aa3be866"),
    ({"engine": "vllm", "preset": "vllm", "vllm_async": False}, "edf76c38e0c4"),
    ({"engine": "sglang", "vllm_async": False}, "bf420daeeaa4"),
    ({"engine": "vllm", "vllm_patch": "penelope", "preset": "vllm"}, "a4f6c437e254"),
    ({"engine": "vllm", "vllm_patch": "continuum", "vllm_async": False}, "fefa19724185"),
    ({"context": "drop:4", "preset": "penelope"}, "3a007e093060"),
    ({"context": "full", "preset": "penelope"}, "6a018ce42e57"),
    ({"replicas": 2}, "7ec747c8510a"),
    ({"replicas": 2, "router": "dynamo-kv"}, "a3db1dfff2ca"),
    ({"replicas": 4, "router": "sglang-cache-aware",
      "router_params": {"balance_abs_threshold": "4"}}, "773568fdafea"),
    ({"router": "round-robin"}, "c03976e2dcd8"),
    ({"pool": 1048576}, "3c989b0ee99e"),
    ({"replicas": 2, "pool": 1048576}, "2f478a299121"),
    ({"replicas": 2, "pool": 1048576, "pool_bandwidth": 10.0, "pool_write": "write-back",
      "pool_watermark": 0.8, "pool_evict_fraction": 0.1, "pool_latency_us": 5.0},
     "a4482d92ef01"),
    ({"pool_bandwidth": 10.0}, "bf420daeeaa4"),
    ({"policy": "ttl?tau_s=5", "scheduler": "lpm"}, "f82ad8366bf2"),
    ({"order": "lfu", "evict": "private-head", "granularity": "block"}, "52c411d8a071"),
    ({"cpu_cache": 65536, "tiering": "hicache", "hicache_write_policy": "write_back"},
     "4c38a1f368c8"),
    ({"trace": "synthetic:codex?sessions=3", "replay": "open", "time_scale": 0.5,
      "max_concurrency": 3}, "63c522a1c38d"),
    ({"extra": {"note": "scratch"}}, "bf420daeeaa4"),
]


@pytest.mark.parametrize("fields, pid", CASES, ids=[str(i) for i in range(len(CASES))])
def test_point_ids_of_configs_stay(fields, pid) -> None:
    assert point_id(RunConfig(**fields)) == pid


@pytest.mark.parametrize("path", sorted(json.loads(GOLDEN.read_text())["files"]))
def test_point_ids_of_the_shipped_sweeps_stay(path, monkeypatch) -> None:
    if "docs/sweeps" in path and not CC_TRACES.is_dir():
        pytest.skip("the docs sweeps replay ../shared/data/cc-traces")
    monkeypatch.chdir(REPO)  # trace paths resolve relative to the working folder
    ids = json.loads(GOLDEN.read_text())["files"][path]
    assert [p.id for p in load_sweep(path).points] == ids
