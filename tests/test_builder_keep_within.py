"""traces/builder.py ``keep_within``: a builder that stores only the requests one
``build(max_context=...)`` keeps builds the same Trace as one that stores every request, and
refuses what it cannot serve (another max_context, a cache copy)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from traces import builder as builder_mod
from traces import synthetic


def _fields(trace) -> dict:
    out = {}
    for f in dataclasses.fields(trace):
        v = getattr(trace, f.name)
        out[f.name] = (v.dtype.str, v.tobytes()) if isinstance(v, np.ndarray) else repr(v)
    return out


@pytest.mark.parametrize("max_context", [12000, 20000, 60000, 131072])
@pytest.mark.parametrize("shared_prefix", [None, "auto"])
def test_a_builder_keeping_one_cut_builds_the_same_trace(monkeypatch, max_context,
                                                         shared_prefix):
    """Sub-agents spawned after, before and at a parent's cut are all in the synthetic trace
    (about one in three requests is over 20K tokens, sessions spawn sub-agents)."""
    spec = "synthetic:claude-code?sessions=30"
    build = {"max_context": max_context, "shared_prefix": shared_prefix, "select": None}
    cut = synthetic.generate(spec, build=build)
    real = builder_mod.TraceBuilder

    def storing_all(*a, keep_within=None, **k):
        return real(*a, **k)

    monkeypatch.setattr(synthetic, "TraceBuilder", storing_all)
    full = synthetic.generate(spec, build=build)
    assert len(full) > 0
    assert _fields(cut) == _fields(full)


def _builder():
    b = builder_mod.TraceBuilder("t", "synthetic", "t", 4, keep_within=8)
    h = b.open_session("a")
    for p in (4, 12, 16):
        b.add(h, prompt=p, output=1, ids=np.arange(p // 4), send_time_s=0.0, gap_s=0.0,
              gap_kind=0)
    return b


def test_a_builder_keeping_one_cut_stores_only_it():
    b = _builder()
    assert b.n_requests(0) == 2  # the request over the cut is kept: build finds it there
    assert len(b.build(max_context=8)) == 1
    with pytest.raises(ValueError, match="max_context=8 only"):
        b.build(max_context=16)
    with pytest.raises(ValueError, match="keep_within"):
        b.storage()
