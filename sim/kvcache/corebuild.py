"""Builds the compiled core (sim/kvcache/native.py): mypyc turns each module of
``native.COMPILED`` into a C extension beside its source, and the manifest records each
source's hash so that an edited source is never shadowed by a stale extension.

    python -m sim.kvcache.corebuild          # build (make runs it); exit 0 even when it can't
    python -m sim.kvcache.corebuild status   # which path this checkout imports, and why

Without mypyc or a C compiler it says so once and leaves the Python path: everything runs,
with the same results, slower. The extensions are built in ``build/`` and renamed into place
(a process that has the old ones loaded keeps its mapping; no file is half-written).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
import sysconfig
import warnings
from pathlib import Path

from sim.kvcache.native import COMPILED, GROUP, MANIFEST, ROOT, decide, digest, source


def _compiler() -> str | None:
    """The C compiler setuptools will call, if one is on PATH."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


def _write_manifest(data: dict) -> None:
    tmp = MANIFEST.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(MANIFEST)


def _unavailable(why: str) -> int:
    _write_manifest({"built": False, "why": why})
    print(f"kvsim: {why}: the simulator runs on the Python path (same results, slower)",
          file=sys.stderr)
    return 0


# Our packages: compiled code may unbox the attributes of their classes.
OURS = ("sim", "policies", "costmodel", "traces")


def _module_of(name: str) -> str | None:
    """``name`` if it is one of our modules or packages (a file), else None (a class)."""
    path = ROOT.joinpath(*name.split("."))
    return name if (path / "__init__.py").exists() or path.with_suffix(".py").exists() else None


def _from(module: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module an ``import from`` (maybe relative) reads."""
    if not node.level:
        return node.module or ""
    package = module if source(module).name == "__init__.py" else module.rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _origin(package: str, name: str) -> str:
    """The module that defines ``name`` where a package re-exports it (else the package)."""
    for node in ast.parse(source(package).read_text()).body:
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name
                                                    for a in node.names):
            return _module_of(_from(package, node)) or package
    return package


def _imports(module: str) -> set[str]:
    """The modules of ours that ``module`` imports from: a name imported from a package is
    traced to the module the package re-exports it from."""
    out = set()
    for node in ast.walk(ast.parse(source(module).read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _from(module, node)
            names = []
            for a in node.names:
                sub = _module_of(f"{base}.{a.name}")
                names.append(sub or (_origin(base, a.name) if _module_of(base)
                                     and source(base).name == "__init__.py" else base))
        else:
            continue
        out.update(m for n in names if n.split(".")[0] in OURS and (m := _module_of(n)))
    return out


def dependencies() -> list[str]:
    """The interpreted modules the compiled ones import from (sim/config.py, the policies and
    cost model they use): a change of a class there changes what the compiled code assumes of
    it, so the manifest hashes them too."""
    return sorted(set().union(*map(_imports, COMPILED)) - set(COMPILED))


def _remove_strays() -> None:
    """Delete extensions of modules no longer in ``COMPILED`` (the import guard refuses them,
    sim/kvcache/native.py ``refused``: they would only lie there)."""
    keep = {source(m).with_suffix("") for m in COMPILED}
    keep.add(ROOT.joinpath(*f"{GROUP}__mypyc".split(".")))
    for so in (ROOT / "sim").rglob("*.so"):
        if so.parent / so.name.split(".", 1)[0] not in keep:
            so.unlink()


def build(quiet: bool = True) -> int:
    """Compile ``COMPILED``; 0 whether or not it could (the Python path always works)."""
    try:
        from mypyc.build import mypycify
    except ImportError:
        return _unavailable("mypyc (the mypy package) is not installed")
    if _compiler() is None:
        return _unavailable("no C compiler on PATH")
    from setuptools import setup

    paths = [str(source(m).relative_to(ROOT)) for m in COMPILED]
    _remove_strays()
    lib = ROOT / "build" / "core-lib"
    old = os.getcwd()
    os.chdir(ROOT)  # mypyc and setuptools name modules by their paths from the root
    try:
        exts = mypycify(["--ignore-missing-imports", "--follow-imports=silent", *paths],
                        opt_level="3", separate=[(paths, GROUP)])
        for ext in exts:
            # No fused multiply-add contraction: the last bit of a float must not depend on
            # the CPU (GCC contracts by default where the target has FMA).
            ext.extra_compile_args = [*ext.extra_compile_args, "-ffp-contract=off"]
        with warnings.catch_warnings():  # setuptools' notes on pyproject.toml's metadata
            warnings.simplefilter("ignore")
            setup(name="kvsim-core", ext_modules=exts,
                  script_args=[*(["-q"] if quiet else []), "build_ext", "--build-lib",
                               str(lib)])
        built = [(lib / Path(*e.name.split(".")).parent, e.name.rsplit(".", 1)[-1])
                 for e in exts]
        for folder, stem in built:
            (so,) = sorted(folder.glob(f"{stem}.*.so"))
            so.replace(ROOT / so.relative_to(lib))
    except (SystemExit, Exception) as e:  # a failed compile: the Python path still works
        return _unavailable(f"the build failed: {e}")
    finally:
        os.chdir(old)
    _write_manifest({"built": True, "compiled": list(COMPILED),
                     "sources": {m: digest(m) for m in (*COMPILED, *dependencies())}})
    print(f"kvsim: compiled core built ({len(COMPILED)} modules)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        return build()
    if args == ["status"]:
        active, why = decide()
        print("compiled" if active else f"python: {why}")
        return 0
    print("usage: python -m sim.kvcache.corebuild [status]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
