"""Shared test fixtures and paths."""

from __future__ import annotations

import os
from pathlib import Path

# The suite runs the Python reference model (its spies replace methods, which compiled classes
# refuse); tests/test_native_core.py runs the compiled core beside it. KVSIM_PURE=0 runs all
# on the compiled core instead. Set before any test imports sim.
os.environ.setdefault("KVSIM_PURE", "1")

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
CC_TRACES = SHARED_DATA / "cc-traces"

needs_cc_traces = pytest.mark.skipif(not CC_TRACES.is_dir(), reason="../shared/data absent")


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


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    """A cc-traces folder of 3 sessions x 5 requests (tests/enginekit.py write_cc_traces)."""
    from tests.enginekit import write_cc_traces

    d = tmp_path_factory.mktemp("cc")
    write_cc_traces(d, sessions=3, turns=5)
    return d
