"""The npz trace cache holds the parse, before max_context, select and shared_prefix: one
parse serves every combination of them (a sweep over --select parses once), and a trace loaded
from the cache is identical, array for array, to one parsed afresh."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

import traces.load
from sim.cli.main import cli
from tests.conftest import SHARED_DATA, needs_cc_traces
from tests.enginekit import write_cc_traces
from traces import load_trace
from traces.cache import CACHE_VERSION

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
        for _ in range(2):  # built from the cached parse, then the built copy
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


def test_the_built_trace_is_kept_and_reloads_the_same(cc4x5, tmp_path, monkeypatch,
                                                     capsys) -> None:
    """A repeated load with the same options reads the Trace it built (no build: a Mooncake
    trace builds 4,000 sessions), equal to a fresh load; a damaged copy is built again, with
    a notice."""
    from traces.builder import TraceBuilder

    cache = str(tmp_path / "kc")
    builds = []
    real = TraceBuilder.build
    monkeypatch.setattr(TraceBuilder, "build",
                        lambda self, **k: (builds.append(k), real(self, **k))[1])
    for o in OPTIONS:
        fresh = load_trace(cc4x5, cache_dir=None, **o)
        builds.clear()
        assert_same(load_trace(cc4x5, cache_dir=cache, **o), fresh)
        assert_same(again := load_trace(cc4x5, cache_dir=cache, **o), fresh)
        assert len(builds) == 1  # the first load built, the second read the copy
        assert not again._pool.flags.writeable
    built = sorted((tmp_path / "kc").glob("built-*.npz"))
    assert len(built) == len(OPTIONS)
    for f in built:
        f.write_bytes(b"not an npz")
    builds.clear()
    capsys.readouterr()
    assert_same(load_trace(cc4x5, cache_dir=cache, **OPTIONS[1]),
                load_trace(cc4x5, cache_dir=None, **OPTIONS[1]))
    err = capsys.readouterr().err
    assert "built-" in err and "does not load" in err and "rebuilding" in err
    assert len(builds) == 2  # the damaged copy was built again (and the fresh load built)
    builds.clear()
    load_trace(cc4x5, cache_dir=cache, **OPTIONS[1])
    assert not builds  # and written back whole


def test_a_changed_source_file_is_loaded_afresh(cc4x5, tmp_path) -> None:
    """Both cached copies (the parse and the built Trace) are keyed by the files' size and
    times: rewritten files are parsed and built again, never served from the old copies."""
    cache = str(tmp_path / "kc")
    before = load_trace(cc4x5, cache_dir=cache)
    load_trace(cc4x5, cache_dir=cache)
    write_cc_traces(cc4x5, sessions=4, turns=3, seed=1)
    after = load_trace(cc4x5, cache_dir=cache)
    assert len(after) == 4 * 3 != len(before)
    assert_same(after, load_trace(cc4x5, cache_dir=None))


UNPICKLED: list[str] = []


def _unpickled(what: str) -> str:
    UNPICKLED.append(what)
    return what


class _Trap:
    """Calls ``_unpickled`` if anything ever unpickles it."""

    def __reduce__(self):
        return (_unpickled, ("trap",))


def test_cache_files_are_never_unpickled(cc4x5, tmp_path) -> None:
    """A cache file holding pickled objects (npz writes object arrays as pickles) is
    treated as damaged: rebuilt from the source, its pickle never loaded."""
    cache = tmp_path / "kc"
    fresh = load_trace(cc4x5, cache_dir=str(cache))
    files = sorted(cache.glob("*.npz"))
    assert {f.name.split("-")[0] for f in files} == {"parsed", "built"}
    trap = np.empty(1, dtype=object)
    trap[0] = _Trap()
    for f in files:
        with open(f, "wb") as out:
            np.savez(out, meta=np.frombuffer(json.dumps({"v": CACHE_VERSION}).encode(),
                                             np.uint8), session=trap, req_ptr=trap)
    assert_same(load_trace(cc4x5, cache_dir=str(cache)), fresh)
    assert UNPICKLED == []


def _aged(folder, ages: dict[str, int]) -> None:
    """Files of 1,000 bytes each, ``ages`` seconds old."""
    import os
    import time

    now = time.time_ns()
    for name, age in ages.items():
        f = folder / name
        f.write_bytes(b"x" * 1000)
        os.utime(f, ns=(now - age * 10**9, now - age * 10**9))


def test_prune_removes_least_recently_used_first(tmp_path) -> None:
    """Against a brute force: the oldest cache files go until the rest fit, the file just
    written stays whatever its age, other files and fresh temporary files are untouched, a
    temporary file an hour older than the newest cache file is a crash's and goes."""
    from itertools import permutations

    from traces.cache import prune

    names = ["parsed-a.npz", "built-b.npz", "parsed-c.npz", "built-d.npz"]
    for order in permutations(range(4)):
        for limit in (0, 999, 1000, 2500, 4000):
            for keep in names:
                d = tmp_path / f"{''.join(map(str, order))}-{limit}-{keep}"
                d.mkdir()
                ages = {n: 10 * (o + 1) for n, o in zip(names, order, strict=True)}
                _aged(d, {**ages, "other.npz": 999, ".x.npz.1.tmp": 5,
                          ".y.npz.2.tmp": 3700})
                prune(d, d / keep, limit)
                want, total = set(names), 4000
                for n in sorted(names, key=lambda n: -ages[n]):  # oldest first
                    if total > limit and n != keep:
                        want.discard(n)
                        total -= 1000
                left = {f.name for f in d.iterdir()}
                assert left == want | {"other.npz", ".x.npz.1.tmp"}, (order, limit, keep)


def test_the_cache_folder_stays_under_its_limit_and_a_hit_renews(cc4x5, tmp_path,
                                                                 monkeypatch) -> None:
    """Loads under a limit that holds about one parse and its built trace: the folder never
    grows past it; the copy a load just hit is the last to go."""
    from traces.cache import max_cache_bytes, resolve_cache_dir
    from traces.errors import OptionError

    cache = tmp_path / "kc"
    load_trace(cc4x5, cache_dir=str(cache))
    one = sum(f.stat().st_size for f in cache.iterdir())
    monkeypatch.setenv("KVSIM_CACHE_MAX_MIB", "1")
    assert max_cache_bytes() == 1 << 20
    monkeypatch.setenv("KVSIM_CACHE_MAX_MIB", "lots")  # refused before any work
    with pytest.raises(OptionError, match="KVSIM_CACHE_MAX_MIB: expected a whole number"):
        resolve_cache_dir(str(cache))
    assert resolve_cache_dir("off") is None
    monkeypatch.setattr("traces.cache.max_cache_bytes", lambda: one + 1)
    for o in OPTIONS[1:]:
        load_trace(cc4x5, cache_dir=str(cache), **o)
        assert sum(f.stat().st_size for f in cache.iterdir()) <= one + 1
    parsed = next(cache.glob("parsed-*.npz"))  # the parse every build read survives
    assert parsed.exists()

