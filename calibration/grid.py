"""Measurement grids: which prefill batches, decode steps and copies to time (no torch).

A prefill point is a batch of disjoint token ranges ``[(a, b), ...]``, each computed over a
cached prefix of ``a`` tokens. The grid varies the cached prefix ``p`` at fixed ``n`` and ``n``
at fixed ``p`` separately, contains the paper's Figure 1 cases (front: the deleted segment from
position 2K batched with 512 new tokens; tail: one contiguous range) and "hole restore" checks:
a phantom middle range batched with the real request's new tokens, and the same two ranges each
timed apart. Some points are *held out*: the fit never sees them; their error is reported.

``quick`` is for a tiny spec on a CPU (every size about 1/16 of the paper's, chosen so that
compute dominates Python overhead); ``cpu`` is the full grid / 16 for a real spec on a CPU;
``cuda`` is the paper's sizes (contexts up to 128K).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from costmodel.figure1 import APPEND, DELETE_FRACTION, FRONT_START
from costmodel.registry import Registry

K = 1024
PROGRESS_UNIT = "timed calls"  # what kvsim calibrate's progress bar counts (measure.py)


@dataclass(frozen=True)
class PrefillPoint:
    ranges: tuple[tuple[int, int], ...]
    kind: str  # p-sweep | n-sweep | figure1-front | figure1-tail | hole-batched | hole-part
    holdout: bool = False

    @property
    def tokens(self) -> int:
        return sum(b - a for a, b in self.ranges)

    @property
    def end(self) -> int:
        return max(b for _, b in self.ranges)


@dataclass(frozen=True)
class DecodePoint:
    batch: int
    context: int  # tokens per sequence, the new one included
    holdout: bool = False


@dataclass(frozen=True)
class Grid:
    name: str
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]
    copy_bytes: tuple[int, ...]
    figure1_contexts: tuple[int, ...]
    hole_checks: tuple[tuple[tuple[int, int], tuple[int, int]], ...]  # (hole, new) pairs

    @property
    def capacity(self) -> int:
        """Cache positions a prefill stack needs."""
        return max(p.end for p in self.prefill)

    @property
    def decode_tokens(self) -> int:
        """Largest ``batch * context`` of a decode point (the decode cache per layer)."""
        return max(d.batch * d.context for d in self.decode)

    def summary(self) -> dict[str, object]:
        return {
            "name": self.name,
            "prefill_points": len(self.prefill),
            "prefill_holdout": sum(p.holdout for p in self.prefill),
            "decode_points": len(self.decode),
            "decode_holdout": sum(d.holdout for d in self.decode),
            "max_position": self.capacity,
            "figure1_contexts": list(self.figure1_contexts),
            "copy_bytes": list(self.copy_bytes),
        }


def _held(i: int, count: int) -> bool:
    """Hold out every third interior point of a sweep (never its ends: no extrapolation)."""
    return 0 < i < count - 1 and i % 3 == 2


def _build(name: str, scale: int, p_sweep: list[int], p_sweep_n: int,
           n_sweeps: dict[int, list[int]], fig_contexts: list[int], hole_contexts: list[int],
           decode_batches: list[int], decode_contexts: list[int], decode_max_tokens: int,
           copy_bytes: list[int]) -> Grid:
    pts: list[PrefillPoint] = []
    seen: set[tuple[tuple[int, int], ...]] = set()

    def add(ranges: list[tuple[int, int]], kind: str, holdout: bool = False) -> None:
        key = tuple(ranges)
        if key not in seen:
            seen.add(key)
            pts.append(PrefillPoint(key, kind, holdout))

    for i, p in enumerate(p_sweep):
        add([(p, p + p_sweep_n)], "p-sweep", _held(i, len(p_sweep)))
    for p, ns in n_sweeps.items():
        for i, n in enumerate(ns):
            add([(p, p + n)], "n-sweep", _held(i, len(ns)))
    front, append = FRONT_START // scale, APPEND // scale
    for j, c in enumerate(fig_contexts):
        d = round(DELETE_FRACTION * c)
        add([(front, front + d), (c, c + append)], "figure1-front", j % 2 == 1)
        add([(c - d, c + append)], "figure1-tail")
    holes = []
    for c in hole_contexts:
        d = round(DELETE_FRACTION * c)
        hole, new = (front, front + d), (c, c + append)
        add([hole, new], "hole-batched")
        add([hole], "hole-part")
        add([new], "hole-part")
        holes.append((hole, new))
    dec = []
    for c in decode_contexts:
        bs = [b for b in decode_batches if b * c <= decode_max_tokens]
        dec += [DecodePoint(b, c, _held(i, len(bs))) for i, b in enumerate(bs)]
    return Grid(name, tuple(pts), tuple(dec), tuple(copy_bytes), tuple(fig_contexts),
                tuple(holes))


MB = 1 << 20


def cuda_grid() -> Grid:
    return _build(
        "cuda", 1,
        p_sweep=[0, 1 * K, 2 * K, 4 * K, 8 * K, 16 * K, 24 * K, 32 * K, 48 * K, 64 * K, 96 * K,
                 128 * K],
        p_sweep_n=512,
        n_sweeps={0: [128, 256, 512, 1 * K, 2 * K, 4 * K, 8 * K],
                  16 * K: [256, 1 * K, 2 * K, 4 * K, 8 * K],
                  64 * K: [512, 2 * K, 4 * K, 8 * K]},
        fig_contexts=[8 * K, 16 * K, 32 * K, 64 * K, 128 * K],
        hole_contexts=[32 * K, 64 * K, 128 * K],
        decode_batches=[1, 4, 16, 32, 64, 128],
        decode_contexts=[1 * K, 4 * K, 16 * K, 32 * K],
        decode_max_tokens=512 * K,
        copy_bytes=[1 * MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB],
    )


def _scaled(name: str, s: int) -> Grid:
    g = {
        "p_sweep": [0, 1 * K, 2 * K, 4 * K, 8 * K, 16 * K, 24 * K, 32 * K, 48 * K, 64 * K],
        "n_sweeps": {0: [1 * K, 2 * K, 4 * K, 6 * K, 8 * K], 32 * K: [1 * K, 2 * K, 6 * K, 8 * K]},
        "fig": [16 * K, 32 * K, 64 * K],
        "holes": [32 * K, 64 * K],
    }
    return _build(
        name, s,
        p_sweep=[p // s for p in g["p_sweep"]], p_sweep_n=4 * K // s,
        n_sweeps={p // s: [n // s for n in ns] for p, ns in g["n_sweeps"].items()},
        fig_contexts=[c // s for c in g["fig"]], hole_contexts=[c // s for c in g["holes"]],
        decode_batches=[1, 4, 16, 32], decode_contexts=[256, 1 * K, 4 * K],
        decode_max_tokens=64 * K, copy_bytes=[1 * MB, 4 * MB, 16 * MB, 64 * MB],
    )


def quick_grid() -> Grid:
    """For the tiny spec on a CPU: ~30 prefill points, positions up to 4K."""
    return _scaled("quick", 16)


def cpu_grid() -> Grid:
    """For a real spec on a CPU: the same shape of grid, positions up to 8K (slow: minutes)."""
    return _scaled("cpu", 8)


GRIDS: Registry[Callable[[], Grid]] = Registry("calibration grid")
GRIDS.register("quick", quick_grid)
GRIDS.register("cpu", cpu_grid)
GRIDS.register("cuda", cuda_grid)
