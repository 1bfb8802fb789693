"""Fit profile coefficients to measured seconds (numpy + scipy, no torch).

Every model here is linear in non-negative coefficients, so the fit is non-negative least
squares (``scipy.optimize.nnls``) on *relative* residuals: row ``i`` is divided by the measured
time ``t_i``, so a 5 ms point weighs as much as a 5 s point and the fit minimises
``sum((pred_i / t_i - 1)**2)``. Columns are scaled to unit max before solving (units span
~10 orders of magnitude) and the solution is scaled back.

    prefill  t = fixed + per_linear_unit * linear + per_attention_unit * attention
                 + per_chunk_token_sq * tokens**2
    decode   t = intercept + per_seq * batch + per_context_token * (batch * context)
    copy     t = latency + bytes / bandwidth
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from costmodel.specs import ModelSpec
from costmodel.units import ranges_units

PREFILL_TERMS = ("fixed_s", "per_linear_unit_s", "per_attention_unit_s", "per_chunk_token_sq_s")
DECODE_TERMS = ("intercept_s", "per_seq_s", "per_context_token_s")
COPY_TERMS = ("latency_s", "s_per_byte")


@dataclass
class FitResult:
    """Coefficients fitted on the training rows, and their errors on training and held-out
    rows. ``rel_errors[i] = predicted_i / measured_i - 1``."""

    terms: tuple[str, ...]
    coeffs: np.ndarray
    predicted: np.ndarray
    rel_errors: np.ndarray
    holdout: np.ndarray  # bool per row
    r2: float
    metrics: dict[str, float | None] = field(default_factory=dict)

    def coeff(self, name: str) -> float:
        return float(self.coeffs[self.terms.index(name)])

    def summary(self) -> dict[str, float | int | None]:
        return dict(self.metrics)


def prefill_design(spec: ModelSpec, ranges: Sequence[Sequence[tuple[int, int]]]) -> np.ndarray:
    """One row per batch: ``[1, linear units, attention units, tokens**2]`` of ``spec``."""
    rows = []
    for batch in ranges:
        u = ranges_units(spec, batch)
        rows.append([1.0, float(u.linear), float(u.attention), float(u.tokens) ** 2])
    return np.array(rows, dtype=np.float64)


def decode_design(batches: Sequence[int], contexts: Sequence[int]) -> np.ndarray:
    b = np.asarray(batches, dtype=np.float64)
    c = np.asarray(contexts, dtype=np.float64)
    return np.column_stack([np.ones_like(b), b, b * c])


def copy_design(nbytes: Sequence[int]) -> np.ndarray:
    x = np.asarray(nbytes, dtype=np.float64)
    return np.column_stack([np.ones_like(x), x])


def nnls_relative(a: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Non-negative ``x`` minimising ``sum(((a @ x) / t - 1)**2)``."""
    if a.shape[0] == 0:
        raise ValueError("no points to fit")
    if np.any(~np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("measured times must be finite and > 0")
    aw = a / t[:, None]
    scale = np.abs(aw).max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(aw / scale, np.ones(len(t)), maxiter=50 * a.shape[1])
    return x / scale


def r_squared(measured: np.ndarray, predicted: np.ndarray) -> float:
    ss_tot = float(np.sum((measured - measured.mean()) ** 2))
    ss_res = float(np.sum((measured - predicted) ** 2))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


def fit(terms: Sequence[str], a: np.ndarray, t: Sequence[float],
        holdout: Sequence[bool] | None = None) -> FitResult:
    """Fit on the rows not held out; report errors on both sets."""
    t = np.asarray(t, dtype=np.float64)
    hold = np.zeros(len(t), bool) if holdout is None else np.asarray(holdout, bool)
    train = ~hold
    x = nnls_relative(a[train], t[train])
    pred = a @ x
    rel = pred / t - 1.0
    r2 = r_squared(t[train], pred[train])

    def stat(f, mask):
        return float(f(np.abs(rel[mask]))) if mask.any() else None

    metrics = {
        "r2": r2,
        "median_abs_rel_error": stat(np.median, train),
        "max_abs_rel_error": stat(np.max, train),
        "holdout_median_abs_rel_error": stat(np.median, hold),
        "holdout_max_abs_rel_error": stat(np.max, hold),
        "points": int(train.sum()),
        "holdout_points": int(hold.sum()),
    }
    return FitResult(tuple(terms), x, pred, rel, hold, r2, metrics)
