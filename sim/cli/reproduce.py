"""``kvsim reproduce NAME``: one of the paper's experiments, our numbers beside the paper's."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from .common import console, emit_json, fmt_metric, stderr

NAMES = ["figure1", "gpu-only", "two-tier", "ablation", "fcfs", "cpu-sweep", "policies",
         "cache-engineering", "pool"]

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


# policies: (header, row key); the full JSON has more (p99, JCT seconds, recomputed units).
POLICY_COLUMNS: list[tuple[str, str]] = [
    ("policy", "policy"), ("model", "model"), ("N", "sessions"), ("gaps", "gaps"),
    ("tree", "tree"), ("TTFT\nmean s", "ttft_mean_s"), ("TTFT\nchange", "ttft_change"),
    ("p90\nTTFT s", "ttft_p90_s"), ("JCT\nchange", "jct_change"), ("hit\nrate", "hit_rate"),
    ("gap\nclosed", "gap_closed"),
]


def policies_tables(rows: list[dict[str, Any]]) -> list[Table]:
    """Every row, then per policy its mean change and gap closed over the grid."""
    from sim.exp_policies import winners

    full = Table(title="kvsim reproduce policies: change vs sglang; gap closed = (sglang - "
                 "policy) / (sglang - oracle) on mean TTFT. clairvoyant-oracle reads the "
                 "replay's future: a clairvoyant heuristic, not a deployable policy.",
                 title_justify="left")
    for head, _ in POLICY_COLUMNS:
        full.add_column(head, justify="left" if head in ("policy", "model", "gaps", "tree")
                        else "right")
    for r in rows:
        full.add_row(*(fmt_metric(k, r.get(k)) for _, k in POLICY_COLUMNS))
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["policy"], []).append(r)
    summary = Table(title="per policy over the grid", title_justify="left")
    for head in ("policy", "configs", "mean TTFT\nchange", "best", "worst",
                 "mean gap\nclosed", "mean\nhit rate"):
        summary.add_column(head, justify="left" if head == "policy" else "right")
    for name, rs in by.items():
        ch = [r["ttft_change"] for r in rs]
        gaps = [r["gap_closed"] for r in rs if r["gap_closed"] == r["gap_closed"]]
        summary.add_row(name, str(len(rs)), f"{sum(ch) / len(ch):+.1%}", f"{min(ch):+.1%}",
                        f"{max(ch):+.1%}",
                        f"{sum(gaps) / len(gaps):.2f}" if gaps else "-",
                        f"{sum(r['hit_rate'] for r in rs) / len(rs):.1%}")
    best = Table(title="best policy per configuration (the oracle aside)", title_justify="left")
    for head in ("model", "N", "gaps", "tree", "best", "its change", "oracle change",
                 "faster than the oracle"):
        best.add_column(head)
    for w in winners(rows):
        best.add_row(w["model"], str(w["sessions"]), w["gaps"], w["tree"], w["best"],
                     f"{w['best_ttft_change']:+.1%}",
                     fmt_metric("ttft_change", w.get("oracle_ttft_change")),
                     ", ".join(w["beat_oracle"]) or "none")
    return [full, summary, best]
def cache_engineering_tables(doc: dict[str, Any]) -> None:
    """Our rows, then AKV's Table 2 beside them; both titles carry the accuracy caveat."""
    rows = doc["rows"]
    t = Table(title=f"kvsim reproduce cache-engineering -- {doc['trace_kind']}, gaps "
                    f"{doc['gaps']}. {doc['note']}", title_justify="left")
    for c in rows[0] if rows else []:
        t.add_column(c, justify="left" if isinstance(rows[0][c], str) else "right")
    for r in rows:
        t.add_row(*(fmt_metric(c, v) for c, v in r.items()))
    console().print(t)
    a = Table(title="AKV Table 2 (GPT-OSS-120B, its own agent traffic on 8 A800s: compare "
                    "directions, not values). Serving only, as ours: task accuracy is AKV's "
                    "Table 1", title_justify="left")
    akv = doc["akv_table2"]
    for c in akv[0]:
        a.add_column(c, justify="left" if isinstance(akv[0][c], str) else "right")
    for r in akv:
        a.add_row(*(fmt_metric(c, v) for c, v in r.items()))
    console().print(a)


def pool_tables(doc: dict[str, Any]) -> None:
    """The timed rows per workload, then the capacity curves (sim/exp_pool.py)."""
    for title, rows, drop in (("with and without a shared pool", doc["rows"], ()),
                              ("capacity (no clock; caches per replica)", doc["capacity"],
                               ("prompt_tokens", "hit_tokens", "policy"))):
        cols = [c for c in (rows[0] if rows else []) if c not in drop]
        t = Table(title=f"kvsim reproduce pool -- {title}", title_justify="left")
        for c in cols:
            t.add_column(c.replace("_", " "), justify="left" if isinstance(rows[0][c], str)
                         else "right")
        for r in rows:
            t.add_row(*(fmt_metric(c, r.get(c)) for c in cols))
        console().print(t)
    for note in doc.get("notes", []):
        console().print(f"note: {note}")


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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def reproduce_cmd(name: str, trace: str | None, gaps: str, prompt_nodes: str, quick: bool,
                  profiles: str | None, jobs: int, executor: str, address: str | None,
                  as_json: bool) -> None:
    """Run a named paper experiment and print ours beside the paper's numbers."""
    from sim.executors import ExecutorSpec
    from sim.experiments import reproduce

    if address and executor != "ray":
        raise click.UsageError("--address is for --executor ray")
    spec = ExecutorSpec(kind=executor, jobs=jobs, address=address)
    doc = reproduce(name, trace=trace, quick=quick, jobs=jobs, gaps=gaps,
                    prompt_nodes=prompt_nodes, executor=spec, profiles=profiles)
    if name != "figure1":
        stderr.print(f"{name}: trace {doc['trace']} ({doc['trace_kind']}), gaps {doc['gaps']}"
                     + (", quick" if quick else ""))
    if as_json:
        emit_json(doc)
        return
    rows = doc["rows"]
    if name == "figure1":
        console().print(figure1_table(rows))
        return
    if name == "policies":
        for table in policies_tables(rows):
            console().print(table)
        return
    if name == "cache-engineering":
        cache_engineering_tables(doc)
        return
    if name == "pool":
        pool_tables(doc)
        return
    t = Table(title=f"kvsim reproduce {name} -- {doc['trace_kind']}, gaps {doc['gaps']}")
    cols = list(rows[0]) if rows else []
    for c in cols:
        t.add_column(c, justify="left" if isinstance(rows[0][c], str) else "right")
    for r in rows:
        t.add_row(*(fmt_metric(c, r.get(c)) for c in cols))
    console().print(t)
