"""PNG plots of a run folder (``kvsim run --out``) or a sweep folder (``kvsim sweep``).

Run folder: the TTFT CDF of every policy and the mean TTFT / JCT change against the first
(with repeats, each change's 95% interval, and changes within it marked), a disaggregated
run's TTFT by part, titled with the trace, model, cache, the fleet's or PD pools' shape and
the load (sessions at once, or the open loop; the concurrency cap).
Sweep folder: small multiples, one visual encoding per grid field that varies: mean TTFT
against one field (x), the policy as the colour, the next two fields as panel columns and
rows, any further field as the line style; so every line of a panel is one series (same
policy, every other field equal) and no two lines of a panel look alike. With a baseline, the
same panels for the mean TTFT and JCT change against it (the baseline's own zeros left out).

Every file is written atomically (``sim.io``), mode 0644.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sim.io import atomic_save_figure, parse_size, read_json, read_parquet

from .fleet_load import replica_load

_POLICY_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _save(fig: Any, path: Path) -> Path:
    try:
        return atomic_save_figure(fig, path)
    finally:
        plt.close(fig)


def _run_title(s: dict[str, Any], cfg: dict[str, Any] | None = None) -> str:
    """Trace, model and cache; then the serving shape (fleet: replicas and router; PD: the
    pools and rule) and the load (closed loop: N sessions at once; open loop: the rate's
    scale), with the concurrency cap where set. ``cfg``: the run's config.json."""
    cfg = cfg or {}
    cpu = f" + CPU {s['cpu_cache_tokens']:,}" if s.get("cpu_cache_tokens") else ""
    shape = []
    if s.get("pd_prefill_replicas"):
        shape.append(f"PD {s['pd_prefill_replicas']}P:{s.get('pd_decode_replicas', '?')}D, "
                     f"rule {s.get('pd_rule', '?')}")
    elif s.get("replicas", 1) != 1 or s.get("router"):
        shape.append(f"{s.get('replicas', '?')} replicas, router {s.get('router', '?')}")
    if cfg.get("replay") == "open":
        scale = cfg.get("time_scale", 1.0)
        shape.append("open loop" + (f", send times x{scale:g}" if scale != 1.0 else ""))
    else:
        shape.append(f"N = {s.get('n_sessions', '?')}")
    if cfg.get("max_concurrency"):
        shape.append(f"at most {cfg['max_concurrency']:,} in flight")
    if s.get("repeats", 1) > 1:
        shape.append(f"{s['repeats']} repeats")
    return (f"{s.get('trace', '?')}: {s.get('model', '?')}, GPU cache "
            f"{s.get('gpu_cache_tokens', 0):,} tokens{cpu}\n{', '.join(shape)}")


def plot_run_dir(d: Path, out: Path) -> list[Path]:
    """TTFT CDF per policy, and mean TTFT / JCT change against the first policy."""
    runs = read_json(d / "runs.json")["runs"]
    cfg_file = d / runs[0]["policy"] / "config.json"
    title = _run_title(runs[0]["summary"], read_json(cfg_file) if cfg_file.is_file() else None)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        df = read_parquet(d / r["policy"] / "requests.parquet", columns=["ttft_s"])
        x = np.sort(df["ttft_s"].dropna().to_numpy())
        ax.step(x, np.arange(1, x.size + 1) / max(1, x.size), where="post",
                label=f"{r['policy']} (mean {r['summary'].get('ttft_mean_s') or 0:.2f} s)")
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("time to first token (s, log scale above 0.1 s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"TTFT CDF\n{title}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    paths = [_save(fig, out / "ttft_cdf.png")]
    for r in runs:  # fleets (--replicas): each replica's load over time
        if (d / r["policy"] / "load.parquet").is_file():
            paths.append(replica_load(d / r["policy"] / "load.parquet", r, title,
                                       out / f"replica_load_{r['policy']}.png"))
    for r in runs:  # fleets with a shared pool (--pool): occupancy and bytes moved
        if (d / r["policy"] / "pool.parquet").is_file():
            paths.append(_pool_use(d / r["policy"], r, title, out / f"pool_{r['policy']}.png"))
    if any((d / r["policy"] / "requests.parquet").is_file() and "pd_prefill_replicas" in
           r["summary"] for r in runs):
        paths.append(_pd_parts(d, runs, title, out / "pd_ttft_parts.png"))
    if len(runs) > 1:
        keys = {"mean TTFT": "ttft_mean_s", "mean JCT": "jct_mean_s"}
        paths.append(_bars(
            [r["policy"] for r in runs[1:]],
            {name: [100 * (r["change_vs_first"].get(k) or 0) for r in runs[1:]]
             for name, k in keys.items()},
            f"change vs {runs[0]['policy']} (%)",
            f"Mean TTFT and job completion time against {runs[0]['policy']}\n{title}",
            out / "change_vs_first.png",
            {name: [_change_interval(runs[0]["summary"], r["summary"], k) for r in runs[1:]]
             for name, k in keys.items()}))
    return paths


def _change_interval(a: dict[str, Any], b: dict[str, Any], key: str) -> float | None:
    """Half-width (in %) of a repeated run's change against the first: the two intervals
    together over the first's mean, so the bar's interval reaches zero exactly where the
    tables mark the change ``~`` (sim/report/runs.py ``within_interval``); None without
    repeats."""
    ca, cb, va = a.get(f"{key}_ci95"), b.get(f"{key}_ci95"), a.get(key)
    if None in (ca, cb, va) or ca != ca or cb != cb or not va:
        return None
    return 100 * (ca + cb) / va


# A disaggregated request's TTFT in order (sim/fleet/pd_run.py): they sum to it.
PD_PARTS = {"prealloc_wait_s": "decode slot (prealloc)", "prefill_s": "prefill",
            "transfer_queue_s": "transfer queue", "transfer_s": "KV transfer",
            "first_decode_s": "first decode"}


def _pd_parts(d: Path, runs: list[dict[str, Any]], title: str, png: Path) -> Path:
    """Mean TTFT of the remotely prefilled requests, stacked by its parts, per policy."""
    fig, ax = plt.subplots(figsize=(max(5.5, 1.1 * len(runs) + 3.5), 4.5))
    labels, bottoms = [], np.zeros(len(runs))
    means = np.zeros((len(PD_PARTS), len(runs)))
    for j, r in enumerate(runs):
        df = read_parquet(d / r["policy"] / "requests.parquet")
        remote = df
        for flag in ("dropped", "prefilled_locally"):  # served, prefilled on the pool
            if flag in remote:
                remote = remote[~remote[flag].astype(bool)]
        for i, k in enumerate(PD_PARTS):
            means[i, j] = float(remote[k].fillna(0.0).mean()) if k in remote and len(
                remote) else 0.0
        local = r["summary"].get("prefilled_locally_share") or 0.0
        labels.append(f"{r['policy']}\n({len(remote):,} remote" +
                      (f", {local:.0%} local)" if local else ")"))
    x = np.arange(len(runs))
    for i, name in enumerate(PD_PARTS.values()):
        ax.bar(x, means[i], 0.6, bottom=bottoms, label=name, color=f"C{i}")
        bottoms += means[i]
    for j, total in enumerate(bottoms):
        ax.annotate(f"{total:.3f} s", (x[j], total), ha="center", va="bottom", fontsize=8,
                    xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("mean seconds (remotely prefilled requests)")
    ax.set_title(f"TTFT by part, disaggregated requests\n{title}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, png)


def _pool_use(d: Path, run: dict[str, Any], title: str, png: Path) -> Path:
    """The shared pool over time: occupancy against its size (top), bytes fetched per second
    in 100 bins against every replica's link at full bandwidth (bottom)."""
    s = run["summary"]
    occ = pd.read_parquet(d / "pool.parquet")
    moved = pd.read_parquet(d / "pool_transfers.parquet")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.step(occ["time_s"], occ["tokens"], where="post", lw=0.9, label="held")
    top.axhline(s.get("pool_size_tokens", 0), color="grey", ls="--", label="pool size")
    top.set_ylabel("pool (tokens)")
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    end = max(float(occ["time_s"].max()) if len(occ) else 0.0,
              float(moved["end_s"].max()) if len(moved) else 0.0, 1e-9)
    edges = np.linspace(0.0, end, 101)
    rate = np.zeros(100)
    for a, b, nbytes in moved[["start_s", "end_s", "bytes"]].itertuples(index=False):
        # spread each transfer's bytes over the bins it spans, in proportion to the overlap
        lo, hi = np.maximum(edges[:-1], a), np.minimum(edges[1:], b)
        rate += np.clip(hi - lo, 0.0, None) * (nbytes / max(b - a, 1e-12))
    bottom.step(edges[:-1], rate / np.diff(edges) / 1e9, where="post", lw=0.9,
                label="fetched")
    cap = s.get("pool_bandwidth_gb_s", 0) * s.get("replicas", 1)
    bottom.axhline(cap, color="grey", ls="--", label=f"links ({cap:g} GB/s)")
    bottom.set_xlabel("simulated time (s)")
    bottom.set_ylabel("GB/s")
    bottom.legend(fontsize=8)
    bottom.grid(alpha=0.3)
    top.set_title(f"Shared pool, {run['policy']} ({s.get('pool_write', '?')}; "
                  f"{100 * (s.get('pool_hit_rate') or 0):.1f}% of prompt tokens from it)\n"
                  f"{title}", fontsize=10)
    return _save(fig, png)


def _bars(labels: list[str], series: dict[str, list[float]], ylabel: str, title: str,
          path: Path, errors: dict[str, list[float | None]] | None = None) -> Path:
    """Grouped bars, one colour per series. ``errors``: each bar's 95% half-width (None:
    none); a bar whose interval reaches zero is within noise: faded, hatched, marked ``~``."""
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(labels) + 3), 4.5))
    width = 0.8 / max(1, len(series))
    x = np.arange(len(labels))
    noisy = False
    for i, (name, vals) in enumerate(series.items()):
        err = (errors or {}).get(name) or [None] * len(vals)
        within = [e is not None and abs(v) <= e for v, e in zip(vals, err, strict=True)]
        noisy = noisy or any(within)
        yerr = None if all(e is None for e in err) else [e or 0.0 for e in err]
        bars = ax.bar(x + i * width, vals, width, label=name, color=f"C{i}", yerr=yerr,
                      capsize=3, error_kw={"lw": 0.9})
        for bar, w in zip(bars, within, strict=True):
            if w:
                bar.set_alpha(0.4)
                bar.set_hatch("//")
        ax.bar_label(bars, labels=[f"{v:+.1f}{' ~' if w else ''}" for v, w in
                                   zip(vals, within, strict=True)], fontsize=7, padding=2)
    ax.set_xticks(x + width * (len(series) - 1) / 2, labels, rotation=30, ha="right")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    # legend entries from the series' colours: an empty series has no bar to take one from
    # (matplotlib then gives every entry the first colour)
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=f"C{i}", label=name) for i, name in enumerate(series)]
    if any(e is not None for err in (errors or {}).values() for e in err):
        handles.append(Patch(facecolor="none", edgecolor="none", label="error bars: 95% "
                             "intervals of the repeats"))
    if noisy:
        handles.append(Patch(facecolor="grey", alpha=0.4, hatch="//",
                             label="~ within the intervals (noise)"))
    ax.legend(handles=handles, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _positions(values: list[str]) -> tuple[dict[str, float], bool]:
    """x positions of a field's values: numeric when every value is a number or a size
    (``128k``), else their order in the grid."""
    try:
        pos = {v: float(parse_size(v)) for v in values}
        return pos, True
    except Exception:
        return {v: float(i) for i, v in enumerate(values)}, False


def short_value(value: str, limit: int = 24) -> str:
    """A grid value as a label: a path by its file name, anything longer than ``limit``
    characters cut in the middle."""
    text = Path(value).name if "/" in value else value
    if len(text) > limit:
        half = (limit - 1) // 2
        text = f"{text[:half]}~{text[-half:]}"
    return text


def policy_colors(n: int) -> list[Any]:
    """``n`` distinct colours: matplotlib's default cycle, tab20 past 10, then a colormap."""
    if n <= len(_POLICY_COLORS):
        return _POLICY_COLORS[:n]
    cmap = plt.get_cmap("tab20" if n <= 20 else "turbo")
    return [cmap(i if n <= 20 else i / (n - 1)) for i in range(n)]


# Line styles for the fields drawn as styles inside a panel: (linestyle, marker) pairs.
_STYLES = [(ls, m) for m in ("o", "s", "^", "D", "v") for ls in ("-", "--", ":", "-.")]


@dataclass
class SweepLayout:
    """How a sweep's grid fields map onto a figure, one visual encoding per field: ``x`` the
    horizontal axis, the policy the colour, ``cols`` and ``rows`` the panels (small
    multiples), ``styles`` the line style and marker inside a panel."""

    x: str | None
    cols: str | None
    rows: str | None
    styles: list[str]
    policies: list[str]
    values: dict[str, list[str]]
    # the colour: the policy, or the router when the sweep compares routers (the policy
    # then takes a place among the fields)
    hue: str = "policy"
    hues: list[str] = field(default_factory=list)

    def style_of(self, row: Any) -> tuple[str, str]:
        if not self.styles:
            return _STYLES[0]
        combos = list(itertools.product(*(self.values[f] for f in self.styles)))
        return _STYLES[combos.index(tuple(row[f] for f in self.styles)) % len(_STYLES)]

    def style_label(self, row: Any) -> str:
        return ", ".join(f"{f}={short_value(row[f])}" for f in self.styles)


def sweep_layout(df: pd.DataFrame, fields: list[str]) -> SweepLayout:
    """x: the numeric field with most values (else the field with most values); panel
    columns and rows: the next two fields; any others: line styles."""
    varied = [k for k in fields if df[k].nunique() > 1]
    hue = "router" if "router" in varied else "policy"
    if hue == "router":  # routers compared: their colours share one panel
        varied = [k for k in varied if k != "router"]
        if df["policy"].nunique() > 1:
            varied.append("policy")
    values = {k: list(dict.fromkeys(df[k])) for k in varied}
    numeric = [k for k in varied if _positions(values[k])[1]]
    x = max(numeric or varied, key=lambda k: len(values[k]), default=None)
    # the fields with most values become panels (columns first), the rest styles
    others = sorted((k for k in varied if k != x), key=lambda k: -len(values[k]))
    return SweepLayout(x=x, cols=others[0] if others else None,
                       rows=others[1] if len(others) > 1 else None, styles=others[2:],
                       policies=list(dict.fromkeys(df["policy"])), values=values, hue=hue,
                       hues=list(dict.fromkeys(df[hue])))


def _facets(layout: SweepLayout, title: str, ylabel: str,
            metric: pd.Series, df: pd.DataFrame, skip: pd.Series | None = None,
            zero_line: bool = False) -> Any:
    """One panel per (rows value, cols value); in each, one line per policy (colour) and
    style combination, ``metric`` against ``layout.x``; rows where ``skip`` is true are not
    drawn."""
    col_vals = layout.values[layout.cols] if layout.cols else [None]
    row_vals = layout.values[layout.rows] if layout.rows else [None]
    fig, axes = plt.subplots(len(row_vals), len(col_vals), squeeze=False, sharex=True,
                             sharey="row", figsize=(3.6 * len(col_vals) + 1.8,
                                                    2.9 * len(row_vals) + 1.2))
    hue, hues = layout.hue, layout.hues
    color = dict(zip(hues, policy_colors(len(hues)), strict=True))
    xvals = layout.values[layout.x] if layout.x else []
    pos, numeric = _positions(xvals) if layout.x else ({}, False)
    for r, rv in enumerate(row_vals):
        for c, cv in enumerate(col_vals):
            ax = axes[r][c]
            sel = pd.Series(True, index=df.index)
            if layout.cols:
                sel &= df[layout.cols] == cv
            if layout.rows:
                sel &= df[layout.rows] == rv
            part = df[sel & ~skip] if skip is not None else df[sel]
            for _, g in part.groupby([hue, *layout.styles], sort=False):
                first = g.iloc[0]
                ls, marker = layout.style_of(first)
                label = short_value(first[hue], 28)
                if layout.styles:
                    label += f" ({layout.style_label(first)})"
                if not layout.x:  # only the colour varies: one bar each
                    ax.bar([hues.index(first[hue])], metric[g.index],
                           color=color[first[hue]], label=label)
                    continue
                g = g.assign(_x=g[layout.x].map(pos)).sort_values("_x")
                ax.plot(g["_x"], metric[g.index], color=color[first[hue]], linestyle=ls,
                        marker=marker, lw=1.5, ms=5, label=label)
            if zero_line:
                ax.axhline(0, color="black", lw=0.8, gid="reference")
            if layout.x:
                ax.set_xticks([pos[v] for v in xvals], [short_value(v) for v in xvals])
                if numeric and max(pos.values()) / max(min(pos.values()), 1e-9) > 8:
                    ax.set_xscale("log")
                    ax.set_xticks([pos[v] for v in xvals], [short_value(v) for v in xvals])
                    ax.minorticks_off()
                if r == len(row_vals) - 1:
                    ax.set_xlabel(layout.x)
            else:
                ax.set_xticks(range(len(hues)), [short_value(p, 16) for p in hues],
                              rotation=20)
            where = [f"{f} = {short_value(v)}" for f, v in ((layout.cols, cv),
                                                            (layout.rows, rv)) if f]
            if where:
                ax.set_title(", ".join(where), fontsize=9)
            if c == 0:
                ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes.flat[1:]:  # every line once in the legend, whichever panel has it
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5),
                   fontsize=8, title=hue + (f" ({', '.join(layout.styles)})"
                                                 if layout.styles else ""),
                   title_fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def sweep_figures(d: Path) -> dict[str, Any]:
    """The figures of a sweep folder by file name (``plot_sweep_dir`` writes them)."""
    df = pd.read_csv(d / "results.csv", dtype=str, keep_default_na=False)
    grid = read_json(d / "sweep.json")["points"]
    if len(df) != len(grid):  # a results.csv cut short would plot part of the sweep
        from sim.io import InputError

        raise InputError(f"{d / 'results.csv'}: {len(df)} rows for the {len(grid)} points of "
                         "sweep.json (truncated?); rerun kvsim sweep to rewrite it")
    from sim.sweep.identity import grid_columns

    # the policy is the colour: its spec (``policy``'s column) is not a field of its own
    fields = grid_columns(k for k in (grid[0]["values"] if grid else {}) if k != "policy")
    layout = sweep_layout(df, fields)
    n = f"{d.name}: {len(df)} points"
    figs = {"sweep_ttft.png": _facets(
        layout, f"{n}: mean TTFT", "mean TTFT (s)",
        pd.to_numeric(df["ttft_mean_s"], errors="coerce"), df)}
    if "ttft_mean_s_change" in df.columns:
        changes = {m: pd.to_numeric(df[f"{m}_change"], errors="coerce")
                   for m in ("ttft_mean_s", "jct_mean_s")}
        # the baseline's own points (their changes are 0 by definition) are not drawn
        if all("baseline_point" in p for p in grid):
            own = df["point"].isin([p["point"] for p in grid
                                    if p["baseline_point"] == p["point"]])
        else:  # a folder of an older kvsim: the policies whose changes are all 0
            own = df["policy"].isin([p for p in layout.policies if (
                changes["ttft_mean_s"][df["policy"] == p].fillna(0).abs() < 1e-12).all()])
        if own.all() or (changes["ttft_mean_s"][~own].fillna(0).abs() < 1e-12).all():
            print(f"kvsim plot: {d}: no change chart: every point's TTFT equals its "
                  "baseline's", file=sys.stderr)
            return figs
        base = sorted({p for p in layout.policies if own[df["policy"] == p].all()})
        which = ", ".join(base) if base else "the baseline points"
        for m, name, what in (("ttft_mean_s", "sweep_change.png", "mean TTFT"),
                              ("jct_mean_s", "sweep_jct_change.png", "mean JCT")):
            figs[name] = _facets(
                layout, f"{n}: {what} change against the baseline point ({which}: 0 by "
                "definition, not drawn)", f"{what} change (%)", 100 * changes[m], df, own,
                zero_line=True)
    return figs


def plot_sweep_dir(d: Path, out: Path) -> list[Path]:
    return [_save(fig, out / name) for name, fig in sweep_figures(d).items()]


def plot_dir(d: str | Path, out: str | Path | None = None) -> list[Path]:
    """Plot a run, sweep or plan folder ``d`` into ``out`` (default: ``d``)."""
    d = Path(d)
    out = d if out is None else Path(out)
    if (d / "plan.json").exists():  # a plan's points are sweep rounds: draw the plan
        from .plan import plot_plan_dir

        return [plot_plan_dir(d, out)]
    if (d / "results.csv").exists() and (d / "sweep.json").exists():
        return plot_sweep_dir(d, out)
    if (d / "runs.json").exists():
        return plot_run_dir(d, out)
    raise FileNotFoundError(f"{d}: neither a run folder (runs.json, from kvsim run --out), "
                            "a finished sweep folder (results.csv, from kvsim sweep) nor a "
                            "plan folder (plan.json, from kvsim plan)")


def plot_capacity(rows: list[dict[str, Any]], title: str, path: Path) -> Path:
    """Hit rate against cache size (log scale), one line per configuration (policy, replicas,
    router, pool; with sizes in bytes, per model against GiB), and the infinite-cache hit
    rate as a dashed line."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series: dict[str, list[dict[str, Any]]] = {}
    x = "cache_bytes" if rows and "cache_bytes" in rows[0] else "cache_tokens"
    for r in rows:
        label = r["policy"] if "model" not in r else f"{r['model']}, {r['policy']}"
        if r.get("replicas", 1) > 1:
            label += f", {r['replicas']} replicas ({r['router']})"
        if r.get("pool_tokens"):
            label += f", pool {r['pool_tokens']:,}"
            if r.get("pool_write") == "write-back":
                label += " (write-back)"
        series.setdefault(label, []).append(r)
    markers = "os^vD<>p"
    for i, (label, pts) in enumerate(series.items()):
        pts = sorted(pts, key=lambda r: r[x])
        ax.plot([r[x] / (2**30 if x == "cache_bytes" else 1) for r in pts],
                [100 * r["hit_rate"] for r in pts],
                marker=markers[i % len(markers)], color=_POLICY_COLORS[i % len(_POLICY_COLORS)],
                label=label)
    if rows:
        ax.axhline(100 * rows[0]["ideal_hit_rate"], color="grey", linestyle="--",
                   label="infinite cache")
    ax.set_xscale("log")
    ax.set_xlabel("KV memory per replica (GiB)" if x == "cache_bytes"
                  else "cache per replica (tokens)")
    ax.set_ylabel("hit rate (% of prompt tokens)")
    ax.set_ylim(0, 100)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return _save(fig, path)
