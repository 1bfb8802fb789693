"""What one run gives back (``RunResult``) and the files ``kvsim run --out`` and a sweep point
write for it (``write_result``, each file atomically; ``clear_run_outputs`` empties a reused
folder of a previous run's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.config import RunConfig
from sim.engines.columns import ColumnTable
from sim.io import atomic_write_parquet, atomic_write_text, dumps, is_tmp_name

if TYPE_CHECKING:  # pandas where a table is read as a DataFrame, never by a run (issue 55)
    import pandas as pd


class RunResult:
    """One run's result: its config, summary, requests table (``requests``, one row per
    request) and more tables (``tables``: NAME.parquet each); ``seed_drawn``: whether anything
    in the run drew from its decision seed (sim/run/summary.py ``summarize``): where nothing
    did, a repeat with another seed is this run again. The tables may be given as columns
    (sim/engines/columns.py): each is made a DataFrame where it is first read, so a caller
    that reads only the summary (``kvsim run``) never imports pandas."""

    def __init__(self, config: RunConfig, requests: ColumnTable | pd.DataFrame,
                 summary: dict[str, Any],
                 tables: dict[str, ColumnTable | pd.DataFrame] | None = None,
                 seed_drawn: bool = True) -> None:
        self.config = config
        self.summary = summary
        self.seed_drawn = seed_drawn
        self._requests = requests
        self._tables = dict(tables or {})

    @property
    def requests(self) -> pd.DataFrame:
        if isinstance(self._requests, ColumnTable):
            self._requests = self._requests.frame()
        return self._requests

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        for name, table in self._tables.items():
            if isinstance(table, ColumnTable):
                self._tables[name] = table.frame()
        return self._tables

    def request_columns(self) -> ColumnTable:
        """The requests table as columns (without pandas where the run made it so)."""
        return ColumnTable.of(self._requests)

    def __repr__(self) -> str:
        return (f"RunResult(config={self.config!r}, requests={len(self._requests)} rows, "
                f"summary={self.summary!r}, tables={sorted(self._tables)}, "
                f"seed_drawn={self.seed_drawn})")


RESULT_FILES = ("requests.parquet", "config.json", "summary.json", "load.parquet",
                "routing.parquet", "pd_transfers.parquet")
# What ``kvsim run --out`` and ``kvsim plot`` write at the top of a run folder.
RUN_FOLDER_FILES = ("runs.json", "ttft_cdf.png", "change_vs_first.png")
RUN_FOLDER_PLOTS = "replica_load_*.png"  # a fleet run's per-replica load, one per policy


def clear_run_outputs(out: str | Path) -> list[str]:
    """Remove a previous ``kvsim run``'s outputs from ``out`` so that a reused folder holds
    only the new run: its runs.json and plots, every child folder that holds nothing but
    ``write_result`` files (a policy folder), and the temporary files of a killed run
    (``sim.io.is_tmp_name``) in both. Anything else stays. Returns what was removed (the
    temporary files are not named)."""
    out = Path(out)
    removed = []
    for child in sorted(out.iterdir()) if out.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            names = [f.name for f in child.iterdir()]
            results = [n for n in names if not is_tmp_name(n)]
            if names and set(results) <= set(RESULT_FILES) and (
                    not results or {"requests.parquet", "summary.json"} & set(results)):
                for name in names:
                    (child / name).unlink()
                child.rmdir()
                if results:
                    removed.append(child.name + "/")
        elif child.is_file() and (child.name in RUN_FOLDER_FILES or is_tmp_name(child.name)
                                  or child.match(RUN_FOLDER_PLOTS)):
            child.unlink()
            if not is_tmp_name(child.name):
                removed.append(child.name)
    return removed


def write_result(result: RunResult, out: str | Path) -> None:
    """requests.parquet, config.json, then summary.json under ``out`` (each atomically)."""
    out = Path(out)
    atomic_write_parquet(result.requests, out / "requests.parquet")
    for name, df in result.tables.items():  # a fleet's load.parquet
        atomic_write_parquet(df, out / f"{name}.parquet")
    atomic_write_text(out / "config.json", json.dumps(result.config.to_dict(), indent=2) + "\n")
    # Last: a sweep takes a folder with summary.json as a finished point.
    atomic_write_text(out / "summary.json", dumps(result.summary) + "\n")
