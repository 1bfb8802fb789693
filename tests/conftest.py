"""Shared test fixtures and paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.vllm_ref import VLLM_VERSIONS

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
CC_TRACES = SHARED_DATA / "cc-traces"

needs_cc_traces = pytest.mark.skipif(not CC_TRACES.is_dir(), reason="../shared/data absent")


def pytest_collection_modifyitems(config, items) -> None:
    """The suite runs the path users run: the compiled core where the install built it
    (sim/native.py). A test marked ``pure_path(why)`` (a spy replacing a method of a compiled
    class, which compiled callers do not see) runs on the Python path only: ``make test``'s
    ``KVSIM_PURE=1`` job runs it, with the golden and differential files."""
    from sim import native

    if not native.current()[0]:
        return
    for item in items:
        if (mark := item.get_closest_marker("pure_path")) is not None:
            item.add_marker(pytest.mark.skip(reason=f"Python path only: {mark.args[0]}"))


@pytest.fixture(autouse=True, scope="session")
def _trace_cache_in_tmp(tmp_path_factory):
    """The npz trace cache is on by default (~/.cache/kvsim): keep the tests' copies in a
    temporary folder of their own instead of the user's cache."""
    import os

    old = os.environ.get("KVSIM_CACHE_DIR")
    os.environ["KVSIM_CACHE_DIR"] = str(tmp_path_factory.mktemp("kvsim-cache"))
    yield
    if old is None:
        os.environ.pop("KVSIM_CACHE_DIR", None)
    else:
        os.environ["KVSIM_CACHE_DIR"] = old


@pytest.fixture(params=VLLM_VERSIONS)
def vllm(request) -> str:
    """The pinned vLLM a test runs against, each in turn (benchmarks/vllm_ref.py
    VLLM_VERSIONS): ``use_vllm`` makes it the one ``VllmRef`` loads. The vLLM differential
    modules ask for it for every test (``pytestmark = pytest.mark.usefixtures("vllm")``)."""
    from benchmarks.vllm_ref import use_vllm

    return use_vllm(request.param)


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray (2 CPUs) for a test module (tests/test_sweep_ray.py,
    tests/test_fleet_ray.py)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """A cc-traces folder of 3 sessions x 5 requests (tests/enginekit.py write_cc_traces)."""
    from tests.enginekit import write_cc_traces

    d = tmp_path_factory.mktemp("cc")
    write_cc_traces(d, sessions=3, turns=5)
    return d
