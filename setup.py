"""Installs kvsim with its compiled core (sim/native.py): at install time (``pip install
[-e] .``; ``make``) mypyc turns each module of ``native.COMPILED`` into a C extension beside
its source, and the manifest records each source's hash, and those of the modules they import
from, so that an edited source is never shadowed by a stale extension. The package metadata
is pyproject.toml's.

    python setup.py build_ext --inplace      # rebuild in a checkout (make core)
    python setup.py status                   # which path this checkout imports, and why

Without mypyc or a C compiler it says so once and leaves the Python path: everything runs,
with the same results, slower (the install still succeeds). The extensions are built in
``build/`` and renamed into place (a process that has the old ones loaded keeps its mapping;
no file is half-written).
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import shutil
import sys
import sysconfig
import warnings
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, str(Path(__file__).resolve().parent))  # an isolated build's checkout
with warnings.catch_warnings():  # sim/__init__.py's note on a stale build: rebuilt here
    warnings.simplefilter("ignore")
    native = importlib.import_module("sim.native")
COMPILED, GROUP, ROOT, digest, source = (native.COMPILED, native.GROUP, native.ROOT,
                                         native.digest, native.source)

MANIFEST = Path("sim") / "core-manifest.json"  # under the tree the extensions go to


def _compiler() -> str | None:
    """The C compiler setuptools will call, if one is on PATH."""
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


def _write_manifest(tree: Path, data: dict) -> None:
    path = tree / MANIFEST
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def _unavailable(tree: Path | None, why: str) -> list:
    """No extensions: says why once (in the checkout's manifest too, ``tree``)."""
    if tree is not None:
        _write_manifest(tree, {"built": False, "why": why})
    print(f"kvsim: {why}: the simulator runs on the Python path (same results, slower)",
          file=sys.stderr)
    return []


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
    sim/native.py ``refused``: they would only lie there)."""
    keep = {source(m).with_suffix("") for m in COMPILED}
    keep.add(ROOT.joinpath(*f"{GROUP}__mypyc".split(".")))
    for so in (ROOT / "sim").rglob("*.so"):
        if so.parent / so.name.split(".", 1)[0] not in keep:
            so.unlink()


def _extensions(tree: Path | None) -> list:
    """mypyc's extensions of ``COMPILED``: C generated under build/ (mypy type-checks first),
    or none where mypyc or a C compiler is missing (``_unavailable``)."""
    try:
        from mypyc.build import mypycify
    except ImportError:
        return _unavailable(tree, "mypyc (the mypy package) is not installed")
    if _compiler() is None:
        return _unavailable(tree, "no C compiler on PATH")
    paths = [str(source(m).relative_to(ROOT)) for m in COMPILED]
    os.chdir(ROOT)  # mypyc and setuptools name modules by their paths from the root
    try:
        exts = mypycify(["--ignore-missing-imports", "--follow-imports=silent", *paths],
                        opt_level="3", separate=[(paths, GROUP)])
    except (SystemExit, Exception) as e:  # a failed type check: the Python path still works
        return _unavailable(tree, f"the build failed: {e}")
    for ext in exts:
        # No fused multiply-add contraction: the last bit of a float must not depend on
        # the CPU (GCC contracts by default where the target has FMA).
        ext.extra_compile_args = [*ext.extra_compile_args, "-ffp-contract=off"]
    return exts


class BuildCore(build_ext):
    """build_ext for the compiled core: the extensions go to the checkout (``--inplace``, an
    editable install) or the wheel's tree, with the manifest beside them; a failed compile
    leaves the Python path (the install succeeds)."""

    def run(self) -> None:
        tree = ROOT if self.inplace else Path(self.build_lib)
        if not self.extensions:  # mypyc or the compiler is missing: said once already
            return
        try:
            super().run()
        except (SystemExit, Exception) as e:
            _unavailable(tree, f"the build failed: {e}")
            return
        if self.inplace:
            _remove_strays()
        _write_manifest(tree, {"built": True, "compiled": list(COMPILED),
                               "sources": {m: digest(m)
                                           for m in (*COMPILED, *dependencies())}})
        print(f"kvsim: compiled core built ({len(COMPILED)} modules)", file=sys.stderr)

    def copy_file(self, infile, outfile, *args, **kwargs):
        """An extension is renamed into place, not rewritten: a process that has the old one
        loaded keeps its mapping (``--inplace``)."""
        tmp = f"{outfile}.tmp"
        shutil.copyfile(infile, tmp)
        os.replace(tmp, outfile)
        return outfile, True


if __name__ == "__main__" and sys.argv[1:] == ["status"]:
    print("compiled" if native.decide()[0] else f"python: {native.decide()[1]}")
elif __name__ == "__main__":
    # Only a build compiles (metadata queries, egg_info, skip mypyc's minute of type checks).
    BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}
    inplace = {"--inplace", "-i", "editable_wheel", "develop"} & set(sys.argv)
    with warnings.catch_warnings():  # setuptools' notes on pyproject.toml's metadata
        warnings.simplefilter("ignore")
        setup(ext_modules=_extensions(ROOT if inplace else None)
              if BUILDS & set(sys.argv) else [], cmdclass={"build_ext": BuildCore})
