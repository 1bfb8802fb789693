"""Every GPU and shape priced as itself (issue 53 item 3): the kernel-table profiles of every
system aiconfigurator-core measured, per engine lane and TP (calibration/kernels/ship.py), the
datasheet roofline of a GPU without tables (costmodel/derive.py ``roofline``), and the choice
between them (costmodel/gpus.py ``profile_for``)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from costmodel.gpus import get_gpu, load_gpus, profile_for
from costmodel.profile import load_profile, shipped_profiles
from costmodel.specs import get_spec
from costmodel.units import ranges_units
from sim.cli.main import cli

PROMPT = [(0, 8192)]  # one 8K-token prompt, no cached prefix: inside the measured 16K


def prefill_ms(gpu: str, model: str, tp: int, engine: str = "sglang") -> float:
    choice = profile_for(get_gpu(gpu), model, tp, engine)
    return 1e3 * load_profile(choice.name, model).prefill_seconds(
        ranges_units(get_spec(model), PROMPT))


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("model", ["qwen3-8b", "llama-3.1-8b"])
def test_each_gpu_has_its_own_profile_ordered_as_the_hardware(model, engine) -> None:
    gpus = ("B200", "H200", "H100", "A100", "L40S")
    names = [profile_for(get_gpu(g), model, 1, engine) for g in gpus]
    assert all(c.exact for c in names) and len({c.name for c in names}) == len(gpus)
    t = {g: prefill_ms(g, model, 1, engine) for g in gpus}
    # H200 is an H100 with more and faster memory, equal compute: its measured tables are
    # within 3% of the H100's on prefill (vLLM's llama-3.1-8b 2.1% slower, SGLang's faster)
    assert t["B200"] < t["H200"] <= 1.03 * t["H100"] < t["A100"] < t["L40S"]
    assert t["B200"] < 0.6 * t["H100"] and t["A100"] > 2 * t["H100"]


@pytest.mark.parametrize("gpu", ["H100", "A100", "B200", "RTX-PRO-6000"])
def test_a_tp2_replica_prefills_faster_than_tp1_where_the_tables_say_so(gpu) -> None:
    for engine in ("sglang", "vllm"):
        for model in ("qwen3-8b", "qwen3-32b"):
            tp1, tp2 = (profile_for(get_gpu(gpu), model, tp, engine) for tp in (1, 2))
            assert tp1.exact and tp2.exact and tp1.name != tp2.name
            assert load_profile(tp2.name).gpus == 2 and load_profile(tp1.name).gpus == 1
            assert prefill_ms(gpu, model, 2, engine) < 0.9 * prefill_ms(gpu, model, 1, engine)
    # the all-reduce rides the replica's link: PCIe on the RTX PRO 6000 server buys less
    # than NVLink on the H100 (qwen3-8b, one 8K prompt)
    def gain(g: str) -> float:
        return prefill_ms(g, "qwen3-8b", 1) / prefill_ms(g, "qwen3-8b", 2)

    assert gain("RTX-PRO-6000") < gain("H100")


def test_rtx_4090_is_priced_by_its_datasheet_roofline_and_labelled_so() -> None:
    gpu = get_gpu("RTX4090")
    # 165.2 TFLOPS dense bf16 tensor (FP32 accumulate); 82.6 is the FP32 CUDA-core rate
    assert (gpu.bf16_tflops, gpu.hbm_tb_s, gpu.memory_mib, gpu.profile) == (165.2, 1.008, 24564,
                                                                           None)
    choice = profile_for(gpu, "llama-3.1-8b", 1, "vllm")
    prof = load_profile(choice.name, "llama-3.1-8b")
    assert prof.name == "roofline-rtx4090-llama-3.1-8b" not in shipped_profiles()
    assert "datasheet roofline" in prof.device and "datasheet roofline" in prof.provenance
    assert "datasheet roofline" in choice.note and not choice.exact
    spec = get_spec("llama-3.1-8b")
    # decode reads every weight once a step at 80% of 1,008 GB/s (costmodel/derive.py)
    assert prof.decode.weights_s == pytest.approx(spec.active_params * 2 / (0.8 * 1.008e12))
    # TP 2 pays its all-reduces over PCIe (no NVLink on a 4090): 2 per layer, ring
    tp2 = load_profile(profile_for(gpu, "llama-3.1-8b", 2, "vllm").name)
    ring = 2 * (2 * 1 / 2) * spec.hidden * 2 / 32e9
    assert tp2.gpus == 2 and tp2.details["tensor_parallel"]["link"] == "PCIe"
    assert tp2.prefill.per_linear_unit_s == pytest.approx(
        prof.prefill.per_linear_unit_s / 2 + ring / spec.W)


def test_run_names_the_roofline_and_a_substitute_is_never_silent(tmp_path) -> None:
    trace = ["synthetic:claude-code?sessions=4", "--max-context", "32k", "--gaps", "tool",
             "--sessions", "2"]
    res = CliRunner().invoke(cli, ["run", "--trace", *trace, "--engine", "vllm", "--model",
                                   "llama-3.1-8b", "--gpu", "RTX4090", "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["runs"][0]["summary"]
    assert s["profile"] == "roofline-rtx4090-llama-3.1-8b"
    assert "datasheet roofline" in s["profile_note"] and "datasheet roofline" in res.stderr
    # a GPU with its own tables at this shape: named, no note
    res = CliRunner().invoke(cli, ["run", "--trace", *trace, "--engine", "vllm", "--model",
                                   "llama-3.1-8b", "--gpu", "RTX-PRO-6000", "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["runs"][0]["summary"]
    assert (s["profile"], s["profile_note"]) == ("kernels-rtx_pro_6000_server-vllm-llama-3.1-8b",
                                                 "")
    # every catalog GPU without its own profile at a shape gets a note
    for g in load_gpus().values():
        for tp in (1, 2, 4, 8):
            c = profile_for(g, "qwen3-32b", tp, "vllm")
            assert c.exact or c.note, (g.name, tp)


def test_a_tp_the_heads_do_not_divide_is_refused() -> None:
    res = CliRunner().invoke(cli, ["run", "--trace", "synthetic:claude-code?sessions=2",
                                   "--model", "qwen3-32b", "--gpu", "H100", "--tp", "3"])
    assert res.exit_code == 2 and "TP sizes that fit: 1, 2, 4, 8, 16" in res.output


def test_dp2_ep2_is_priced_as_its_own_shape_or_said() -> None:
    """The Qwen3-30B-A3B ground-truth run (vLLM --data-parallel-size 2
    --enable-expert-parallel on RTX PRO 6000): each DP rank is a replica whose MoE layer runs
    both ranks' tokens on half the experts between an NCCL all-gather and reduce-scatter over
    PCIe (calibration/kernels/compose.py)."""
    gpu = get_gpu("RTX-PRO-6000")
    ep = profile_for(gpu, "qwen3-30b-a3b", 1, "vllm", ep=2)
    assert ep.exact and ep.name == "kernels-rtx_pro_6000_server-vllm-qwen3-30b-a3b-dp2ep2"
    prof, tp1 = load_profile(ep.name), load_profile(profile_for(gpu, "qwen3-30b-a3b", 1,
                                                                "vllm").name)
    assert prof.gpus == 1 and "DP2 x EP2" in prof.device
    assert prof.details["tables"]["ep_dispatch_all_gather"]["kernel_source"] == \
        "nccl all_gather"
    assert prof.details["tables"]["moe"]["moe_ep_size"] == 2
    # the group's tokens and the dispatch over PCIe cost more per token than one GPU alone
    assert prof.prefill.per_linear_unit_s > tp1.prefill.per_linear_unit_s
    # a shape without its own profile is priced as TP replicas, and the note says so
    dense = profile_for(gpu, "qwen3-8b", 1, "vllm", ep=2)
    assert not dense.exact and "DP2 x EP2" in dense.note and "not priced" in dense.note


def test_the_shipped_matrix_regenerates_on_a_sample() -> None:
    """``python -m calibration.kernels.ship`` wrote the files; three of them fitted again."""
    pytest.importorskip("aiconfigurator_core")
    from calibration.kernels import ship

    sample = [("rtx_pro_6000_server", "vllm", "llama-3.1-8b", 1),
              ("h100_sxm", "vllm", "qwen3-32b", 2), ("l40s", "sglang", "qwen3-8b", 2)]
    fresh = {p.name: p for p in (ship.fit_matrix_one(*x) for x in sample)}
    ep = ship.fit_matrix_one("rtx_pro_6000_server", "vllm", "qwen3-30b-a3b", 1, ep=2)
    fresh[ep.name] = ep
    assert ship.differences(fresh) == [], "run python -m calibration.kernels.ship"
    planned = {ship.profile_name(s, ln, m, tp) for s, ln, m, tp in ship.matrix()}
    planned |= {ship.profile_name(s, ln, m, 1, e) for s, ln, m, e in ship.ep_matrix()}
    names = set(shipped_profiles())
    kernels = {n for n in names if n.startswith("kernels-")}
    assert kernels <= planned | set(ship.shipped_names())
    for system in ("h100_sxm", "h200_sxm", "b200_sxm", "a100_sxm", "l40s",
                   "rtx_pro_6000_server"):
        for lane in ("", "vllm-"):
            assert f"kernels-{system}-{lane}llama-3.1-8b" in names
