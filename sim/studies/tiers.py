"""The paper's studies with a GPU and a CPU tier: SGLang HiCache (lpm, lpm-cpu, write-back)
against Penelope's unified tiers (``two-tier``), and a CPU tier growing from 1x to 4x the GPU
tier (``cpu-sweep``), with the numbers the paper published (docs/reproduction.md)."""

from __future__ import annotations

from typing import Any

from sim.config import RunConfig
from sim.report.tables import Col
from sim.sweep import relative_change as _change

from .study import MODEL, MODEL_SETUP, QUICK_GPU_CACHE, Experiment, N, StudySetup, run_all

PAPER: dict[str, Any] = {
    "two_tier_lpm_cpu_ttft_change": (-0.37, -0.13),
    "two_tier_penelope_further_ttft_change": (-0.76, -0.46),
    "cpu_sweep": {"4x_sglang_hit_rate": 0.92, "1x_ttft_change": -0.10},
}


def _tiered(cfg: RunConfig, system: str, scheduler: str, cpu: int,
            write_policy: str = "write_through") -> RunConfig:
    """``hicache`` = SGLang (whole-node LRU tail on the device) + HiCache; ``penelope`` =
    unified tiers under lru+private-head+block."""
    preset, tiering = ("sglang", "hicache") if system == "hicache" else ("penelope", "unified")
    return cfg.with_preset(preset).with_fields(tiering=tiering, scheduler=scheduler, cpu_cache=cpu,
                                               hicache_write_policy=write_policy)


def two_tier(ctx: StudySetup) -> list[dict[str, Any]]:
    """A GPU tier 3/4 of the GPU-only cap (so the longest prompts still fit) plus an equal CPU
    tier: SGLang HiCache with lpm, with lpm-cpu (counts CPU-resident prefixes), and
    Penelope's unified tiers."""
    models = ["qwen3-8b"] if ctx.quick else list(MODEL_SETUP)
    ns = [4] if ctx.quick else [4, 8]
    lo, hi = PAPER["two_tier_lpm_cpu_ttft_change"]
    plo, phi = PAPER["two_tier_penelope_further_ttft_change"]
    cases, configs = [], []
    for model in models:
        for n in ns:
            base = ctx.base(model, n)
            gpu = base.cache.gpu_cache * 3 // 4
            base = base.with_fields(gpu_cache=gpu)
            cases.append((model, n, gpu))
            configs += [_tiered(base, "hicache", "lpm", gpu),
                        _tiered(base, "hicache", "lpm-cpu", gpu),
                        _tiered(base, "penelope", "lpm-cpu", gpu),
                        _tiered(base, "hicache", "lpm-cpu", gpu, "write_back")]
    sums = run_all(ctx, configs)
    rows = []
    for i, (model, n, gpu) in enumerate(cases):
        lpm, lpm_cpu, pen, wb = sums[4 * i: 4 * i + 4]
        rows.append({
            "model": model, "sessions": n, "gpu_tokens": gpu, "cpu_tokens": gpu,
            "hicache_lpm_ttft_s": lpm["ttft_mean_s"],
            "hicache_lpm_cpu_ttft_s": lpm_cpu["ttft_mean_s"],
            "penelope_ttft_s": pen["ttft_mean_s"],
            "lpm_cpu_change": _change(lpm_cpu["ttft_mean_s"], lpm["ttft_mean_s"]),
            "penelope_change_vs_lpm_cpu": _change(pen["ttft_mean_s"], lpm_cpu["ttft_mean_s"]),
            "penelope_jct_change_vs_lpm_cpu": _change(pen["jct_mean_s"], lpm_cpu["jct_mean_s"]),
            "hicache_hit_rate": lpm_cpu["hit_rate"] + lpm_cpu["cpu_hit_rate"],
            "penelope_hit_rate": pen["hit_rate"] + pen["cpu_hit_rate"],
            "penelope_swap_buffer_loads": pen["swap_buffer_loads"],
            # Write-through keeps host copies of device nodes, so an equal host tier holds
            # little else; write-back (copy at eviction) is the stronger HiCache baseline.
            "hicache_write_back_ttft_s": wb["ttft_mean_s"],
            "penelope_change_vs_write_back": _change(pen["ttft_mean_s"], wb["ttft_mean_s"]),
            "hicache_write_back_hit_rate": wb["hit_rate"] + wb["cpu_hit_rate"],
            "paper_lpm_cpu_change": f"{lo:+.0%}..{hi:+.0%}",
            "paper_penelope_change": f"{plo:+.0%}..{phi:+.0%}",
        })
    return rows


def cpu_sweep(ctx: StudySetup) -> list[dict[str, Any]]:
    """Qwen3-8B, 8 sessions, fcfs for both, GPU tier 128K, CPU tier 1x..4x the GPU tier."""
    base = ctx.base("qwen3-8b", 8).with_fields(gpu_cache=131072)
    if ctx.quick:
        base = ctx.base("qwen3-8b", 4).with_fields(gpu_cache=QUICK_GPU_CACHE * 3 // 4)
    mults = [1, 2, 4] if ctx.quick else [1, 2, 3, 4]
    configs = []
    for k in mults:
        cpu = k * base.cache.gpu_cache
        configs += [_tiered(base, "hicache", "fcfs", cpu), _tiered(base, "penelope", "fcfs", cpu)]
    sums = run_all(ctx, configs)
    rows = []
    for i, k in enumerate(mults):
        sg, pen = sums[2 * i], sums[2 * i + 1]
        paper = PAPER["cpu_sweep"]["1x_ttft_change"] if k == 1 else (0.0 if k == 4 else None)
        rows.append({
            "cpu_over_gpu": k, "gpu_tokens": base.cache.gpu_cache,
            "cpu_tokens": k * base.cache.gpu_cache,
            "sglang_ttft_s": sg["ttft_mean_s"], "penelope_ttft_s": pen["ttft_mean_s"],
            "ttft_change": _change(pen["ttft_mean_s"], sg["ttft_mean_s"]),
            "jct_change": _change(pen["jct_mean_s"], sg["jct_mean_s"]),
            "sglang_hit_rate": sg["hit_rate"] + sg["cpu_hit_rate"],
            "penelope_hit_rate": pen["hit_rate"] + pen["cpu_hit_rate"],
            "dropped_requests": sg["dropped_requests"],
            "paper_ttft_change": paper,
            "paper_sglang_hit_rate": PAPER["cpu_sweep"]["4x_sglang_hit_rate"] if k == 4 else None,
        })
    return rows


TWO_TIER_LAYOUT = (
    ("mean TTFT (s) with a GPU and a CPU tier",
     (MODEL, N, Col("GPU\ntier", "gpu_tokens", "tokens"),
      Col("CPU\ntier", "cpu_tokens", "tokens"),
      Col("HiCache\nlpm", "hicache_lpm_ttft_s", "s"),
      Col("HiCache\nlpm-cpu", "hicache_lpm_cpu_ttft_s", "s"),
      Col("HiCache\nwrite-back", "hicache_write_back_ttft_s", "s"),
      Col("Penelope", "penelope_ttft_s", "s"))),
    ("mean TTFT changes (paper: ranges over models and N)",
     (MODEL, N, Col("lpm-cpu\nvs lpm", "lpm_cpu_change", "change"),
      Col("paper", "paper_lpm_cpu_change", "paper"),
      Col("Penelope\nvs lpm-cpu", "penelope_change_vs_lpm_cpu", "change"),
      Col("paper", "paper_penelope_change", "paper"),
      Col("Penelope vs\nwrite-back", "penelope_change_vs_write_back", "change"))),
    ("hit rate (GPU + CPU tier) and Penelope's mean JCT",
     (MODEL, N, Col("HiCache\nlpm-cpu", "hicache_hit_rate", "rate"),
      Col("HiCache\nwrite-back", "hicache_write_back_hit_rate", "rate"),
      Col("Penelope", "penelope_hit_rate", "rate"),
      Col("Penelope vs\nlpm-cpu", "penelope_hit_rate", "pp", minus="hicache_hit_rate"),
      Col("swap-buffer\nloads", "penelope_swap_buffer_loads", "int"),
      Col("JCT change\nvs lpm-cpu", "penelope_jct_change_vs_lpm_cpu", "change"))),
)
CPU_SWEEP_LAYOUT = (
    ("mean TTFT and JCT as the CPU tier grows (penelope against sglang + HiCache)",
     (Col("CPU /\nGPU", "cpu_over_gpu", "int"), Col("GPU\ntier", "gpu_tokens", "tokens"),
      Col("CPU\ntier", "cpu_tokens", "tokens"),
      Col("sglang\nTTFT (s)", "sglang_ttft_s", "s"),
      Col("penelope\nTTFT (s)", "penelope_ttft_s", "s"),
      Col("TTFT\nchange", "ttft_change", "change"),
      Col("paper", "paper_ttft_change", "paper"),
      Col("JCT\nchange", "jct_change", "change"))),
    ("hit rate (GPU + CPU tier)",
     (Col("CPU /\nGPU", "cpu_over_gpu", "int"),
      Col("sglang", "sglang_hit_rate", "rate"),
      Col("paper\nsglang", "paper_sglang_hit_rate", "paper_rate"),
      Col("penelope", "penelope_hit_rate", "rate"),
      Col("change", "penelope_hit_rate", "pp", minus="sglang_hit_rate"),
      Col("dropped\nrequests", "dropped_requests", "int"))),
)

TWO_TIER = Experiment("two-tier", two_tier, TWO_TIER_LAYOUT,
                      paper={k: v for k, v in PAPER.items() if k.startswith("two_tier")})
CPU_SWEEP = Experiment("cpu-sweep", cpu_sweep, CPU_SWEEP_LAYOUT,
                       paper={"cpu_sweep": PAPER["cpu_sweep"]})
