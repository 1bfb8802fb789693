"""``kvsim reproduce pd``: aggregated against disaggregated serving at the same GPU count.

Per workload, on ``GPUS`` Qwen3-8B SGLang GPUs (``QUICK_GPUS`` with ``--quick``), every
prefill pool and aggregated fleet routed by ``dynamo-kv`` (Dynamo's KV router, the one a
prefill pool is deployed behind), links ``rdma-400``:
- ``agg``: ``GPUS`` replicas, sglang and penelope eviction;
- the P:D ratios (every split of the GPUs), sglang eviction on the prefill pool;
- penelope eviction on the prefill pool at the even split;
- conditional disaggregation (``THRESHOLD`` uncached tokens) at the even split;
- decode caching off, and the output KV sent back (``--pd-return output``);
- the decode worker's KV landing unreserved (``--pd-prealloc off``) at the even split;
- the ``vllm`` engine: aggregated, and its pools at the even split (fcfs: vLLM's order);
- the field's PD rules (policies/pd_rules.py) at the even split, ``sglang-pd`` behind SGLang's
  own ``sglang-cache-aware`` router as its gateway deploys it.
Workloads: ``cc-traces`` (the paper's setup: top sessions, 15.6K shared prefix, 128K cut,
tool gaps, lpm; ``SESSIONS_PER_GPU`` sessions at once per GPU) and ``mooncake`` (the Mooncake
FAST'25 synthetic trace, open loop; ``--quick``: its first 300 requests). Without
../shared/data the Claude Code workload is the synthetic one and Mooncake is left out.
One row per run; docs/pd.md prints the table beside what the published systems report.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from sim.config import DEFAULTS, RunConfig
from sim.report.tables import Col, narrow_table
from sim.sweep import relative_change

from .study import SHARED_DATA, Experiment, StudySetup, run_all

GPUS = 8
QUICK_GPUS = 4
SESSIONS_PER_GPU = 4
QUICK_SESSIONS_PER_GPU = 2
ROUTER = "dynamo-kv"
THRESHOLD = 2048
RULES = ("dynamo", "sglang-pd", "llm-d", "mooncake")
ENGINE = DEFAULTS["engine"]  # every row's engine but the vLLM rows
MOONCAKE = SHARED_DATA / "mooncake" / "synthetic_trace.jsonl.gz"
QUICK_MOONCAKE_SELECT = "first:300"


def workloads(ctx: StudySetup, gpus: int) -> list[tuple[str, RunConfig]]:
    per = QUICK_SESSIONS_PER_GPU if ctx.quick else SESSIONS_PER_GPU
    out = [("cc-traces", ctx.base("qwen3-8b", per * gpus))]
    if MOONCAKE.is_file():
        out.append(("mooncake", RunConfig.from_flat(
            trace=str(MOONCAKE), trace_format="mooncake", replay="open", model="qwen3-8b",
            gpu_cache=262144, scheduler="lpm", profile=ctx.profile("qwen3-8b"),
            select=QUICK_MOONCAKE_SELECT if ctx.quick else None)))
    else:
        ctx.notes.append(f"mooncake workload left out: {MOONCAKE} is absent")
    return out


def arrangements(gpus: int) -> list[dict[str, Any]]:
    """The runs of one workload: (row keys, config changes)."""
    half = gpus // 2
    pd = dict(router=ROUTER)
    out: list[dict[str, Any]] = [
        dict(arrangement=f"agg {gpus}", policy=p, replicas=gpus, router=ROUTER)
        for p in ("sglang", "penelope")]
    for p in range(1, gpus):
        out.append(dict(arrangement=f"{p}P:{gpus - p}D", policy="sglang", prefill_replicas=p,
                        decode_replicas=gpus - p, **pd))
    even = dict(prefill_replicas=half, decode_replicas=gpus - half, **pd)
    out += [
        dict(arrangement=f"{half}P:{gpus - half}D", policy="penelope", **even),
        dict(arrangement=f"{half}P:{gpus - half}D", policy="sglang",
             pd_local_threshold=THRESHOLD, **even),
        dict(arrangement=f"{half}P:{gpus - half}D", policy="sglang", decode_cache="off",
             **even),
        dict(arrangement=f"{half}P:{gpus - half}D", policy="sglang", pd_return="output",
             **even),
    ]
    # the decode worker's KV lands unreserved (the old behaviour, --pd-prealloc off)
    out.append(dict(arrangement=f"{half}P:{gpus - half}D", policy="sglang", pd_prealloc="off",
                    **even))
    # vLLM pools (its KV connector path) against vLLM aggregated (FCFS: vLLM's only order)
    vllm = dict(policy="vllm", engine="vllm", scheduler="fcfs")
    out += [dict(arrangement=f"agg {gpus}", replicas=gpus, router=ROUTER, **vllm),
            dict(arrangement=f"{half}P:{gpus - half}D", **vllm, **even)]
    for rule in RULES:
        kw = dict(even)
        if rule in ("dynamo", "llm-d"):
            kw["pd_local_threshold"] = THRESHOLD
        if rule == "sglang-pd":
            kw["router"] = "sglang-cache-aware"
        out.append(dict(arrangement=f"{half}P:{gpus - half}D", policy="sglang", pd_rule=rule,
                        **kw))
    return out


KEYS = ("arrangement", "policy")


def configs(ctx: StudySetup) -> tuple[list[dict[str, Any]], list[RunConfig]]:
    gpus = QUICK_GPUS if ctx.quick else GPUS
    keys, cfgs = [], []
    for name, base in workloads(ctx, gpus):
        for a in arrangements(gpus):
            changes = {k: v for k, v in a.items() if k not in KEYS}
            cfgs.append(base.with_preset(a["policy"]).with_fields(**changes))
            keys.append({"workload": name, "gpus": gpus, **{k: a[k] for k in KEYS}})
    return keys, cfgs


def row(key: dict[str, Any], cfg: RunConfig, s: dict[str, Any]) -> dict[str, Any]:
    pd = cfg.is_pd
    return {
        **key,
        "router": cfg.fleet.router,
        "rule": cfg.pd.pd_rule if pd else "-",
        "threshold": cfg.pd.pd_local_threshold if pd else 0,
        "decode_cache": cfg.pd.decode_cache if pd else "-",
        "pd_return": cfg.pd.pd_return if pd else "-",
        "engine": cfg.engine.name,
        "prealloc": cfg.pd.pd_prealloc if pd else "-",
        "prealloc_wait_s_mean": s.get("prealloc_wait_s_mean", 0.0),
        "ttft_mean_s": s["ttft_mean_s"], "ttft_p90_s": s["ttft_p90_s"],
        "jct_mean_s": s["jct_mean_s"], "hit_rate": s["hit_rate"],
        "local_share": s.get("prefilled_locally_share", 1.0),
        "transfer_gb": s.get("transfer_bytes", 0) / 1e9,
        "link_busy_max": s.get("link_busy_share_max", 0.0),
        "prefill_busy": s.get("prefill_pool_busy_share", float("nan")),
        "decode_busy": s.get("decode_pool_busy_share", float("nan")),
        "prefill_s_mean": s.get("prefill_s_mean", 0.0),
        "transfer_s_mean": s.get("transfer_s_mean", 0.0),
        "first_decode_s_mean": s.get("first_decode_s_mean", 0.0),
        "decode_retractions": s.get("decode_retractions", s["retractions"]),
        "redone_tokens": s["preempted_recompute_tokens"],
        "recomputed_output_share": s.get("recomputed_output_tokens_share", 0.0),
        "requests": s["requests"], "dropped_requests": s["dropped_requests"],
    }


def pd_rows(ctx: StudySetup) -> list[dict[str, Any]]:
    """The rows, each with its change against the workload's first (aggregated sglang) row:
    ``ttft_change`` (relative) and ``agg_hit_rate`` (its hit rate, for a pp difference)."""
    keys, cfgs = configs(ctx)
    rows = [row(k, c, s) for k, c, s in zip(keys, cfgs, run_all(ctx, cfgs), strict=True)]
    first: dict[str, dict[str, Any]] = {}
    for r in rows:
        base = first.setdefault(r["workload"], r)
        r["ttft_change"] = relative_change(r["ttft_mean_s"], base["ttft_mean_s"])
        r["agg_hit_rate"] = base["hit_rate"]
    return rows


def setup(row: dict[str, Any]) -> str:
    """A row's arrangement in one cell: the split, the eviction, and what differs from the
    baseline PD fleet (rule, local threshold, decode cache, return, router)."""
    parts = [row["arrangement"], row["policy"]]
    if row["engine"] != ENGINE:
        parts.append(f"[{row['engine']}]")
    if row["prealloc"] == "off":
        parts.append("no prealloc")
    if row["rule"] != "-":
        parts.append(row["rule"])
    if row["threshold"]:
        parts.append(f"local<{row['threshold']:,}")
    if row["decode_cache"] == "off":
        parts.append("no decode cache")
    if row["pd_return"] not in ("-", "none"):
        parts.append(f"return {row['pd_return']}")
    if row["router"] != ROUTER:
        parts.append(f"({row['router']})")
    return " ".join(parts)


SETUP = Col("setup", "setup")
LAYOUT = (
    ("time and reuse", (SETUP, Col("TTFT\nmean (s)", "ttft_mean_s", "s"),
                        Col("vs agg", "ttft_change", "change"),
                        Col("hit\nrate", "hit_rate", "rate"),
                        Col("hit\nvs agg", "hit_rate", "pp", minus="agg_hit_rate"),
                        Col("output\nrecomputed", "recomputed_output_share", "rate"))),
    ("TTFT's parts", (SETUP, Col("TTFT\np90 (s)", "ttft_p90_s", "s"),
                      Col("JCT\nmean (s)", "jct_mean_s", "s"),
                      Col("prealloc\nwait (s)", "prealloc_wait_s_mean", "s"),
                      Col("prefill\nmean (s)", "prefill_s_mean", "s"),
                      Col("transfer\nmean (s)", "transfer_s_mean", "s"),
                      Col("first\ndecode (s)", "first_decode_s_mean", "s"))),
    ("pools and links", (SETUP, Col("local", "local_share", "rate"),
                         Col("moved\n(GB)", "transfer_gb", "ratio"),
                         Col("link\nbusy max", "link_busy_max", "rate"),
                         Col("prefill\nbusy", "prefill_busy", "rate"),
                         Col("decode\nbusy", "decode_busy", "rate"))),
    ("decode pressure", (SETUP, Col("retract-\nions", "decode_retractions", "int"),
                         Col("redone\ntokens", "redone_tokens", "int"),
                         Col("requests", "requests", "int"),
                         Col("dropped", "dropped_requests", "int"))),
)


def pd_tables(doc: dict[str, Any]) -> list[Table | str]:
    """Per workload, a heading and the layout's tables."""
    out: list[Table | str] = []
    notes = "; ".join(doc.get("notes", []))
    rows = [{**r, "setup": setup(r)} for r in doc["rows"]]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        mine = [r for r in rows if r["workload"] == workload]
        out.append(f"kvsim reproduce pd -- {workload}, {mine[0]['gpus']} GPUs"
                   + (f" ({notes})" if notes else ""))
        out.extend(narrow_table(f"{workload}: {title}", list(cols), mine)
                   for title, cols in LAYOUT)
    return out


PD = Experiment("pd", pd_rows, layout=LAYOUT, tables=pd_tables)
