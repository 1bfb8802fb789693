"""The paper's studies on one GPU tier, with its published numbers beside ours: the cost
model's Figure 1, GPU-only TTFT per engine, the start x granularity ablation, FCFS against lpm.

Each study is an ``Experiment`` (sim/studies/study.py): its rows, its tables, the numbers the
paper published (``PAPER``, listed beside ours in docs/reproduction.md; where the seed gives
no number, none is invented). The two-tier studies are in sim/studies/tiers.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table

from sim.config import RunConfig
from sim.report.tables import Col
from sim.sweep import relative_change as _change

from .study import MODEL, MODEL_SETUP, TREE, Experiment, N, StudySetup, run_all

PAPER: dict[str, Any] = {
    "figure1": {8: 1.14, 128: 2.93},
    "gpu_only_ttft_change": (-0.60, -0.36),  # range over models / N
    "gpu_only_jct_change": (-0.37, -0.27),
    "freeinference_ttft_change": {3: -0.30, 4: -0.32},
    "freeinference_jct_change": -0.02,
    "ablation_ttft_change": {("leaf-head", "block"): -0.43, ("tail", "block"): -0.45,
                             ("private-head", "block"): -0.63},
    "ablation_hit_rate": {("private-head", "block"): 0.845, ("tail", "block"): 0.826},
    "ablation_lost90_share": {"node": (0.90, 0.94), "block": (0.16, 0.23)},
    "fcfs_235b_ttft_change": {"lpm": -0.43, "fcfs": -0.17},
}


def figure1(ctx: StudySetup) -> list[dict[str, Any]]:
    from costmodel.figure1 import figure1 as fig1
    from costmodel.profile import load_profile
    from costmodel.specs import get_spec

    rows = fig1(get_spec("qwen3-8b"), load_profile(ctx.profile("qwen3-8b"), "qwen3-8b"))
    for r in rows:
        paper = r["paper_measured_speedup"]
        r["paper_speedup"] = paper
        r["difference"] = None if paper is None else r["speedup"] / paper - 1
    return rows


@dataclass(frozen=True)
class GpuOnlyCase:
    """One engine setup of ``gpu_only``: the engine and tree shape (None: a block pool has
    none), the baseline preset, the presets compared with it and the vLLM patch they run
    under (a baseline always runs unpatched), the engine's scheduler, and whether the paper
    published the case's penelope numbers."""

    engine: str
    shape: str | None
    baseline: str
    compared: tuple[str, ...]
    patch: str = "none"
    scheduler: str = "lpm"
    published: bool = False


GPU_ONLY_CASES = (
    GpuOnlyCase("sglang", "chunked", "sglang", ("vllm", "penelope"), published=True),
    GpuOnlyCase("sglang", "whole", "sglang", ("vllm", "penelope"), published=True),
    GpuOnlyCase("vllm", None, "vllm", ("penelope",), scheduler="fcfs"),  # vLLM schedules fcfs
    GpuOnlyCase("vllm", None, "vllm", ("penelope",), patch="penelope", scheduler="fcfs"),
)


def gpu_only(ctx: StudySetup) -> list[dict[str, Any]]:
    """Penelope (and vLLM's order) against each engine's own default policy, GPU-only, per
    model and N: the ``sglang`` engine against ``sglang`` for both tree shapes (``chunked``:
    SGLang's per-chunk inserts; ``whole``: one node per prompt), with lpm as in the paper; the
    ``vllm`` engine against ``vllm`` (a block pool has no tree shape; vLLM schedules fcfs):
    penelope as a free order only, and penelope on vLLM with the Penelope patch (engine
    ``vllm+penelope-patch``: holes refilled in the request's step) against stock ``vllm``."""
    models = ["qwen3-8b"] if ctx.quick else list(MODEL_SETUP)
    ns = [4] if ctx.quick else [2, 4, 8]
    configs, keys = [], []
    for case in GPU_ONLY_CASES:
        for model in models:
            for n in ns:
                base = ctx.base(model, n).with_fields(engine=case.engine,
                                                      checkpoint_chunks=case.shape != "whole",
                                                      scheduler=case.scheduler)
                for preset, p in ((case.baseline, "none"),
                                  *((x, case.patch) for x in case.compared)):
                    key = (case.engine, case.shape, model, n, preset, p)
                    if key not in keys:
                        configs.append(base.with_preset(preset).with_fields(vllm_patch=p))
                        keys.append(key)
    runs = dict(zip(keys, zip(configs, run_all(ctx, configs), strict=True), strict=True))
    rows = []
    lo, hi = PAPER["gpu_only_ttft_change"]
    jlo, jhi = PAPER["gpu_only_jct_change"]
    for case in GPU_ONLY_CASES:
        for model in models:
            for n in ns:
                _, ref = runs[(case.engine, case.shape, model, n, case.baseline, "none")]
                for preset in case.compared:
                    cfg, s = runs[(case.engine, case.shape, model, n, preset, case.patch)]
                    paper = preset == "penelope" and case.published
                    rows.append({
                        "engine": cfg.engine_label,
                        "prompt_nodes": case.shape, "model": model,
                        "sessions": n, "scheduler": s["scheduler"], "policy": preset,
                        "baseline": case.baseline, "ttft_mean_s": s["ttft_mean_s"],
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


STARTS_BY_GRANULARITY = [(e, g) for g in ("node", "block")
                         for e in ("tail", "leaf-head", "private-head")]


def ablation(ctx: StudySetup) -> list[dict[str, Any]]:
    """All six start x granularity combinations against sglang (8B, 4 sessions), for both
    tree shapes: ``chunked`` (SGLang inserts every prefill chunk, so nodes hold <= 8K tokens)
    and ``whole`` (one node per prompt). Whole-node deletion only hurts when nodes are big,
    so the tree shape decides how much granularity matters."""
    rows = []
    for nodes in ("chunked", "whole"):
        base = ctx.base("qwen3-8b", 4).with_fields(checkpoint_chunks=nodes == "chunked")
        configs = [base.with_preset("sglang")] + [
            base.with_fields(preset=None, order="lru", evict=e, granularity=g)
            for e, g in STARTS_BY_GRANULARITY]
        sums = run_all(ctx, configs)
        ref = sums[0]
        for (e, g), s in zip(STARTS_BY_GRANULARITY, sums[1:], strict=True):
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


def fcfs(ctx: StudySetup) -> list[dict[str, Any]]:
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
                          ctx.base(model, n).with_fields(scheduler=sched)))
    codex = "synthetic:codex?sessions=6" if ctx.quick else "synthetic:codex"
    for n in (3, 4):
        c = ctx.base("qwen3-8b", n).with_fields(trace=codex, select=None, shared_prefix=None,
                                                gaps="recorded")
        cases.append((f"codex N={n}", c))
    # The 8B's cache and context cut, priced with the model's own profile.
    for model in ("gemma-3-27b", "llama-3.1-8b"):
        cases.append((f"{model} (window)" if model.startswith("gemma") else
                      f"{model} (full)", ctx.base("qwen3-8b", 4).with_fields(model=model,
                                                 profile=ctx.profile(model))))
    configs = []
    for _, c in cases:
        configs += [c.with_preset("sglang"), c.with_preset("penelope")]
    sums = run_all(ctx, configs)
    rows = []
    for i, (name, c) in enumerate(cases):
        ref, pen = sums[2 * i], sums[2 * i + 1]
        paper = None
        if name.startswith("qwen3-235b"):
            paper = PAPER["fcfs_235b_ttft_change"][c.policy.scheduler]
        elif name.startswith("codex"):
            paper = PAPER["freeinference_ttft_change"][c.traffic.sessions]
        rows.append({
            "case": name, "model": c.cache.model, "scheduler": c.policy.scheduler,
            "sessions": c.traffic.sessions,
            "gaps": c.traffic.gaps, "trace": c.traffic.trace,
            "ttft_change": _change(pen["ttft_mean_s"], ref["ttft_mean_s"]),
            "jct_change": _change(pen["jct_mean_s"], ref["jct_mean_s"]),
            "hit_rate": pen["hit_rate"], "sglang_hit_rate": ref["hit_rate"],
            "paper_ttft_change": paper,
            "paper_jct_change": PAPER["freeinference_jct_change"]
            if name.startswith("codex") else None,
        })
    return rows


# --- tables -------------------------------------------------------------------------------
# figure1: (header with its unit, row key, format); fits 100 columns.
FIGURE1_COLUMNS: list[tuple[str, str, str]] = [
    ("context\n(tokens)", "context_tokens", "{:,}"),
    ("deleted\n(tokens)", "deleted_tokens", "{:,}"),
    ("front\n(units)", "front_units", "{:.3g}"),
    ("tail\n(units)", "tail_units", "{:.3g}"),
    ("front\n(s)", "front_seconds", "{:.3f}"),
    ("tail\n(s)", "tail_seconds", "{:.3f}"),
    ("speedup\n(units)", "speedup", "{:.3f}x"),
    ("speedup\n(s)", "speedup_seconds", "{:.3f}x"),
    ("paper\n(s)", "paper_speedup", "{:.2f}x"),
    ("vs\npaper", "difference", "{:+.1%}"),
]


def figure1_tables(doc: dict[str, Any]) -> list[Table | str]:
    t = Table(title="Figure 1 (cost model, qwen3-8b, h100 profile): the next request's cost "
                    "after deleting 30% of the context at the front or at the tail; speedup = "
                    "tail / front", title_justify="left")
    for head, _, _ in FIGURE1_COLUMNS:
        t.add_column(head, justify="right")
    for r in doc["rows"]:
        t.add_row(*("-" if r.get(k) is None else fmt.format(r[k])
                    for _, k, fmt in FIGURE1_COLUMNS))
    return [t]


GPU_ONLY_LAYOUT = (
    ("mean TTFT: each policy against its engine's own default policy (the baseline)",
     (Col("engine", "engine"), TREE, MODEL, N, Col("policy", "policy"),
      Col("TTFT\n(s)", "ttft_mean_s", "s"),
      Col("baseline\nTTFT (s)", "baseline_ttft_mean_s", "s"),
      Col("TTFT\nchange", "ttft_change", "change"),
      Col("paper\nTTFT change", "paper_ttft_change", "paper"))),
    ("mean JCT and hit rate against the baseline",
     (Col("engine", "engine"), TREE, MODEL, N, Col("policy", "policy"),
      Col("JCT\nchange", "jct_change", "change"),
      Col("paper\nJCT change", "paper_jct_change", "paper"),
      Col("hit\nrate", "hit_rate", "rate"),
      Col("hit rate\nchange", "hit_rate", "pp", minus="baseline_hit_rate"))),
    ("prompt tokens computed again after preemptions (vLLM) or retractions (SGLang)",
     (Col("engine", "engine"), TREE, MODEL, N, Col("policy", "policy"),
      Col("redone\n(tokens)", "preempted_recompute_tokens", "int"),
      Col("baseline\nredone", "baseline_preempted_recompute_tokens", "int"))),
)
ABLATION_LAYOUT = (
    ("start x granularity against sglang: mean TTFT and hit rate",
     (TREE, Col("evict", "evict"), Col("granularity", "granularity"),
      Col("TTFT\n(s)", "ttft_mean_s", "s"), Col("TTFT\nchange", "ttft_change", "change"),
      Col("paper", "paper_ttft_change", "paper"),
      Col("vs\npaper", "difference", "pp"),
      Col("hit\nrate", "hit_rate", "rate"),
      Col("paper\nhit rate", "paper_hit_rate", "paper_rate"))),
    ("share of the recomputation carried by requests that lost >= 90% of their private "
     "history",
     (TREE, Col("evict", "evict"), Col("granularity", "granularity"),
      Col("share", "recompute_share_lost90", "rate"),
      Col("paper", "paper_recompute_share_lost90", "paper_rate"))),
)
FCFS_LAYOUT = (
    ("penelope against sglang per case: mean TTFT and JCT",
     (Col("case", "case"), Col("gaps", "gaps"),
      Col("TTFT\nchange", "ttft_change", "change"),
      Col("paper\nTTFT change", "paper_ttft_change", "paper"),
      Col("JCT\nchange", "jct_change", "change"),
      Col("paper\nJCT change", "paper_jct_change", "paper"))),
    ("hit rate per case",
     (Col("case", "case"), Col("gaps", "gaps"),
      Col("sglang\nhit rate", "sglang_hit_rate", "rate"),
      Col("penelope\nhit rate", "hit_rate", "rate"),
      Col("hit rate\nchange", "hit_rate", "pp", minus="sglang_hit_rate"))),
)


def _schedulers(doc: dict[str, Any]) -> str:
    scheds = ", ".join(dict.fromkeys(f"{r['engine']} engine {r['scheduler']}"
                                     for r in doc["rows"]))
    return f"; schedulers: {scheds}"


FIGURE1 = Experiment("figure1", figure1, tables=figure1_tables, replays=False,
                     paper={"figure1": PAPER["figure1"]})
GPU_ONLY = Experiment("gpu-only", gpu_only, GPU_ONLY_LAYOUT, heading=_schedulers,
                      prompt_nodes="both",
                      paper={k: PAPER[k] for k in ("gpu_only_ttft_change",
                                                   "gpu_only_jct_change")})
ABLATION = Experiment("ablation", ablation, ABLATION_LAYOUT, prompt_nodes="both",
                      paper={k: v for k, v in PAPER.items() if k.startswith("ablation")})
FCFS = Experiment("fcfs", fcfs, FCFS_LAYOUT,
                  heading=lambda doc: "; the codex cases replay synthetic:codex with its "
                                      "recorded gaps",
                  paper={k: PAPER[k] for k in ("fcfs_235b_ttft_change",
                                               "freeinference_ttft_change",
                                               "freeinference_jct_change")})
