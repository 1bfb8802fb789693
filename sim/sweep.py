"""Sweeps: a grid of runs, handed to an executor, resumable, one tidy table at the end.

CONFIG.yaml (``yaml.safe_load``; every key of ``base`` and ``grid`` is a ``RunConfig`` field;
docs/sweeps.md documents each)::

    base:                      # fields every point shares
      trace: synthetic:claude-code
      gaps: tool
    grid:                      # cartesian product, in the order written (absent: one point)
      preset: [sglang, vllm, penelope]
      gpu_cache: [128k, 256k]
      sessions: [2, 4]
    baseline: {preset: sglang} # optional: *_change columns against the point that differs
                               # only in these grid fields
    executor: {kind: local, jobs: 2}   # optional; kvsim sweep's options win

Everything is checked when the file is loaded, before any point runs: fields, sizes, models,
profiles, and that the baseline names grid fields with values that occur in the grid.

Each point runs in its own folder ``points/<id>`` (``id`` hashes its resolved config) and
writes ``requests.parquet``, ``config.json`` and, last, ``summary.json``: a folder with a
summary is a finished point, so a rerun skips it (resume), whatever the executor or ``-j``;
a summary that does not parse (truncated) is not: that point runs again, with a notice.
Every file is written atomically; temporary files a killed writer left are removed when a
sweep starts and when it ends. The table (``results.parquet``/``.csv``) is built from the
folders in grid order, so it is byte-identical on every executor.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd

from sim.config import ConfigError, RunConfig, default_replay
from sim.executors import DEFAULT_RETRIES, EXECUTORS, Executor, ExecutorSpec, worker_id
from sim.io import (
    SIZE_GRAMMAR,
    atomic_write_parquet,
    atomic_write_text,
    dumps,
    folder_lock,
    parse_size,
    read_json,
    read_yaml,
    remove_stale_tmp,
)

SIZE_FIELDS = ("gpu_cache", "cpu_cache", "max_context", "chunk_size", "shared_prefix",
               "swap_buffer", "pool")
SECTIONS = ("base", "grid", "baseline", "executor")
CHANGE_METRICS = ("ttft_mean_s", "jct_mean_s", "hit_rate")
# Grid fields whose value is already the row's ``policy`` label (one policy column); a grid
# of ``policy`` specs keeps them as written in ``policy_spec`` (a file path is not a label).
POLICY_FIELDS = ("preset",)
COLUMN = {"policy": "policy_spec"}


class SweepError(RuntimeError):
    """Points failed; the others finished and a rerun resumes."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self._args = (message, exit_code)

    def __reduce__(self):  # rebuilt from its arguments when a sweep worker sends it back
        return type(self), self._args


def _size(v: Any, where: str, field: str) -> Any:
    if field == "shared_prefix" and (v is None or v == "auto"):
        return v
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    try:
        return parse_size(str(v), field)
    except Exception:
        raise ConfigError(where, field, f"not a size: {v!r} (sizes in tokens: "
                          f"{SIZE_GRAMMAR})") from None


def _policy_path(v: Any, base_dir: Path) -> Any:
    """A ``FILE.py:CLASS`` policy relative to the sweep file (when it exists there)."""
    from policies.registry import is_policy_file

    if not isinstance(v, str) or not is_policy_file(v.partition("?")[0]):
        return v
    path, _, rest = v.partition(":")
    p = Path(path).expanduser()
    if not p.is_absolute() and (base_dir / p).is_file():
        return f"{base_dir / p}:{rest}"
    return v


def _trace_path(v: Any, base_dir: Path) -> Any:
    """Trace path(s) relative to the sweep file (each where it exists there); absolute paths
    and ``synthetic:`` names stay as written."""
    if not isinstance(v, str) or v.startswith("synthetic:"):
        return v
    parts = []
    for part in v.split(","):
        p = Path(part).expanduser()
        if not p.is_absolute() and (base_dir / p).exists():
            part = os.path.normpath(base_dir / p)
        parts.append(part)
    return ",".join(parts)


def _resolve(point: dict[str, Any], where: str, base_dir: Path | None = None) -> RunConfig:
    point = {k: _size(v, where, k) if k in SIZE_FIELDS else v for k, v in point.items()}
    if base_dir is not None and "policy" in point:
        point["policy"] = _policy_path(point["policy"], base_dir)
    if base_dir is not None and "router" in point:
        point["router"] = _policy_path(point["router"], base_dir)
    if base_dir is not None and "trace" in point:
        point["trace"] = _trace_path(point["trace"], base_dir)
    return RunConfig.from_dict(point, where)


def _check_idle_fields(points: list[Point], base: dict, grid: dict, where: str) -> None:
    """A field the file sets that does nothing (``sim.config.IDLE_RULES``): varied by the
    grid where it does nothing and not part of the point's identity there, it makes points
    that are one run (one point id, identical rows); a field that does nothing in any point
    is refused too."""
    from collections import Counter

    from sim.config import idle_fields, spell_fields

    given = [*base, *grid]
    ids = Counter(p.id for p in points)
    inert_everywhere = dict.fromkeys(given, "")
    for i, p in enumerate(points):
        idle = dict(idle_fields(p.cfg, given))
        for k, why in idle.items():
            if k in grid and ids[p.id] > 1:
                raise ConfigError(f"{where} point {i}", k, f"does nothing here: "
                                  f"{spell_fields(why, str)}; the grid's points that differ "
                                  f"only in it are one run (point {p.id})")
        for k in list(inert_everywhere):
            if k in idle:
                inert_everywhere[k] = idle[k]
            else:
                del inert_everywhere[k]
    if points and inert_everywhere:
        k, why = next(iter(inert_everywhere.items()))
        raise ConfigError(where, f"{'grid' if k in grid else 'base'}.{k}", f"does nothing in "
                          f"any point: {spell_fields(why, str)}")


def _check_traces(points: list[Point], where: str) -> None:
    """Every point's trace files exist and have a format, checked once each before any
    point runs (a relative path is read from the sweep file's folder where it exists
    there, else from the working folder)."""
    from traces import TraceFormatError, detect_format

    seen: set[tuple] = set()
    for i, p in enumerate(points):
        key = (p.cfg.trace, p.cfg.trace_format)
        if key in seen or p.cfg.trace.startswith("synthetic:"):
            continue
        seen.add(key)
        parts = p.cfg.trace.split(",")
        for part in parts:
            if not Path(part).expanduser().exists():
                raise ConfigError(f"{where} point {i}", "trace", f"{part}: no such file or "
                                  "folder (relative paths are read from the sweep file's "
                                  "folder, then the working folder)")
        if p.cfg.trace_format is None:
            try:
                detect_format(parts)
            except TraceFormatError as e:
                raise ConfigError(f"{where} point {i}", "trace", str(e)) from None


def _norm(field: str, v: Any, where: str) -> str:
    """A grid value as compared with the baseline (``128k`` equals ``131072``)."""
    v = _size(v, where, field) if field in SIZE_FIELDS else v
    return json.dumps(v, sort_keys=True, default=str)


def point_id(cfg: RunConfig) -> str:
    d = cfg.to_dict()
    d.pop("extra", None)
    if d.get("context") == "full":  # the default: points saved before it existed keep ids
        d.pop("context")
    if cfg.engine != "vllm" or not cfg.vllm_async:
        # sglang: no such knob; vllm sync: the results points had before async existed
        d.pop("vllm_async", None)
    if d.get("vllm_patch") == "none":  # likewise
        d.pop("vllm_patch")
    if not cfg.is_fleet:  # one server: ids as before fleets existed
        for k in ("replicas", "router", "router_params"):
            d.pop(k, None)
    if not cfg.pool:  # no pool: ids as before pools existed
        for k in ("pool", "pool_bandwidth", "pool_latency_us", "pool_write", "pool_watermark",
                  "pool_evict_fraction"):
            d.pop(k, None)
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Point:
    values: dict[str, Any]  # the grid's values for this point, as written
    cfg: RunConfig

    @property
    def id(self) -> str:
        return point_id(self.cfg)


@dataclass
class Sweep:
    path: str
    points: list[Point]
    baseline: dict[str, Any] | None
    refs: list[int] | None  # per point, the index of its baseline point
    executor: ExecutorSpec
    has_grid: bool


def _executor_spec(raw: Any, where: str) -> ExecutorSpec:
    if raw is None:
        return ExecutorSpec()
    if isinstance(raw, str):
        raw = {"kind": raw}
    if not isinstance(raw, dict):
        raise ConfigError(where, "executor", "must be local, ray or a mapping "
                          "{kind, jobs, address, max_retries}")
    known = ("kind", "jobs", "address", "max_retries")
    for k in raw:
        if k not in known:
            raise ConfigError(where, f"executor.{k}", f"unknown key ({', '.join(known)})")
    kind = raw.get("kind", "local")
    if kind not in EXECUTORS:
        raise ConfigError(where, "executor.kind", f"must be one of {EXECUTORS}, got {kind!r}")
    for k, lo in (("jobs", 0), ("max_retries", 0)):
        v = raw.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            raise ConfigError(where, f"executor.{k}", f"must be an integer >= {lo}, got {v!r}")
    address = raw.get("address")
    if address is not None and not isinstance(address, str):
        raise ConfigError(where, "executor.address", "must be a string like auto or "
                          "ray://HOST:10001")
    return ExecutorSpec(kind=kind, jobs=raw.get("jobs") or 1, address=address,
                        max_retries=raw.get("max_retries", DEFAULT_RETRIES))


def _baseline_refs(points: list[Point], grid: dict[str, list], baseline: Any,
                   where: str) -> list[int]:
    """Per point, the index of the point with the baseline's values in the baseline's fields
    and this point's values elsewhere. Every failure names the baseline key."""
    if not isinstance(baseline, dict) or not baseline:
        raise ConfigError(where, "baseline", "must be a non-empty mapping like "
                          "{preset: sglang}")
    for k, v in baseline.items():
        if k not in grid:
            raise ConfigError(where, f"baseline.{k}", "not a grid field (grid: "
                              f"{', '.join(grid) or 'none'}): the baseline must pick one "
                              "value of a field the grid varies")
        if _norm(k, v, where) not in {_norm(k, g, where) for g in grid[k]}:
            raise ConfigError(where, f"baseline.{k}", f"{v!r} matches no point: the grid's "
                              f"values are {grid[k]}")
    keys = list(grid)
    index: dict[tuple, int] = {}
    for i, p in enumerate(points):
        index.setdefault(tuple(_norm(k, p.values[k], where) for k in keys), i)
    return [index[tuple(_norm(k, baseline[k] if k in baseline else p.values[k], where)
                        for k in keys)] for p in points]


def _check_inputs(points: list[Point], where: str) -> None:
    """Models and profiles of every point, checked once each before anything runs."""
    from sim.checks import check_model_and_profile

    seen: set[tuple] = set()
    for i, p in enumerate(points):
        key = (p.cfg.model, p.cfg.profile)
        if key not in seen:
            seen.add(key)
            check_model_and_profile(p.cfg, f"{where} point {i}")


def load_sweep(path: str | Path) -> Sweep:
    """Parse and validate CONFIG.yaml (``ConfigError``/``InputError``, exit status 2)."""
    where = str(path)
    raw = read_yaml(path, "sweep config")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(where, "<root>", "must be a mapping with base/grid")
    for k in raw:
        if k not in SECTIONS:
            raise ConfigError(where, k, f"unknown section ({', '.join(SECTIONS)})")
    base = raw.get("base") or {}
    grid = raw.get("grid") or {}
    if not isinstance(base, dict):
        raise ConfigError(where, "base", "must be a mapping")
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError(where, "grid", "must map fields to non-empty lists")
    known = {f.name for f in fields(RunConfig)}
    for k in list(base) + list(grid):
        if k not in known:
            raise ConfigError(where, k, "not a run field")
    points = []
    keys = list(grid)
    for i, combo in enumerate(itertools.product(*(grid[k] for k in keys))):
        values = dict(zip(keys, combo, strict=True))
        point = {**base, **values}
        if "replay" not in point and isinstance(point.get("trace"), str):
            point["replay"] = default_replay(point["trace"], point.get("trace_format"))
        points.append(Point(values, _resolve(point, f"{where} point {i}", Path(path).parent)))
    _check_idle_fields(points, base, grid, where)
    baseline = raw.get("baseline")
    refs = _baseline_refs(points, grid, baseline, where) if baseline is not None else None
    _check_inputs(points, where)
    _check_traces(points, where)
    return Sweep(where, points, baseline, refs, _executor_spec(raw.get("executor"), where),
                 has_grid=bool(grid))


# --- running --------------------------------------------------------------------------------
def summary_path(out: str | Path, pid: str) -> Path:
    return Path(out) / "points" / pid / "summary.json"


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


def run_point(cfg: RunConfig, out: str, get_trace: Callable[[], Any]) -> dict[str, Any]:
    """Run one point into ``out/points/<id>`` (any executor calls this). A user error in the
    point (a bad trace file, ...) comes back as ``error`` instead of stopping the others."""
    from sim.executors import worker_trace_loads
    from sim.runner import run, write_result

    pid = point_id(cfg)
    info: dict[str, Any] = {"point": pid, "worker": worker_id(), "error": None,
                            "exit_code": 0, "trace_loads": 0}
    try:
        trace = get_trace()
        from traces.load import check_shared_prefix

        check_shared_prefix(trace, cfg.shared_prefix)  # a typo such as 10m for 10k
        info["trace_loads"] = worker_trace_loads()
        write_result(run(cfg, trace), Path(out) / "points" / pid)
    except Exception as e:
        code = getattr(e, "exit_code", None)
        if not isinstance(code, int):
            raise  # a bug: keep its traceback
        info.update(error=" ".join(str(e).split()), exit_code=code)
    return info


def run_sweep(sweep: Sweep, out: str | Path, executor: Executor,
              progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """Run the unfinished points, then write results.parquet/.csv (all points in grid order).
    Raises ``SweepError`` after the others finish if any point failed."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with folder_lock(out, "kvsim sweep"):  # one sweep per folder: a second one is refused
        return _run_locked(sweep, out, executor, progress)


def _run_locked(sweep: Sweep, out: Path, executor: Executor,
                progress: Callable[[int, int], None] | None) -> pd.DataFrame:
    remove_stale_tmp(out)  # a killed writer's leftovers; no writer runs in ``out`` now
    refs = sweep.refs or [None] * len(sweep.points)
    atomic_write_text(out / "sweep.json", dumps({
        "config": sweep.path, "points": [
            {"point": p.id, "values": p.values, "config": p.cfg.to_dict(),
             **({"baseline_point": sweep.points[r].id} if r is not None else {})}
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
        for _i, info in executor.map(run_point, [(p.cfg, str(out)) for p in todo]):
            done += 1
            if info["error"]:
                failed.append(info)
            if progress:
                progress(done, len(seen))
    finally:
        remove_stale_tmp(out)
    if failed:
        first = failed[0]
        raise SweepError(f"{len(failed)} of {len(seen)} points failed (first: point "
                         f"{first['point']}: {first['error']}); the others are in "
                         f"{out}/points: fix the cause and rerun to finish",
                         max(f["exit_code"] for f in failed))
    df = tidy(sweep, out)
    atomic_write_parquet(df, out / "results.parquet")
    atomic_write_text(out / "results.csv", df.to_csv(index=False))
    return df


# --- the table ------------------------------------------------------------------------------
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
    rows = []
    for p in sweep.points:
        summary = read_json(summary_path(out, p.id), "point summary")
        row: dict[str, Any] = {"point": p.id, "policy": p.cfg.policy_label}
        row.update({COLUMN.get(k, k): str(v) for k, v in p.values.items()
                    if k not in POLICY_FIELDS})
        row.update({k: v for k, v in summary.items()
                    if k not in row and k not in POLICY_FIELDS
                    and not isinstance(v, dict | list)})
        rows.append(row)
    df = pd.DataFrame(rows)
    if sweep.refs is not None and len(df):
        for metric in CHANGE_METRICS:
            vals = df[metric].tolist()
            df[f"{metric}_change"] = [relative_change(vals[i], vals[r])
                                      for i, r in enumerate(sweep.refs)]
    return df
