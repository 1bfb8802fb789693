"""Installs kvsim with its compiled core (sim/native.py): at install time (``pip install
[-e] .``; ``make``) mypyc turns each module of ``native.COMPILED`` into a C extension beside
its source, and the manifest records each source's hash, and those of the modules they import
from, so that an edited source is never shadowed by a stale extension. The package metadata
is pyproject.toml's.

    python setup.py build_ext --inplace      # rebuild in a checkout (make core)
    python setup.py status                   # which path this checkout imports, and why

mypyc compiles a copy of our packages, ``build/native-src`` (``_native_tree``), the same
modules under the same names, in which each keyword-only dataclass of a compiled module (the
hot records: sim/engines/request.py ``Req``, sim/engines/sglang.py ``Admission``,
sim/engines/recorder.py ``RequestRecord``, sim/kvcache/results.py ``EvictResult`` and
``LoadResult``) has its ``__init__`` written out from its fields (``native_init``: keyword-only,
the fields' defaults, a fresh value per ``default_factory``, on a blank line of the class, so
no line moves). mypyc would hand such a class to the dataclasses module, whose ``__init__``
runs interpreted, about ten times slower per object; written in the class, it is native and
a compiled call to it is resolved at compile time. The decorator stays, so ``fields()``,
``repr`` and ``eq`` are the dataclass's; the sources declare each field once and the Python
path runs them as they are. tests/test_native_inits.py holds the generated ``__init__`` to
the dataclass's contract. Frozen dataclasses, positional ones and those with an ``__init__``
of their own are compiled as written.

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


# The copy of our packages that mypyc compiles (under the checkout): the same modules, with
# each keyword-only dataclass of a compiled module given a written-out ``__init__``.
NATIVE_SRC = Path("build") / "native-src"


def _named(node: ast.expr, name: str) -> bool:
    """``node`` is ``name`` or ``something.name``."""
    return ((isinstance(node, ast.Name) and node.id == name)
            or (isinstance(node, ast.Attribute) and node.attr == name))


def _dataclass_options(node: ast.ClassDef) -> dict[str, object] | None:
    """The keywords of ``node``'s ``@dataclass(...)`` decorator ({} bare), None if it has none."""
    for dec in node.decorator_list:
        call = dec if isinstance(dec, ast.Call) else None
        if _named(call.func if call else dec, "dataclass"):
            return {k.arg: ast.literal_eval(k.value) for k in (call.keywords if call else ())}
    return None


def _made(factory: ast.expr) -> str:
    """The expression that calls a ``default_factory`` (a lambda's body, written inline)."""
    if isinstance(factory, ast.Lambda) and not factory.args.args:
        return ast.unparse(factory.body)
    return f"{ast.unparse(factory)}()" if isinstance(factory, ast.Name | ast.Attribute) \
        else f"({ast.unparse(factory)})()"


def _fields(node: ast.ClassDef, where: str) -> list[tuple[str, str, str | None, str | None, bool]]:
    """A dataclass's own fields as the dataclasses module reads them: (name, annotation,
    default, the factory's call, set by ``__init__``'s arguments?)."""
    out = []
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        ann = ast.unparse(stmt.annotation)
        kind = ann.split("[")[0].rsplit(".", 1)[-1]
        if kind in ("ClassVar", "KW_ONLY"):
            continue
        if kind == "InitVar":
            raise SystemExit(f"{where}: an InitVar has no generated native __init__")
        default = factory = None
        init, value = True, stmt.value
        if isinstance(value, ast.Call) and _named(value.func, "field"):
            kw = {k.arg: k.value for k in value.keywords}
            default = ast.unparse(kw["default"]) if "default" in kw else None
            factory = _made(kw["default_factory"]) if "default_factory" in kw else None
            init = ast.literal_eval(kw["init"]) if "init" in kw else True
            if factory is not None and init and ("None" in ann or "Optional" in ann):
                raise SystemExit(f"{where}.{stmt.target.id}: a default_factory field that "
                                 "may be None (the generated __init__ marks 'not given' "
                                 "with None)")
        elif value is not None:
            default = ast.unparse(value)
        out.append((stmt.target.id, ann, default, factory, init))
    return out


def native_init(node: ast.ClassDef, where: str) -> str | None:
    """The ``__init__`` a keyword-only dataclass gets in the compiled copy, on one line: the
    dataclass's own contract (its fields in order, keyword-only, their defaults, a fresh
    value of each factory, ``__post_init__``) written out, so that mypyc compiles it (it
    hands a dataclass to the dataclasses module, whose ``__init__`` runs interpreted, about
    ten times slower). None for any other class: not a dataclass, not ``kw_only=True``,
    frozen (its ``__init__`` must bypass ``__setattr__``), or with an ``__init__`` of its
    own."""
    options = _dataclass_options(node)
    if (options is None or not options.get("kw_only") or options.get("frozen")
            or options.get("init") is False):
        return None
    methods = {s.name for s in node.body if isinstance(s, ast.FunctionDef)}
    if "__init__" in methods:
        return None
    if node.bases:  # (inherited fields would need the base's annotations here)
        raise SystemExit(f"{where}: a keyword-only dataclass with a base class has no "
                         "generated native __init__")
    params, body = [], []
    for name, ann, default, factory, init in _fields(node, where):
        if not init:
            if default is not None or factory is not None:
                body.append(f"self.{name} = {default if factory is None else factory}")
        elif factory is not None:
            params.append(f"{name}: {ann} | None = None")
            body.append(f"self.{name} = {factory} if {name} is None else {name}")
        else:
            params.append(f"{name}: {ann}{'' if default is None else ' = ' + default}")
            body.append(f"self.{name} = {name}")
    if "__post_init__" in methods:
        body.append("self.__post_init__()")
    star = "*, " if params else ""
    return f"def __init__(self, {star}{', '.join(params)}) -> None: {'; '.join(body) or 'pass'}"


def native_source(module: str) -> str:
    """``module``'s source as mypyc compiles it: each class ``native_init`` gives an
    ``__init__`` gets it on a blank line of its body (no line moves, so a compiled
    traceback's line is the source's), or on a new last line of its body where it has none."""
    text = source(module).read_text()
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    edits = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        init = native_init(node, f"{module}.{node.name}")
        if init is None:
            continue
        indent = " " * node.body[0].col_offset
        covered = set()
        for stmt in node.body:
            first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])
            covered.update(range(first, (stmt.end_lineno or stmt.lineno) + 1))
        blank = [n for n in range(node.body[0].lineno, (node.end_lineno or 0) + 1)
                 if n not in covered and not lines[n - 1].strip()]
        edits.append((blank[0], True, f"{indent}{init}\n") if blank
                     else (node.end_lineno or 0, False, f"{indent}{init}\n"))
    for line, blank_line, code in sorted(edits, reverse=True):
        if blank_line:
            lines[line - 1] = code
        else:
            lines.insert(line, code)
    return "".join(lines)


def _native_tree() -> Path:
    """A fresh copy of our packages under ``NATIVE_SRC``, the compiled modules as
    ``native_source`` writes them; the manifest still hashes the real sources."""
    tree = ROOT / NATIVE_SRC
    shutil.rmtree(tree, ignore_errors=True)
    for package in OURS:
        for py in (ROOT / package).rglob("*.py"):
            dst = tree / py.relative_to(ROOT)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(py, dst)
    for module in COMPILED:
        (tree / source(module).relative_to(ROOT)).write_text(native_source(module))
    return tree


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
    try:
        # mypyc names modules by their paths from the copy's root; its C goes to build/
        os.chdir(_native_tree())
        exts = mypycify(["--ignore-missing-imports", "--follow-imports=silent", *paths],
                        opt_level="3", separate=[(paths, GROUP)],
                        target_dir=str(ROOT / "build"))
    except (SystemExit, Exception) as e:  # a failed type check: the Python path still works
        return _unavailable(tree, f"the build failed: {e}")
    finally:
        os.chdir(ROOT)  # setuptools places the extensions by their paths from the root
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
