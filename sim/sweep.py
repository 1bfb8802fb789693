"""Sweeps: a grid of runs, handed to an executor, resumable, one tidy table at the end.

CONFIG.yaml (``yaml.safe_load``; every key is a ``RunConfig`` field)::

    base:                      # fields every point shares
      trace: synthetic:claude-code
      gaps: tool
    grid:                      # cartesian product, in the order written
      preset: [sglang, vllm, penelope]
      gpu_cache: [128k, 256k]
      sessions: [2, 4]
    baseline: {preset: sglang} # optional: change columns against the point that differs only here

Each point's directory is named by a hash of its resolved config, so a rerun skips finished
points (resumable) and results do not depend on the executor or on ``-j``. Every file is
written atomically.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import yaml

from sim.config import ConfigError, RunConfig
from sim.io import atomic_write_parquet, atomic_write_text, dumps

SIZE_FIELDS = ("gpu_cache", "cpu_cache", "max_context", "chunk_size", "shared_prefix",
               "swap_buffer")


def _size(v: Any, where: str, field: str) -> Any:
    if field == "shared_prefix" and (v is None or v == "auto"):
        return v
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    from sim.cli.common import parse_size  # sizes use the CLI's grammar ("256k")

    try:
        return parse_size(str(v), field)
    except Exception:
        raise ConfigError(where, field, f"not a size: {v!r}") from None


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


def _resolve(point: dict[str, Any], where: str, base_dir: Path | None = None) -> RunConfig:
    point = {k: _size(v, where, k) if k in SIZE_FIELDS else v for k, v in point.items()}
    if base_dir is not None and "policy" in point:
        point["policy"] = _policy_path(point["policy"], base_dir)
    return RunConfig.from_dict(point, where)


def point_id(cfg: RunConfig) -> str:
    d = cfg.to_dict()
    d.pop("extra", None)
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def load_sweep(path: str | Path) -> tuple[list[tuple[dict, RunConfig]], dict | None]:
    """Parse CONFIG.yaml into (grid values, resolved config) points and the baseline."""
    where = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(where, "<file>", f"cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(where, "<yaml>", f"not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(where, "<root>", "must be a mapping with base/grid")
    for k in raw:
        if k not in ("base", "grid", "baseline"):
            raise ConfigError(where, k, "unknown section (base, grid, baseline)")
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
        points.append((values, _resolve({**base, **values}, f"{where} point {i}",
                                        Path(path).parent)))
    baseline = raw.get("baseline")
    if baseline is not None and not isinstance(baseline, dict):
        raise ConfigError(where, "baseline", "must be a mapping like {preset: sglang}")
    return points, baseline


class Executor(Protocol):
    """Runs a function over items; results in item order. Local pool now, Ray later."""

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]: ...


class SerialExecutor:
    def map(self, fn, items):
        return map(fn, items)


class LocalPoolExecutor:
    def __init__(self, workers: int) -> None:
        self.workers = workers

    def map(self, fn, items):
        with ProcessPoolExecutor(max_workers=self.workers) as pool:
            yield from pool.map(fn, items)


def run_point(args: tuple[RunConfig, str]) -> str:
    """Run one point into its directory (skipped if finished). Returns the point id."""
    from sim.runner import run, write_result

    cfg, out = args
    pid = point_id(cfg)
    d = Path(out) / "points" / pid
    if (d / "summary.json").exists():
        return pid
    write_result(run(cfg), d)
    return pid


def _column(field: str) -> str:
    return "policy_spec" if field == "policy" else field


def tidy(points: list[tuple[dict, RunConfig]], out: str | Path,
         baseline: dict | None) -> pd.DataFrame:
    rows = []
    for values, cfg in points:
        pid = point_id(cfg)
        summary = json.loads((Path(out) / "points" / pid / "summary.json").read_text())
        row: dict[str, Any] = {"point": pid, "policy": cfg.policy_label}
        row.update({k: v for k, v in summary.items() if not isinstance(v, dict | list)})
        # The grid's own values win; a grid of policies keeps the label in "policy" and the
        # spec as written in "policy_spec".
        row.update({_column(k): str(v) for k, v in values.items()})
        rows.append(row)
    df = pd.DataFrame(rows)
    if baseline and len(df):
        keys = [_column(k) for k in points[0][0] if k not in baseline]
        base = df
        for k, v in baseline.items():
            base = base[base[_column(k)] == str(v)]
        for metric in ("ttft_mean_s", "jct_mean_s", "hit_rate"):
            if keys:
                ref = base[[*keys, metric]].rename(columns={metric: "_ref"})
                refs = df[keys].merge(ref, on=keys, how="left")["_ref"].to_numpy()
            else:
                refs = base[metric].iloc[0]
            df[f"{metric}_change"] = df[metric].to_numpy() / refs - 1
    return df


def run_sweep(config: str | Path, out: str | Path, executor: Executor,
              progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    points, baseline = load_sweep(config)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "sweep.json", dumps({
        "config": str(config), "points": [
            {"point": point_id(c), "values": v, "config": c.to_dict()} for v, c in points]}))
    todo = [(c, str(out)) for _, c in points]
    for i, _pid in enumerate(executor.map(run_point, todo), 1):
        if progress:
            progress(i, len(todo))
    df = tidy(points, out, baseline)
    atomic_write_parquet(df, out / "results.parquet")
    atomic_write_text(out / "results.csv", df.to_csv(index=False))
    return df
