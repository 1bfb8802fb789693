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
# qwen3-32b on 2 x H100 at SGLang 0.5.23's derived --mem-fraction-static, 0.828 at TP 2 with
# an 8,192-token chunk (tests/test_gpus.py derives both by hand): (int(81559 MiB * 0.828) -
# weights / 2) // (2 * 4 heads * 128 * 64 layers * 2 B), whole blocks (337,216 at 0.9)
QWEN32_2XH100 = 290_240


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
    # issue 53 item 3: a GPU without kernel tables is priced by its own datasheet roofline
    res = run_cli("--gpu", "H100-PCIE", "--replicas", "2", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["runs"][0]["summary"]
    assert s["profile"] == "roofline-h100-pcie-qwen3-8b"
    assert "no kernel tables for H100-PCIE" in s["profile_note"]
    assert "datasheet roofline" in s["profile_note"]
    assert s["gpus"] == 2
    assert "no kernel tables for H100-PCIE" in res.stderr
    s = json.loads(run_cli("--gpu", "A100", "--json").stdout)["runs"][0]["summary"]
    assert (s["profile"], s["profile_note"]) == ("kernels-a100_sxm-qwen3-8b", "")


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
    assert two["profile"] == "kernels-h100_sxm-qwen3-8b-tp2"  # TP 2's own tables (issue 53)
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

    from costmodel.specs import get_spec

    spec = get_spec("qwen3-32b")
    cell = 2 * 4 * 128 * 64 * 2  # 4 KV heads per rank at TP 2
    # SGLang's fraction on an H200 at TP 2: round((143771 - (512 + 12288 + 256 + 976)) /
    # 143771, 3) = 0.902 (graphs: 256 x 2 + 58 prefill sizes x 8 MiB; no 10 GiB floor here)
    h200 = (int(143771 * 2**20 * 0.902) - spec.weight_bytes // 2) // cell // 64 * 64
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


def summary_of(*args: str) -> dict:
    res = run_cli(*args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["runs"][0]["summary"]


def test_kv_bytes_per_gpu_count_the_gpus_they_were_sized_on() -> None:
    # issue 51 D3: one TP for the bytes and the GPU count. qwen3-8b at TP 2: 4 KV heads per
    # rank, 73,728 B a token per GPU: 40 GiB per GPU holds 582,528 tokens on 2 GPUs
    s = summary_of("--gpu-cache", "40GiB", "--tp", "2")
    assert (s["gpu_cache_tokens"], s["gpus"], s["gpus_per_replica"], s["tp"],
            s["kv_tokens_per_gpu"]) == (582_528, 2, 2, 2, 291_264)
    assert "measured on 1 x" in s["profile_note"] and "for TP 2" in s["profile_note"]
    assert s["output_tokens_per_s_per_gpu"] == pytest.approx(s["output_tokens_per_s"] / 2)
    # qwen3-32b's default profile is measured on 2 x H100: TP defaults to it, so 40 GiB per
    # GPU on 2 GPUs (4 heads per rank, 131,072 B a token) holds 327,680 tokens, as --tp 2 does
    s = summary_of("--model", "qwen3-32b", "--gpu-cache", "40GiB")
    assert (s["gpu_cache_tokens"], s["gpus"], s["tp"], s["kv_tokens_per_gpu"]) == (
        (40 << 30) // 131_072, 2, 2, 163_840)
    assert summary_of("--model", "qwen3-32b", "--gpu-cache", "40GiB", "--tp", "2",
                      "--gpu", "H100")["gpu_cache_tokens"] == 327_680
    # and with --gpu: the TP the profile was measured at, the same as --tp 2
    s = summary_of("--model", "qwen3-32b", "--gpu", "H100")
    assert (s["gpu_cache_tokens"], s["gpus"], s["tp"]) == (QWEN32_2XH100, 2, 2)


@pytest.mark.parametrize("args, says", [
    (["--gpu", "H100", "--tp", "3"], "--tp 3 does not fit qwen3-8b"),
    (["--model", "qwen3-32b", "--gpu", "H100", "--tp", "3"], "--tp 3 does not fit qwen3-32b"),
    (["--model", "llama-3.1-70b", "--gpu", "H100", "--tp", "3"], "does not fit llama-3.1-70b"),
    (["--gpu-cache", "40GiB", "--tp", "12"], "--tp 12 does not fit qwen3-8b"),
])
def test_a_tp_the_engines_refuse_is_refused(args, says) -> None:
    # issue 51 D5, new-user G02, G14: vLLM and SGLang refuse TP 3 for 32 or 64 heads
    res = run_cli(*args)
    assert res.exit_code == 2, res.output
    assert says in res.output and "attention heads % tp == 0" in res.output
    assert "Traceback" not in res.output


def test_plan_refuses_a_tp_the_engines_refuse_before_any_point_runs(tmp_path) -> None:
    # new-user P07: plan --tp 3 recommended an impossible deployment
    res = CliRunner().invoke(cli, ["plan", "synthetic:claude-code?sessions=4", "--max-context",
                                   "32k", "--gaps", "tool", "--sessions", "2", "--tp", "1,3",
                                   "--repeats", "1", "--slo", "ttft_p90=30s", "--out",
                                   str(tmp_path / "p")])
    assert res.exit_code == 2, res.output
    assert "tp 3 does not fit qwen3-8b" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "p").exists()


def test_sglang_sizes_at_its_derived_fraction_and_says_so() -> None:
    # issue 51 D7: SGLang 0.5.23 derives --mem-fraction-static: 0.83 on one H100 with an
    # 8,192-token chunk (tests/test_gpus.py); 370,240 tokens of qwen3-8b, not 0.9's 410,880
    res = run_cli("--gpu", "H100", "--json")
    s = json.loads(res.stdout)["runs"][0]["summary"]
    assert (s["gpu_cache_tokens"], s["mem_fraction"]) == (370_240, 0.83)
    assert "SGLang 0.5.23" in s["mem_fraction_source"]
    assert "memory fraction 0.83 (SGLang 0.5.23's --mem-fraction-static default" in res.stderr
    # a given --mem-fraction is used as given
    s = summary_of("--gpu", "H100", "--mem-fraction", "0.9")
    assert (s["gpu_cache_tokens"], s["mem_fraction"], s["mem_fraction_source"]) == (
        410_880, 0.9, "--mem-fraction")


def test_vllm_sizes_by_its_versions_utilization_less_the_reserve() -> None:
    # reference/vllm-034.md: 0.33 (and 0.34 under NIXL P/D) reserve the activation peak and
    # the CUDA graphs inside 0.92 of the GPU; 0.34's extensible cache takes 1.0 less those
    # and max(1 GiB, 0.75 x peak); a given fraction keeps vLLM's meaning (graphs + peak)
    from costmodel.gpus import GIB, get_gpu, kv_cache_tokens
    from costmodel.specs import get_spec

    spec, gpu = get_spec("qwen3-8b"), get_gpu("H100")
    peak, graphs = 1024 * 151936 * 8, GIB  # tests/test_gpus.py
    point = {"gpu": "H100", "engine": "vllm"}
    v34 = resolve_gpu_fields(point, "t")["gpu_cache"]
    assert v34 == kv_cache_tokens(spec, gpu, 1, 1.0, 64, peak + graphs + GIB).tokens == 445_824
    v33 = resolve_gpu_fields({**point, "vllm_version": "0.33"}, "t")["gpu_cache"]
    assert v33 == kv_cache_tokens(spec, gpu, 1, 0.92, 64, peak + graphs).tokens == 406_720
    assert resolve_gpu_fields({**point, "prefill_replicas": 1, "decode_replicas": 1},
                              "t")["gpu_cache"] == v33
    given = resolve_gpu_fields({**point, "mem_fraction": 0.9}, "t")["gpu_cache"]
    assert given == kv_cache_tokens(spec, gpu, 1, 0.9, 64, peak + graphs).tokens == 395_136
    # at 0.99 the 1 GiB margin binds past the 0.8 GiB left outside the fraction
    near = resolve_gpu_fields({**point, "mem_fraction": 0.99}, "t")["gpu_cache"]
    left = int(gpu.memory_bytes * (1 - 0.99))
    assert near == kv_cache_tokens(spec, gpu, 1, 0.99, 64, peak + graphs + GIB - left).tokens
    res = CliRunner().invoke(cli, ["run", *TRACE[:-2], "--engine", "vllm", "--preset", "vllm",
                                   "--gpu", "H100"])
    assert res.exit_code == 0, res.output
    assert "memory fraction 1 (vLLM 0.34's gpu_memory_utilization default, less 3.2 GiB" \
        in res.stderr
