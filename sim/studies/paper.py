"""The paper's experiments by name, with its published numbers beside ours.

Each experiment is a function ``(ctx) -> rows`` registered under the name users type in
``kvsim reproduce NAME``. The numbers the paper published are in ``PAPER`` (listed beside
ours in docs/reproduction.md); where the seed gives no number, none is invented.

Defaults follow the paper's setup (docs/reproduction.md, Setup): the 24
Claude Code sessions with most requests after the context cut, a 15.6K-token shared prefix,
the cache-aware scheduler (lpm) for every system, GPU KV caps 256K / 192K / 384K tokens for
Qwen3 8B / 32B / 235B-A22B, and the recorded *tool* waits as the gap model (the paper replays
"the recorded tool time"). Without ``--trace`` the shared cc-traces are used when present, else
the synthetic Claude Code trace. ``--quick`` shrinks every run to seconds (tests, notebooks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sim import exp_continuum, exp_fleet, exp_policies
from sim.config import RunConfig
from sim.report.progress import current as current_progress
from sim.sweep import relative_change as _change
from sim.sweep.executors import ExecutorSpec

REPO = Path(__file__).resolve().parent.parent
SHARED_CC_TRACES = REPO.parent / "shared" / "data" / "cc-traces"
SHARED_PREFIX = 15974  # 15.6K tokens (K = 1024)
# --quick: the 8 sessions with most requests under 64K tokens, 4 at a time, in 96K tokens.
QUICK_SELECT = "top-requests:8"
QUICK_CONTEXT = 65536
QUICK_GPU_CACHE = 98304

# GPU-only KV caps and context cut per model (paper: 8B/32B 128K context, 235B 256K).
MODEL_SETUP: dict[str, tuple[int, int]] = {
    "qwen3-8b": (262144, 131072),
    "qwen3-32b": (196608, 131072),
    "qwen3-235b-a22b": (393216, 262144),
}

PAPER: dict[str, Any] = {
    "figure1": {8: 1.14, 128: 2.93},
    "gpu_only_ttft_change": (-0.60, -0.36),  # range over models / N
    "gpu_only_jct_change": (-0.37, -0.27),
    "freeinference_ttft_change": {3: -0.30, 4: -0.32},
    "freeinference_jct_change": -0.02,
    "two_tier_lpm_cpu_ttft_change": (-0.37, -0.13),
    "two_tier_penelope_further_ttft_change": (-0.76, -0.46),
    "ablation_ttft_change": {("leaf-head", "block"): -0.43, ("tail", "block"): -0.45,
                             ("private-head", "block"): -0.63},
    "ablation_hit_rate": {("private-head", "block"): 0.845, ("tail", "block"): 0.826},
    "ablation_lost90_share": {"node": (0.90, 0.94), "block": (0.16, 0.23)},
    "fcfs_235b_ttft_change": {"lpm": -0.43, "fcfs": -0.17},
    "cpu_sweep": {"4x_sglang_hit_rate": 0.92, "1x_ttft_change": -0.10},
}


@dataclass
class Context:
    trace: str
    quick: bool = False
    gaps: str = "tool"
    jobs: int = 1
    prompt_nodes: str = "chunked"  # chunked (SGLang: a node per prefill chunk) | whole
    profiles: str | None = None  # a shipped profile family (derived, kernels); None: default
    notes: list[str] = field(default_factory=list)
    executor: ExecutorSpec | None = None  # None: local, ``jobs`` processes

    def profile(self, model: str) -> str | None:
        from costmodel.profile import default_profile_name

        return None if self.profiles is None else default_profile_name(model, self.profiles)

    @property
    def is_synthetic(self) -> bool:
        return self.trace.startswith("synthetic:")

    def base(self, model: str = "qwen3-8b", sessions: int = 4) -> RunConfig:
        cache, ctx_cut = MODEL_SETUP.get(model, (262144, 131072))
        cfg = RunConfig(trace=self.trace, model=model, gpu_cache=cache, max_context=ctx_cut,
                        shared_prefix=None if self.is_synthetic else SHARED_PREFIX,
                        select=None if self.is_synthetic else "top-requests:24",
                        gaps=self.gaps, sessions=sessions, scheduler="lpm",
                        checkpoint_chunks=self.prompt_nodes == "chunked",
                        profile=self.profile(model))
        if self.quick:
            # Seconds, not minutes: fewer sessions, shorter contexts, a proportionally
            # smaller cache so that eviction still happens.
            cfg = replace(cfg, select=None if self.is_synthetic else QUICK_SELECT,
                          max_context=QUICK_CONTEXT, gpu_cache=QUICK_GPU_CACHE)
            if self.is_synthetic:
                cfg = replace(cfg, trace=_quick_synthetic(self.trace))
        return cfg


def _quick_synthetic(trace: str) -> str:
    sep = "&" if "?" in trace else "?"
    return trace if "sessions=" in trace else f"{trace}{sep}sessions=6"


def _run_all(ctx: Context, configs: list[RunConfig], job: Callable | None = None,
             ) -> list[dict[str, Any]]:
    """Summaries of ``configs`` in order (or what ``job(cfg, None, get_trace)`` returns for
    each), on the context's executor (identical results on every executor: a run is a pure
    function of its config and trace)."""
    spec = ctx.executor or ExecutorSpec(jobs=ctx.jobs)
    if spec.kind == "local" and len(configs) < 2:
        spec = replace(spec, jobs=1)
    ex = spec.make()
    out: list[dict[str, Any] | None] = [None] * len(configs)
    bar = current_progress()  # counts finished runs as they arrive (from any worker)
    runs_counted = bar.counts("runs")
    if runs_counted:
        bar.add_total(len(configs))
    try:
        for i, summary in ex.map(job or _summary_of, [(c, None) for c in configs]):
            out[i] = summary
            if runs_counted:
                bar.advance()
    finally:
        ex.close()
    return out  # type: ignore[return-value]


def _summary_of(cfg: RunConfig, _arg: Any, get_trace: Callable[[], Any]) -> dict[str, Any]:
    from sim.runner import run

    return run(cfg, get_trace()).summary


# --- experiments ------------------------------------------------------------------------
def figure1(ctx: Context) -> list[dict[str, Any]]:
    from costmodel.figure1 import figure1 as fig1
    from costmodel.profile import load_profile
    from costmodel.specs import get_spec

    rows = fig1(get_spec("qwen3-8b"), load_profile(ctx.profile("qwen3-8b"), "qwen3-8b"))
    for r in rows:
        paper = r["paper_measured_speedup"]
        r["paper_speedup"] = paper
        r["difference"] = None if paper is None else r["speedup"] / paper - 1
    return rows


def gpu_only(ctx: Context) -> list[dict[str, Any]]:
    """Penelope (and vLLM's order) against each engine's own default policy, GPU-only, per
    model and N: the ``sglang`` engine against ``sglang`` for both tree shapes (``chunked``:
    SGLang's per-chunk inserts; ``whole``: one node per prompt), with lpm as in the paper; the
    ``vllm`` engine against ``vllm`` (a block pool has no tree shape; vLLM schedules fcfs):
    penelope as a free order only, and penelope on vLLM with the Penelope patch (engine
    ``vllm+penelope-patch``: holes refilled in the request's step) against stock ``vllm``."""
    models = ["qwen3-8b"] if ctx.quick else list(MODEL_SETUP)
    ns = [4] if ctx.quick else [2, 4, 8]
    # (engine, tree shape, baseline preset, compared presets, vllm patch of the compared);
    # a baseline always runs unpatched
    cases = [("sglang", "chunked", "sglang", ("vllm", "penelope"), "none"),
             ("sglang", "whole", "sglang", ("vllm", "penelope"), "none"),
             ("vllm", None, "vllm", ("penelope",), "none"),
             ("vllm", None, "vllm", ("penelope",), "penelope")]
    configs, keys = [], []
    for engine, shape, baseline, presets, patch in cases:
        for model in models:
            for n in ns:
                base = replace(ctx.base(model, n), engine=engine,
                               checkpoint_chunks=shape != "whole")
                if engine == "vllm":
                    base = replace(base, scheduler="fcfs")
                for preset, p in ((baseline, "none"), *((x, patch) for x in presets)):
                    key = (engine, shape, model, n, preset, p)
                    if key not in keys:
                        configs.append(replace(base.with_preset(preset), vllm_patch=p))
                        keys.append(key)
    sums = dict(zip(keys, _run_all(ctx, configs), strict=True))
    rows = []
    lo, hi = PAPER["gpu_only_ttft_change"]
    jlo, jhi = PAPER["gpu_only_jct_change"]
    for engine, shape, baseline, presets, patch in cases:
        for model in models:
            for n in ns:
                ref = sums[(engine, shape, model, n, baseline, "none")]
                for preset in presets:
                    s = sums[(engine, shape, model, n, preset, patch)]
                    paper = preset == "penelope" and engine == "sglang"
                    rows.append({
                        "engine": engine if patch == "none" else f"{engine}+{patch}-patch",
                        "prompt_nodes": shape, "model": model,
                        "sessions": n, "scheduler": s["scheduler"], "policy": preset,
                        "baseline": baseline, "ttft_mean_s": s["ttft_mean_s"],
                        "baseline_ttft_mean_s": ref["ttft_mean_s"],
                        "ttft_change": _change(s["ttft_mean_s"], ref["ttft_mean_s"]),
                        "jct_change": _change(s["jct_mean_s"], ref["jct_mean_s"]),
                        "hit_rate": s["hit_rate"], "baseline_hit_rate": ref["hit_rate"],
                        "preempted_recompute_tokens": s["preempted_recompute_tokens"],
                        "baseline_preempted_recompute_tokens":
                            ref["preempted_recompute_tokens"],
                        "paper_ttft_change": f"{lo:+.0%}..{hi:+.0%}" if paper else None,
                        "paper_jct_change": f"{jlo:+.0%}..{jhi:+.0%}" if paper else None,
                    })
    return rows


ABLATION = [(e, g) for g in ("node", "block") for e in ("tail", "leaf-head", "private-head")]


def ablation(ctx: Context) -> list[dict[str, Any]]:
    """All six start x granularity combinations against sglang (8B, 4 sessions), for both
    tree shapes: ``chunked`` (SGLang inserts every prefill chunk, so nodes hold <= 8K tokens)
    and ``whole`` (one node per prompt). Whole-node deletion only hurts when nodes are big,
    so the tree shape decides how much granularity matters."""
    rows = []
    for nodes in ("chunked", "whole"):
        base = replace(ctx.base("qwen3-8b", 4), checkpoint_chunks=nodes == "chunked")
        configs = [base.with_preset("sglang")] + [
            replace(base, preset=None, order="lru", evict=e, granularity=g) for e, g in ABLATION]
        sums = _run_all(ctx, configs)
        ref = sums[0]
        for (e, g), s in zip(ABLATION, sums[1:], strict=True):
            paper = PAPER["ablation_ttft_change"].get((e, g))
            change = _change(s["ttft_mean_s"], ref["ttft_mean_s"])
            lost = PAPER["ablation_lost90_share"][g]
            rows.append({
                "prompt_nodes": nodes, "evict": e, "granularity": g,
                "ttft_mean_s": s["ttft_mean_s"], "ttft_change": change,
                "hit_rate": s["hit_rate"], "paper_ttft_change": paper,
                "paper_hit_rate": PAPER["ablation_hit_rate"].get((e, g)),
                "difference": None if paper is None else change - paper,
                "recompute_share_lost90": s["recompute_share_lost90_tokens"],
                "paper_recompute_share_lost90": f"{lost[0]:.0%}..{lost[1]:.0%}",
            })
    return rows


def fcfs(ctx: Context) -> list[dict[str, Any]]:
    """FCFS vs lpm (235B and 8B); a Codex-style trace with long tool waits; and a model with
    sliding-window layers, where front eviction helps much less."""
    cases: list[tuple[str, RunConfig]] = []
    models = ["qwen3-8b"] if ctx.quick else ["qwen3-235b-a22b", "qwen3-8b"]
    # N = 8: scheduling order only matters when requests queue up (at N = 4 the queue rarely
    # holds two, and lpm and fcfs pick the same request).
    n = 4 if ctx.quick else 8
    for model in models:
        for sched in ("lpm", "fcfs"):
            cases.append((f"{model} {sched} N={n}",
                          replace(ctx.base(model, n), scheduler=sched)))
    codex = "synthetic:codex?sessions=6" if ctx.quick else "synthetic:codex"
    for n in (3, 4):
        c = replace(ctx.base("qwen3-8b", n), trace=codex, select=None, shared_prefix=None,
                    gaps="recorded")
        cases.append((f"codex N={n}", c))
    # The 8B's cache and context cut, priced with the model's own profile.
    for model in ("gemma-3-27b", "llama-3.1-8b"):
        cases.append((f"{model} (window)" if model.startswith("gemma") else
                      f"{model} (full)", replace(ctx.base("qwen3-8b", 4), model=model,
                                                 profile=ctx.profile(model))))
    configs = []
    for _, c in cases:
        configs += [c.with_preset("sglang"), c.with_preset("penelope")]
    sums = _run_all(ctx, configs)
    rows = []
    for i, (name, c) in enumerate(cases):
        ref, pen = sums[2 * i], sums[2 * i + 1]
        paper = None
        if name.startswith("qwen3-235b"):
            paper = PAPER["fcfs_235b_ttft_change"][c.scheduler]
        elif name.startswith("codex"):
            paper = PAPER["freeinference_ttft_change"][c.sessions]
        rows.append({
            "case": name, "model": c.model, "scheduler": c.scheduler, "sessions": c.sessions,
            "gaps": c.gaps, "trace": c.trace,
            "ttft_change": _change(pen["ttft_mean_s"], ref["ttft_mean_s"]),
            "jct_change": _change(pen["jct_mean_s"], ref["jct_mean_s"]),
            "hit_rate": pen["hit_rate"], "sglang_hit_rate": ref["hit_rate"],
            "paper_ttft_change": paper,
            "paper_jct_change": PAPER["freeinference_jct_change"]
            if name.startswith("codex") else None,
        })
    return rows


def _tiered(cfg: RunConfig, system: str, scheduler: str, cpu: int,
            write_policy: str = "write_through") -> RunConfig:
    """``hicache`` = SGLang (whole-node LRU tail on the device) + HiCache; ``penelope`` =
    unified tiers under lru+private-head+block."""
    preset, tiering = ("sglang", "hicache") if system == "hicache" else ("penelope", "unified")
    return replace(cfg.with_preset(preset), tiering=tiering, scheduler=scheduler, cpu_cache=cpu,
                   hicache_write_policy=write_policy)


def two_tier(ctx: Context) -> list[dict[str, Any]]:
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
            gpu = base.gpu_cache * 3 // 4
            base = replace(base, gpu_cache=gpu)
            cases.append((model, n, gpu))
            configs += [_tiered(base, "hicache", "lpm", gpu),
                        _tiered(base, "hicache", "lpm-cpu", gpu),
                        _tiered(base, "penelope", "lpm-cpu", gpu),
                        _tiered(base, "hicache", "lpm-cpu", gpu, "write_back")]
    sums = _run_all(ctx, configs)
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


def cpu_sweep(ctx: Context) -> list[dict[str, Any]]:
    """Qwen3-8B, 8 sessions, fcfs for both, GPU tier 128K, CPU tier 1x..4x the GPU tier."""
    base = replace(ctx.base("qwen3-8b", 8), gpu_cache=131072)
    if ctx.quick:
        base = replace(ctx.base("qwen3-8b", 4), gpu_cache=QUICK_GPU_CACHE * 3 // 4)
    mults = [1, 2, 4] if ctx.quick else [1, 2, 3, 4]
    configs = []
    for k in mults:
        cpu = k * base.gpu_cache
        configs += [_tiered(base, "hicache", "fcfs", cpu), _tiered(base, "penelope", "fcfs", cpu)]
    sums = _run_all(ctx, configs)
    rows = []
    for i, k in enumerate(mults):
        sg, pen = sums[2 * i], sums[2 * i + 1]
        paper = PAPER["cpu_sweep"]["1x_ttft_change"] if k == 1 else (0.0 if k == 4 else None)
        rows.append({
            "cpu_over_gpu": k, "gpu_tokens": base.gpu_cache, "cpu_tokens": k * base.gpu_cache,
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


def cache_engineering(ctx: Context) -> list[dict[str, Any]]:
    """Context and cache engineering beside Penelope (sim/exp_cache_engineering.py)."""
    from sim.exp_cache_engineering import cache_engineering as run

    return run(ctx)


def pool(ctx: Context) -> list[dict[str, Any]]:
    """A fleet with and without a shared KV pool (sim/exp_pool.py)."""
    from sim.exp_pool import pool as run

    return run(ctx)


# For experiments in their own modules (sim/exp_*.py).
run_all = _run_all

EXPERIMENTS: dict[str, Callable[[Context], list[dict[str, Any]]]] = {
    "figure1": figure1,
    "gpu-only": gpu_only,
    "ablation": ablation,
    "fcfs": fcfs,
    "two-tier": two_tier,
    "cpu-sweep": cpu_sweep,
    "policies": exp_policies.policies,  # the zoo and the clairvoyant oracle
    "cache-engineering": cache_engineering,
    "fleet": exp_fleet.fleet,  # routers x eviction x replicas (sim/exp_fleet.py)
    "pool": pool,
}


# --engine vllm: the experiments that have a vLLM-engine form (Continuum on its own engine)
ENGINE_EXPERIMENTS: dict[str, Callable[[Context], list[dict[str, Any]]]] = {
    "policies": exp_continuum.continuum,
}


def default_trace() -> tuple[str, str]:
    if SHARED_CC_TRACES.is_dir():
        return str(SHARED_CC_TRACES), "shared cc-traces (real Claude Code sessions)"
    return "synthetic:claude-code", "synthetic Claude Code trace (../shared/data absent)"


def reproduce(name: str, trace: str | None = None, quick: bool = False, jobs: int = 1,
              gaps: str = "tool", prompt_nodes: str = "chunked",
              executor: ExecutorSpec | None = None,
              profiles: str | None = None, engine: str = "sglang") -> dict[str, Any]:
    if name not in EXPERIMENTS:
        raise KeyError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    if engine != "sglang" and name not in ENGINE_EXPERIMENTS:
        raise KeyError(f"experiment {name!r} runs on the sglang engine only; --engine vllm: "
                       f"{', '.join(ENGINE_EXPERIMENTS)}")
    if trace is None:
        trace, which = default_trace()
    else:
        which = "given trace"
    ctx = Context(trace=trace, quick=quick, gaps=gaps, jobs=jobs, prompt_nodes=prompt_nodes,
                  executor=executor, profiles=profiles)
    rows = (ENGINE_EXPERIMENTS[name] if engine == "vllm" else EXPERIMENTS[name])(ctx)
    if name == "policies" and engine == "sglang":  # runs its own gap models
        gaps = ",".join(dict.fromkeys(r["gaps"] for r in rows))
    doc = {"experiment": name, "trace": trace, "trace_kind": which, "gaps": gaps,
           "prompt_nodes": "both" if name in ("ablation", "gpu-only", "policies")
           and engine == "sglang" else prompt_nodes,
           "quick": quick, "rows": rows}
    if engine != "sglang":  # only then: documents of the sglang engine stay as they were
        doc["engine"] = engine
    if profiles is not None:
        doc["profiles"] = profiles
    if ctx.notes:
        doc["notes"] = ctx.notes
    if name == "cache-engineering":  # the accuracy caveat, prices and AKV's Table 2
        from sim.exp_cache_engineering import document_extras

        doc.update(document_extras(quick))
    if name in ("fleet", "pool"):  # the capacity curves of the pooled fleets
        from sim.exp_pool import document_extras as pool_extras
        from sim.exp_pool import pool as pool_rows

        if name == "fleet":  # local caches vs the same fleets over a shared pool
            doc["pool_rows"] = pool_rows(ctx)
        doc.update(pool_extras(ctx))
    return doc
