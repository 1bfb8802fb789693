"""Attention from the measured tables: prefill over a cached prefix, and decode.

**Context (prefill) attention.** The table times one attention-layer call (KV write and causal
prefill kernel) for ``isl`` new tokens with *no* cached prefix, ``isl <= 16,384``. kvsim needs
``n`` new tokens after ``c`` cached ones. Query row ``p`` of a causal prefill attends ``p + 1``
keys whatever came before it, so the rows ``[c, c + n)`` of a full prefill of ``c + n`` tokens
are exactly the work of computing ``n`` tokens over a cached prefix of ``c``::

    attention(c, n) = A(1) + A(c + n) - A(c)        (A(0) := A(1): the call's fixed cost)

where ``A`` is the measured full-prefill latency at batch size 1. The curve is interpolated
piecewise-linearly in the number of attended query-key pairs ``P(s) = sum_{p<s} min(p+1, w)``
(``w`` the window, unbounded for full attention), so between measured lengths the cost grows
with the work, and beyond 16K it extends the last measured segment: a constant cost per pair
at the largest measured size (*extrapolated*; the profile's provenance says so). A batch of
ranges (a phantom hole plus the real request's new tokens) is one call: one ``A(1)`` plus each
range's difference.

**Sliding-window layers.** Where the table measured the model's window (gpt-oss: 128), that
curve is used. Where it did not (gemma-3: 1024), it is derived from the full-attention curve:
up to ``w`` tokens the two are the same kernel work; past ``w`` every new row attends ``w``
keys, so each costs the full curve's marginal cost per pair at ``P(w)`` times ``w``.

**Generation (decode) attention.** The table times one decode step of ``batch_size``
sequences each holding ``step`` cached tokens (batch up to 2,048, ``batch * step`` up to about
256K). Latency is interpolated linearly in ``step`` for a measured batch size (and linearly
between batch sizes), extending the last segment beyond the largest measured ``step``; a
window caps ``step`` at ``w`` (the KV read stops growing).

**Shapes that were not measured.** Heads are per GPU (after tensor parallelism). When the
exact ``(heads, kv_heads, head_dim)`` is missing, the nearest measured shape with the same
``head_dim`` and window is used (same query heads first, then the nearest KV-head count) and
scaled: prefill by query heads (compute-bound), decode by KV heads (bound by the KV read).
The profile records which shape stood in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .tables import FLOAT, INT, MS, STR, NoRows, Series, TableSource, choose, read_table

COLUMNS = {"kernel_source": STR, "batch_size": INT, "isl": INT, "num_heads": INT,
           "num_key_value_heads": INT, "head_dim": INT, "attn_dtype": STR,
           "kv_cache_dtype": STR, "step": INT, "window_size": INT, "latency": FLOAT}
CONTEXT_PREFERRED = ("fa3", "vllm_flash_attn_fa3", "vllm_flashinfer_trtllmprefill",
                     "trtllm_mha", "flashinfer", "torch_flow")
GENERATION_PREFERRED = ("fa3", "vllm_flash_attn_fa3", "vllm_flashinfer_trtllmdecode",
                        "trtllm_mha", "flashinfer", "torch_flow")


def pairs(s: int | np.ndarray, window: int | None) -> np.ndarray:
    """Query-key pairs of a causal prefill of ``s`` tokens: ``sum_{p<s} min(p + 1, w)``."""
    s = np.asarray(s, dtype=np.float64)
    if window is None:
        return s * (s + 1) / 2
    w = float(window)
    return np.where(s <= w, s * (s + 1) / 2, w * (w + 1) / 2 + (s - w) * w)


@dataclass
class Shape:
    heads: int
    kv_heads: int
    head_dim: int
    window: int | None  # None = full attention

    @property
    def window_size(self) -> int:
        return 0 if self.window is None else self.window


def _table(path: Path) -> dict[str, np.ndarray]:
    """The bf16 rows. Older tables (a100_sxm's sglang 0.5.10, vllm 0.14.0) have no
    ``window_size`` column: they measured full attention only, read as window 0."""
    import pyarrow.parquet as pq

    dtypes = {"attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16"}
    try:
        windowed = "window_size" in pq.read_schema(path).names
    except Exception:  # read_table below names the unreadable file
        windowed = True
    if windowed:
        return read_table(path, COLUMNS, dtypes)
    cols = dict(read_table(path, {k: v for k, v in COLUMNS.items() if k != "window_size"},
                           dtypes))
    cols["window_size"] = np.zeros(len(cols["latency"]), dtype=np.int64)
    return cols


def _stand_in(cols, path: Path, shape: Shape, window_size: int) -> tuple[np.ndarray, dict]:
    """Rows of the measured shape that stands in for ``shape`` at ``window_size``."""
    base = (cols["head_dim"] == shape.head_dim) & (cols["window_size"] == window_size)
    if not base.any():
        return base, {}
    measured = sorted({(int(h), int(kv)) for h, kv in
                       zip(cols["num_heads"][base], cols["num_key_value_heads"][base],
                           strict=True)})

    def dist(hk: tuple[int, int]) -> tuple:
        h, kv = hk
        return (abs(math.log(h / shape.heads)), abs(math.log(kv / shape.kv_heads)), -kv, -h)

    h, kv = min(measured, key=dist)
    rows = base & (cols["num_heads"] == h) & (cols["num_key_value_heads"] == kv)
    info = {} if (h, kv) == (shape.heads, shape.kv_heads) else {
        "stand_in_heads": h, "stand_in_kv_heads": kv}
    return rows, info


def _rows_with_window(cols, path: Path, shape: Shape) -> tuple[np.ndarray, dict, bool]:
    """Rows for the layer's window; a windowed layer without rows of its own falls back to the
    full-attention rows (``True``: the caller derives the window from them)."""
    rows, info = _stand_in(cols, path, shape, shape.window_size)
    if not rows.any() and shape.window is not None:
        rows, info = _stand_in(cols, path, shape, 0)
        return rows, info, True
    return rows, info, False


class ContextAttention:
    """Seconds of one layer's attention call for a batch of ranges over cached prefixes."""

    def __init__(self, path: Path, version: str, shape: Shape) -> None:
        cols = _table(path)
        rows, info, derived_window = _rows_with_window(cols, path, shape)
        rows &= cols["batch_size"] == 1
        if not rows.any():
            raise NoRows(path, "head_dim", f"no bfloat16 context attention rows for "
                                   f"head_dim {shape.head_dim} (window {shape.window_size})")
        src = choose(cols["kernel_source"][rows], CONTEXT_PREFERRED)
        rows &= cols["kernel_source"] == src
        isl, lat = cols["isl"][rows], cols["latency"][rows] * MS
        scale = shape.heads / info.get("stand_in_heads", shape.heads)
        self.shape = shape
        self.source = TableSource(str(path), version, src)
        self.max_isl = int(isl.max())
        self.fixed_s = float(lat[np.argmin(isl)]) * scale
        table_window = None if derived_window else shape.window
        x = pairs(isl, table_window)
        curve = Series(x, lat * scale)
        if derived_window and shape.window is not None:
            curve = self._window_curve(curve, shape.window)
        self.curve = curve
        self.info = {**info, "window_from_full_attention": derived_window,
                     "measured_max_tokens": self.max_isl}

    @staticmethod
    def _window_curve(full: Series, w: int) -> Series:
        """Full-attention curve up to ``w`` tokens, then ``w`` pairs per row at the full
        curve's marginal cost per pair at ``P(w)``."""
        pw = float(pairs(w, None))
        x = np.r_[full.x[full.x < pw], pw]
        i = int(np.clip(np.searchsorted(full.x, pw), 1, len(full.x) - 1))
        slope = (full.y[i] - full.y[i - 1]) / (full.x[i] - full.x[i - 1])
        return Series(x, full(x), tail_slope=slope)

    def full(self, s: int) -> float:
        """A(s): one call computing ``s`` tokens with no cached prefix (A(0) = A(1))."""
        return float(self.curve(pairs(max(s, 1), self.shape.window)))

    def seconds(self, ranges) -> float:
        """One call for ``[(a, b), ...]``: ``A(1) + sum(A(b) - A(a))``."""
        total = self.fixed_s
        for a, b in ranges:
            if b > a:
                total += self.full(b) - self.full(a)
        return total

    def extrapolated(self, ranges) -> bool:
        return any(b > self.max_isl for _, b in ranges)


class GenerationAttention:
    """Seconds of one layer's decode-step attention for ``batch`` sequences of ``context``."""

    def __init__(self, path: Path, version: str, shape: Shape) -> None:
        cols = _table(path)
        rows, info, derived_window = _rows_with_window(cols, path, shape)
        if not rows.any():
            raise NoRows(path, "head_dim", f"no bfloat16 generation attention rows "
                                   f"for head_dim {shape.head_dim}")
        src = choose(cols["kernel_source"][rows], GENERATION_PREFERRED)
        rows &= cols["kernel_source"] == src
        scale = shape.kv_heads / info.get("stand_in_kv_heads", shape.kv_heads)
        batch, step, lat = cols["batch_size"][rows], cols["step"][rows], cols["latency"][rows]
        self.by_batch = {int(b): Series(step[batch == b], lat[batch == b] * MS * scale)
                         for b in np.unique(batch)}
        self.batches = np.array(sorted(self.by_batch), dtype=np.int64)
        self.window = shape.window
        self.source = TableSource(str(path), version, src)
        self.info = {**info, "window_from_full_attention": derived_window,
                     "measured_max_step": {int(b): s.max_x for b, s in self.by_batch.items()}}

    def seconds(self, batch: int, context: int) -> float:
        c = context if self.window is None else min(context, self.window)
        bs = self.batches
        if batch <= bs[0] or batch >= bs[-1]:
            b = int(bs[0] if batch <= bs[0] else bs[-1])
            return float(self.by_batch[b](c)) * (batch / b if batch > bs[-1] else 1.0)
        i = int(np.searchsorted(bs, batch))
        lo, hi = int(bs[i - 1]), int(bs[i])
        if hi == batch:
            return float(self.by_batch[hi](c))
        f = (batch - lo) / (hi - lo)
        return float((1 - f) * self.by_batch[lo](c) + f * self.by_batch[hi](c))

    def extrapolated(self, batch: int, context: int) -> bool:
        c = context if self.window is None else min(context, self.window)
        b = int(self.batches[np.clip(np.searchsorted(self.batches, batch), 0,
                                     len(self.batches) - 1)])
        return batch > self.batches[-1] or c > self.by_batch[b].max_x
