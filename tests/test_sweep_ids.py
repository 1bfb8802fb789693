"""Sweep point ids are the names of result folders users keep: they must not move.

The ids below are those kvsim gave before ``max_concurrency`` existed (and, for configs
that use it, since): every point of the
shipped sweep files (docs/sweeps/*.yaml, tests/snapshot_sweep.yaml; the ids are in
tests/goldens/sweep_point_ids.json) and one config per way a field can enter or leave an id
(vLLM async on and off, patches, context strategies, fleets with and without a router or its
parameters, pools with default and other knobs, a pool knob without a pool, scratch data).
"""

from __future__ import annotations

import json

import pytest
from conftest import CC_TRACES, REPO

from sim.config import ConfigError, RunConfig
from sim.sweep import load_sweep, point_id

GOLDEN = REPO / "tests" / "goldens" / "sweep_point_ids.json"

CASES = [
    ({}, "90411c5a0aae"),
    ({"preset": "sglang"}, "56a762e352cf"),
    ({"engine": "vllm", "preset": "vllm"}, "ea8de6f0f73c"),
    ({"engine": "vllm", "preset": "vllm", "vllm_async": False}, "86b4bd5e1b6b"),
    ({"engine": "sglang", "vllm_async": True}, "90411c5a0aae"),  # vLLM's default: as unset
    ({"engine": "vllm", "vllm_patch": "penelope", "preset": "vllm"}, "5073a0fe8be7"),
    ({"engine": "vllm", "vllm_patch": "continuum", "vllm_async": False}, "850902d744af"),
    ({"context": "drop:4", "preset": "penelope"}, "402757d83ec7"),
    ({"context": "full", "preset": "penelope"}, "618be4782a09"),
    ({"replicas": 2}, "aa6a8435a501"),
    ({"replicas": 2, "router": "dynamo-kv"}, "61cbf5307958"),
    ({"replicas": 4, "router": "sglang-cache-aware",
      "router_params": {"balance_abs_threshold": "4"}}, "64a5f87b55c9"),
    ({"router": "round-robin"}, "52d52012f49c"),
    ({"pool": 1048576}, "c5911b04cecf"),
    ({"replicas": 2, "pool": 1048576}, "83e0f7f4c937"),
    ({"replicas": 2, "pool": 1048576, "pool_bandwidth": 10.0, "pool_write": "write-back",
      "pool_watermark": 0.8, "pool_evict_fraction": 0.1, "pool_latency_us": 5.0},
     "48f64b34ff6e"),
    ({"pool_bandwidth": 10.0}, "90411c5a0aae"),
    ({"policy": "ttl?tau_s=5", "scheduler": "lpm"}, "2d2f3c9d3be0"),
    ({"order": "lfu", "evict": "private-head", "granularity": "block"}, "c0835a5e8efb"),
    ({"cpu_cache": 65536, "tiering": "hicache", "hicache_write_policy": "write_back"},
     "f99bd61e8509"),
    ({"trace": "synthetic:codex?sessions=3", "replay": "open", "time_scale": 0.5,
      "max_concurrency": 3}, "63c522a1c38d"),
    ({"extra": {"note": "scratch"}}, "90411c5a0aae"),
]


@pytest.mark.parametrize("fields, pid", CASES, ids=[str(i) for i in range(len(CASES))])
def test_point_ids_of_configs_stay(fields, pid) -> None:
    assert point_id(RunConfig.from_flat(**fields)) == pid


def test_a_vllm_knob_off_its_default_cannot_be_an_sglang_point() -> None:
    # it once made an sglang point with vLLM's async off (the id above); now it is refused
    with pytest.raises(ConfigError, match="'vllm_async': is a knob of the vllm engine"):
        RunConfig.from_flat(engine="sglang", vllm_async=False)


@pytest.mark.parametrize("path", sorted(json.loads(GOLDEN.read_text())["files"]))
def test_point_ids_of_the_shipped_sweeps_stay(path, monkeypatch) -> None:
    if "docs/sweeps" in path and not CC_TRACES.is_dir():
        pytest.skip("the docs sweeps replay ../shared/data/cc-traces")
    monkeypatch.chdir(REPO)  # trace paths resolve relative to the working folder
    ids = json.loads(GOLDEN.read_text())["files"][path]
    assert [p.id for p in load_sweep(path).points] == ids
