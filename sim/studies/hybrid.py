"""``kvsim reproduce hybrid``: Penelope against SGLang's and vLLM's eviction on hybrid models.

Per model (``MODELS``: full attention, a sliding-window hybrid, a Gated DeltaNet hybrid, an
MLA+DSA model) the paper's GPU-only setup (sim/studies/paper.py ``gpu_only``: the Claude Code
sessions, lpm on the sglang engine with SGLang's per-chunk nodes, fcfs on the vllm engine,
``SESSIONS`` at once) at **equal cache pressure**: each model's KV memory in bytes holds the
same number of sessions at the context cut as the anchor's (Qwen3-32B's 192K tokens at 128K:
1.5 sessions; ``--quick``: 96K at 64K). ``cache_bytes = anchor tokens / cut x
spec.kv_bytes(cut)`` (every group as it keeps a request: a window group its last ``w``
tokens, a Gated DeltaNet group its state), then into tokens by ``costmodel.gpus.kv_capacity``
as each engine allocates its groups (one GPU). Equal bytes alone would not compare eviction:
DeepSeek-V3.2's 86 KB per token against Qwen3-32B's 256 KB holds three times the sessions and
hardly evicts; equal tokens would ignore that a window group keeps only ``w`` of them.

Each row says what the engine's cache is for the model (``cache``, the class the engine
built) and, in ``note``, where it is not the model's groups (a full-attention cache of that
many tokens) or where the engine refuses the combination (no numbers then). The document adds
Figure 1 per model (``figure1``: the deletion-position speedup, ``kvsim microbench figure1
--model M``) and capacity curves per model at equal bytes (``capacity``: as ``kvsim capacity
--cache BYTES --model M``). docs/hybrid.md, "Penelope on hybrid models", prints the table.
"""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

from sim.config import ConfigError, RunConfig
from sim.report.tables import Col, narrow_table
from sim.sweep import relative_change

from .study import MODEL_SETUP, Experiment, StudySetup, heading, run_all

MODELS = ("qwen3-32b", "gpt-oss-120b", "qwen3-next-80b-a3b", "deepseek-v3.2")
ANCHOR = "qwen3-32b"
SESSIONS = 4
# (engine, baseline preset, presets compared, scheduler, the compared presets' vLLM patch):
# gpu_only's cases (sim/studies/paper.py GPU_ONLY_CASES): on the vllm engine penelope runs
# with the Penelope patch (holes refilled in the request's step), its only deployable form
CASES = (("sglang", "sglang", ("vllm", "penelope"), "lpm", "none"),
         ("vllm", "vllm", ("penelope",), "fcfs", "penelope"))
# capacity curves: the anchor's bytes times these, per model
CAPACITY_SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)
# caches that keep one full-attention group whatever the model has
FULL_ATTENTION_CACHES = ("RadixKVCache", "BlockPool", "HolePool")


def cache_bytes(model: str, cfg: RunConfig) -> int:
    """KV bytes holding the anchor's number of sessions at ``cfg``'s context cut (module
    docstring): equal cache pressure in bytes."""
    from costmodel.specs import get_spec

    cut = cfg.value("max_context")
    sessions = cfg.cache.gpu_cache / cut  # the anchor's cache in sessions at the cut
    return round(sessions * get_spec(model, cfg.cache.kv_dtype).kv_bytes(cut))


def tokens_of(model: str, nbytes: int, engine: str, cfg: RunConfig) -> int:
    """Tokens ``nbytes`` hold of ``model`` on one GPU as ``engine`` allocates its groups."""
    from costmodel.gpus import kv_capacity
    from costmodel.specs import get_spec

    spec = get_spec(model, cfg.cache.kv_dtype)
    return kv_capacity(spec, nbytes, 1, engine, cfg.cache.block_size).tokens


def groups_label(model: str) -> str:
    from costmodel.specs import get_spec

    return ", ".join(f"{g.layers} {g.kind}" + (f"({g.window})" if g.window else "")
                     for g in get_spec(model).groups)


def cache_layout(cfg: RunConfig) -> tuple[str | None, str]:
    """The cache class ``cfg``'s engine builds for its model (None: the engine refuses it)
    and a note: the refusal, or that the model's groups are kept as one full-attention
    cache. Built on a one-session trace: the class does not depend on the trace."""
    from costmodel.profile import load_profile
    from costmodel.specs import get_spec
    from sim.engines.clock import Clock
    from sim.run.build import build_replicas
    from sim.run.check import check
    from sim.run.trace import load_run_trace

    try:
        check(cfg)
    except ConfigError as e:
        return None, f"refused: {e}"
    spec = get_spec(cfg.cache.model, cfg.cache.kv_dtype)
    profile = load_profile(cfg.cache.profile, cfg.cache.model)
    tiny = cfg.with_fields(trace="synthetic:claude-code?sessions=1", select=None,
                           shared_prefix=None)
    (engine,), _ = build_replicas(Clock(), cfg, profile.pricing_spec(spec), profile,
                                  load_run_trace(tiny), [None])
    name = type(engine.cache).__name__
    if len(spec.groups) > 1 and name in FULL_ATTENTION_CACHES:
        return name, (f"{cfg.engine.name} engine: one full-attention {name} of "
                      f"{cfg.cache.gpu_cache:,} tokens; the model's groups "
                      f"({groups_label(cfg.cache.model)}) are not modelled in it yet")
    return name, ""


def configs(ctx: StudySetup) -> tuple[list[dict[str, Any]], list[RunConfig | None]]:
    """Every (model, engine, preset): its row keys and config (None where refused)."""
    anchor = ctx.base(ANCHOR, SESSIONS)
    keys: list[dict[str, Any]] = []
    cfgs: list[RunConfig | None] = []
    for model in MODELS:
        base = ctx.base(model, SESSIONS)
        if model not in MODEL_SETUP:  # the anchor's context cut (ctx.base's default is 128K)
            base = base.with_fields(max_context=anchor.value("max_context"))
        nbytes = cache_bytes(model, anchor)
        for engine, baseline, compared, scheduler, patch in CASES:
            tokens = tokens_of(model, nbytes, engine, anchor)
            for preset in (baseline, *compared):
                cfg = (base.with_fields(engine=engine, scheduler=scheduler, gpu_cache=tokens)
                       .with_preset(preset))
                if preset != baseline and patch != "none":
                    cfg = cfg.with_fields(vllm_patch=patch)
                layout, note = cache_layout(cfg)
                keys.append({"model": model, "groups": groups_label(model), "engine": engine,
                             "preset": preset, "vllm_patch": cfg.value("vllm_patch"),
                             "baseline": baseline, "cache_bytes": nbytes,
                             "cache_gib": nbytes / 2**30, "cache_tokens": tokens,
                             "cache": layout or "-", "note": note})
                cfgs.append(None if layout is None else cfg)
    return keys, cfgs


NAN_FIELDS = ("ttft_mean_s", "ttft_p90_s", "jct_mean_s", "hit_rate", "recompute_units")


def row(key: dict[str, Any], s: dict[str, Any] | None) -> dict[str, Any]:
    if s is None:
        return {**key, **{k: math.nan for k in NAN_FIELDS}, "recomputed_tokens": 0,
                "recompute_by_group": [], "requests": 0}
    out = {**key, **{k: s[k] for k in NAN_FIELDS}, "recomputed_tokens": s["recomputed_tokens"],
           "recompute_by_group": s["recompute_by_group"], "requests": s["requests"]}
    for g in s["recompute_by_group"]:  # flat, for the tables
        out[f"recompute_{g['kind']}_gunits"] = g["attention_units"] / 1e9
    return out


def hybrid_rows(ctx: StudySetup) -> list[dict[str, Any]]:
    """One row per (model, engine, preset), with its TTFT change against the engine's own
    default on the same model (``ttft_change``, ``baseline_hit_rate``)."""
    keys, cfgs = configs(ctx)
    runnable = [c for c in cfgs if c is not None]
    done = iter(run_all(ctx, runnable))
    rows = [row(k, None if c is None else next(done)) for k, c in zip(keys, cfgs, strict=True)]
    base = {(r["model"], r["engine"]): r for r in rows if r["preset"] == r["baseline"]}
    for r in rows:
        ref = base[(r["model"], r["engine"])]
        r["ttft_change"] = relative_change(r["ttft_mean_s"], ref["ttft_mean_s"])
        r["baseline_hit_rate"] = ref["hit_rate"]
    return rows


def figure1_rows(ctx: StudySetup) -> list[dict[str, Any]]:
    """``kvsim microbench figure1 --model M`` per model: the tail deletion over the front one."""
    from costmodel.figure1 import figure1
    from costmodel.profile import load_profile
    from costmodel.specs import get_spec

    out = []
    for model in MODELS:
        profile = load_profile(ctx.profile(model), model)
        for r in figure1(get_spec(model), profile):
            out.append({"model": model, "profile": profile.name,
                        "context_k": r["context_tokens"] // 1024, "speedup": r["speedup"],
                        "speedup_seconds": r["speedup_seconds"]})
    return out


def capacity_rows(ctx: StudySetup) -> list[dict[str, Any]]:
    """Hit rate against KV memory in bytes per model (SGLang's allocation of its groups, its
    eviction, no clock: sim/studies/capacity.py), at ``CAPACITY_SCALES`` of each model's
    equal-pressure bytes' anchor, the same bytes for every model."""
    from sim.run.trace import load_run_trace

    from .capacity import capacity_curve

    anchor = ctx.base(ANCHOR, SESSIONS)
    trace = load_run_trace(anchor)
    ref = cache_bytes(ANCHOR, anchor)
    out = []
    for model in MODELS:
        sizes = [round(ref * s) for s in CAPACITY_SCALES]
        tokens = [tokens_of(model, b, "sglang", anchor) for b in sizes]
        by = {r.cache_tokens: r for r in capacity_curve(trace, sorted(set(tokens)), ("sglang",))}
        out += [{"model": model, "cache_bytes": b, "cache_gib": b / 2**30, "cache_tokens": t,
                 "hit_rate": by[t].hit_rate, "ideal_hit_rate": by[t].ideal_hit_rate}
                for b, t in zip(sizes, tokens, strict=True)]
    return out


def extras(ctx: StudySetup) -> dict[str, Any]:
    return {"anchor": ANCHOR, "sessions": SESSIONS,
            "pressure": "equal sessions at the context cut in bytes (sim/studies/hybrid.py)",
            "figure1": figure1_rows(ctx), "capacity": capacity_rows(ctx)}


SETUP = (Col("model", "model"), Col("engine", "engine"), Col("preset", "preset"))
LAYOUT = (
    ("TTFT and reuse at equal cache pressure",
     (*SETUP, Col("KV\n(GiB)", "cache_gib", "ratio"),
      Col("TTFT\nmean (s)", "ttft_mean_s", "s"), Col("vs\nbaseline", "ttft_change", "change"),
      Col("hit\nrate", "hit_rate", "rate"),
      Col("hit vs\nbaseline", "hit_rate", "pp", minus="baseline_hit_rate"),
      Col("recomputed\ntokens", "recomputed_tokens", "int"))),
    ("cache and recompute by KV cache group (attention units, 1e9)",
     (*SETUP, Col("cache\ntokens", "cache_tokens", "int"),
      Col("full", "recompute_full_gunits", "ratio"),
      Col("sliding", "recompute_sliding_gunits", "ratio"),
      Col("linear", "recompute_linear_gunits", "ratio"),
      Col("mla", "recompute_mla_gunits", "ratio"),
      Col("dsa", "recompute_dsa_gunits", "ratio"))),
)


def hybrid_tables(doc: dict[str, Any]) -> list[Table | str]:
    out: list[Table | str] = [heading("hybrid", doc)]
    out += [narrow_table(title, list(cols), doc["rows"]) for title, cols in LAYOUT]
    # one line per model and engine (a patched preset's pool class differs), per refusal
    notes: dict[tuple[str, ...], str] = {}
    for r in doc["rows"]:
        if r["note"]:
            notes.setdefault((r["model"], r["engine"], r["preset"] if r["cache"] == "-"
                              else ""), r["note"])
    out += [f"{' / '.join(x for x in k if x)}: {note}" for k, note in notes.items()]
    if doc.get("figure1"):
        out.append(narrow_table("Figure 1 per model: tail deletion over front",
                                [Col("model", "model"), Col("context (K)", "context_k", "int"),
                                 Col("speedup\n(units)", "speedup", "ratio"),
                                 Col("speedup\n(s)", "speedup_seconds", "ratio")],
                                doc["figure1"]))
    if doc.get("capacity"):
        out.append(narrow_table("capacity at equal bytes (sglang, clockless)",
                                [Col("model", "model"), Col("KV\n(GiB)", "cache_gib", "ratio"),
                                 Col("tokens", "cache_tokens", "int"),
                                 Col("hit\nrate", "hit_rate", "rate"),
                                 Col("ideal", "ideal_hit_rate", "rate")], doc["capacity"]))
    return out


HYBRID = Experiment("hybrid", hybrid_rows, layout=LAYOUT, tables=hybrid_tables, extras=extras)
