"""Timing helpers of the calibration: medians over interleaved rounds, and the CPU clock that
ignores time spent descheduled (what makes ``--quick`` robust on a busy shared machine)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from calibration.measure import Timer, median, time_points


def test_median():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_cpu_clock_ignores_sleeping_wall_clock_does_not():
    def nap():
        time.sleep(0.05)

    assert Timer("cpu", "cpu")(nap) < 0.02
    assert Timer("cpu", "wall")(nap) >= 0.05


def test_time_points_takes_the_median_over_rounds_in_shuffled_order():
    calls: list[int] = []
    timed = {0: iter([1.0, 1.0, 10.0]), 1: iter([1.0, 1.0, 1.0])}  # one outlier for point 0

    class FakeTimer:
        def sync(self):
            pass

        def __call__(self, fn):
            return next(timed[fn()])

    def make(i):
        def fn():
            calls.append(i)
            return i
        return fn

    fns = [make(0), make(1)]
    med, spread = time_points(FakeTimer(), fns, warmup=2, rounds=3, seed=0)
    assert calls[:4] == [0, 0, 1, 1]  # warm-up first, point by point
    assert sorted(calls[4:6]) == [0, 1]  # then rounds that visit every point once
    assert med == [1.0, 1.0]  # the outlier is not the median
    assert spread == [9.0, 0.0]  # (q3 - q1) / median


def test_bad_clock_refused():
    with pytest.raises(ValueError):
        Timer("cpu", "sundial")
