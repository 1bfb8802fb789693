"""PNG plots of a run folder (``kvsim run --out``) or a sweep folder (``kvsim sweep``).

Run folder: the TTFT CDF of every policy and the mean TTFT / JCT change against the first,
titled with the trace, model, cache and number of sessions.
Sweep folder: one panel per grid field that varies, mean TTFT against that field's values;
a line joins only points of one series (same policy, every other field equal), so no line
crosses from one configuration to an unrelated one. With a baseline, a bar chart of each
point's TTFT and JCT change against it.

Every file is written atomically (``sim.io``), mode 0644.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sim.io import atomic_save_figure, read_json, read_parquet

_POLICY_COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _save(fig: Any, path: Path) -> Path:
    try:
        return atomic_save_figure(fig, path)
    finally:
        plt.close(fig)


def _run_title(s: dict[str, Any]) -> str:
    cpu = f" + CPU {s['cpu_cache_tokens']:,}" if s.get("cpu_cache_tokens") else ""
    return (f"{s.get('trace', '?')}: {s.get('model', '?')}, GPU cache "
            f"{s.get('gpu_cache_tokens', 0):,} tokens{cpu}, N = {s.get('n_sessions', '?')}")


def plot_run_dir(d: Path, out: Path) -> list[Path]:
    """TTFT CDF per policy, and mean TTFT / JCT change against the first policy."""
    runs = read_json(d / "runs.json")["runs"]
    title = _run_title(runs[0]["summary"])
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
            paths.append(_replica_load(d / r["policy"] / "load.parquet", r, title,
                                       out / f"replica_load_{r['policy']}.png"))
    if len(runs) > 1:
        paths.append(_bars(
            [r["policy"] for r in runs[1:]],
            {"mean TTFT": [100 * (r["change_vs_first"].get("ttft_mean_s") or 0)
                           for r in runs[1:]],
             "mean JCT": [100 * (r["change_vs_first"].get("jct_mean_s") or 0)
                          for r in runs[1:]]},
            f"change vs {runs[0]['policy']} (%)",
            f"Mean TTFT and job completion time against {runs[0]['policy']}\n{title}",
            out / "change_vs_first.png"))
    return paths


def _replica_load(path: Path, run: dict[str, Any], title: str, png: Path) -> Path:
    """Requests in each replica (waiting + running), sampled at every routing decision."""
    df = pd.read_parquet(path)
    s = run["summary"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for replica, g in df.groupby("replica", sort=True):
        ax.step(g["time_s"], g["waiting"] + g["running"], where="post", lw=0.8,
                label=f"replica {replica}")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("requests in the replica (waiting + running)")
    ax.set_title(f"Load per replica, {run['policy']}, router {s.get('router', '?')} "
                 f"(busy-time CV {s.get('load_cv_busy') or 0:.2f})\n{title}", fontsize=10)
    ax.grid(alpha=0.3)
    if df["replica"].nunique() <= 16:
        ax.legend(fontsize=8, ncol=2)
    return _save(fig, png)


def _bars(labels: list[str], series: dict[str, list[float]], ylabel: str, title: str,
          path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(labels) + 3), 4.5))
    width = 0.8 / max(1, len(series))
    x = np.arange(len(labels))
    for i, (name, vals) in enumerate(series.items()):
        bars = ax.bar(x + i * width, vals, width, label=name, color=f"C{i}")
        ax.bar_label(bars, fmt="%+.1f", fontsize=7, padding=2)
    ax.set_xticks(x + width * (len(series) - 1) / 2, labels, rotation=30, ha="right")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    # legend entries from the series' colours: an empty series has no bar to take one from
    # (matplotlib then gives every entry the first colour)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(facecolor=f"C{i}", label=name) for i, name in enumerate(series)])
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _positions(values: list[str]) -> tuple[dict[str, float], bool]:
    """x positions of a field's values: numeric when every value is a number or a size
    (``128k``), else their order in the grid."""
    from sim.cli.common import parse_size

    try:
        pos = {v: float(parse_size(v)) for v in values}
        return pos, True
    except Exception:
        return {v: float(i) for i, v in enumerate(values)}, False


def plot_sweep_dir(d: Path, out: Path) -> list[Path]:
    df = pd.read_csv(d / "results.csv", dtype=str, keep_default_na=False)
    grid = read_json(d / "sweep.json")["points"]
    if len(df) != len(grid):  # a results.csv cut short would plot part of the sweep
        from sim.io import InputError

        raise InputError(f"{d / 'results.csv'}: {len(df)} rows for the {len(grid)} points of "
                         "sweep.json (truncated?); rerun kvsim sweep to rewrite it")
    from sim.sweep import COLUMN, POLICY_FIELDS

    fields = [COLUMN.get(k, k) for k in (grid[0]["values"] if grid else {})
              if k not in POLICY_FIELDS]
    varied = [k for k in fields if df[k].nunique() > 1]
    ttft = pd.to_numeric(df["ttft_mean_s"], errors="coerce")
    policies = list(dict.fromkeys(df["policy"]))
    color = {p: _POLICY_COLORS[i % len(_POLICY_COLORS)] for i, p in enumerate(policies)}
    paths = []
    panels = varied or ["policy"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2), squeeze=False)
    for ax, field in zip(axes[0], panels, strict=True):
        values = list(dict.fromkeys(df[field]))
        pos, numeric = _positions(values)
        others = [k for k in varied if k != field]
        for keys, g in df.groupby(["policy", *others], sort=False):
            keys = keys if isinstance(keys, tuple) else (keys,)
            g = g.assign(_x=g[field].map(pos), _y=ttft[g.index]).sort_values("_x")
            ax.plot(g["_x"], g["_y"], marker="o", color=color[keys[0]], alpha=0.8, lw=1.2)
        for p in policies:
            ax.plot([], [], marker="o", color=color[p], label=p)
        ax.set_xticks([pos[v] for v in values], values)
        if numeric and max(pos.values()) / max(min(pos.values()), 1e-9) > 8:
            ax.set_xscale("log")
            ax.set_xticks([pos[v] for v in values], values)
            ax.minorticks_off()
        ax.set_xlabel(field)
        ax.set_ylabel("mean TTFT (s)")
        ax.set_title(f"mean TTFT vs {field}" + (
            f"\n(one line per policy x {', '.join(others)})" if others else ""), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{d.name}: {len(df)} points", fontsize=11)
    fig.tight_layout()
    paths.append(_save(fig, out / "sweep_ttft.png"))
    if "ttft_mean_s_change" in df.columns:
        change = {m: pd.to_numeric(df[f"{m}_change"], errors="coerce")
                  for m in ("ttft_mean_s", "jct_mean_s")}
        keep = change["ttft_mean_s"].abs() > 1e-12  # the baseline points themselves: 0
        if not keep.any():  # every change is 0: a chart would be empty
            print(f"kvsim plot: {d}: no change chart: every point's TTFT equals its "
                  "baseline's", file=sys.stderr)
            return paths
        labels = [" ".join([r["policy"], *(f"{k}={r[k]}" for k in varied)])
                  for _, r in df[keep].iterrows()]
        paths.append(_bars(labels, {
            "mean TTFT": list(100 * change["ttft_mean_s"][keep].fillna(0)),
            "mean JCT": list(100 * change["jct_mean_s"][keep].fillna(0))},
            "change vs baseline (%)", f"{d.name}: change against the baseline point",
            out / "sweep_change.png"))
    return paths


def plot_dir(d: str | Path, out: str | Path | None = None) -> list[Path]:
    """Plot a run or sweep folder ``d`` into ``out`` (default: ``d``)."""
    d = Path(d)
    out = d if out is None else Path(out)
    if (d / "results.csv").exists() and (d / "sweep.json").exists():
        return plot_sweep_dir(d, out)
    if (d / "runs.json").exists():
        return plot_run_dir(d, out)
    raise FileNotFoundError(f"{d}: neither a run folder (runs.json, from kvsim run --out) nor "
                            "a finished sweep folder (results.csv, from kvsim sweep)")


def plot_capacity(rows: list[dict[str, Any]], title: str, path: Path) -> Path:
    """Hit rate against cache size (log scale), one line per configuration (policy, replicas,
    router, pool), and the infinite-cache hit rate as a dashed line."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        label = r["policy"]
        if r.get("replicas", 1) > 1:
            label += f", {r['replicas']} replicas ({r['router']})"
        if r.get("pool_tokens"):
            label += f", pool {r['pool_tokens']:,}"
        series.setdefault(label, []).append(r)
    markers = "os^vD<>p"
    for i, (label, pts) in enumerate(series.items()):
        pts = sorted(pts, key=lambda r: r["cache_tokens"])
        ax.plot([r["cache_tokens"] for r in pts], [100 * r["hit_rate"] for r in pts],
                marker=markers[i % len(markers)], color=_POLICY_COLORS[i % len(_POLICY_COLORS)],
                label=label)
    if rows:
        ax.axhline(100 * rows[0]["ideal_hit_rate"], color="grey", linestyle="--",
                   label="infinite cache")
    ax.set_xscale("log")
    ax.set_xlabel("cache per replica (tokens)")
    ax.set_ylabel("hit rate (% of prompt tokens)")
    ax.set_ylim(0, 100)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return _save(fig, path)
