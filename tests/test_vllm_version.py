"""The vLLM release modelled (``VllmKnobs.vllm_version``, ``--vllm-version``; issue 51 item 6):
0.34 by default, 0.33 kept; 0.34's opt-in cache-aware admission as engine knobs (refused by
name under 0.33). docs/engine.md (versions) says which default comes from which release."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import DEFAULTS, ConfigError, RunConfig
from sim.sweep import point_id

SYN = "synthetic:chat?sessions=2&max_requests=2"


def test_the_newest_release_is_the_default_and_its_point_ids_are_as_before() -> None:
    cfg = RunConfig.from_flat(engine="vllm")
    assert cfg.engine.vllm_version == DEFAULTS["vllm_version"] == "0.34"
    assert cfg.engine.vllm_cache_aware_window == 0
    # the default leaves a saved sweep's ids alone; another release is another point
    assert point_id(RunConfig.from_flat(engine="vllm", vllm_version="0.34")) == point_id(cfg)
    assert point_id(RunConfig.from_flat(engine="vllm", vllm_version="0.33")) != point_id(cfg)


@pytest.mark.parametrize("flat, field, needle", [
    ({"vllm_version": "0.35"}, "vllm_version", "unknown vLLM version"),
    ({"vllm_version": "0.33", "vllm_cache_aware_window": 8}, "vllm_cache_aware_window",
     "new in vLLM 0.34"),
    ({"vllm_cache_aware_window": -1}, "vllm_cache_aware_window", "integer >= 0"),
    ({"vllm_cache_aware_window": 4, "vllm_cache_aware_threshold": 1.5},
     "vllm_cache_aware_threshold", r"in \[0, 1\]"),
])
def test_bad_values_are_refused_by_name(flat, field, needle) -> None:
    with pytest.raises(ConfigError, match=needle) as e:
        RunConfig.from_dict({"engine": "vllm", **flat}, "sweep.yaml point 0")
    assert e.value.field == field


def _run_syn(*extra: str):
    return CliRunner().invoke(cli, ["run", "--trace", SYN, "--gpu-cache", "16k", *extra])


def test_the_cli_option_reaches_the_config_and_the_sglang_engine_refuses_it() -> None:
    res = _run_syn("--engine", "vllm", "--vllm-version", "0.33", "--json")
    assert res.exit_code == 0, res.stderr
    res = _run_syn("--engine", "sglang", "--vllm-version", "0.33")
    assert res.exit_code == 2 and "vllm_version" in res.stderr
    res = _run_syn("--engine", "vllm", "--vllm-version", "0.33", "--vllm-cache-aware-window", "4")
    assert res.exit_code == 2 and "new in vLLM 0.34" in res.stderr, res.stderr
    res = _run_syn("--engine", "vllm", "--vllm-cache-aware-threshold", "0.7")
    assert res.exit_code == 2
    assert "--vllm-cache-aware-threshold does nothing here" in res.stderr, res.stderr


def test_the_run_names_the_release_and_what_0_33_deployed() -> None:
    res = _run_syn("--engine", "vllm", "--vllm-version", "0.33")
    assert res.exit_code == 0, res.stderr
    assert "vllm engine (vLLM 0.33, async on)" in res.stdout
    assert "vLLM 0.33 deployed 16-token KV blocks on CUDA by default (0.34: 64); this run " \
        "keeps --block-size 64" in res.stderr
    res = _run_syn("--engine", "vllm", "--vllm-version", "0.33", "--block-size", "16")
    assert res.exit_code == 0 and "deployed 16-token" not in res.stderr


def test_max_num_inflight_kv_loads_is_refused_by_name() -> None:
    res = _run_syn("--engine", "vllm", "--prefill-replicas", "1", "--decode-replicas", "1",
               "--max-num-inflight-kv-loads", "4")
    assert res.exit_code == 2
    assert "--max-num-inflight-kv-loads" in res.stderr
    assert "kvsim does not model vLLM 0.34's cap on KV loads in flight" in res.stderr


# --- 0.34's cache-aware admission in runs (its steps: tests/test_vllm_sched_diff.py) ---------
def _runs_of(monkeypatch, cfg, trace):
    """The run with decode runs and with one event per V1 step: identical."""
    import numpy as np

    from sim.engines import VllmServer
    from sim.run import run

    fast = run(cfg, trace)
    monkeypatch.setattr(VllmServer, "decode_runs", False)
    slow = run(cfg, trace)
    monkeypatch.undo()
    for col in ("hit_gpu_tokens", "recomputed_tokens", "retractions", "decoded_tokens"):
        assert fast.requests[col].tolist() == slow.requests[col].tolist(), col
    for col in ("ttft_s", "end_s", "admit_s"):
        np.testing.assert_allclose(fast.requests[col], slow.requests[col], rtol=1e-9)
    return fast.requests.sort_values("request")


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_cache_aware_admission_admits_the_cached_prefix_once_usage_reaches_the_threshold(
        monkeypatch, asynchronous) -> None:
    """A 40-block pool: A (10 blocks) decodes 1,000 tokens; X (31 blocks, nothing cached)
    and Y (4 blocks, 2 cached: A's) wait, X first. FCFS: X blocks Y until A has finished.
    With a window of 8 and threshold 0.5 nothing moves at first (usage 10/40); A's decode
    fills blocks until usage reaches 0.5, and that step puts Y, the deeper cached prefix,
    before X: Y is admitted while A still decodes. So no decode run is taken while requests
    wait under the window (the run equals one event per step)."""
    from tests.enginekit import KitTrace

    trace = KitTrace([[(640, 1000, 0.0)], [(1950, 10, 0.0)], [(193, 10, 0.0)]],
                     shared_blocks=[2, 0, 2])

    def cfg(window: int) -> RunConfig:
        return RunConfig.from_flat(engine="vllm", gpu_cache=2560, sessions=3,
                                   profile="derived-h100-qwen3-8b", vllm_async=asynchronous,
                                   vllm_cache_aware_window=window,
                                   vllm_cache_aware_threshold=0.5).with_preset("vllm")

    fcfs = _runs_of(monkeypatch, cfg(0), trace)
    aware = _runs_of(monkeypatch, cfg(8), trace)
    a_end = fcfs["end_s"].iloc[0]
    assert fcfs["admit_s"].tolist()[1:] == [a_end] * 2  # X and Y once A has finished
    assert aware["admit_s"].iloc[2] < 0.6 * a_end < aware["admit_s"].iloc[1]
    assert aware["hit_gpu_tokens"].iloc[2] == 128


def test_an_unquoted_yaml_release_reads_as_the_release() -> None:
    import yaml

    raw = yaml.safe_load("engine: vllm\nvllm_version: 0.33")
    assert raw["vllm_version"] == 0.33  # a number, as YAML reads it
    assert RunConfig.from_dict(raw).engine.vllm_version == "0.33"
    with pytest.raises(ConfigError, match="unknown vLLM version"):
        RunConfig.from_dict({"engine": "vllm", "vllm_version": 0.3})
