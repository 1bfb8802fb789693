"""The npz trace cache holds the parse, before max_context, select and shared_prefix: one
parse serves every combination of them (a sweep over --select parses once), and a trace loaded
from the cache is identical, array for array, to one parsed afresh."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

import traces.load
from sim.cli.main import cli
from tests.conftest import SHARED_DATA, needs_cc_traces
from tests.enginekit import write_cc_traces
from traces import load_trace

OPTIONS = [{}, {"select": "top-requests:2", "max_context": 20_000},
           {"shared_prefix": 1024, "max_context": 60_000, "select": "first:1"},
           {"shared_prefix": "auto", "select": "first:3"}]


def assert_same(a, b) -> None:
    arrays_a, scalars_a = a.storage()
    arrays_b, scalars_b = b.storage()
    assert scalars_a == scalars_b
    for k, v in arrays_a.items():
        assert v.dtype == arrays_b[k].dtype and np.array_equal(v, arrays_b[k]), k
    assert a.sessions == b.sessions and a.options == b.options
    for k in ("name", "block_size", "format", "source", "models", "skipped", "hash_id_refs",
              "hash_id_distinct"):
        assert getattr(a, k) == getattr(b, k), k


@pytest.fixture()
def cc4x5(tmp_path):
    write_cc_traces(tmp_path / "cc", sessions=4, turns=5)
    return str(tmp_path / "cc")


def test_one_parse_serves_every_option_and_equals_a_fresh_load(cc4x5, tmp_path,
                                                               monkeypatch) -> None:
    cache = str(tmp_path / "kc")
    fresh = {i: load_trace(cc4x5, cache_dir=None, **o) for i, o in enumerate(OPTIONS)}
    parses = []
    real = traces.load._read_format
    monkeypatch.setattr(traces.load, "_read_format",
                        lambda *a, **k: (parses.append(a[0]), real(*a, **k))[1])
    for i, o in enumerate(OPTIONS):
        assert_same(load_trace(cc4x5, cache_dir=cache, **o), fresh[i])
    assert len(parses) == 1  # the first load parsed; the other options came from the cache
    assert len(list((tmp_path / "kc").glob("parsed-*.npz"))) == 1
    fresh_lenient = load_trace(cc4x5, cache_dir=None, lenient=True)
    parses.clear()
    assert_same(load_trace(cc4x5, cache_dir=cache, lenient=True), fresh_lenient)
    assert len(parses) == 1  # lenient is part of the parse: a copy of its own


@needs_cc_traces
@pytest.mark.parametrize("spec,extra", [("cc-traces", {}), ("mooncake", {}),
                                        ("mooncake", {"rebuild_sessions": True})])
def test_shared_traces_from_the_cache_equal_a_fresh_parse(spec, extra, tmp_path) -> None:
    path = str(SHARED_DATA / spec)
    options = [{"shared_prefix": 15974, "max_context": 131072, "select": "top-requests:24"},
               {"max_context": 65536, "select": "top-requests:8"}]
    for o in options:
        fresh = load_trace(path, cache_dir=None, **extra, **o)
        assert_same(load_trace(path, cache_dir=str(tmp_path), **extra, **o), fresh)


def test_a_sweep_over_select_parses_the_files_once(cc4x5, tmp_path, monkeypatch) -> None:
    from sim.run.trace import _load

    _load.cache_clear()
    parses = []
    real = traces.load._read_format
    monkeypatch.setattr(traces.load, "_read_format",
                        lambda *a, **k: (parses.append(a[0]), real(*a, **k))[1])
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "kc"))
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump({"base": {"trace": cc4x5, "gpu_cache": "16k", "preset": "sglang"},
                                   "grid": {"select": ["first:1", "first:2", "first:3"],
                                            "max_context": ["20k", "64k"]}}))
    res = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.stderr
    assert len(parses) == 1, parses
