"""``kvsim reproduce NAME``: one of the paper's experiments, our numbers beside the paper's."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import click
from rich.table import Table

from sim.report.tables import Col, narrow_table

from .common import console, emit_json, stderr

NAMES = ["figure1", "gpu-only", "two-tier", "ablation", "fcfs", "cpu-sweep", "policies",
         "cache-engineering", "fleet", "pool"]

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


def figure1_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="Figure 1 (cost model, qwen3-8b, h100 profile): the next request's cost "
                    "after deleting 30% of the context at the front or at the tail; speedup = "
                    "tail / front", title_justify="left")
    for head, _, _ in FIGURE1_COLUMNS:
        t.add_column(head, justify="right")
    for r in rows:
        t.add_row(*("-" if r.get(k) is None else fmt.format(r[k])
                    for _, k, fmt in FIGURE1_COLUMNS))
    return t


TREE, MODEL, N = Col("tree", "prompt_nodes"), Col("model", "model"), Col("N", "sessions", "int")

# experiment -> [(table title, columns)]
LAYOUTS: dict[str, list[tuple[str, list[Col]]]] = {
    "gpu-only": [
        ("mean TTFT: each policy against its engine's own default policy (the baseline)",
         [Col("engine", "engine"), TREE, MODEL, N, Col("policy", "policy"),
          Col("TTFT\n(s)", "ttft_mean_s", "s"),
          Col("baseline\nTTFT (s)", "baseline_ttft_mean_s", "s"),
          Col("TTFT\nchange", "ttft_change", "change"),
          Col("paper\nTTFT change", "paper_ttft_change", "paper")]),
        ("mean JCT and hit rate against the baseline",
         [Col("engine", "engine"), TREE, MODEL, N, Col("policy", "policy"),
          Col("JCT\nchange", "jct_change", "change"),
          Col("paper\nJCT change", "paper_jct_change", "paper"),
          Col("hit\nrate", "hit_rate", "rate"),
          Col("hit rate\nchange", "hit_rate", "pp", minus="baseline_hit_rate")]),
        ("prompt tokens computed again after preemptions (vLLM) or retractions (SGLang)",
         [Col("engine", "engine"), TREE, MODEL, N, Col("policy", "policy"),
          Col("redone\n(tokens)", "preempted_recompute_tokens", "int"),
          Col("baseline\nredone", "baseline_preempted_recompute_tokens", "int")]),
    ],
    "ablation": [
        ("start x granularity against sglang: mean TTFT and hit rate",
         [TREE, Col("evict", "evict"), Col("granularity", "granularity"),
          Col("TTFT\n(s)", "ttft_mean_s", "s"), Col("TTFT\nchange", "ttft_change", "change"),
          Col("paper", "paper_ttft_change", "paper"),
          Col("vs\npaper", "difference", "pp"),
          Col("hit\nrate", "hit_rate", "rate"),
          Col("paper\nhit rate", "paper_hit_rate", "paper_rate")]),
        ("share of the recomputation carried by requests that lost >= 90% of their private "
         "history",
         [TREE, Col("evict", "evict"), Col("granularity", "granularity"),
          Col("share", "recompute_share_lost90", "rate"),
          Col("paper", "paper_recompute_share_lost90", "paper_rate")]),
    ],
    "fcfs": [
        ("penelope against sglang per case: mean TTFT and JCT",
         [Col("case", "case"), Col("gaps", "gaps"),
          Col("TTFT\nchange", "ttft_change", "change"),
          Col("paper\nTTFT change", "paper_ttft_change", "paper"),
          Col("JCT\nchange", "jct_change", "change"),
          Col("paper\nJCT change", "paper_jct_change", "paper")]),
        ("hit rate per case",
         [Col("case", "case"), Col("gaps", "gaps"),
          Col("sglang\nhit rate", "sglang_hit_rate", "rate"),
          Col("penelope\nhit rate", "hit_rate", "rate"),
          Col("hit rate\nchange", "hit_rate", "pp", minus="sglang_hit_rate")]),
    ],
    "two-tier": [
        ("mean TTFT (s) with a GPU and a CPU tier",
         [MODEL, N, Col("GPU\ntier", "gpu_tokens", "tokens"),
          Col("CPU\ntier", "cpu_tokens", "tokens"),
          Col("HiCache\nlpm", "hicache_lpm_ttft_s", "s"),
          Col("HiCache\nlpm-cpu", "hicache_lpm_cpu_ttft_s", "s"),
          Col("HiCache\nwrite-back", "hicache_write_back_ttft_s", "s"),
          Col("Penelope", "penelope_ttft_s", "s")]),
        ("mean TTFT changes (paper: ranges over models and N)",
         [MODEL, N, Col("lpm-cpu\nvs lpm", "lpm_cpu_change", "change"),
          Col("paper", "paper_lpm_cpu_change", "paper"),
          Col("Penelope\nvs lpm-cpu", "penelope_change_vs_lpm_cpu", "change"),
          Col("paper", "paper_penelope_change", "paper"),
          Col("Penelope vs\nwrite-back", "penelope_change_vs_write_back", "change")]),
        ("hit rate (GPU + CPU tier) and Penelope's mean JCT",
         [MODEL, N, Col("HiCache\nlpm-cpu", "hicache_hit_rate", "rate"),
          Col("HiCache\nwrite-back", "hicache_write_back_hit_rate", "rate"),
          Col("Penelope", "penelope_hit_rate", "rate"),
          Col("Penelope vs\nlpm-cpu", "penelope_hit_rate", "pp", minus="hicache_hit_rate"),
          Col("swap-buffer\nloads", "penelope_swap_buffer_loads", "int"),
          Col("JCT change\nvs lpm-cpu", "penelope_jct_change_vs_lpm_cpu", "change")]),
    ],
    "cpu-sweep": [
        ("mean TTFT and JCT as the CPU tier grows (penelope against sglang + HiCache)",
         [Col("CPU /\nGPU", "cpu_over_gpu", "int"), Col("GPU\ntier", "gpu_tokens", "tokens"),
          Col("CPU\ntier", "cpu_tokens", "tokens"),
          Col("sglang\nTTFT (s)", "sglang_ttft_s", "s"),
          Col("penelope\nTTFT (s)", "penelope_ttft_s", "s"),
          Col("TTFT\nchange", "ttft_change", "change"),
          Col("paper", "paper_ttft_change", "paper"),
          Col("JCT\nchange", "jct_change", "change")]),
        ("hit rate (GPU + CPU tier)",
         [Col("CPU /\nGPU", "cpu_over_gpu", "int"),
          Col("sglang", "sglang_hit_rate", "rate"),
          Col("paper\nsglang", "paper_sglang_hit_rate", "paper_rate"),
          Col("penelope", "penelope_hit_rate", "rate"),
          Col("change", "penelope_hit_rate", "pp", minus="sglang_hit_rate"),
          Col("dropped\nrequests", "dropped_requests", "int")]),
    ],
    "cache-engineering": [
        ("latency (s) and API-equivalent cost per context strategy and eviction",
         [Col("strategy", "strategy"), Col("eviction", "eviction"), MODEL,
          Col("N", "concurrency", "int"),
          Col("latency\nmean", "request_latency_mean_s", "s"),
          Col("latency\np95", "request_latency_p95_s", "s"),
          Col("TTFT\nmean", "ttft_mean_s", "s"),
          Col("cost\n(USD)", "api_cost_usd", "usd")]),
        ("throughput (tokens/s) and KV",
         [Col("strategy", "strategy"), Col("eviction", "eviction"), MODEL,
          Col("N", "concurrency", "int"),
          Col("input\ntokens/s", "input_tokens_per_s", "per_s"),
          Col("output\ntokens/s", "output_tokens_per_s", "per_s"),
          Col("KV peak\n(tokens)", "kv_peak_tokens", "int"),
          Col("recomputed\n(tokens)", "recomputed_tokens", "int")]),
    ],
}
AKV_COLUMNS = [Col("N", "concurrency", "int"), Col("method", "method"),
               Col("latency\nmean (s)", "request_latency_mean_s", "ratio"),
               Col("latency\np95 (s)", "request_latency_p95_s", "ratio"),
               Col("TTFT\nmean (s)", "ttft_mean_s", "ratio"),
               Col("input\ntokens/s", "input_tokens_per_s", "per_s"),
               Col("output\ntokens/s", "output_tokens_per_s", "per_s")]


def warn_idle_fleets(rows: list[dict[str, Any]]) -> None:
    """One warning line when fleet runs left replicas without a request (their rows' column
    ``idle replicas`` says which)."""
    idle = [r for r in rows if r.get("idle_replicas")]
    if idle:
        r = max(idle, key=lambda r: r["idle_replicas"])
        stderr.print(f"[yellow]warning:[/yellow] {len(idle)} of {len(rows)} fleet runs left "
                     f"replicas without a request (column 'idle replicas'; the most: "
                     f"{r['router']}, {r['policy']}, {r['idle_replicas']} of "
                     f"{r['replicas']} idle on {r['workload']})")


def experiment_tables(name: str, doc: dict[str, Any]) -> list[Table | str]:
    """The heading and tables of one experiment's document (``kvsim reproduce NAME``'s
    JSON)."""
    rows = doc["rows"]
    if name == "figure1":
        return [figure1_table(rows)]
    if name == "policies" and doc.get("engine") == "vllm":
        return continuum_tables(rows)
    if name == "policies":
        return policies_tables(rows)
    if name == "fleet":
        return fleet_tables(doc)
    if name == "pool":
        return pool_tables(doc)
    head = f"kvsim reproduce {name} -- {doc['trace_kind']}, gaps {doc['gaps']}"
    if name == "gpu-only":
        scheds = ", ".join(dict.fromkeys(f"{r['engine']} engine {r['scheduler']}"
                                         for r in rows))
        head += f"; schedulers: {scheds}"
    elif name == "fcfs":
        head += "; the codex cases replay synthetic:codex with its recorded gaps"
    elif name == "cache-engineering":
        head += f". {doc['note']}"
    tables: list[Table | str] = [head, *(narrow_table(title, cols, rows)
                                         for title, cols in LAYOUTS[name])]
    if name == "cache-engineering":
        tables.append(narrow_table(
            "AKV Table 2 (GPT-OSS-120B, its own agent traffic on 8 A800s: compare directions, "
            "not values). Serving only, as ours: task accuracy is AKV's Table 1", AKV_COLUMNS,
            doc["akv_table2"]))
    return tables


# policies: one table per configuration; the full JSON has more (p99, JCT seconds, units).
POLICY_COLUMNS = [Col("policy", "policy"), Col("TTFT\n(s)", "ttft_mean_s", "s"),
                  Col("TTFT\nchange", "ttft_change", "change"),
                  Col("p90\nTTFT (s)", "ttft_p90_s", "s"),
                  Col("JCT\nchange", "jct_change", "change"),
                  Col("hit\nrate", "hit_rate", "rate"),
                  Col("hit rate\nchange", "hit_rate", "pp", minus="sglang_hit_rate"),
                  Col("gap\nclosed", "gap_closed", "ratio")]


def policies_tables(rows: list[dict[str, Any]]) -> list[Table | str]:
    """Per configuration every policy against sglang, then per policy its mean change and
    gap closed over the grid, then the best policy per configuration."""
    from sim.exp_policies import winners

    by_config: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        by_config.setdefault((r["model"], r["sessions"], r["gaps"], r["tree"]), []).append(r)
    tables: list[Table | str] = [
        "kvsim reproduce policies: changes vs sglang; gap closed = (sglang - policy) / "
        "(sglang - oracle) on mean TTFT. clairvoyant-oracle reads the replay's future: a "
        "clairvoyant heuristic, not a deployable policy."]
    for (model, n, gaps, tree), rs in by_config.items():
        ref = next((r["hit_rate"] for r in rs if r["policy"] == "sglang"), None)
        title = f"{model}, N = {n}, gaps {gaps}, tree {tree}"
        tables.append(narrow_table(title, POLICY_COLUMNS,
                                   [{**r, "sglang_hit_rate": ref} for r in rs]))
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["policy"], []).append(r)
    summary = []
    def known(values: list[Any]) -> list[float]:  # NaN (None once through JSON) left out
        return [v for v in values if v is not None and v == v]

    for name, rs in by.items():
        ch, gaps_closed = known([r["ttft_change"] for r in rs]), known(
            [r["gap_closed"] for r in rs])
        summary.append({"policy": name, "configs": len(rs),
                        "mean": sum(ch) / len(ch) if ch else None,
                        "best": min(ch, default=None), "worst": max(ch, default=None),
                        "gap": sum(gaps_closed) / len(gaps_closed) if gaps_closed else None,
                        "hit": sum(r["hit_rate"] for r in rs) / len(rs)})
    tables.append(narrow_table("per policy over the grid (TTFT changes vs sglang)", [
        Col("policy", "policy"), Col("configs", "configs", "int"),
        Col("mean TTFT\nchange", "mean", "change"), Col("best", "best", "change"),
        Col("worst", "worst", "change"), Col("mean gap\nclosed", "gap", "ratio"),
        Col("mean\nhit rate", "hit", "rate")], summary))
    best = [{**w, "sessions": w["sessions"], "beat": ", ".join(w["beat_oracle"]) or "none"}
            for w in winners(rows)]
    tables.append(narrow_table("best policy per configuration (the oracle aside)", [
        MODEL, N, Col("gaps", "gaps"), Col("tree", "tree"), Col("best", "best"),
        Col("its TTFT\nchange", "best_ttft_change", "change"),
        Col("oracle\nchange", "oracle_ttft_change", "change"),
        Col("faster than\nthe oracle", "beat")], best))
    return tables


# policies --engine vllm: Continuum's variants against vLLM, one table per load.
CONTINUUM_COLUMNS = [Col("variant", "policy"), Col("JCT\nmean (s)", "jct_mean_s", "s"),
                     Col("JCT\nchange", "jct_change", "change"),
                     Col("JCT p90\n(s)", "jct_p90_s", "s"),
                     Col("TTFT\nmean (s)", "ttft_mean_s", "s"),
                     Col("TTFT p90\n(s)", "ttft_p90_s", "s"),
                     Col("recomputed\nsaved", "recomputed_saved_tokens", "int"),
                     Col("queue wait\nsaved (s)", "queue_saved_s", "s")]


def continuum_tables(rows: list[dict[str, Any]]) -> list[Table | str]:
    """Per load (N sessions) every variant against vllm."""
    by_n: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_n.setdefault(r["sessions"], []).append(r)
    tables: list[Table | str] = [
        "kvsim reproduce policies --engine vllm: Continuum's TTL pins and program-level FCFS "
        "as vLLM patches, changes vs vllm; Continuum reports over 8x better mean JCT. "
        "recomputed saved: prompt tokens vllm recomputed and the variant did not (the "
        "pins' share); queue wait saved: mean queue wait vs vllm (the order's share). "
        "TTFT changes, p90 changes and how the pins ended: --json."]
    for n, rs in by_n.items():
        tables.append(narrow_table(f"{rs[0]['model']}, N = {n}, gaps {rs[0]['gaps']}",
                                   CONTINUUM_COLUMNS, rs))
    return tables


FLEET_KEYS = [Col("router", "router"), Col("policy", "policy"), Col("N", "replicas", "int")]
FLEET_LAYOUTS = [
    ("time", [Col("TTFT\nmean (s)", "ttft_mean_s", "s"), Col("TTFT\np90 (s)", "ttft_p90_s", "s"),
              Col("JCT\nmean (s)", "jct_mean_s", "s"), Col("hit\nrate", "hit_rate", "rate")]),
    ("reuse and balance", [Col("reuse\navailable", "reuse_available", "rate"),
                           Col("reuse\ncaptured", "reuse_captured", "rate"),
                           Col("affinity", "affinity", "rate"),
                           Col("load\nCV", "load_cv", "ratio"),
                           Col("idle\nreplicas", "idle_replicas", "int")]),
]


def fleet_tables(doc: dict[str, Any]) -> list[Table | str]:
    """Per workload, a heading and two narrow tables (sim/exp_fleet.py's columns)."""
    out: list[Table | str] = []
    notes = "; ".join(doc.get("notes", []))
    for workload in dict.fromkeys(r["workload"] for r in doc["rows"]):
        rows = [r for r in doc["rows"] if r["workload"] == workload]
        out.append(f"kvsim reproduce fleet -- {workload}" + (f" ({notes})" if notes else ""))
        out.extend(narrow_table(f"{workload}: {title}", [*FLEET_KEYS, *cols], rows)
                   for title, cols in FLEET_LAYOUTS)
    if "pool_rows" in doc:  # the pool and capacity part of the experiment
        out.extend(pool_tables({**doc, "rows": doc["pool_rows"], "notes": []}))
    return out


POOL_KEYS = [Col("workload", "workload"), Col("router", "router"),
             Col("N", "replicas", "int"), Col("pool", "pool", "tokens")]
POOL_LAYOUTS = [
    ("with and without a shared pool", [
        Col("TTFT\nmean (s)", "ttft_mean_s", "s"), Col("TTFT\np90 (s)", "ttft_p90_s", "s"),
        Col("JCT\nmean (s)", "jct_mean_s", "s"), Col("hit\nrate", "hit_rate", "rate"),
        Col("reuse\ncaptured", "reuse_captured", "rate")]),
    ("what the pool served", [
        Col("pool\nhit rate", "pool_hit_rate", "rate"),
        Col("fetched\ntokens", "fetched_tokens", "int"), Col("fetch\n(s)", "fetch_s", "s"),
        Col("refused\nfetches", "refused_fetches", "int"),
        Col("link\nbusy", "bandwidth_utilization", "rate")]),
]
CAPACITY_COLUMNS = [Col("workload", "workload"), Col("router", "router"),
                    Col("N", "replicas", "int"),
                    Col("cache per\nreplica", "cache_tokens", "tokens"),
                    Col("pool", "pool_tokens", "tokens"), Col("hit\nrate", "hit_rate", "rate"),
                    Col("from the\npool", "pool_hit_rate", "rate"),
                    Col("infinite\ncache", "ideal_hit_rate", "rate")]


def pool_tables(doc: dict[str, Any]) -> list[Table | str]:
    """The timed rows, then the capacity curves of the same fleets (sim/exp_pool.py)."""
    out: list[Table | str] = [narrow_table(f"kvsim reproduce pool -- {title}",
                                           [*POOL_KEYS, *cols], doc["rows"])
                              for title, cols in POOL_LAYOUTS]
    out.append(narrow_table("capacity (no clock; caches per replica)", CAPACITY_COLUMNS,
                            doc.get("capacity", [])))
    out.extend(f"note: {note}" for note in doc.get("notes", []))
    return out


@click.command("reproduce")
@click.argument("name", type=click.Choice(NAMES))
@click.option("--trace", "-t", default=None,
              help="Trace to replay (default: ../shared/data/cc-traces when present, else "
                   "synthetic:claude-code).")
@click.option("--gaps", default="tool", show_default=True,
              help="Gap model; the paper replays the recorded tool time.")
@click.option("--prompt-nodes", type=click.Choice(["chunked", "whole"]), default="chunked",
              show_default=True, help="Tree shape (see kvsim run --help); ablation runs both.")
@click.option("--quick", is_flag=True, help="Shrink every run to seconds.")
@click.option("--profiles", type=click.Choice(["derived", "kernels"]), default=None,
              help="Shipped H100 profiles to price with: derived (datasheet) or kernels "
                   "(measured kernel tables) [default: each model's default profile].")
@click.option("-j", "--jobs", type=click.IntRange(min=0), default=1, show_default=True,
              help="Local: parallel processes. Ray: runs in flight (0 = no cap).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True, help="Where the runs execute (see kvsim sweep --help).")
@click.option("--address", default=None, metavar="ADDR",
              help="Ray: the cluster to join (auto, ray://HOST:10001); default: a local Ray.")
@click.option("--engine", type=click.Choice(["sglang", "vllm"]), default="sglang",
              show_default=True,
              help="policies only: vllm runs Continuum's patches of vLLM against vLLM at "
                   "N = 4, 8, 16, 32 (docs/policies.md).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def reproduce_cmd(name: str, trace: str | None, gaps: str, prompt_nodes: str, quick: bool,
                  profiles: str | None, jobs: int, executor: str, address: str | None,
                  engine: str, as_json: bool) -> None:
    """Run a named paper experiment and print ours beside the paper's numbers."""
    from sim.experiments import reproduce
    from sim.report.progress import progress
    from sim.sweep.executors import ExecutorSpec

    if address and executor != "ray":
        raise click.UsageError("--address is for --executor ray")
    if engine != "sglang" and name != "policies":
        raise click.UsageError(f"--engine {engine} is for the policies experiment only")
    spec = ExecutorSpec(kind=executor, jobs=jobs, address=address)
    with progress(f"kvsim reproduce {name}", "runs", console=stderr) if name != "figure1" \
            else nullcontext():  # figure1 prices a formula: nothing to wait for
        doc = reproduce(name, trace=trace, quick=quick, jobs=jobs, gaps=gaps,
                        prompt_nodes=prompt_nodes, executor=spec, profiles=profiles,
                        engine=engine)
    if name != "figure1":
        stderr.print(f"{name}: trace {doc['trace']} ({doc['trace_kind']}), gaps {doc['gaps']}"
                     + (", quick" if quick else ""))
    warn_idle_fleets(doc.get("rows", []))
    if as_json:
        emit_json(doc)
        return
    con = console()
    for i, table in enumerate(experiment_tables(name, doc)):
        if i and isinstance(table, Table):
            con.print()
        con.print(table)
