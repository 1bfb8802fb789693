"""Inter-token gaps of a run in closed form (docs/engine.md, Metrics).

Engines advance many decode steps per event, so a run never holds one number per token.
A decode run of ``n`` steps whose step times grow by a constant (``decode_run_seconds``:
each step reads ``batch`` more KV tokens) gives every request in it ``n - 1`` gaps forming
an arithmetic series ``step_s + inc_s * i`` (``i = 0 .. n-2``), plus one gap of its own:
from its previous token (before the run: a prefill batch, a pause, its prefill) to the
run's first step. ``TokenGaps`` keeps the series as (first, increment, count, weight) rows
and the lone gaps as values, and answers the mean and ``np.percentile``'s (linear)
percentiles over the multiset of all gaps exactly, by counting series terms below a value
(bisection over the value, never an expansion).
"""

from __future__ import annotations

import math
from array import array
from typing import Final

import numpy as np

_BISECTIONS: Final = 200  # enough for adjacent floats from [0, max]; stops when it cannot move
_NARROW_EVERY: Final = 4  # bisection steps between two narrowings of the gaps counted
_SETTLE_TERMS: Final = 4096  # gaps left in the bracket few enough to list (``_settle``)
_SETTLE_ULPS: Final = 64  # the window around the listed estimate, in units of the last place


class TokenGaps:
    """The inter-token gaps of a run (module docstring)."""

    def __init__(self) -> None:
        self._single = array("d")  # one gap each
        self._first = array("d")  # series: first gap, increment, terms, repeats
        self._inc = array("d")
        self._terms = array("q")
        self._weight = array("q")

    def add(self, gap: float) -> None:
        self._single.append(gap)

    def add_series(self, first: float, inc: float, terms: int, weight: int = 1) -> None:
        """``weight`` copies of the gaps ``first + inc * i``, ``i = 0 .. terms-1``."""
        if terms <= 0 or weight <= 0:
            return
        if terms == 1 and weight == 1:
            self._single.append(first)
            return
        self._first.append(first)
        self._inc.append(inc)
        self._terms.append(terms)
        self._weight.append(weight)

    def extend(self, other: TokenGaps) -> None:
        """Take ``other``'s gaps too (a fleet's replicas into one)."""
        self._single.extend(other._single)
        self._first.extend(other._first)
        self._inc.extend(other._inc)
        self._terms.extend(other._terms)
        self._weight.extend(other._weight)

    def _arrays(self):
        return (np.sort(np.frombuffer(self._single, dtype=np.float64)),
                np.frombuffer(self._first, dtype=np.float64),
                np.frombuffer(self._inc, dtype=np.float64),
                np.frombuffer(self._terms, dtype=np.int64),
                np.frombuffer(self._weight, dtype=np.int64))

    @property
    def count(self) -> int:
        terms = np.frombuffer(self._terms, dtype=np.int64)
        weight = np.frombuffer(self._weight, dtype=np.int64)
        return len(self._single) + int((terms * weight).sum())

    def mean(self) -> float:
        single, first, inc, terms, weight = self._arrays()
        n = single.size + int((terms * weight).sum())
        if not n:
            return math.nan
        series = (weight * (terms * first + inc * (terms * (terms - 1) / 2))).sum()
        return float((single.sum() + series) / n)

    def percentiles(self, qs: tuple[float, ...]) -> list[float]:
        """``np.percentile(all_gaps, q)`` for each ``q`` (linear interpolation between the
        two order statistics around rank ``(N - 1) q / 100``)."""
        arrays = self._arrays()
        single, _first, _inc, terms, weight = arrays
        n = single.size + int((terms * weight).sum())
        if not n:
            return [math.nan for _ in qs]
        ranks = [(n - 1) * q / 100 for q in qs]
        wanted: set[int] = set()
        for rank in ranks:
            lo = math.floor(rank)
            wanted.add(lo)
            if lo + 1 < n and rank != lo:
                wanted.add(lo + 1)
        stats = {j: _order_statistic(arrays, j) for j in sorted(wanted)}
        out = []
        for rank in ranks:
            lo = math.floor(rank)
            a = stats[lo]
            b = stats.get(lo + 1, a) if rank != lo else a
            out.append(float(a + (b - a) * (rank - lo)))
        return out


def _series_counts(first, inc, terms, x: float) -> np.ndarray:
    """Per series, how many of its terms are at most ``x`` (non-decreasing in ``x``: every
    step of the arithmetic rounds monotonically)."""
    rising = inc > 0  # (a flat series counts all its terms from its first on)
    k = np.floor((x - first) / np.where(rising, inc, 1.0)) + 1
    k = np.where(rising, k, np.where(first <= x, terms, 0))
    return np.minimum(np.maximum(k, 0), terms).astype(np.int64)


def _count_at_most(arrays, x: float) -> int:
    single, first, inc, terms, weight = arrays
    count = int(np.searchsorted(single, x, side="right"))
    if first.size:
        count += int((_series_counts(first, inc, terms, x) * weight).sum())
    return count


def _within(arrays, lo: float, hi: float):
    """(the gaps that can still change the count between ``lo`` and ``hi``, how many gaps are
    at most every value in between, how many lie in ``(lo, hi]``): singles at most ``lo`` and
    series wholly counted at ``lo`` always count there; singles above ``hi`` and series with
    nothing counted at ``hi`` never do. Exact: counts are non-decreasing in the value."""
    single, first, inc, terms, weight = arrays
    i0 = int(np.searchsorted(single, lo, side="right"))
    i1 = int(np.searchsorted(single, hi, side="right"))
    base, inside = i0, i1 - i0
    if first.size:
        at_lo = _series_counts(first, inc, terms, lo)
        at_hi = _series_counts(first, inc, terms, hi)
        whole = at_lo == terms
        base += int((terms[whole] * weight[whole]).sum())
        keep = ~whole & (at_hi > 0)
        inside += int((at_hi[keep] - at_lo[keep]).sum())
        first, inc, terms, weight = first[keep], inc[keep], terms[keep], weight[keep]
    return (single[i0:i1], first, inc, terms, weight), base, inside


def _order_statistic(arrays, j: int) -> float:
    """The ``j``-th smallest gap (0-based): the least value with more than ``j`` gaps at
    most it. A bisection over the value (it reaches adjacent floats well within
    ``_BISECTIONS`` steps); every few steps the gaps are narrowed to those that can still
    change the count inside the bracket (``_within``), and once few are left the answer is
    settled from their listed values (``_settle``), so later steps count few."""
    single, first, inc, terms, _weight = arrays
    tops = [single[-1]] if single.size else []
    if first.size:
        tops.append(float((first + inc * (terms - 1)).max()))
    lows = [single[0]] if single.size else []
    if first.size:
        lows.append(float(first.min()))
    lo, hi = min(lows), max(tops)
    if _count_at_most(arrays, lo) > j:
        return float(lo)
    base = 0  # gaps counted at every value in [lo, hi] but no longer in ``arrays``
    for step in range(_BISECTIONS):  # invariant: count(lo) <= j < count(hi)
        if step and step % _NARROW_EVERY == 0:
            arrays, below, inside = _within(arrays, lo, hi)
            base += below
            if inside <= _SETTLE_TERMS:
                settled = _settle(arrays, base, j, lo, hi)
                if settled is not None:
                    return settled
        mid = _midpoint(lo, hi)
        if mid <= lo or mid >= hi:
            break
        if base + _count_at_most(arrays, mid) > j:
            hi = mid
        else:
            lo = mid
    return float(hi)


def _midpoint(lo: float, hi: float) -> float:
    """The float halfway between ``lo`` and ``hi`` in bit patterns when both are
    non-negative (they order those floats as the values): on gaps spread over many orders of
    magnitude each step halves the orders left, where a halving of the value would spend its
    first steps on the longest gaps; else the arithmetic mean."""
    if lo < 0:
        return (lo + hi) / 2
    a = int(np.float64(lo).view(np.int64))
    b = int(np.float64(hi).view(np.int64))
    return float(np.int64((a + b) // 2).view(np.float64))


def _settle(arrays, base: int, j: int, lo: float, hi: float) -> float | None:
    """The least value in ``(lo, hi]`` with more than ``j`` gaps at most it, when few gaps
    of ``arrays`` (``base`` gaps counted below them) lie there: those listed give an
    estimate, the exact count confirms that the answer lies within ``_SETTLE_ULPS`` floats of
    it, and a bisection over the floats between (their bit patterns, ordered as the
    non-negative values are) finds it. None when the window does not hold it (the caller
    bisects on)."""
    single, first, inc, terms, weight = arrays
    if lo < 0:
        return None
    k_lo = _series_counts(first, inc, terms, lo)
    k_hi = _series_counts(first, inc, terms, hi)
    per = k_hi - k_lo  # each series' terms in (lo, hi], from its term k_lo on
    series = np.repeat(np.arange(first.size), per)
    term = k_lo[series] + np.arange(series.size) - np.repeat(np.cumsum(per) - per, per)
    values = np.concatenate((single, first[series] + inc[series] * term))
    counts = np.concatenate((np.ones(single.size, np.int64), weight[series]))
    order = np.argsort(values, kind="stable")
    rank = j - base - int((k_lo * weight).sum())  # among the gaps in (lo, hi]
    at = int(np.searchsorted(np.cumsum(counts[order]), rank, side="right"))
    if at >= values.size:
        return None
    return _pin(arrays, base, j, float(values[order[at]]), lo, hi)


def _pin(arrays, base: int, j: int, guess_value: float, lo: float, hi: float) -> float | None:
    """The least value in ``(lo, hi]`` with more than ``j`` gaps at most it (``base`` of them
    counted outside ``arrays``), when it lies within ``_SETTLE_ULPS`` floats of
    ``guess_value`` (a listed gap's value: rounding may put the count's step a few floats
    off): the exact count confirms the window, and a bisection over the floats between
    (their bit patterns, ordered as the non-negative values are) finds it. None when the
    window does not hold it."""
    guess = int(np.float64(guess_value).view(np.int64))
    if guess > 0 and lo < guess_value <= hi:  # most often the listed value is the step
        below = float(np.int64(guess - 1).view(np.float64))
        if lo <= below and base + _count_at_most(arrays, below) <= j \
                < base + _count_at_most(arrays, guess_value):
            return guess_value
    low = max(float(np.int64(max(guess - _SETTLE_ULPS, 0)).view(np.float64)), lo)
    high = min(float(np.int64(guess + _SETTLE_ULPS).view(np.float64)), hi)
    if not (base + _count_at_most(arrays, low) <= j < base + _count_at_most(arrays, high)):
        return None
    a = int(np.float64(low).view(np.int64))
    b = int(np.float64(high).view(np.int64))
    while b - a > 1:  # invariant: count(float(a)) <= j < count(float(b))
        m = (a + b) // 2
        if base + _count_at_most(arrays, float(np.int64(m).view(np.float64))) > j:
            b = m
        else:
            a = m
    return float(np.int64(b).view(np.float64))
