"""User-facing errors survive the trip back from a worker process (sweeps and `kvsim
reproduce -j N` run points in a process pool): an error that cannot be rebuilt from its
pickle broke the pool, and the user saw "worker process died" instead of the message."""

from __future__ import annotations

import pickle

import pytest

from calibration.kernels.tables import KernelTableError, NoRows
from costmodel.errors import ProfileError
from sim.config import ConfigError
from sim.studies.study import StudySetup, run_all
from sim.sweep import SweepError
from traces.errors import TraceFormatError

ERRORS = [
    ProfileError("p.yaml", "model", "profile is for 'a', not 'b'"),
    ConfigError("sweep.yaml", "gpu_cache", "must be positive"),
    SweepError("2 points failed", 3),
    TraceFormatError("t.jsonl", 4, "input_tokens", "not an integer"),
    TraceFormatError("t.jsonl", None, None, "empty file"),
    KernelTableError("gemm_perf.txt", "latency", "missing"),
    NoRows("gemm_perf.txt", "m", "no rows for n=4096"),
]


@pytest.mark.parametrize("err", ERRORS, ids=lambda e: type(e).__name__)
def test_errors_round_trip_through_pickle(err: Exception) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == str(err)
    assert getattr(back, "exit_code", None) == getattr(err, "exit_code", None)
    assert {k: v for k, v in vars(back).items()} == {k: v for k, v in vars(err).items()}


def test_a_workers_profile_error_reaches_the_caller() -> None:
    ctx = StudySetup(trace="synthetic:claude-code?sessions=2", jobs=2, quick=True)
    good = ctx.base("qwen3-8b", 2)
    bad = good.with_fields(model="gemma-3-27b", profile="derived-h100-qwen3-8b")
    with pytest.raises(ProfileError, match="profile is for 'qwen3-8b', not 'gemma-3-27b'"):
        run_all(ctx, [good, bad])
