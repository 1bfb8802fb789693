"""``kvsim plan``'s report: the answers as narrow tables and goodput against GPUs as a plot.

The plot has one line per question (GPU, TP, router, policy, load): goodput (requests per
second meeting the per-request SLO thresholds) against the GPUs of each size run, a filled
marker where the size meets the SLO at the interval's pessimistic end, a hollow one where it
misses, the knee ringed and the chosen deployment starred.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt

from sim.io import atomic_save_figure

from .tables import Col, narrow_table

KEYS = [Col("GPU", "gpu"), Col("memory\nfraction", "mem_fraction", "ratio"),
        Col("KV tokens\nper GPU", "kv_tokens_per_gpu", "int"), Col("TP", "tp", "int"),
        Col("router", "router"), Col("policy", "policy")]
MEASURES = [Col("size", "size"), Col("GPUs", "gpus", "int"), Col("$/h", "usd_per_h", "usd"),
            Col("TTFT\np90 (s)", "ttft_p90_s", "s"), Col("±", "ttft_p90_s_ci95", "s"),
            Col("TPOT\nmean (ms)", "tpot_mean_s", "ms"),
            Col("SLO\nmet", "slo_attainment", "rate"), Col("±", "slo_attainment_ci95", "rate"),
            Col("goodput\nreq/s", "goodput_rps", "float3"),
            Col("meets", "meets")]


LOAD_KEYS = ("sessions", "time_scale")  # sim/sweep/plan.py: a question's load fields


def _load_cols(rows: list[dict[str, Any]]) -> list[Col]:
    return [Col(k, k) for k in LOAD_KEYS if any(k in r for r in rows)]


def _varied(cols: list[Col], rows: list[dict[str, Any]]) -> tuple[list[Col], str]:
    """The columns whose value differs between rows, and the others as ``k v`` text."""
    keep, same = [], []
    for c in cols:
        values = {str(r.get(c.key)) for r in rows}
        if len(values) > 1 or c.key in ("router", "policy"):
            keep.append(c)
        elif values:
            same.append(f"{c.head} {values.pop()}")
    return keep, ", ".join(same)


def plan_tables(doc: dict[str, Any]) -> list[Any]:
    """Cheapest deployments first, then what each choice buys at the chosen one; the
    question fields every answer shares go to the title."""
    tables = []
    rows = doc["cheapest"]
    every = [a for a in doc["answers"] if "gpu" in a] + doc["buys"]
    keys, same = _varied([*KEYS, *_load_cols(every)], every)
    if same:
        doc = {**doc, "slo": f"{doc['slo']} ({same})"}
    if rows:
        tables.append(narrow_table(f"deployments meeting {doc['slo']} (cheapest first)",
                                   [*keys, *MEASURES], rows))
    missing = [a for a in doc["answers"] if not a.get("meets")]
    if missing:
        tables.append(narrow_table("no size in the range meets the SLO",
                                   [Col("question", "question")], missing))
    if doc.get("one_smaller"):
        tables.append(narrow_table("one size smaller than the chosen deployment",
                                   [*keys, *MEASURES], [doc["one_smaller"]]))
    if len(doc["buys"]) > 1:
        tables.append(narrow_table("what each choice buys at the chosen size",
                                   [*keys, *MEASURES], doc["buys"]))
    return tables


def plot_plan(doc: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> Path:
    """Per run-level SLO target its value at the interval's pessimistic end against GPUs,
    the target as a dashed line; then goodput against GPUs (module docstring)."""
    from sim.slo import parse_slo

    slo = parse_slo(doc["slo"])
    panels = [*slo.targets, "goodput_rps"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    by_q: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_q.setdefault(r["question"], []).append(r)
    chosen = doc.get("chosen") or {}
    # colour: everything but the policy (GPU, TP, router, load); line style: the policy
    def hue_of(r: dict[str, Any]) -> str:
        return r["question"].replace(f" {r['policy']} ", " ")

    hues = sorted({hue_of(r) for r in rows})
    policies = sorted({r["policy"] for r in rows})
    styles = ["-", "--", ":", "-."]
    for ax, key in zip(axes[0], panels, strict=True):
        for label, pts in sorted(by_q.items()):
            pts = sorted(pts, key=lambda r: r["gpus"])
            c = colors[hues.index(hue_of(pts[0])) % len(colors)]
            ls = styles[policies.index(pts[0]["policy"]) % len(styles)]
            xs = [r["gpus"] for r in pts]
            ys = [_pessimistic(r, key) for r in pts]
            ax.plot(xs, ys, color=c, linestyle=ls, label=label, linewidth=1.4)
            for x, y, r in zip(xs, ys, pts, strict=True):
                ax.plot([x], [y], "o", color=c, markersize=6,
                        markerfacecolor=c if r["meets"] else "white")
            knee = doc["curves"].get(label, {}).get("knee_gpus")
            if key == "goodput_rps" and knee is not None:
                y = next(_pessimistic(r, key) for r in pts if r["gpus"] == knee)
                ax.plot([knee], [y], "o", markersize=15, markerfacecolor="none", color=c)
        if key in slo.targets:
            ax.axhline(slo.targets[key], color="black", linestyle="--", linewidth=1,
                       label=f"target {slo.targets[key]:g} s")
            ax.set_ylabel(f"{key} at the 95% interval's top (s)")
        else:
            ax.set_ylabel("goodput (requests/s within the per-request SLO)")
        if chosen:
            ax.plot([chosen["gpus"]], [_pessimistic(chosen, key)], "*", color="black",
                    markersize=14, label=f"chosen: {chosen['size']} x {chosen['gpu']}")
        ax.set_xlabel("GPUs")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(f"kvsim plan: {doc['slo']} (filled: meets at the pessimistic end; "
                 "ring: knee of goodput)", fontsize=10)
    fig.tight_layout()
    try:
        return atomic_save_figure(fig, path)
    finally:
        plt.close(fig)


def _pessimistic(row: dict[str, Any], key: str) -> float:
    v = row.get(key)
    ci = row.get(f"{key}_ci95")
    if v is None:
        return float("nan")
    return v + (ci if ci is not None and ci == ci and key != "goodput_rps" else 0.0)
