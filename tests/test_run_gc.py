"""A run paces the cyclic garbage collector (sim/run/driver.py ``fewer_collections``): the
youngest generation's threshold is raised while it serves and the caller's thresholds come
back after, even when the run fails; when the collector runs changes no result."""

from __future__ import annotations

import gc

import pandas as pd
import pytest

from sim.config import RunConfig
from sim.engines import StepObserver
from sim.io import dumps
from sim.run import load_run_trace, run
from sim.run.driver import RUN_GC_THRESHOLD

TRACE = "synthetic:claude-code?sessions=4"


def _cfg(**kw) -> RunConfig:
    base = dict(trace=TRACE, gpu_cache=48 * 1024, sessions=4, max_context=32 * 1024,
                engine="vllm", replicas=2, router="dynamo-kv")
    base.update(kw)
    return RunConfig.from_flat(**base).with_preset("vllm")


class _Thresholds(StepObserver):
    def __init__(self) -> None:
        self.seen: set[tuple[int, int, int]] = set()

    def scheduled(self, engine, batch) -> None:
        self.seen.add(gc.get_threshold())


@pytest.fixture
def caller_thresholds():
    before = gc.get_threshold()
    gc.set_threshold(500, 7, 3)
    yield (500, 7, 3)
    gc.set_threshold(*before)


def test_a_run_raises_the_young_threshold_and_restores_the_callers(caller_thresholds) -> None:
    cfg = _cfg()
    seen = _Thresholds()
    run(cfg, load_run_trace(cfg), steps=seen)
    assert seen.seen == {(RUN_GC_THRESHOLD, 7, 3)}  # the older generations' as the caller's
    assert gc.get_threshold() == caller_thresholds


def test_a_higher_caller_threshold_is_kept(caller_thresholds) -> None:
    gc.set_threshold(4 * RUN_GC_THRESHOLD, 7, 3)
    cfg = _cfg()
    seen = _Thresholds()
    run(cfg, load_run_trace(cfg), steps=seen)
    assert seen.seen == {(4 * RUN_GC_THRESHOLD, 7, 3)}
    assert gc.get_threshold() == (4 * RUN_GC_THRESHOLD, 7, 3)


def test_a_failed_run_restores_the_callers_thresholds(caller_thresholds) -> None:
    cfg = _cfg()
    trace = load_run_trace(cfg)

    class Fails(StepObserver):
        def scheduled(self, engine, batch) -> None:
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        run(cfg, trace, steps=Fails())
    assert gc.get_threshold() == caller_thresholds


def test_the_collector_changes_no_result() -> None:
    cfg = _cfg()
    trace = load_run_trace(cfg)
    paced = run(cfg, trace)
    gc.disable()
    try:
        never = run(cfg, trace)
    finally:
        gc.enable()
    assert gc.isenabled()
    pd.testing.assert_frame_equal(paced.requests, never.requests)
    assert dumps(paced.summary) == dumps(never.summary)  # as summary.json writes it (NaN too)
