"""The tidy table of a sweep: one row per point in grid order, ``*_change`` columns against
the baseline point (sim/sweep/points.py ``baseline``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from sim.io import read_json

if TYPE_CHECKING:
    import pandas as pd

    from .points import Sweep

CHANGE_METRICS = ("ttft_mean_s", "jct_mean_s", "hit_rate")


def summary_path(out: str | Path, pid: str) -> Path:
    return Path(out) / "points" / pid / "summary.json"


def relative_change(value: float, ref: float) -> float:
    """value / ref - 1; NaN (never inf) when the reference is missing, zero or NaN."""
    try:
        value, ref = float(value), float(ref)
    except (TypeError, ValueError):
        return math.nan
    if not ref or math.isnan(ref) or math.isnan(value):
        return math.nan
    return value / ref - 1.0


def tidy(sweep: Sweep, out: str | Path) -> pd.DataFrame:
    """One row per point in grid order: point, policy, the grid's values (as written), then
    every scalar of the point's summary; ``*_change`` columns against the baseline."""
    import pandas as pd

    df = pd.DataFrame([p.row(read_json(summary_path(out, p.id), "point summary"))
                       for p in sweep.points])
    if sweep.refs is not None and len(df):
        for metric in CHANGE_METRICS:
            vals = df[metric].tolist()
            df[f"{metric}_change"] = [relative_change(vals[i], vals[r])
                                      for i, r in enumerate(sweep.refs)]
    return df
