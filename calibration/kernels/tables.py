"""Read NVIDIA's measured kernel tables (aiconfigurator-core) and look up latencies.

Layout (the wheel's ``aiconfigurator_core/systems``, or any folder shaped the same way)::

    <root>/<system>.yaml                                           memory, PCIe, NVLink
    <root>/data/<system>/<op>/<framework>/<version>/<table>.parquet

Every latency in the tables is in milliseconds; this module returns seconds. Tables are
untrusted files: each is opened by reading its schema first, every needed column must exist
with the right kind (integer, float, string), and latencies must be finite and > 0; otherwise
:class:`KernelTableError` names the file and the column (exit status 2).

Interpolation (all piecewise linear, so a measured point is returned exactly):
- GEMM latency in ``m`` along each measured ``(n, k)`` series, then bilinear in ``(n, k)``
  between the grid's neighbours: exact for a latency proportional to ``m * n * k``; beyond the
  largest measured ``m`` the last segment is extended.
- MoE latency in ``num_tokens``; all-reduce latency in message size; both extend their last
  segment beyond the table.
Attention curves live in :mod:`calibration.kernels.attention`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

MS = 1e-3  # the tables' latency unit, in seconds

INT, FLOAT, STR = "integer", "float", "string"


GEMM_COLUMNS = {"kernel_source": STR, "gemm_dtype": STR, "m": INT, "n": INT, "k": INT,
                "latency": FLOAT}
MOE_COLUMNS = {"kernel_source": STR, "moe_dtype": STR, "num_tokens": INT, "hidden_size": INT,
               "inter_size": INT, "topk": INT, "num_experts": INT, "moe_tp_size": INT,
               "moe_ep_size": INT, "distribution": STR, "latency": FLOAT}
ALLREDUCE_COLUMNS = {"num_gpus": INT, "message_size": INT, "latency": FLOAT}
SYSTEM_FIELDS = {"gpu": ("mem_bw", "mem_bw_empirical_scaling_factor",
                         "mem_empirical_constant_latency", "mem_capacity"),
                 "node": ("pcie_bw", "intra_node_bw", "p2p_latency")}


class KernelTableError(ValueError):
    """A kernel table or system file is missing or malformed. Names the file and column."""

    exit_code = 2

    def __init__(self, path: str | Path, column: str, message: str) -> None:
        super().__init__(f"{path}: column {column!r}: {message}")
        self.path = str(path)
        self.column = column
        self._args = (path, column, message)

    def __reduce__(self):  # rebuilt from its arguments when a worker process sends it back
        return type(self), self._args


class NoRows(KernelTableError):
    """A well-formed table holds no rows for the asked shape (an older version may)."""


def version_key(version: str) -> tuple:
    """Order framework versions: ``0.5.6.post2 < 0.5.14``, ``1.3.0rc20 < 1.3.0rc23 < 1.3.0``."""
    key: list[tuple] = []
    for part in re.findall(r"\d+|[A-Za-z]+", version):
        if part.isdigit():
            key.append((2, int(part), ""))
        elif part.lower() == "post":
            key.append((3, 0, ""))
        else:  # rc, dev, a, b: before the release
            key.append((0, 0, part.lower()))
    key.append((1, 0, ""))
    return tuple(key)


def versions(root: Path, system: str, op: str, framework: str, table: str) -> list[str]:
    """Versions of ``framework`` holding ``table`` for ``op`` on ``system``, newest first."""
    base = root / "data" / system / op / framework
    if not base.is_dir():
        return []
    found = [d.name for d in base.iterdir() if (d / f"{table}.parquet").is_file()]
    return sorted(found, key=version_key, reverse=True)


def read_table(path: Path, columns: dict[str, str],
               filters: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The named columns of one parquet table as numpy arrays (read-only: shared between
    callers), rows kept where every ``filters`` column equals its value. Latency (if asked) is
    checked finite and > 0. Cached per file version, columns and filters: one ``kvsim
    calibrate`` run and the shipped-profile generator look up many shapes in one table."""
    try:
        st = Path(path).stat()
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = (0, 0)  # _read_table reports the missing file
    return _read_cached(str(path), stamp, tuple(columns.items()),
                        tuple(sorted((filters or {}).items())))


@functools.lru_cache(maxsize=64)
def _read_cached(path: str, stamp: tuple, columns: tuple, filters: tuple):
    out = _read_table(Path(path), dict(columns), dict(filters))
    for a in out.values():
        a.flags.writeable = False
    return out


def _read_table(path: Path, columns: dict[str, str],
                filters: dict[str, Any]) -> dict[str, np.ndarray]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except FileNotFoundError:
        raise KernelTableError(path, "<file>", "missing") from None
    except (OSError, pa.ArrowException) as e:
        raise KernelTableError(path, "<file>", f"not a readable parquet file ({e})") from None
    for name, kind in columns.items():
        if name not in schema.names:
            raise KernelTableError(path, name, "missing")
        t = schema.field(name).type
        ok = {INT: pa.types.is_integer(t), FLOAT: pa.types.is_floating(t) or
              pa.types.is_integer(t), STR: pa.types.is_string(t) or
              pa.types.is_large_string(t) or pa.types.is_dictionary(t)}[kind]
        if not ok:
            raise KernelTableError(path, name, f"must be {kind}, is {t}")
    try:
        table = pq.read_table(path, columns=list(columns))
    except (OSError, pa.ArrowException) as e:
        raise KernelTableError(path, "<file>", f"cannot read ({e})") from None
    if filters:
        mask = None
        for name, value in filters.items():
            m = pc.equal(table[name], value)
            mask = m if mask is None else pc.and_(mask, m)
        table = table.filter(mask)
    out: dict[str, np.ndarray] = {}
    for name, kind in columns.items():
        col = table[name]
        if col.null_count:
            raise KernelTableError(path, name, "has empty (null) values")
        out[name] = (np.asarray(col.to_pylist(), dtype=object) if kind == STR
                     else col.to_numpy().astype(np.int64 if kind == INT else np.float64))
    if "latency" in out:
        lat = out["latency"]
        bad = ~np.isfinite(lat) | (lat <= 0)
        if bad.any():
            raise KernelTableError(path, "latency",
                                   f"must be finite and > 0 (row value {lat[bad][0]!r})")
    return out


def choose(sources: np.ndarray, preferred: tuple[str, ...]) -> str:
    """One kernel source among those present: the first of ``preferred``, else the first
    by name (deterministic)."""
    present = sorted(set(sources.tolist()))
    for name in preferred:
        if name in present:
            return name
    return present[0]


class Series:
    """A measured latency series ``y(x)`` (seconds), piecewise linear, clamped below the
    smallest ``x``; beyond the largest it continues with ``tail_slope`` (default: the last
    segment's slope)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, tail_slope: float | None = None) -> None:
        order = np.argsort(x, kind="stable")
        x, y = np.asarray(x, np.float64)[order], np.asarray(y, np.float64)[order]
        keep = np.concatenate([[True], np.diff(x) > 0])  # duplicate x: first row kept
        self.x, self.y = x[keep], y[keep]
        if tail_slope is None and len(self.x) >= 2:
            tail_slope = (self.y[-1] - self.y[-2]) / (self.x[-1] - self.x[-2])
        self.tail_slope = tail_slope or 0.0

    @property
    def max_x(self) -> float:
        return float(self.x[-1])

    def __call__(self, x: float | np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        y = np.interp(x, self.x, self.y)
        return np.where(x > self.x[-1], self.y[-1] + self.tail_slope * (x - self.x[-1]), y)


@dataclass
class TableSource:
    """Where one looked-up quantity came from (provenance)."""

    path: str
    version: str
    kernel_source: str = ""


class GemmTable:
    """bf16 GEMM latency ``t(m, n, k)`` for ``y = x @ W.T`` with ``x`` of ``m x k``."""

    PREFERRED = ("torch.nn.functional.linear", "sglang_torch_linear", "torch_flow")

    def __init__(self, path: Path, version: str) -> None:
        cols = read_table(path, GEMM_COLUMNS, {"gemm_dtype": "bfloat16"})
        if len(cols["m"]) == 0:
            raise NoRows(path, "gemm_dtype", "no bfloat16 rows")
        src = choose(cols["kernel_source"], self.PREFERRED)
        keep = cols["kernel_source"] == src
        self.source = TableSource(str(path), version, src)
        self._series: dict[tuple[int, int], Series] = {}
        m, n, k, lat = (cols[c][keep] for c in ("m", "n", "k", "latency"))
        order = np.lexsort((m, k, n))
        m, n, k, lat = m[order], n[order], k[order], lat[order]
        starts = np.flatnonzero(np.r_[True, (np.diff(n) != 0) | (np.diff(k) != 0)])
        ends = np.r_[starts[1:], len(n)]
        for s, e in zip(starts, ends, strict=True):
            self._series[(int(n[s]), int(k[s]))] = Series(m[s:e], lat[s:e] * MS)
        self.ns = np.array(sorted({nk[0] for nk in self._series}), dtype=np.int64)
        self.ks = np.array(sorted({nk[1] for nk in self._series}), dtype=np.int64)
        self.path = path

    def _bracket(self, grid: np.ndarray, v: int) -> tuple[int, int, float]:
        if v <= grid[0]:
            return int(grid[0]), int(grid[0]), 0.0
        if v >= grid[-1]:  # beyond the grid: proportional from the largest (t ~ n, t ~ k)
            return int(grid[-1]), int(grid[-1]), 0.0
        i = int(np.searchsorted(grid, v))
        lo, hi = int(grid[i - 1]), int(grid[i])
        return (lo, hi, (v - lo) / (hi - lo)) if hi != v else (hi, hi, 0.0)

    def __call__(self, m: int | np.ndarray, n: int, k: int) -> np.ndarray:
        """Seconds of one GEMM; ``m`` may be an array."""
        n0, n1, fn = self._bracket(self.ns, n)
        k0, k1, fk = self._bracket(self.ks, k)
        total = np.zeros(np.shape(m))
        for nn, wn in ((n0, 1 - fn), (n1, fn)):
            for kk, wk in ((k0, 1 - fk), (k1, fk)):
                w = wn * wk
                if w == 0:
                    continue
                s = self._series.get((nn, kk))
                if s is None:
                    raise KernelTableError(self.path, "n",
                                           f"no bfloat16 series for n={nn}, k={kk} "
                                           f"(needed for a {n} x {k} weight)")
                total = total + w * s(m)
        scale = 1.0
        if n > self.ns[-1]:
            scale *= n / self.ns[-1]
        if k > self.ks[-1]:
            scale *= k / self.ks[-1]
        return total * scale


class MoeTable:
    """Fused MoE latency over ``num_tokens`` for one shape, parallel layout and dtype."""

    PREFERRED = ("sglang_fused_moe_triton", "moe_torch_flow", "moe_torch_flow_cutlass")

    def __init__(self, path: Path, version: str, *, hidden: int, inter: int, topk: int,
                 experts: int, tp: int, ep: int, dtype: str) -> None:
        cols = read_table(path, MOE_COLUMNS, {"distribution": "balanced", "moe_dtype": dtype})
        keep = ((cols["hidden_size"] == hidden) & (cols["inter_size"] == inter)
                & (cols["topk"] == topk) & (cols["num_experts"] == experts)
                & (cols["moe_tp_size"] == tp) & (cols["moe_ep_size"] == ep))
        if not keep.any():
            raise NoRows(
                path, "hidden_size", f"no balanced {dtype} rows for hidden {hidden}, inter "
                f"{inter}, top-{topk} of {experts} experts, moe_tp {tp}, moe_ep {ep}")
        src = choose(cols["kernel_source"][keep], self.PREFERRED)
        keep &= cols["kernel_source"] == src
        self.source = TableSource(str(path), version, src)
        self.series = Series(cols["num_tokens"][keep], cols["latency"][keep] * MS)
        self.layout = {"moe_tp_size": tp, "moe_ep_size": ep, "moe_dtype": dtype,
                       "distribution": "balanced"}

    def __call__(self, tokens: int | np.ndarray) -> np.ndarray:
        return self.series(tokens)


class AllReduceTable:
    """All-reduce latency over message size (bf16 elements) for ``num_gpus``. ``backend``
    picks the eager or CUDA-graph rows where the table has a ``backend`` column (SGLang, vLLM);
    otherwise (TensorRT-LLM) the fastest implementation per size is kept, as the runtime
    picks one per size."""

    def __init__(self, path: Path, version: str, gpus: int, backend: str | None) -> None:
        cols = dict(ALLREDUCE_COLUMNS)
        filters: dict[str, Any] = {"num_gpus": gpus}
        if backend is not None:
            cols["backend"] = STR
            filters["backend"] = backend
        data = read_table(path, cols, filters)
        if len(data["latency"]) == 0:
            raise NoRows(path, "num_gpus", f"no all-reduce rows for {gpus} GPUs"
                         + (f", backend {backend}" if backend else ""))
        size, lat = data["message_size"], data["latency"]
        order = np.lexsort((lat, size))  # per size, the fastest first (Series keeps it)
        self.source = TableSource(str(path), version, backend or "fastest per size")
        self.series = Series(size[order], lat[order] * MS)

    def __call__(self, elements: int | np.ndarray) -> np.ndarray:
        return self.series(elements)


class NcclTable:
    """NCCL collective latency (``op``: ``all_gather``, ``reduce_scatter``, ...) over message
    size (fp16/bf16 elements) for ``num_gpus`` (``comm/nccl/<version>/nccl_perf.parquet``);
    the fastest row per size."""

    def __init__(self, path: Path, version: str, gpus: int, op: str) -> None:
        data = read_table(path, {"op_name": STR, "num_gpus": INT, "message_size": INT,
                                 "latency": FLOAT}, {"num_gpus": gpus, "op_name": op})
        if len(data["latency"]) == 0:
            raise NoRows(path, "num_gpus", f"no NCCL {op} rows for {gpus} GPUs")
        size, lat = data["message_size"], data["latency"]
        order = np.lexsort((lat, size))
        self.source = TableSource(str(path), version, f"nccl {op}")
        self.series = Series(size[order], lat[order] * MS)

    def __call__(self, elements: int | np.ndarray) -> np.ndarray:
        return self.series(elements)


@dataclass(frozen=True)
class SystemDesc:
    """The system description: what the profile's transfer terms and element-wise ops use."""

    name: str
    path: str
    mem_bw: float  # bytes/s per GPU (HBM)
    mem_bw_scaling: float  # the description's empirical fraction of mem_bw
    mem_latency_s: float
    pcie_bw: float  # bytes/s, one direction
    nvlink_bw: float  # bytes/s per GPU, one direction (intra-node)
    p2p_latency_s: float
    mem_capacity: int

    @classmethod
    def load(cls, root: Path, system: str) -> SystemDesc:
        path = root / f"{system}.yaml"
        try:
            raw = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise KernelTableError(path, "<file>", "missing: no such system") from None
        except (OSError, yaml.YAMLError) as e:
            raise KernelTableError(path, "<file>", f"not readable YAML ({e})") from None
        vals: dict[str, float] = {}
        for section, names in SYSTEM_FIELDS.items():
            sec = raw.get(section) if isinstance(raw, dict) else None
            for name in names:
                v = sec.get(name) if isinstance(sec, dict) else None
                if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0 \
                        or not np.isfinite(v):
                    raise KernelTableError(path, f"{section}.{name}",
                                           f"must be a finite number >= 0, got {v!r}")
                vals[name] = float(v)
        if vals["mem_bw"] <= 0 or vals["pcie_bw"] <= 0:
            raise KernelTableError(path, "gpu.mem_bw/node.pcie_bw", "must be > 0")
        return cls(system, str(path), vals["mem_bw"], vals["mem_bw_empirical_scaling_factor"],
                   vals["mem_empirical_constant_latency"], vals["pcie_bw"],
                   vals["intra_node_bw"], vals["p2p_latency"], int(vals["mem_capacity"]))
