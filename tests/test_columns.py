"""``sim.engines.columns.ColumnTable`` (a run's tables as numpy columns, a DataFrame where one
is read) against pandas, which made these tables before: the frame, the join of replicas'
tables, the sort by send time and the NaN-skipping reductions of the summaries
(sim/engines/recorder.py ``_total``/``_mean``, sim/studies/saturation.py ``_median``) are
pandas' own, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engines.columns import ColumnTable, frame
from sim.engines.recorder import COLUMNS, RunRecorder, _mean, _total, empty_table
from sim.studies.saturation import _median

KINDS = ("int", "float", "bool", "str")


def _values(kind: str, n: int) -> st.SearchStrategy:
    one = {"int": st.integers(-2**40, 2**40),
           "float": st.one_of(st.floats(-1e12, 1e12), st.just(math.nan)),
           "bool": st.booleans(), "str": st.sampled_from(["", "a", "context", "cache"])}[kind]
    return st.lists(one, min_size=n, max_size=n)


def _array(kind: str, values: list) -> np.ndarray:
    return np.array(values, dtype={"int": np.int64, "float": np.float64, "bool": np.bool_,
                                   "str": object}[kind])


@st.composite
def tables(draw, n: int | None = None, kinds: tuple[str, ...] | None = None):
    """(kinds, ColumnTable) with columns c0.. of the drawn kinds and ``n`` rows."""
    n = draw(st.integers(0, 30)) if n is None else n
    kinds = kinds or tuple(draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=5)))
    cols = {f"c{i}": _array(k, draw(_values(k, n))) for i, k in enumerate(kinds)}
    return kinds, ColumnTable(cols, [f"c{i}" for i, k in enumerate(kinds) if k == "str"])


def _equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert list(a.dtypes) == list(b.dtypes)


@settings(max_examples=60, deadline=None)
@given(tables())
def test_the_frame_is_pandas_frame_of_the_arrays(drawn):
    """With rows: ``pd.DataFrame`` of the arrays. Without: the dtypes a row would give (a
    string column is pandas' string dtype, as the recorder's ``empty_table`` has it)."""
    kinds, cols = drawn
    if len(cols):
        _equal(cols.frame(), pd.DataFrame({k: cols[k] for k in cols}))
    else:
        row = {"int": 0, "float": 0.0, "bool": False, "str": ""}
        _equal(cols.frame(), pd.DataFrame([{f"c{i}": row[k] for i, k in enumerate(kinds)}])
               .iloc[:0].reset_index(drop=True))
    _equal(ColumnTable.of(cols.frame()).frame(), cols.frame())
    assert frame(cols.frame()) is not None and len(frame(cols)) == len(cols)


def test_an_empty_request_table_is_the_recorders_empty_table():
    rec = RunRecorder([], [], [], [])
    _equal(rec.columns().frame(), empty_table())
    assert list(rec.columns().names) == list(COLUMNS)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 2.5]), st.integers(0, 5)),
                max_size=40))
def test_rows_in_send_order_are_pandas_stable_sort(rows):
    """The fleet's and the saturation check's order: ``sort_values(["send_s", "request"],
    kind="stable")``, ties (same send and request) in table order."""
    t = ColumnTable({"send_s": np.array([s for s, _ in rows], dtype=float),
                 "request": np.array([r for _, r in rows], dtype=np.int64),
                 "pos": np.arange(len(rows), dtype=np.int64)})
    ours = t.rows(np.lexsort((t["request"], t["send_s"]))).frame()
    theirs = t.frame().sort_values(["send_s", "request"], kind="stable").reset_index(drop=True)
    _equal(ours, theirs)


def test_a_column_set_or_inserted_keeps_the_others_in_place():
    t = ColumnTable({"a": [1, 2], "b": [3.0, 4.0]})
    assert t.with_column("c", [5, 6], at=1).names == ["a", "c", "b"]
    assert t.with_column("c", [5, 6]).names == ["a", "b", "c"]
    changed = t.with_column("a", np.array([7, 8]))
    assert changed.names == ["a", "b"] and changed["a"].tolist() == [7, 8]
    assert t["a"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="different lengths"):
        ColumnTable({"a": [1], "b": [1, 2]})


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e15, 1e15), st.just(math.nan)), max_size=300))
def test_nan_skipping_reductions_are_pandas_bit_for_bit(values):
    """The summaries' sums, means and medians of a float column: pandas' ``Series.sum``,
    ``mean`` and ``median`` (NaN skipped), the same bits."""
    a = np.array(values, dtype=float)
    s = pd.Series(a)
    assert _same(_total(a), float(s.sum()) if len(s) else 0.0)
    assert _same(_mean(a), float(s.mean()))
    assert _same(_median(a), float(s.median()))
