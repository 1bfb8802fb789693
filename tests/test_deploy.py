"""Runs in GPUs (sim/deploy.py): --gpu/--tp/--mem-fraction, --gpu-cache in bytes, refusals."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import ConfigError
from sim.deploy import parse_kv_bytes, resolve_gpu_fields

TRACE = ["--trace", "synthetic:claude-code?sessions=4", "--max-context", "32k",
         "--gaps", "tool", "--sessions", "2", "--preset", "sglang"]
# qwen3-32b on 2 x H100 at 0.9 (tests/test_gpus.py derives it by hand from the spec):
# (int(81559 MiB * 0.9) - weights / 2) // (2 * 4 heads * 128 * 64 layers * 2 B), whole blocks
QWEN32_2XH100 = 337_216


def run_cli(*args: str):
    return CliRunner().invoke(cli, ["run", *TRACE, *args])


def test_h100_tp2_qwen3_32b_gives_the_hand_computed_tokens_and_says_so() -> None:
    res = run_cli("--model", "qwen3-32b", "--gpu", "H100", "--tp", "2", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["runs"][0]["summary"]
    assert s["gpu_cache_tokens"] == QWEN32_2XH100
    assert (s["gpu"], s["tp"], s["gpus"], s["gpus_per_replica"]) == ("H100", 2, 2, 2)
    assert s["kv_tokens_per_gpu"] == QWEN32_2XH100 // 2
    assert s["profile"] == "kernels-h100_sxm-qwen3-32b" and s["profile_note"] == ""
    assert f"KV cache {QWEN32_2XH100:,} tokens per replica" in res.stderr
    assert "2 x H100 (1 replica x TP 2)" in res.stderr


def test_a_gpu_without_a_measured_profile_says_what_priced_it() -> None:
    res = run_cli("--gpu", "A100", "--replicas", "2", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["runs"][0]["summary"]
    assert s["profile"] == "kernels-h100_sxm-qwen3-8b"
    assert "no measured profile for A100" in s["profile_note"]
    assert s["gpus"] == 2
    assert "no measured profile for A100" in res.stderr


def test_kv_bytes_per_gpu_become_tokens_through_the_models_kv_bytes() -> None:
    # qwen3-8b: 8 KV heads x 128 x 36 layers x K,V x 2 bytes = 147,456 bytes per token;
    # at TP 2 each rank holds 4 heads: 73,728 bytes per token per GPU
    assert parse_kv_bytes("40GiB") == 40 << 30 and parse_kv_bytes("256k") is None
    assert parse_kv_bytes("80GB") == 80 * 10**9 and parse_kv_bytes("3mb") is None
    one = resolve_gpu_fields({"gpu_cache": "40GiB", "model": "qwen3-8b"}, "t")
    assert one["gpu_cache"] == (40 << 30) // 147_456 // 64 * 64
    two = resolve_gpu_fields({"gpu_cache": "40GiB", "model": "qwen3-8b", "tp": 2,
                              "gpu": "H100"}, "t")
    assert two["gpu_cache"] == (40 << 30) // 73_728 // 64 * 64
    assert two["profile"] == "kernels-h100_sxm-qwen3-8b"
    res = run_cli("--gpu-cache", "4GiB", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["runs"][0]["summary"]
    assert s["gpu_cache_tokens"] == (4 << 30) // 147_456 // 64 * 64
    assert s["kv_bytes_per_gpu"] == 4 << 30


@pytest.mark.parametrize("args, says", [
    (["--tp", "2"], "--tp does nothing here"),
    (["--mem-fraction", "0.8"], "--mem-fraction does nothing here"),
    (["--gpu", "H100", "--gpu-cache", "96k"], "contradicts --gpu H100"),
    (["--gpu", "H100", "--gpu-cache", "40GiB", "--mem-fraction", "0.8"],
     "--mem-fraction does nothing here"),
    (["--gpu", "H100", "--gpu-cache", "90GiB"], "does not fit --gpu H100"),
    (["--gpu", "Z9"], "unknown GPU 'Z9'"),
    (["--model", "qwen3-235b-a22b", "--gpu", "H100", "--tp", "2"], "leave no room"),
])
def test_contradicting_or_idle_gpu_options_are_refused(args, says) -> None:
    res = run_cli(*args)
    assert res.exit_code == 2, res.output
    assert says in res.output
    assert "Traceback" not in res.output


def test_the_gpu_derived_tokens_equal_the_explicit_ones() -> None:
    same = resolve_gpu_fields({"gpu": "H100", "tp": 2, "model": "qwen3-32b",
                               "gpu_cache": QWEN32_2XH100}, "t")
    assert same["gpu_cache"] == QWEN32_2XH100
    with pytest.raises(ConfigError, match="contradicts"):
        resolve_gpu_fields({"gpu": "H100", "model": "qwen3-32b", "tp": 2,
                            "gpu_cache": QWEN32_2XH100 + 64}, "t")


def test_a_sweep_grid_of_gpus_derives_each_points_tokens(tmp_path) -> None:
    import yaml

    from costmodel.gpus import weight_bytes
    from costmodel.specs import get_spec

    spec = get_spec("qwen3-32b")
    cell = 2 * 4 * 128 * 64 * 2  # 4 KV heads per rank at TP 2
    h200 = (int(143771 * 2**20 * 0.9) - weight_bytes(spec) // 2) // cell // 64 * 64
    cfg = {"base": {"trace": "synthetic:claude-code?sessions=4", "max_context": "32k",
                    "gaps": "tool", "sessions": 2, "preset": "sglang", "model": "qwen3-32b",
                    "tp": 2},
           "grid": {"gpu": ["H100", "H200"]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "s.yaml"), "--out",
                                   str(tmp_path / "o"), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [r["gpu_cache_tokens"] for r in rows] == [QWEN32_2XH100, h200]
    assert [r["profile"] for r in rows] == ["kernels-h100_sxm-qwen3-32b",
                                            "kernels-h200_sxm-qwen3-32b"]
    # tp without a gpu does nothing in a sweep file either
    del cfg["grid"]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "t.yaml"), "--out",
                                   str(tmp_path / "p")])
    assert res.exit_code == 2 and "base.tp" in res.output and "does nothing" in res.output
