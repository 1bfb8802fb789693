"""The compiled core (sim/native.py) against its Python source, the reference model: the same
random op streams on the radix cache and the same standard runs, each side in a subprocess on
its path (tests/native_probe.py), must give identical results: every return value, counter,
node, serial and stamp, every summary figure and every row of the per-request frame.

The rest of the suite runs the path users run, the compiled one where it is built (the
install builds it: setup.py), and ``make test`` runs a Python-path job beside it
(``KVSIM_PURE=1``; tests marked ``pure_path`` run there only, tests/conftest.py).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import subprocess
import sys
import types

import pytest

import setup as corebuild  # the build (setup.py at the repository's root)
from sim import native
from tests.conftest import REPO

PROBE = REPO / "tests" / "native_probe.py"


def _built() -> None:
    """Skip where the build could not compile (no C compiler: the build said why once)."""
    try:
        manifest = json.loads(native.MANIFEST.read_text())
    except (OSError, ValueError):
        pytest.fail("no compiled core manifest: make (or pip install -e .) builds it")
    if not manifest.get("built"):
        pytest.skip(f"no compiled core on this machine: {manifest.get('why')}")


def _native_probe(*args: str, pure: bool) -> dict:
    env = {**os.environ, native.PURE_ENV: "1" if pure else "0"}
    out = subprocess.run([sys.executable, str(PROBE), *args], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)
    assert got["compiled"] is not pure, got["reason"]
    return got["result"]


def _same_results(compiled: dict, pure: dict) -> None:
    assert compiled.keys() == pure.keys()
    for key in compiled:
        assert compiled[key] == pure[key], f"{key}: the compiled core differs"


def test_the_build_compiles_every_module_and_the_process_imports_them() -> None:
    _built()
    env = {**os.environ, native.PURE_ENV: "0"}
    code = ("import importlib; from sim import native as n; print(n.current()[0]); "
            "print(*(importlib.import_module(m).__file__ for m in n.COMPILED))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[0] == "True"
    assert len(out) == 1 + len(native.COMPILED)
    assert all(not f.endswith(".py") for f in out[1:]), out


@pytest.mark.parametrize("seeds", [(0, 40), (40, 40)])
def test_random_op_streams_run_identically(seeds: tuple[int, int]) -> None:
    _built()
    args = ("ops", str(seeds[0]), str(seeds[1]))
    compiled, pure = _native_probe(*args, pure=False), _native_probe(*args, pure=True)
    assert len(compiled) == seeds[1] * 6
    assert sum(len(log) for log in pure.values()) > 1000  # a real workout, not empty streams
    _same_results(compiled, pure)


def test_standard_runs_run_identically() -> None:
    _built()
    compiled, pure = _native_probe("runs", pure=False), _native_probe("runs", pure=True)
    assert all(r["rows"] > 0 for r in pure.values())
    _same_results(compiled, pure)


def _fake_checkout(tmp_path, monkeypatch, *, built: bool = True) -> None:
    """A checkout in tmp_path with every compiled module's source, its extension and the
    build's manifest."""
    monkeypatch.setattr(native, "ROOT", tmp_path)
    monkeypatch.setattr(native, "MANIFEST", tmp_path / corebuild.MANIFEST)
    monkeypatch.setattr(corebuild, "ROOT", tmp_path)
    monkeypatch.delenv(native.PURE_ENV, raising=False)
    for m in native.COMPILED:
        src = native.source(m)
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(f"# {m}\n")
        src.with_suffix(importlib.machinery.EXTENSION_SUFFIXES[0]).write_bytes(b"")
    digests = {m: hashlib.sha256(native.source(m).read_bytes()).hexdigest()
               for m in native.COMPILED}
    manifest = {"built": True, "compiled": list(native.COMPILED), "sources": digests} if built \
        else {"built": False, "why": "no C compiler"}
    native.MANIFEST.write_text(json.dumps(manifest))


def test_the_path_is_decided_by_the_build_the_sources_and_the_environment(
        tmp_path, monkeypatch) -> None:
    _fake_checkout(tmp_path, monkeypatch)
    assert native.decide() == (True, "compiled (mypyc)")
    monkeypatch.setenv(native.PURE_ENV, "1")
    assert native.decide()[0] is False
    monkeypatch.setenv(native.PURE_ENV, "0")
    assert native.decide()[0] is True
    edited = native.source(native.COMPILED[2])
    edited.write_text(edited.read_text() + "x = 1\n")
    active, why = native.decide()
    assert not active and "changed after the compiled core was built" in why
    assert str(edited.relative_to(tmp_path)) in why


def test_a_dependency_of_the_compiled_modules_is_hashed_too(tmp_path, monkeypatch) -> None:
    """Compiled code unboxes attributes of interpreted classes (sim/config.py's knobs, the
    policies): the manifest hashes the modules the compiled ones import from, and a change
    there runs the Python path (issue 51, D12's suspicion)."""
    deps = corebuild.dependencies()
    assert {"sim.config", "policies.eviction", "costmodel.specs"} <= set(deps)
    assert not set(deps) & set(native.COMPILED)
    _fake_checkout(tmp_path, monkeypatch)
    config = native.source("sim.config")
    config.write_text("# config\n")
    manifest = json.loads(native.MANIFEST.read_text())
    manifest["sources"]["sim.config"] = native.digest("sim.config")
    native.MANIFEST.write_text(json.dumps(manifest))
    assert native.decide()[0] is True
    config.write_text("# config, a knob's type changed\n")
    active, why = native.decide()
    assert not active and why.startswith(str(config.relative_to(tmp_path)))
    config.unlink()
    assert native.decide()[0] is False
    manifest["compiled"] = [*native.COMPILED, "sim.kvcache.hybridpool"]  # another build's list
    native.MANIFEST.write_text(json.dumps(manifest))
    assert "built for other modules" in native.decide()[1]


def test_no_extension_but_the_current_builds_is_ever_imported(tmp_path) -> None:
    """A checkout in a built tree (a branch switch, ``git bisect``) leaves extensions the
    current build does not list: the finder loads their modules from source (D12)."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    stray = tmp_path / "sim" / "engines" / "vllm_patch.py"
    stray.parent.mkdir(parents=True)
    stray.write_text("X = 1\n")
    stray.with_suffix(suffix).write_bytes(b"not a library")
    compiled = tmp_path.joinpath(*native.COMPILED[0].split(".")).with_suffix(".py")
    compiled.parent.mkdir(parents=True, exist_ok=True)
    compiled.write_text("")
    compiled.with_suffix(suffix).write_bytes(b"")
    everything = frozenset(native.COMPILED)
    # a stray extension is refused on either path; its source runs
    for allowed in (frozenset(), everything):
        assert native.refused("sim.engines.vllm_patch", allowed, tmp_path) == stray
    # the current build's extensions load on the compiled path only
    assert native.refused(native.COMPILED[0], everything, tmp_path) is None
    assert native.refused(native.COMPILED[0], frozenset(), tmp_path) == compiled
    # a module with no extension, and modules outside sim, take the usual way
    assert native.refused("sim.engines.other", frozenset(), tmp_path) is None
    assert native.refused("policies.zoo", frozenset(), tmp_path) is None
    stray.unlink()  # an extension whose source is gone cannot be imported at all
    with pytest.raises(ModuleNotFoundError, match="no source"):
        native.refused("sim.engines.vllm_patch", everything, tmp_path)


def test_a_stray_extension_under_sim_is_not_imported_in_a_process() -> None:
    """The installed finder, end to end: a broken extension beside a module of ``sim`` that
    no build lists would fail to load if it were imported (D12)."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    stray = REPO / "sim" / "io" / f"units_stray_probe{suffix}"
    code = "import sim.io.units_stray_probe as m; print(m.__file__)"
    src = stray.with_name("units_stray_probe.py")
    src.write_text("")
    stray.write_bytes(b"not a library")
    try:
        for pure in ("1", "0"):
            out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=REPO,
                                 env={**os.environ, native.PURE_ENV: pure},
                                 capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            assert out.stdout.strip() == str(src)
    finally:
        stray.unlink()
        src.unlink()


def test_a_missing_extension_or_build_runs_the_python_path(tmp_path, monkeypatch) -> None:
    _fake_checkout(tmp_path, monkeypatch)
    src = native.source(native.COMPILED[0])
    src.with_suffix(importlib.machinery.EXTENSION_SUFFIXES[0]).unlink()
    active, why = native.decide()
    assert not active and native.COMPILED[0] in why
    _fake_checkout(tmp_path, monkeypatch, built=False)
    active, why = native.decide()
    assert not active and "not built: no C compiler" in why


def test_the_build_without_a_compiler_says_so_and_keeps_the_python_path(
        tmp_path, monkeypatch, capsys) -> None:
    _fake_checkout(tmp_path, monkeypatch)
    # mypyc importable whether or not this venv has mypy (pip builds the core in an isolated
    # environment that has it): only the compiler is missing here.
    mypyc_build = types.ModuleType("mypyc.build")
    mypyc_build.mypycify = lambda *a, **k: pytest.fail("mypycify called without a compiler")
    monkeypatch.setitem(sys.modules, "mypyc", types.ModuleType("mypyc"))
    monkeypatch.setitem(sys.modules, "mypyc.build", mypyc_build)
    monkeypatch.setattr(corebuild, "_compiler", lambda: None)
    assert corebuild._extensions(tmp_path) == []  # setup.py installs kvsim without a core
    assert "no C compiler on PATH: the simulator runs on the Python path" in \
        capsys.readouterr().err
    assert native.decide() == (False, "the compiled core is not built: no C compiler on PATH "
                                      "(make builds it)")


def test_the_build_removes_extensions_of_modules_it_no_longer_compiles(tmp_path,
                                                                       monkeypatch) -> None:
    """Only the modules of COMPILED are guarded by the manifest: a leftover extension of any
    other module would be imported before its source."""
    _fake_checkout(tmp_path, monkeypatch)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    stray = tmp_path / "sim" / "engines" / f"vllm_patch{suffix}"
    group = tmp_path.joinpath(*f"{native.GROUP}__mypyc".split(".")).with_suffix(suffix)
    for path in (stray, group):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    corebuild._remove_strays()
    assert not stray.exists() and group.exists()
    assert all(native.source(m).with_suffix(suffix).exists() for m in native.COMPILED)


def test_the_path_is_chosen_in_one_place_before_any_module_of_sim_loads() -> None:
    """The manifest guards a compiled module only if the decision ran before it was found:
    sim/__init__.py decides (every compiled module is in ``sim``, whose __init__ runs before
    any of its modules), and nothing else in sim/ does (issue 52 item 5)."""
    assert all(m.startswith("sim.") for m in native.COMPILED)
    init = REPO / "sim" / "__init__.py"
    assert "native.install()" in init.read_text()
    for path in sorted((REPO / "sim").rglob("*.py")):
        text = path.read_text()
        assert path == init or "native.install()" not in text, path
        assert "noqa: E402" not in text, f"{path.relative_to(REPO)}: imports after code"
    out = subprocess.run([sys.executable, "-c", "import sim, sys; "
                          "print(sorted(m for m in sys.modules if m.startswith('sim')))"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['sim', 'sim.native']"


def test_make_rebuilds_the_core_when_any_compiled_source_changes() -> None:
    """``make``'s core target must name every compiled module's source among its
    prerequisites (directly or by a wildcard): an edit it missed would leave the checkout on
    the (slower) Python path until a manual ``make core``."""
    from fnmatch import fnmatch
    line = next(x for x in (REPO / "Makefile").read_text().splitlines()
                if x.startswith("$(CORE_STAMP):"))
    deps = line.split(":", 1)[1].replace("$(wildcard", " ").replace(")", " ").split()
    for module in (*native.COMPILED, *corebuild.dependencies()):
        rel = native.source(module).relative_to(native.ROOT).as_posix()
        assert any(fnmatch(rel, d) for d in deps), f"{rel} is not a prerequisite of make core"


def test_the_compiled_fleet_takes_a_router_returning_numpy_integers() -> None:
    """A user's router may return a numpy integer (docs/fleet.md); the compiled front checks
    annotations, so it must not declare the router's answer an ``int``."""
    _built()
    env = {**os.environ, native.PURE_ENV: "0"}
    code = """
import numpy as np
from policies.routing import Router, register_router
from sim.config import RunConfig
from sim import native
from sim.run import run

class Argmin(Router):
    name = "probe-numpy-argmin"
    def route(self, request, view):
        return np.argmin([r.in_flight for r in view.replicas])

register_router(Argmin)
cfg = RunConfig.from_flat(trace="synthetic:claude-code?sessions=4", max_context=32768,
                          gpu_cache=65536, sessions=2, replicas=2,
                          router="probe-numpy-argmin").with_preset("sglang")
res = run(cfg)
print(native.current()[0], sorted(set(res.requests["replica"])))
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split(maxsplit=1)
    assert out == ["True", "[0, 1]\n"] or out == ["True", "[0, 1]"]


def test_mypyc_compiles_a_copy_in_which_the_records_inits_are_written_out(
        tmp_path, monkeypatch) -> None:
    """The build hands mypyc the copy under build/native-src (setup.py ``native_source``),
    from the copy's root, with its C under the checkout's build/; the sources stay as written
    and the manifest hashes them (sim/native.py)."""
    _fake_checkout(tmp_path, monkeypatch)
    monkeypatch.chdir(REPO)  # (the build changes directory; restored after the test)
    record = native.source("sim.engines.request")
    written = ("from dataclasses import dataclass\n\n\n@dataclass(kw_only=True)\nclass R:\n"
               "    a: int\n\n    b: int = 0\n")
    record.write_text(written)
    seen: dict = {}

    def mypycify(args, **kw):
        seen.update(cwd=os.getcwd(), target=kw["target_dir"],
                    text=(tmp_path / corebuild.NATIVE_SRC / "sim/engines/request.py").read_text())
        return []

    mypyc_build = types.ModuleType("mypyc.build")
    mypyc_build.mypycify = mypycify
    monkeypatch.setitem(sys.modules, "mypyc", types.ModuleType("mypyc"))
    monkeypatch.setitem(sys.modules, "mypyc.build", mypyc_build)
    monkeypatch.setattr(corebuild, "_compiler", lambda: "cc")
    assert corebuild._extensions(tmp_path) == []
    assert seen["cwd"] == str(tmp_path / corebuild.NATIVE_SRC)
    assert seen["target"] == str(tmp_path / "build")
    assert seen["text"].splitlines()[6] == (
        "    def __init__(self, *, a: int, b: int = 0) -> None: self.a = a; self.b = b")
    assert record.read_text() == written and os.getcwd() == str(tmp_path)
