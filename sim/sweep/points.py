"""Sweep points: CONFIG.yaml into a ``Sweep`` of ``Point``s, every check before any runs.

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
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config import FLAT, ConfigError, RunConfig, default_replay
from sim.io import SIZE_GRAMMAR, parse_size, read_yaml

from .executors import DEFAULT_RETRIES, EXECUTORS, ExecutorSpec
from .identity import Point

SIZE_FIELDS = ("gpu_cache", "cpu_cache", "max_context", "chunk_size", "shared_prefix",
               "swap_buffer", "pool")
SECTIONS = ("base", "grid", "baseline", "executor")


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
    from sim.deploy import parse_kv_bytes, resolve_gpu_fields

    point = {k: _size(v, where, k) if k in SIZE_FIELDS and not (
        k == "gpu_cache" and parse_kv_bytes(v) is not None) else v for k, v in point.items()}
    point = resolve_gpu_fields(point, where)  # gpu, tp, memory fraction or bytes: tokens
    if base_dir is not None and "policy" in point:
        point["policy"] = _policy_path(point["policy"], base_dir)
    if base_dir is not None and "router" in point:
        point["router"] = _policy_path(point["router"], base_dir)
    if base_dir is not None and "trace" in point:
        point["trace"] = _trace_path(point["trace"], base_dir)
    from sim.run.check import check_rooms

    return check_rooms(RunConfig.from_dict(point, where), where)


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
        key = (p.cfg.traffic.trace, p.cfg.traffic.trace_format)
        if key in seen or p.cfg.traffic.trace.startswith("synthetic:"):
            continue
        seen.add(key)
        parts = p.cfg.traffic.trace.split(",")
        for part in parts:
            if not Path(part).expanduser().exists():
                raise ConfigError(f"{where} point {i}", "trace", f"{part}: no such file or "
                                  "folder (relative paths are read from the sweep file's "
                                  "folder, then the working folder)")
        if p.cfg.traffic.trace_format is None:
            try:
                detect_format(parts)
            except TraceFormatError as e:
                raise ConfigError(f"{where} point {i}", "trace", str(e)) from None


def _norm(field: str, v: Any, where: str) -> str:
    """A grid value as compared with the baseline (``128k`` equals ``131072``)."""
    v = _size(v, where, field) if field in SIZE_FIELDS else v
    return json.dumps(v, sort_keys=True, default=str)


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
        raise ConfigError(where, "executor.kind", EXECUTORS.message(kind))
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
        key = (p.cfg.cache.model, p.cfg.cache.profile)
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
    known = FLAT
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
