"""PNG plots of a run directory (``kvsim run --out``) or a sweep directory (``kvsim sweep``)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


def _save(fig, path: Path) -> Path:
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path


def plot_run_dir(d: Path) -> list[Path]:
    """TTFT CDF per policy, and mean TTFT / JCT change against the first policy."""
    runs = json.loads((d / "runs.json").read_text())["runs"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in runs:
        df = pd.read_parquet(d / r["policy"] / "requests.parquet", columns=["ttft_s"])
        x = np.sort(df["ttft_s"].dropna().to_numpy())
        ax.step(x, np.arange(1, x.size + 1) / max(1, x.size), where="post", label=r["policy"])
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("TTFT CDF")
    ax.grid(alpha=0.3)
    ax.legend()
    out = [_save(fig, d / "ttft_cdf.png")]
    out.append(_bars(
        [r["policy"] for r in runs[1:]],
        {m: [100 * (r["change_vs_first"].get(m) or 0) for r in runs[1:]]
         for m in ("ttft_mean_s", "jct_mean_s")},
        f"change vs {runs[0]['policy']} (%)", d / "change_vs_first.png"))
    return out


def _bars(labels: list[str], series: dict[str, list[float]], ylabel: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(labels) + 2), 4))
    width = 0.8 / max(1, len(series))
    x = np.arange(len(labels))
    for i, (name, vals) in enumerate(series.items()):
        ax.bar(x + i * width, vals, width, label=name.replace("_s", "").replace("_", " "))
    ax.set_xticks(x + width * (len(series) - 1) / 2, labels, rotation=30, ha="right")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_sweep_dir(d: Path) -> list[Path]:
    df = pd.read_parquet(d / "results.parquet")
    out = []
    if "ttft_mean_s_change" in df.columns:
        others = df[df["ttft_mean_s_change"].abs() > 1e-12]
        label_cols = [c for c in ("policy", "model", "gpu_cache", "sessions", "gaps", "trace")
                      if c in df.columns and df[c].nunique() > 1]
        labels = [" ".join(str(r[c]) for c in label_cols) for _, r in others.iterrows()]
        out.append(_bars(labels, {
            "ttft_mean_s": list(100 * others["ttft_mean_s_change"]),
            "jct_mean_s": list(100 * others["jct_mean_s_change"])},
            "change vs baseline (%)", d / "sweep_change.png"))
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, g in df.groupby("policy", sort=False):
        ax.plot(range(len(g)), g["ttft_mean_s"], marker="o", label=policy)
    ax.set_ylabel("mean TTFT (s)")
    ax.set_xlabel("grid point")
    ax.legend()
    ax.grid(alpha=0.3)
    out.append(_save(fig, d / "sweep_ttft.png"))
    return out


def plot_dir(d: str | Path) -> list[Path]:
    d = Path(d)
    if (d / "results.parquet").exists():
        return plot_sweep_dir(d)
    if (d / "runs.json").exists():
        return plot_run_dir(d)
    raise FileNotFoundError(f"{d}: neither a run directory (runs.json) nor a sweep "
                            "directory (results.parquet)")
