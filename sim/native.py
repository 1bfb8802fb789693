"""The compiled core: the modules of ``COMPILED``, built from their own Python source by
mypyc into C extensions that sit beside the sources, at install time (``pip install [-e] .``
and ``make`` run setup.py's build). The Python source stays the reference model; the
extensions run the same code with native classes and typed locals, and
tests/test_native_core.py requires identical results.

``install`` (run once, by sim/__init__.py: every module of ``sim`` loads after it) decides
which one is imported: the extensions, unless ``KVSIM_PURE=1`` asks for the Python path, or
a source changed after the build (an edit must never run stale compiled code; the build's
manifest holds the hash of each compiled module's source and of each module they import
from, setup.py ``dependencies``: compiled code unboxes the attributes of interpreted classes
such as sim/config.py's knobs). The decision covers all modules together: compiled modules
call each other's native classes directly, so they cannot be mixed with their Python
versions. The finder (``_SourceFirst``) then refuses every extension under ``sim/`` but the
current build's: a checkout (a branch switch, ``git bisect``) never imports a stale
extension, not even of a module no longer compiled.

    python setup.py build_ext --inplace     # compile (make core; says so without a compiler)
    python setup.py status                  # which path this checkout imports, and why
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

ROOT = Path(__file__).resolve().parents[1]
# The cache (radix nodes and tree, the eviction planner, the tiers, the facade the engines
# call), the SGLang engine (its base, requests, ever-inserted blocks, waiting order and
# scheduler), the vLLM engine (its V1 scheduler, block pool, free queue, hash map and hybrid
# pool; its patches subclass the block pool, interpreted), the prompt's pricing, the fleet
# routers' cache index (beliefs, SMG's approximate tree), and SGLang's hybrid radix tree with
# its engine (a native subclass of the SGLang engine).
COMPILED = ("sim.kvcache.node", "sim.kvcache.tree", "sim.kvcache.planner",
            "sim.kvcache.tiering", "sim.kvcache.cache", "sim.engines.request",
            "sim.engines.known", "sim.engines.base", "sim.engines.sglang_queue",
            "sim.engines.sglang", "sim.context.prompt", "sim.fleet.beliefs",
            "sim.kvcache.paths", "sim.kvcache.results", "sim.engines.latency",
            "sim.engines.recorder", "sim.replay", "sim.kvcache.events", "sim.fleet.fleet",
            "sim.fleet.kvevents", "sim.fleet.load", "sim.fleet.eventindex",
            "sim.engines.clock", "sim.fleet.active", "sim.kvcache.freequeue",
            "sim.kvcache.cachedids", "sim.kvcache.blockpool", "sim.engines.vllm",
            "sim.kvcache.hybridtree", "sim.fleet.radix", "sim.engines.sglang_hybrid",
            "sim.kvcache.hybridpool")
# The shared library of the compiled modules, sim/core__mypyc.*.so: outside their package,
# whose attribute lookups fail while its __init__ runs.
GROUP = "sim.core"
MANIFEST = ROOT / "sim" / "core-manifest.json"  # written by build, gitignored
PURE_ENV = "KVSIM_PURE"


def source(module: str) -> Path:
    """A module's source file (a package's ``__init__.py``)."""
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


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
    if manifest.get("compiled") != list(COMPILED):  # built from another list of modules
        return False, "the compiled core was built for other modules (make rebuilds it)", True
    for module in COMPILED:
        if _extension(module) is None:
            return False, f"{module} has no compiled extension (make builds it)", True
    for module, sha in hashes.items():  # the compiled sources, then what they import from
        if not source(module).exists() or sha != digest(module):
            return False, (f"{source(module).relative_to(ROOT)} changed after the compiled core "
                           "was built (make rebuilds it)"), True
    if not set(COMPILED) <= hashes.keys():
        return False, "the compiled core's manifest is incomplete (make rebuilds it)", True
    return True, "compiled (mypyc)", False


def refused(fullname: str, allowed: frozenset[str], root: Path | None = None) -> Path | None:
    """The ``.py`` source to load instead of ``fullname``'s extension, if that extension must
    not be imported (a module of ``sim`` outside ``allowed``, the current build's modules);
    None: let the import system go on (no extension there, or an allowed one)."""
    if not fullname.startswith("sim.") or fullname in allowed:
        return None
    src = (root or ROOT).joinpath(*fullname.split(".")).with_suffix(".py")
    if fullname not in COMPILED and not any(src.with_suffix(x).exists()
                                            for x in importlib.machinery.EXTENSION_SUFFIXES):
        return None
    if not src.exists():
        raise ModuleNotFoundError(f"{fullname}: only a compiled extension left by an earlier "
                                  "build is there, no source (make rebuilds the core)",
                                  name=fullname)
    return src


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Loads a module of ``sim`` from its ``.py`` source wherever an extension beside it is
    not the current build's (``refused``)."""

    def __init__(self, allowed: frozenset[str]) -> None:
        self.allowed = allowed

    def find_spec(self, fullname, path=None, target=None):
        src = refused(fullname, self.allowed)
        return None if src is None else importlib.util.spec_from_file_location(fullname, src)


COMPILED_ACTIVE = False
REASON = "not decided"


def current() -> tuple[bool, str]:
    """(runs compiled?, why): this process's decision."""
    return COMPILED_ACTIVE, REASON


def install() -> None:
    """Decide the path once and put the source-first finder in front: on the compiled path
    it admits the build's extensions only, on the Python path none. A changed source warns
    (once): the user expects the edit to run, and it does, slower."""
    global COMPILED_ACTIVE, REASON
    if REASON != "not decided":
        return
    COMPILED_ACTIVE, REASON, unusable = _decision()
    sys.meta_path.insert(0, _SourceFirst(frozenset((*COMPILED, f"{GROUP}__mypyc"))
                                         if COMPILED_ACTIVE else frozenset()))
    if COMPILED_ACTIVE:
        return
    if unusable:
        warnings.warn(f"kvsim runs on the Python path: {REASON}", RuntimeWarning, stacklevel=2)
