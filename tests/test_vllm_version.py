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


def _run(*extra: str):
    return CliRunner().invoke(cli, ["run", "--trace", SYN, "--gpu-cache", "16k", *extra])


def test_the_cli_option_reaches_the_config_and_the_sglang_engine_refuses_it() -> None:
    res = _run("--engine", "vllm", "--vllm-version", "0.33", "--json")
    assert res.exit_code == 0, res.stderr
    res = _run("--engine", "sglang", "--vllm-version", "0.33")
    assert res.exit_code == 2 and "vllm_version" in res.stderr
    res = _run("--engine", "vllm", "--vllm-version", "0.33", "--vllm-cache-aware-window", "4")
    assert res.exit_code == 2 and "new in vLLM 0.34" in res.stderr, res.stderr
    res = _run("--engine", "vllm", "--vllm-cache-aware-threshold", "0.7")
    assert res.exit_code == 2
    assert "--vllm-cache-aware-threshold does nothing here" in res.stderr, res.stderr
