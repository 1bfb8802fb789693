"""``ColumnTable``: a run's table as one numpy array per column, in order, made into a pandas
DataFrame only where one is read (``frame``).

A run's requests and a fleet's load and routing tables are assembled and summarized as
columns (sim/engines/recorder.py ``RunRecorder.columns``, sim/fleet/results.py), so a run
whose caller reads only its summary, as ``kvsim run`` does, never imports pandas and pyarrow
(a fifth of a second; issue 55 start-up). ``frame()`` is the DataFrame the same columns have
always made: ``pd.DataFrame`` of the arrays (dtypes as pandas infers them: a column of
strings becomes pandas' string dtype), with a fresh index; an empty column named in
``strings`` is typed as the strings it would hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


class ColumnTable:
    """Named 1-D numpy arrays of one length; ``strings``: the columns that hold text."""

    __slots__ = ("_cols", "_n", "_strings")

    def __init__(self, cols: dict[str, Any], strings: Iterable[str] = ()) -> None:
        self._cols = {name: np.asarray(values) for name, values in cols.items()}
        lengths = {len(v) for v in self._cols.values()}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths: {sorted(lengths)}")
        self._n = lengths.pop() if lengths else 0
        self._strings = frozenset(strings) & self._cols.keys()

    @classmethod
    def of(cls, table: ColumnTable | pd.DataFrame) -> ColumnTable:
        """``table`` as columns: itself, or a DataFrame's columns as numpy arrays."""
        if isinstance(table, ColumnTable):
            return table
        return cls({str(name): table[name].to_numpy() for name in table.columns},
                   (str(name) for name in table.columns if table[name].dtype.kind not in "biuf"))

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, name: str) -> np.ndarray:
        return self._cols[name]

    def __contains__(self, name: object) -> bool:
        return name in self._cols

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    @property
    def names(self) -> list[str]:
        return list(self._cols)

    def rows(self, which: np.ndarray) -> ColumnTable:
        """The rows ``which`` selects (a boolean mask, or positions in the order wanted)."""
        return ColumnTable({k: v[which] for k, v in self._cols.items()}, self._strings)

    def with_column(self, name: str, values: Any, at: int | None = None) -> ColumnTable:
        """A copy with column ``name`` set to ``values`` (replaced in place where it exists,
        else inserted before position ``at``, or last)."""
        cols = list(self._cols.items())
        names = [k for k, _ in cols]
        if name in self._cols:
            cols[names.index(name)] = (name, values)
        else:
            cols.insert(len(cols) if at is None else at, (name, values))
        return ColumnTable(dict(cols), self._strings)

    def frame(self) -> pd.DataFrame:
        """The DataFrame of these columns (pandas is imported here)."""
        import pandas as pd

        cols: dict[str, Any] = dict(self._cols)
        if not self._n:
            for name in self._strings:
                cols[name] = pd.array([], dtype="str")
        # copy=False: the frame holds these arrays (one copy of the rows, not two)
        return pd.DataFrame(cols, copy=False)


def frame(table: ColumnTable | pd.DataFrame) -> pd.DataFrame:
    """``table`` as a DataFrame (a DataFrame is itself)."""
    return table.frame() if isinstance(table, ColumnTable) else table
