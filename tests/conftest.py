"""Shared test fixtures and paths."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
CC_TRACES = SHARED_DATA / "cc-traces"

needs_cc_traces = pytest.mark.skipif(not CC_TRACES.is_dir(), reason="../shared/data absent")
