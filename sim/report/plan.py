"""``kvsim plan``'s report: the answers as narrow tables and goodput against GPUs as a plot.

The plot has one line per question (GPU, TP, router, policy, load): each run-level target at
its interval's pessimistic end and, where the SLO has per-request thresholds, goodput
(requests per second meeting them) against the GPUs of each size run, a filled marker where
the size meets the SLO at the interval's pessimistic end, a hollow one where it misses, the
knee ringed and the chosen deployment starred. Axes read plainly (no offset), GPU ticks are
whole, P:D shapes are labelled points, and points priced with another GPU's profile get their
note below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt

from sim.io import atomic_save_figure
from sim.slo import worst_end

from .tables import Col, narrow_table

KEYS = [Col("GPU", "gpu"), Col("memory\nfraction", "mem_fraction", "ratio"),
        Col("KV tokens\nper GPU", "kv_tokens_per_gpu", "int"), Col("TP", "tp", "int"),
        Col("router", "router"), Col("policy", "policy")]
def measures(doc: dict[str, Any], rows: list[dict[str, Any]]) -> list[Col]:
    """The size and price, then only what the SLO judges (each run-level target and its
    interval; attainment and goodput where it has per-request thresholds: without them
    attainment is 100% and goodput is throughput), a ``*`` where a point was priced with
    another GPU's profile, and the verdict: within 100 columns."""
    from sim.slo import parse_slo

    slo = parse_slo(doc["slo_text"] if "slo_text" in doc else doc["slo"])
    cols = [Col("size", "size"), Col("GPUs", "gpus", "int"), Col("$/h", "usd_per_h", "usd")]
    for k in slo.targets:  # e.g. ttft_p90_s -> "TTFT\np90 (s)"
        base, _, stat = k.removesuffix("_s").partition("_")
        cols += [Col(f"{base.upper()}\n{stat} (s)", k, "s"), Col("±", f"{k}_ci95", "text")]
    if slo.thresholds:
        cols += [Col("SLO\nmet", "slo_attainment", "rate"),
                 Col("±", "slo_attainment_ci95", "text"),
                 Col("goodput\nreq/s", "goodput_rps", "float3")]
    if any(r.get("profile_note") for r in rows):
        cols.append(Col("", "profile_mark"))
    return [*cols, Col("meets", "meets")]


def _shown(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as displayed: intervals as text, ``n/a`` where the repeats were identical (the
    router and policy draw nothing from the decision seeds the repeats vary), ``*`` beside a
    point priced with another GPU's profile."""
    out = []
    for r in rows:
        r = dict(r)
        for k in [k for k in r if k.endswith("_ci95")]:
            v = r[k]
            r[k] = ("n/a" if r.get("repeats_identical") else "-" if v is None or v != v
                    else f"{100 * v:.1f}%" if "attainment" in k else f"{v:.3f}")
        r["profile_mark"] = "*" if r.get("profile_note") else ""
        out.append(r)
    return out


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
    shown = measures(doc, [*every, *([doc["one_smaller"]] if doc.get("one_smaller") else [])])
    cols = [*keys, *shown]
    if narrow_table("", cols, _shown(every)).width is not None:
        # too wide for 100 columns even folded (many fields vary): the deployment as one
        # folding column (its question label) keeps every measure whole
        cols = [Col("deployment", "question"), *shown]
    doc = {**doc, "slo_text": doc["slo"]}
    if same:
        doc = {**doc, "slo": f"{doc['slo']} ({same})"}
    if rows:
        tables.append(_table(f"deployments meeting {doc['slo']} (cheapest first; at "
                             "one price, most margin first)", cols, _shown(rows)))
    missing = [a for a in doc["answers"] if not a.get("meets")]
    if missing:
        tables.append(narrow_table("no size in the range meets the SLO",
                                   [Col("question", "question")], missing))
    if doc.get("one_smaller"):
        tables.append(_table("one size smaller than the chosen deployment", cols,
                             _shown([doc["one_smaller"]])))
    if len(doc["buys"]) > 1:
        tables.append(_table("what each choice buys at the chosen size", cols,
                             _shown(doc["buys"])))
    return tables


def _table(title: str, cols: list[Col], rows: list[dict[str, Any]]) -> Any:
    t = narrow_table(title, cols, rows)
    if cols[0].key == "question":  # the folded deployment stays readable beside the numbers
        t.columns[0].min_width, t.padding = 16, (0, 1, 0, 0)
    return t


def _shown_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    one = [doc["one_smaller"]] if doc.get("one_smaller") else []
    return [*doc["cheapest"], *one, *doc["buys"]]


def plan_notes(doc: dict[str, Any]) -> list[str]:
    """What the tables cannot say: requests above the model's context (as ``kvsim run``
    warns), points priced with another GPU's profile (``*``), identical repeats (``n/a``),
    runs stopped early (``-``), and questions whose curve was not monotone (bisection fell
    back to every size)."""
    lines = []
    over = doc.get("over_context_requests") or 0
    if over:
        lines.append(f"warning: {over:,} requests have prompts above {doc.get('model')}'s "
                     f"{doc.get('model_context') or 0:,}-token context; replayed anyway (a "
                     "server would refuse them): cut the trace with --max-context")
    priced = dict.fromkeys(f"{r['gpu']} x{r.get('tp', 1)} {r['profile']}"
                           for r in _shown_rows(doc) if r.get("profile"))
    if priced:  # every point names the profile that priced it (issue 53 item 3)
        lines.append(f"priced with: {', '.join(priced)}")
    notes = dict.fromkeys(f"{r['gpu']}: {r['profile_note']}" for r in _shown_rows(doc)
                          if r.get("profile_note"))
    lines += [f"* {n}" for n in notes]
    same = dict.fromkeys(f"{r['router']} {r['policy']}" for r in _shown_rows(doc)
                         if r.get("repeats_identical"))
    if same:
        lines.append(f"n/a: the repeats vary decision seeds only, and {', '.join(same)} drew "
                     "nothing from them (deterministic): the repeats were identical, so there "
                     "is no interval and the pessimistic end is the run itself")
    stopped = [f"{r['router']} {r['policy']} at {r['size']}: {r['stopped_early']}"
               for r in _shown_rows(doc) if r.get("stopped_early")]
    if stopped:  # (sim/sweep/early_stop.py)
        lines.append("-: stopped once it could no longer meet, so no numbers: "
                     + "; ".join(stopped))
    why = {"not monotone": "more replicas did worse somewhere among the sizes bisection ran",
           "the largest size misses": "the largest size missed (bisection assumes it meets)"}
    for a in doc["answers"]:
        reason = a.get("search", "").partition("(")[2].rstrip(")")
        if reason:
            lines.append(f"note: {a['question']}: {why.get(reason, reason)}: every size below "
                         "its answer was run")
    return lines


def pick_line(doc: dict[str, Any], replicas: tuple[int, int], pd: bool) -> str:
    """The chosen deployment, saying when it was not priced as measured for it; or, when
    none meets, the nearest size run and what may help."""
    c = doc["chosen"]
    if c:
        line = (f"pick: {c['size']} x {c['gpu']} (TP {c['tp']}, {c['gpus']} GPUs, "
                f"${c['usd_per_h']:,.2f}/h), router {c['router']}, policy {c['policy']}")
        ties = [r for r in doc["cheapest"][1:] if r["usd_per_h"] == c["usd_per_h"]
                and r["gpus"] == c["gpus"] and r["margin"] < c["margin"]]
        if ties:  # the order at one price is by margin to the SLO (sim/sweep/plan.py)
            line += f" (of {len(ties) + 1} at this price, the most margin to the SLO)"
        if c.get("profile_note"):
            line += f"; not priced as measured for it: {c['profile_note']}"
        return line
    best = [(a["best"], a["question"]) for a in doc["answers"] if a.get("best")]
    if not best:
        return "no deployment meets the SLO"
    from sim.slo import parse_slo

    slo = parse_slo(doc["slo"])
    near, question = max(best, key=lambda b: b[0]["margin"])
    reached = ", ".join(f"{k} {near[k]:.3g}" + (f" (target {slo.targets[k]:g})"
                                                if k in slo.targets else
                                                f" (target {slo.attain:g})")
                        for k in near if k not in ("size", "gpus", "margin"))
    wider = "larger --pd shapes" if pd else f"--replicas beyond {replicas[1]}"
    far = near["margin"] < -1.0  # the nearest is more than twice its target
    hint = (f"relax --slo (or try {wider} if larger sizes still improve)" if far
            else f"try {wider} (or relax --slo)")
    return (f"no deployment in the range meets the SLO; nearest: {question} at size "
            f"{near['size']} ({near['gpus']} GPUs): {reached} at the pessimistic end: {hint}")


def plot_plan(doc: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> Path:
    """``plan_figure`` saved to ``path``."""
    fig = plan_figure(doc, rows)
    try:
        return atomic_save_figure(fig, path)
    finally:
        plt.close(fig)


def plot_plan_dir(d: Path, out: Path) -> Path:
    """``kvsim plot`` on a plan folder: the plan's figure (every point of every round, the
    pick starred) from its plan.json and plan.parquet, as out/plan.png."""
    import json

    import pandas as pd

    doc = json.loads((d / "plan.json").read_text())
    rows = pd.read_parquet(d / "plan.parquet").to_dict("records")
    return plot_plan(doc, rows, out / "plan.png")


def plan_figure(doc: dict[str, Any], rows: list[dict[str, Any]]) -> Any:
    """Per run-level SLO target its value at the interval's pessimistic end against GPUs,
    the target as a dashed line; then goodput against GPUs (module docstring). P:D shapes
    are points labelled with their shape (several shapes share a GPU count: no line)."""
    from sim.slo import parse_slo

    slo = parse_slo(doc["slo"])
    # goodput only where per-request thresholds make it differ from throughput
    panels = [*slo.targets, *(["goodput_rps"] if slo.thresholds else [])]
    fig, axes = plt.subplots(1, len(panels), figsize=(max(5.2 * len(panels), 8.0), 4.6),
                             squeeze=False)
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
            shapes = any(":" in str(r["size"]) for r in pts)
            ax.plot(xs, ys, color=c, linestyle="none" if shapes else ls, label=label,
                    linewidth=1.4, marker="o" if shapes else None, markerfacecolor="white")
            for x, y, r in zip(xs, ys, pts, strict=True):
                ax.plot([x], [y], "o", color=c, markersize=6,
                        markerfacecolor=c if r["meets"] else "white")
                if shapes:
                    ax.annotate(str(r["size"]), (x, y), textcoords="offset points",
                                xytext=(5, 3), fontsize=7, color=c)
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
        ax.set_xticks(sorted({int(r["gpus"]) for r in rows}))  # whole GPUs only
        ax.margins(x=0.12)  # room for the shape labels
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)  # no 1e-5+0.134
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    ring = "; ring: knee of goodput" if "goodput_rps" in panels else ""
    fig.suptitle(f"kvsim plan: {doc['slo']} (filled: meets at the pessimistic end{ring})",
                 fontsize=10)
    # the profile that priced each GPU, and what differs where it was not measured for it
    # (issue 51 cause G, issue 53 item 3)
    notes = sorted({f"{r['gpu']} x{r.get('tp', 1)}: {r['profile']}"
                    + (f" ({r['profile_note']})" if r.get("profile_note") else "")
                    for r in rows if r.get("profile")})
    if notes:
        fig.text(0.01, 0.01, "\n".join(notes), fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.035 * len(notes), 1, 1))
    return fig


def _pessimistic(row: dict[str, Any], key: str) -> float:
    """A panel's value: a latency at its interval's top, goodput at its mean."""
    return worst_end(row, key, 0.0 if key == "goodput_rps" else 1.0)
