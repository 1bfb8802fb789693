"""Running a sweep: each unfinished point into its folder, resumable, then the table.

Each point runs in its own folder ``points/<id>`` (sim/sweep/identity.py) and writes
``requests.parquet``, ``config.json`` and, last, ``summary.json``: a folder with a summary is a
finished point, so a rerun skips it (resume), whatever the executor or ``-j``; a summary that
does not parse (truncated) is not: that point runs again, with a notice. Every file is written
atomically; temporary files a killed writer left are removed when a sweep starts and when it
ends. The table (``results.parquet``/``.csv``) is built from the folders in grid order, so it
is byte-identical on every executor. One sweep writes a folder at a time (its lock).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.config import RunConfig
from sim.io import atomic_write_parquet, atomic_write_text, dumps, folder_lock, remove_stale_tmp

from .executors import Executor, worker_id
from .identity import point_id
from .points import Sweep
from .table import summary_path, tidy

if TYPE_CHECKING:
    import pandas as pd


class SweepError(RuntimeError):
    """Points failed; the others finished and a rerun resumes."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self._args = (message, exit_code)

    def __reduce__(self):  # rebuilt from its arguments when a sweep worker sends it back
        return type(self), self._args


def point_done(out: str | Path, pid: str) -> bool:
    """A point is done when its summary.json exists and parses. A summary that does not
    parse (a truncated file, an edit) makes the point unfinished: it runs again, and a
    notice on stderr says so."""
    path = summary_path(out, pid)
    if not path.exists():
        return False
    try:
        json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        print(f"kvsim: notice: {path}: does not load ({' '.join(str(e).split())}): running "
              f"point {pid} again", file=sys.stderr)
        return False
    return True


def run_point(cfg: RunConfig, out: str, get_trace: Callable[[], Any],
              write: Callable[[RunConfig, Any, Path], None] | None = None) -> dict[str, Any]:
    """Run one point into ``out/points/<id>`` (any executor calls this). A user error in the
    point (a bad trace file, ...) comes back as ``error`` instead of stopping the others.
    ``write(cfg, trace, folder)`` runs it and writes its folder in place of ``run`` and
    ``write_result`` (kvsim plan's early stops: sim/sweep/early_stop.py)."""
    from sim.run import run, write_result

    from .executors import worker_trace_loads

    pid = point_id(cfg)
    info: dict[str, Any] = {"point": pid, "worker": worker_id(), "error": None,
                            "exit_code": 0, "trace_loads": 0}
    try:
        trace = get_trace()
        from traces.load import check_shared_prefix

        check_shared_prefix(trace, cfg.traffic.shared_prefix)  # a typo such as 10m for 10k
        info["trace_loads"] = worker_trace_loads()
        if write is None:
            write_result(run(cfg, trace), Path(out) / "points" / pid)
        else:
            write(cfg, trace, Path(out) / "points" / pid)
    except Exception as e:
        code = getattr(e, "exit_code", None)
        if not isinstance(code, int):
            raise  # a bug: keep its traceback
        info.update(error=" ".join(str(e).split()), exit_code=code)
    return info


def run_sweep(sweep: Sweep, out: str | Path, executor: Executor,
              progress: Callable[[int, int], None] | None = None,
              job: Callable[..., dict[str, Any]] = run_point) -> pd.DataFrame:
    """Run the unfinished points, then write results.parquet/.csv (all points in grid order).
    Raises ``SweepError`` after the others finish if any point failed. ``job``: what runs a
    point (``run_point`` or one with its ``write``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out, "kvsim sweep"):  # one sweep per folder: a second one is refused
        return _run_locked(sweep, out, executor, progress, job)


def _run_locked(sweep: Sweep, out: Path, executor: Executor,
                progress: Callable[[int, int], None] | None,
                job: Callable[..., dict[str, Any]]) -> pd.DataFrame:
    remove_stale_tmp(out)  # a killed writer's leftovers; no writer runs in ``out`` now
    refs = sweep.refs or [None] * len(sweep.points)
    atomic_write_text(out / "sweep.json", dumps({
        "config": sweep.path, "points": [
            p.record(sweep.points[r] if r is not None else None)
            for p, r in zip(sweep.points, refs, strict=True)]}) + "\n")
    seen: set[str] = set()
    todo = []
    for p in sweep.points:
        if p.id not in seen and not point_done(out, p.id):
            todo.append(p)
        seen.add(p.id)
    done = len(seen) - len(todo)
    if progress:
        progress(done, len(seen))
    failed: list[dict[str, Any]] = []
    try:
        for _i, info in executor.map(job, [(p.cfg, str(out)) for p in todo]):
            done += 1
            if info["error"]:
                failed.append(info)
            if progress:
                progress(done, len(seen))
    finally:
        remove_stale_tmp(out)
    if failed:
        first = failed[0]
        if len(failed) == len(todo) and len({(f["error"], f["exit_code"]) for f in failed}) == 1:
            # every point failed alike (a missing trace, a size too large): an input error,
            # said alone; nothing finished to resume
            raise SweepError(first["error"], first["exit_code"])
        raise SweepError(f"{len(failed)} of {len(seen)} points failed (first: point "
                         f"{first['point']}: {first['error']}); the others are in "
                         f"{out}/points: fix the cause and rerun to finish",
                         max(f["exit_code"] for f in failed))
    df = tidy(sweep, out)
    atomic_write_parquet(df, out / "results.parquet")
    atomic_write_text(out / "results.csv", df.to_csv(index=False))
    return df
