"""A fleet's per-replica load as a heatmap (``kvsim plot`` of a fleet run folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from sim.io import atomic_save_figure


def _save(fig: Any, path: Path) -> Path:
    try:
        return atomic_save_figure(fig, path)
    finally:
        plt.close(fig)


LOAD_BINS = 200  # time bins of the per-replica load heatmap


def load_heatmap(df: pd.DataFrame, bins: int = LOAD_BINS
                 ) -> tuple[np.ndarray, np.ndarray, list[Any]]:
    """(replicas x bins matrix of time-weighted mean load, bin edges, replicas): each
    replica's requests (waiting + running, a step function sampled at every routing
    decision) averaged over each bin, the bins spanning the busy period only (from the
    first sample where the fleet holds a request to the last one where it holds none after
    holding some)."""
    times = np.unique(df["time_s"].to_numpy(dtype=float))
    replicas = sorted(df["replica"].unique())
    steps = []  # per replica: its sample times and loads, in time order
    total = np.zeros(times.size)
    for r in replicas:
        g = df[df["replica"] == r].sort_values("time_s", kind="stable")
        t = g["time_s"].to_numpy(dtype=float)
        v = (g["waiting"] + g["running"]).to_numpy(dtype=float)
        steps.append((t, v))
        at = np.searchsorted(t, times, side="right") - 1  # the last sample at or before
        total += np.where(at >= 0, v[np.maximum(at, 0)], 0.0)
    busy = np.flatnonzero(total > 0)
    if not busy.size:
        t0, t1 = float(times[0]) if times.size else 0.0, float(times[-1]) if times.size \
            else 1.0
    else:
        t0 = float(times[busy[0]])
        t1 = float(times[busy[-1] + 1]) if busy[-1] + 1 < times.size else float(times[-1])
    t1 = max(t1, t0 + 1e-9)
    edges = np.linspace(t0, t1, bins + 1)
    out = np.zeros((len(replicas), bins))
    for i, (t, v) in enumerate(steps):
        t = np.append(t, max(t1, t[-1]))  # the last value holds to the window's end
        cum = np.concatenate([[0.0], np.cumsum(v * np.diff(t))])
        at = np.interp(edges, t, cum, left=0.0)  # the area is linear between samples
        out[i] = np.diff(at) / np.diff(edges)
    return out, edges, replicas


def replica_load(path: Path, run: dict[str, Any], title: str, png: Path) -> Path:
    """Requests in each replica (waiting + running) as a heatmap: replica x time, the time
    axis clipped to the busy period (``load_heatmap``)."""
    df = pd.read_parquet(path)
    s = run["summary"]
    grid, edges, replicas = load_heatmap(df)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.35 * len(replicas)))
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis",
                   extent=(edges[0], edges[-1], len(replicas) - 0.5, -0.5))
    ax.set_yticks(range(len(replicas)), [f"replica {r}" for r in replicas]
                  if len(replicas) <= 16 else [str(r) for r in replicas])
    ax.set_xlabel("simulated time (s), the busy period")
    fig.colorbar(im, ax=ax, label="requests (waiting + running)")
    ax.set_title(f"Load per replica, {run['policy']}, router {s.get('router', '?')} "
                 f"(busy-time CV {s.get('load_cv_busy') or 0:.2f})\n{title}", fontsize=10)
    fig.tight_layout()
    return _save(fig, png)
