"""The compiled core: the modules of ``COMPILED``, built from their own Python source by
mypyc into C extensions that sit beside the sources (``make`` runs
``python -m sim.kvcache.corebuild``). The Python source stays the reference model; the
extensions run the same code with native classes and typed locals, and
tests/test_native_core.py requires identical results.

``install`` (run by the ``__init__`` of each package holding a compiled module, before any of
them loads) decides once per process which one is imported: the extensions, unless
``KVSIM_PURE=1`` asks for the Python path, or a source changed after the build (an edit must
never run stale compiled code; the build's manifest holds each source's hash). The decision
covers all modules together: compiled modules call each other's native classes directly, so
they cannot be mixed with their Python versions.

    python -m sim.kvcache.corebuild          # compile (says so once without a C compiler)
    python -m sim.kvcache.corebuild status   # which path this checkout imports, and why
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The cache (radix nodes and tree, the eviction planner, the tiers, the facade the engines
# call), the SGLang engine (its base, requests, ever-inserted blocks, waiting order and
# scheduler), the prompt's pricing and the fleet routers' cache index (beliefs). Each
# package holding one decides (``install``) before its modules load.
COMPILED = ("sim.kvcache.node", "sim.kvcache.tree", "sim.kvcache.planner",
            "sim.kvcache.tiering", "sim.kvcache.cache", "sim.engines.request",
            "sim.engines.known", "sim.engines.base", "sim.engines.sglang_queue",
            "sim.engines.sglang", "sim.context.prompt", "sim.fleet.beliefs",
            "sim.kvcache.paths", "sim.kvcache.results", "sim.engines.latency",
            "sim.engines.recorder", "sim.replay", "sim.kvcache.events", "sim.fleet.fleet",
            "sim.fleet.kvevents", "sim.fleet.load", "sim.fleet.eventindex",
            "sim.engines.clock", "sim.fleet.active")
# The shared library of the compiled modules, sim/core__mypyc.*.so: outside their package,
# whose attribute lookups fail while its __init__ runs.
GROUP = "sim.core"
MANIFEST = ROOT / "sim" / "core-manifest.json"  # written by build, gitignored
PURE_ENV = "KVSIM_PURE"


def source(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def digest(module: str) -> str:
    return hashlib.sha256(source(module).read_bytes()).hexdigest()


def _extension(module: str) -> Path | None:
    src = source(module)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = src.with_suffix(suffix)
        if path.exists():
            return path
    return None


def decide() -> tuple[bool, str]:
    """(use the extensions?, why) for this checkout and environment."""
    active, why, _unusable = _decision()
    return active, why


def _decision() -> tuple[bool, str, bool]:
    """(use the extensions?, why, a build exists but cannot be used?)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False, f"{PURE_ENV}={os.environ[PURE_ENV]} asks for the Python path", False
    try:
        manifest = json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or not manifest.get("built"):
        why = manifest.get("why", "") if isinstance(manifest, dict) else ""
        return (False, f"the compiled core is not built{': ' + why if why else ''} "
                "(make builds it)", False)
    hashes = manifest.get("sources", {})
    for module in COMPILED:
        if _extension(module) is None:
            return False, f"{module} has no compiled extension (make builds it)", True
        if hashes.get(module) != digest(module):
            return False, (f"{source(module).relative_to(ROOT)} changed after the compiled core "
                           "was built (make rebuilds it)"), True
    return True, "compiled (mypyc)", False


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Loads the compiled modules from their ``.py`` source instead of their extension."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in COMPILED:
            return None
        return importlib.util.spec_from_file_location(fullname, source(fullname))


COMPILED_ACTIVE = False
REASON = "not decided"


def current() -> tuple[bool, str]:
    """(runs compiled?, why): this process's decision."""
    return COMPILED_ACTIVE, REASON


def install() -> None:
    """Decide the path once; on the Python path, put the source-first finder in front.
    A changed source warns (once): the user expects the edit to run, and it does, slower."""
    global COMPILED_ACTIVE, REASON
    if REASON != "not decided":
        return
    COMPILED_ACTIVE, REASON, unusable = _decision()
    if COMPILED_ACTIVE:
        return
    sys.meta_path.insert(0, _SourceFirst())
    if unusable:
        warnings.warn(f"kvsim runs on the Python path: {REASON}", RuntimeWarning, stacklevel=2)
