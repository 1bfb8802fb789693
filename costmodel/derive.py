"""Derive the shipped H100 profiles from datasheet peaks and stated efficiencies.

``python -m costmodel.derive`` prints the derived profiles (YAML) on stdout; ``--out DIR``
writes them as files there; ``--update-shipped`` regenerates the shipped
``costmodel/profiles/derived-h100-*.yaml`` (only then is the repository written). A test checks
the shipped files equal what this module derives, so the numbers never drift from their
reasons. These are *derived, not measured*: the default profiles are the measured-kernel ones
(``kernels-h100_sxm-*``, ``kvsim calibrate --from-kernels``); these stay for comparison
(docs/calibration.md), and ``kvsim calibrate`` measures real ones on a GPU. A model without
shipped profiles (the config.json catalog, ``--model path/config.json``) is priced by
``derive(model)`` when asked (``costmodel/profile.py`` ``derivable``; docs/models.md).
"""

from __future__ import annotations

from pathlib import Path

from .gpus import decode_read_bytes
from .profile import DecodeCoeffs, PrefillCoeffs, Profile, TransferCoeffs
from .specs import ModelSpec, get_spec, model_names

# NVIDIA H100 SXM5 80GB datasheet.
H100_BF16_DENSE_FLOPS = 989.4e12
H100_HBM_BYTES_PER_S = 3.35e12
PCIE5_X16_BYTES_PER_S = 64e9  # per direction

# Stated efficiencies (fractions of peak) -- assumptions, not measurements.
EFF_LINEAR = 0.62  # large bf16 GEMMs in prefill
EFF_ATTENTION = 0.60  # FlashAttention-3 causal prefill, head_dim 128
EFF_HBM = 0.80  # decode: streaming weights and KV
EFF_PCIE = 0.80  # pinned-memory cudaMemcpyAsync
EFF_TP = 0.85  # tensor-parallel communication overhead on throughput when gpus > 1
PREFILL_FIXED_S = 0.004  # scheduling, launches, sampling per prefill batch
DECODE_FIXED_S = 0.003  # per decode step (CUDA graph replay, sampling, scheduling)
DECODE_PER_SEQ_S = 2e-5
TRANSFER_LATENCY_S = 2e-5

# Effective bf16 FLOP/s of the hybrid kinds' attention kernels on one H100 SXM, fitted to
# aiconfigurator-core 0.12.0's h100_sxm tables (MLA: mla/sglang/0.5.14 context_mla_perf; DSA:
# sparse_attention/trtllm/1.3.0rc23 dsa_context_module_perf less its projections; Gated
# DeltaNet: linear_attention/sglang/0.5.14 gdn_perf chunk_gated_delta_rule) by
# ``python -m calibration.kernels.hybrid`` (tests/test_hybrid_sizing.py refits them).
KIND_FLOPS_H100 = {"mla": 1.6570e14, "dsa": 7.1130e13, "linear": 2.8566e13}
KIND_RATES_SOURCE = ("aiconfigurator-core 0.12.0 h100_sxm kernel tables "
                     "(calibration/kernels/hybrid.py; docs/hybrid.md, Profiles)")

# GPUs per model: enough HBM for weights plus the paper's KV caps.
GPUS = {
    "qwen3-8b": 1, "qwen3-32b": 2, "qwen3-235b-a22b": 8, "llama-3.1-8b": 1,
    "llama-3.1-70b": 4, "gpt-oss-120b": 1, "gemma-3-27b": 1,
}


def kind_rates(spec: ModelSpec, flops_scale: float) -> tuple[tuple[str, float], ...]:
    """Seconds per attention unit of each of ``spec``'s kinds with a fitted kernel
    (``KIND_FLOPS_H100`` x ``flops_scale``: GPUs, TP efficiency and peak over the H100's)."""
    return tuple((str(k), 2 * spec.macs_per_unit / (KIND_FLOPS_H100[k] * flops_scale))
                 for k in sorted(spec.kind_counts()) if k in KIND_FLOPS_H100)


def derive(model: str) -> Profile:
    spec = get_spec(model)
    gpus = GPUS.get(model, 1)
    tp = EFF_TP if gpus > 1 else 1.0
    rates = kind_rates(spec, gpus * tp)
    flops_per_unit = 2 * spec.macs_per_unit
    lin = flops_per_unit / (gpus * H100_BF16_DENSE_FLOPS * EFF_LINEAR * tp)
    attn = flops_per_unit / (gpus * H100_BF16_DENSE_FLOPS * EFF_ATTENTION * tp)
    hbm = gpus * H100_HBM_BYTES_PER_S * EFF_HBM * tp
    weights_s = spec.weight_read_bytes() / hbm
    per_ctx, per_seq = decode_read_bytes(spec, gpus, gpus)
    pcie = gpus * PCIE5_X16_BYTES_PER_S * EFF_PCIE
    return Profile(
        name=f"derived-h100-{model}", model=model, gpus=gpus,
        device=f"NVIDIA H100 80GB SXM x{gpus} (datasheet)",
        provenance="derived, not measured",
        prefill=PrefillCoeffs(PREFILL_FIXED_S, lin, attn, 0.0),
        decode=DecodeCoeffs(DECODE_FIXED_S, weights_s, DECODE_PER_SEQ_S + per_seq / hbm,
                            per_ctx / hbm),
        transfer=TransferCoeffs(pcie, pcie, TRANSFER_LATENCY_S),
        details={
            "derived_by": "costmodel/derive.py",
            "peak_bf16_flops_per_gpu": H100_BF16_DENSE_FLOPS,
            "hbm_bytes_per_s_per_gpu": H100_HBM_BYTES_PER_S,
            "pcie_bytes_per_s_per_gpu": PCIE5_X16_BYTES_PER_S,
            "efficiency": {"linear": EFF_LINEAR, "attention": EFF_ATTENTION, "hbm": EFF_HBM,
                           "pcie": EFF_PCIE, "tensor_parallel": tp},
            "flops_per_unit": flops_per_unit,
        } | ({"attention_rates": f"{KIND_RATES_SOURCE}, measured on H100"} if rates else {}),
        attention_rates=rates,
    )


def roofline(gpu_name: str, model: str, tp: int | None = None) -> Profile:
    """A GPU's *datasheet roofline* profile (a GPU without kernel tables: RTX 4090, H100
    PCIe, H20), derived as :func:`derive` derives the H100's: the catalog's dense bf16 peak,
    memory and PCIe bandwidth (``costmodel/data/gpus.yaml``, with their sources) at the same
    stated efficiencies and fixed terms, on ``tp`` GPUs (default: the model's ``GPUS``). In
    place of ``EFF_TP``, tensor parallelism pays its two all-reduces per layer over the GPU's
    own link (ring: ``2 (tp-1)/tp x tokens x hidden x 2 bytes`` each, one direction of NVLink
    where the GPU has it, else PCIe), per token in prefill and per sequence in decode; a decode
    step reads what each group's attention reads, each rank its share from its own memory
    (``decode_read_bytes``), as :func:`derive`'s does. Named
    ``roofline-<gpu>-MODEL[-tpN]`` and labelled "datasheet roofline" in its device and
    provenance: every output that names the profile says it was not measured."""
    from .gpus import get_gpu, roofline_profile_name

    gpu, spec = get_gpu(gpu_name), get_spec(model)
    gpus = tp or GPUS.get(model, 1)
    peak, hbm1 = gpu.bf16_tflops * 1e12, gpu.hbm_tb_s * 1e12
    link = (gpu.nvlink_gb_s / 2 if gpu.nvlink_gb_s > 0 else gpu.pcie_gb_s) * 1e9
    flops_per_unit = 2 * spec.macs_per_unit
    lin = flops_per_unit / (gpus * peak * EFF_LINEAR)
    attn = flops_per_unit / (gpus * peak * EFF_ATTENTION)
    hbm = gpus * hbm1 * EFF_HBM
    # all-reduce seconds per token per layer; a linear unit is W per token per layer
    allreduce = 2 * (2 * (gpus - 1) / gpus) * spec.hidden * spec.dtype_bytes / link
    pcie = gpus * gpu.pcie_gb_s * 1e9 * EFF_PCIE
    per_ctx, per_seq = decode_read_bytes(spec, gpus, gpus)
    link_kind = "NVLink" if gpu.nvlink_gb_s > 0 else "PCIe"
    rates = kind_rates(spec, gpus * peak / H100_BF16_DENSE_FLOPS)
    return Profile(
        name=roofline_profile_name(gpu.name, model, gpus), model=model, gpus=gpus,
        device=f"{gpu.name} x{gpus} (datasheet roofline)",
        provenance=f"datasheet roofline, not measured: {gpu.source}",
        prefill=PrefillCoeffs(PREFILL_FIXED_S, lin + allreduce / spec.W, attn, 0.0),
        decode=DecodeCoeffs(DECODE_FIXED_S, spec.weight_read_bytes() / hbm,
                            DECODE_PER_SEQ_S + allreduce * spec.layers + per_seq / hbm,
                            per_ctx / hbm),
        transfer=TransferCoeffs(pcie, pcie, TRANSFER_LATENCY_S),
        details={
            "derived_by": "costmodel/derive.py roofline",
            "gpu": gpu.name, "gpu_source": gpu.source,
            "peak_bf16_flops_per_gpu": peak, "hbm_bytes_per_s_per_gpu": hbm1,
            "pcie_bytes_per_s_per_gpu": gpu.pcie_gb_s * 1e9,
            "tensor_parallel": {"gpus": gpus, "link": link_kind,
                                "link_bytes_per_s_one_direction": link,
                                "allreduce_s_per_token_per_layer": allreduce},
            "efficiency": {"linear": EFF_LINEAR, "attention": EFF_ATTENTION, "hbm": EFF_HBM,
                           "pcie": EFF_PCIE},
            "flops_per_unit": flops_per_unit,
        } | ({"attention_rates": f"{KIND_RATES_SOURCE}: the H100's rates at this GPU's "
                                 "peak (derived, not measured)"} if rates else {}),
        attention_rates=rates,
    )


def main(argv: list[str] | None = None) -> None:
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m costmodel.derive", description=(
        "Print the datasheet-derived H100 profiles (YAML), or write them as files."))
    ap.add_argument("--model", choices=model_names(), help="one model [default: all]")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR", help="write derived-h100-MODEL.yaml files here")
    where.add_argument("--update-shipped", action="store_true",
                       help="regenerate the shipped costmodel/profiles/derived-h100-*.yaml")
    args = ap.parse_args(argv)
    models = [args.model] if args.model else model_names()
    if not args.out and not args.update_shipped:
        sys.stdout.write("---\n".join(derive(m).to_yaml() for m in models))
        return
    out = Path(__file__).parent / "profiles" if args.update_shipped else Path(args.out)
    if out.exists() and not out.is_dir():
        ap.error(f"--out {out}: exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    for model in models:
        derive(model).dump(out / f"derived-h100-{model}.yaml")
        print(f"wrote {out / f'derived-h100-{model}.yaml'}", file=sys.stderr)


if __name__ == "__main__":
    main()
