"""Timing: warm-up, repeats in interleaved rounds, median.

On CUDA each call is bracketed by CUDA events (device time, no host jitter); on a CPU by
``time.perf_counter`` or, for one torch thread on a shared machine, ``time.process_time``.
Points are timed in rounds: every round visits every point once, in a seeded shuffled order,
and a point's time is the median over rounds -- a burst of foreign load on a shared machine
then spoils one sample of many points instead of every sample of one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

from sim.report.progress import current as current_progress

from .errors import require_torch
from .grid import PROGRESS_UNIT

torch = require_torch()


class Timer:
    """``clock``: ``wall`` (``perf_counter``) or ``cpu`` (``process_time``: CPU seconds of this
    process, all its threads -- equal to wall time for one busy thread, but blind to time
    spent descheduled on a shared machine). CUDA always uses events."""

    def __init__(self, device, clock: str = "wall") -> None:
        self.cuda = torch.device(device).type == "cuda"
        if clock not in ("wall", "cpu"):
            raise ValueError(f"clock must be wall or cpu, got {clock!r}")
        self.clock = "cuda-events" if self.cuda else clock
        self._now = time.process_time if clock == "cpu" else time.perf_counter

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], object]) -> float:
        """Seconds one call of ``fn`` takes."""
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        t0 = self._now()
        fn()
        return self._now() - t0


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def time_points(timer: Timer, fns: Sequence[Callable[[], object]], warmup: int, rounds: int,
                seed: int = 0) -> tuple[list[float], list[float]]:
    """Median seconds per function and its spread (interquartile range / median)."""
    samples: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    rng = random.Random(seed)
    bar = current_progress()  # a progress bar on screen counts the calls; it times nothing
    tick = bar.advance if bar.counts(PROGRESS_UNIT) else (lambda: None)
    with torch.inference_mode():
        for fn in fns:
            for _ in range(warmup):
                fn()
                tick()
        timer.sync()
        for _ in range(rounds):
            rng.shuffle(order)
            for i in order:
                samples[i].append(timer(fns[i]))
                tick()
    meds, spreads = [], []
    for s in samples:
        s.sort()
        med = median(s)
        q1, q3 = s[len(s) // 4], s[(3 * len(s)) // 4]
        meds.append(med)
        spreads.append((q3 - q1) / med if med > 0 else 0.0)
    return meds, spreads
