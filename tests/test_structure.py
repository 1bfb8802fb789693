"""Structure the code promises: modules own their state, and packages have no import cycles.

- No attribute starting with ``_`` (dunders aside) is read or written on any object but
  ``self``/``cls`` inside ``sim/kvcache/`` and ``policies/``: the tree's counters change only
  through its own methods (the appliers), whatever module asks.
- No import cycle among the modules of ``sim/`` (all of it), ``policies/`` or ``traces/``
  (imports under ``if TYPE_CHECKING:`` are for annotations only and do not count; an import
  inside a function counts).
- Product code (``PRODUCT``) imports nothing from ``tests/`` (test fixtures live there), reads
  no trace or request attribute with a ``getattr`` default (test doubles implement the real
  interface instead), and its docstrings and comments cite files inside the repository only.
- The engines build themselves; the run room (sim/run/) does not branch on the engine's name.
- No attribute is written on another room's object (a room: a folder of ``sim/`` or a
  package): only the owner's methods change it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import REPO

OWNED = ("sim/kvcache", "policies", "traces")
PRODUCT = ("sim", "policies", "traces", "costmodel")
ACYCLIC = ("sim", "policies", "traces")


def private_accesses(source: str) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            out.append((node.lineno, ast.unparse(node)))
    return out


def _runtime_imports(tree: ast.Module) -> list[ast.stmt]:
    """Import statements outside ``if TYPE_CHECKING:`` blocks."""
    out: list[ast.stmt] = []

    def visit(body: list[ast.stmt]) -> None:
        for st in body:
            if isinstance(st, ast.If) and "TYPE_CHECKING" in ast.unparse(st.test):
                visit(st.orelse)
                continue
            if isinstance(st, ast.Import | ast.ImportFrom):
                out.append(st)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(st, field, None)
                if isinstance(inner, list):
                    visit([x for x in inner if isinstance(x, ast.stmt)])
                    for h in inner:
                        if isinstance(h, ast.ExceptHandler):
                            visit(h.body)

    visit(tree.body)
    return out


def import_graph(package: str) -> dict[str, set[str]]:
    """module -> modules of the same package it imports at run time."""
    root = REPO / package
    dotted = package.replace("/", ".")
    mods = {p: f"{dotted}.{'.'.join(p.relative_to(root).with_suffix('').parts)}"
            for p in root.rglob("*.py")}
    names = {m.removesuffix(".__init__") for m in mods.values()}
    graph: dict[str, set[str]] = {}
    for path, mod in mods.items():
        mod = mod.removesuffix(".__init__")
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for st in _runtime_imports(ast.parse(path.read_text())):
            if isinstance(st, ast.ImportFrom):
                base = st.module or ""
                if st.level:
                    parts = pkg.split(".")
                    parts = parts[: len(parts) - (st.level - 1)]
                    base = ".".join([*parts, base] if base else parts)
                # ``from pkg import mod`` depends on the submodule, not on the package
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in names else base
                           for a in st.names]
            else:
                targets = [a.name for a in st.names]
            deps |= {t for t in targets if t in names and t != mod}
        graph[mod] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m):], m]
            if m not in state and (c := dfs(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := dfs(n)):
            return c
    return None


@pytest.mark.parametrize("package", OWNED)
def test_no_private_member_of_another_object(package: str) -> None:
    bad = [f"{p.relative_to(REPO)}:{line}: {expr}"
           for p in sorted((REPO / package).rglob("*.py"))
           for line, expr in private_accesses(p.read_text())]
    assert not bad, "private members used from outside their object:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_cycle(package: str) -> None:
    graph = import_graph(package)
    assert graph, f"no modules found under {package}"
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle in {package}: {' -> '.join(cycle)}"


def test_the_checks_can_fail() -> None:
    """The detectors themselves: a private access and a cycle are found."""
    assert private_accesses("def f(cache):\n    return cache._gpu\n") == [(2, "cache._gpu")]
    assert private_accesses("class A:\n    def f(self):\n        return self._x\n") == []
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_engines_build_themselves_and_the_run_does_not_branch_on_them() -> None:
    """``sim.run`` takes the engine from ``sim.engines.ENGINES``; each engine class has
    its own ``build`` (its cache and its options), so adding one touches no if/else."""
    from sim.engines import ENGINES

    for name, cls in ENGINES.items():
        assert "build" in vars(cls), f"{name}: {cls.__name__} has no build of its own"
    branches = [f"{p.relative_to(REPO)}: {ast.unparse(n)}"
                for p in sorted((REPO / "sim" / "run").glob("*.py"))
                for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Compare)
                and "engine" in ast.unparse(n.left)]
    assert not branches, f"sim/run/ branches on the engine: {branches}"


def _product_files() -> list[Path]:
    return [p for pkg in PRODUCT for p in sorted((REPO / pkg).rglob("*.py"))]


def test_product_code_imports_no_test_module() -> None:
    bad = []
    for p in _product_files():
        for st in _runtime_imports(ast.parse(p.read_text())):
            mods = [st.module or ""] if isinstance(st, ast.ImportFrom) else [
                a.name for a in st.names]
            bad += [f"{p.relative_to(REPO)}: {m}" for m in mods
                    if m == "tests" or m.startswith("tests.") or m.endswith(".fixtures")]
    assert not bad, "product code imports test modules:\n" + "\n".join(bad)
    assert not (REPO / "traces" / "fixtures.py").exists()


DUCK_TYPED = ("trace", "t", "tr", "req", "request", "view", "prompt")


def duck_typing(source: str) -> list[tuple[int, str]]:
    """``getattr(trace, "name", default)`` and the like on the objects tests fake."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)):
            obj = node.args[0]
            while isinstance(obj, ast.Call) and getattr(obj.func, "id", "") == "getattr":
                obj = obj.args[0]
            if isinstance(obj, ast.Name) and obj.id in DUCK_TYPED:
                out.append((node.lineno, ast.unparse(node)))
    return out


def test_no_duck_typing_of_traces_or_requests() -> None:
    bad = [f"{p.relative_to(REPO)}:{line}: {expr}" for p in _product_files()
           for line, expr in duck_typing(p.read_text())]
    assert not bad, "getattr defaults stand in for the real interface:\n" + "\n".join(bad)


OUTSIDE = re.compile(r"reference/[\w.-]+\.md|DESIGN\.md|DESIGN \"|\.\./shared/reference")


def test_product_code_cites_files_inside_the_repository() -> None:
    bad = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in _product_files()
           for i, line in enumerate(p.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert not bad, "citations outside the repository (bring them into docs/):\n" + \
        "\n".join(bad)


def test_the_shape_checks_can_fail() -> None:
    assert duck_typing("x = getattr(trace, 'skipped', 0)\n") == [
        (1, "getattr(trace, 'skipped', 0)")]
    assert duck_typing("x = getattr(getattr(req, 'view', None), 'kind', 'turn')\n")
    assert duck_typing("x = getattr(e, 'exit_code', None)\n") == []
    assert OUTSIDE.search("(see reference/sglang-radix.md)")
    assert OUTSIDE.search('records (DESIGN "Results")')
    assert not OUTSIDE.search("(docs/engine.md, Metrics)")


MIXIN_FREE = ("sim/kvcache", "sim/context")


def cross_module_bases(package: str) -> list[str]:
    """Classes of ``package`` that inherit a class defined in another of its modules: the
    shape of a class split into mixins across files to meet a line count."""
    defined: dict[str, str] = {}
    bases: list[tuple[str, str, str]] = []
    for p in sorted((REPO / package).rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                defined[node.name] = p.name
                bases += [(p.name, node.name, ast.unparse(b)) for b in node.bases]
    return [f"{package}/{mod}: {cls}({base})" for mod, cls, base in bases
            if base in defined and defined[base] != mod]


@pytest.mark.parametrize("package", MIXIN_FREE)
def test_no_class_split_into_mixins_across_modules(package: str) -> None:
    bad = cross_module_bases(package)
    assert not bad, "classes assembled from other modules' mixins:\n" + "\n".join(bad)


def test_one_request_record_per_engine() -> None:
    """A request's record holds only its engine's state: vLLM's sequence fields live in
    ``VllmReq``, which the vLLM engine declares and the replay builds; SGLang's is ``Req``."""
    from dataclasses import fields

    from sim.engines import ENGINES
    from sim.engines.request import Req
    from sim.engines.vllm import VllmReq

    vllm_only = {"seq_ids", "computed", "decoding", "placeholders", "in_flight", "stale"}
    assert not vllm_only & {f.name for f in fields(Req)}
    assert vllm_only <= set(vars(VllmReq))  # declared by VllmReq itself, on either path
    assert ENGINES["vllm"].request_class is VllmReq
    assert ENGINES["sglang"].request_class is Req


# --- the rooms of sim/ -----------------------------------------------------------------------
ROOMS = ("sim/sweep", "sim/studies", "sim/io", "sim/report", "sim/cli")


def cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """An import circle that leaves ``start`` and comes back to it, or None."""
    parent: dict[str, str] = {}
    todo = [start]
    seen = {start}
    while todo:
        n = todo.pop()
        for m in sorted(graph.get(n, ())):
            if m == start:
                path = [n]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if m not in seen:
                seen.add(m)
                parent[m] = n
                todo.append(m)
    return None


@pytest.mark.parametrize("room", ROOMS)
def test_no_module_of_the_rooms_lies_on_an_import_circle(room: str) -> None:
    """Within sim/ as a whole: a circle through a room's module would tie it to another room
    (sim.sweep to sim.studies, a report to the CLI, ...)."""
    graph = import_graph("sim")
    dotted = room.replace("/", ".")
    mods = sorted(m for m in graph if m == dotted or m.startswith(dotted + "."))
    assert mods, f"no modules under {room}"
    circles = [c for m in mods if (c := cycle_through(graph, m))]
    assert not circles, f"import circle through {room}: {' -> '.join(circles[0])}"


def _all_imports(source: str, pkg: str) -> list[str]:
    """Every module a file imports (annotations-only imports too), relative ones resolved
    against the file's package ``pkg``."""
    out = []
    for st in ast.walk(ast.parse(source)):
        if isinstance(st, ast.ImportFrom):
            base = st.module or ""
            if st.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - (st.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            out += [base, *(f"{base}.{a.name}" for a in st.names)]
        elif isinstance(st, ast.Import):
            out += [a.name for a in st.names]
    return out


def test_nothing_below_the_cli_imports_it() -> None:
    bad = []
    for p in [*_product_files(), *sorted((REPO / "calibration").rglob("*.py"))]:
        rel = p.relative_to(REPO)
        if rel.parts[:2] == ("sim", "cli"):
            continue
        pkg = ".".join(rel.with_suffix("").parts[:-1])
        bad += [f"{rel}: {m}" for m in _all_imports(p.read_text(), pkg)
                if m == "sim.cli" or m.startswith("sim.cli.")]
    assert not bad, "a room below the CLI imports it:\n" + "\n".join(bad)


def name_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
    """Comparisons with a string literal (or a tuple, list or set of them) in ``names``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                elts = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
                if any(isinstance(e, ast.Constant) and e.value in names for e in elts):
                    out.append((node.lineno, ast.unparse(node)))
                    break
    return out


def test_the_cli_and_the_studies_never_compare_a_study_name() -> None:
    """What a study does, prints and adds to its document are fields of its ``Experiment``
    record (sim/studies/study.py), not ``if name == ...`` in the command or the driver."""
    from sim.studies import STUDIES

    names = set(STUDIES.names())
    files = [p for room in ("sim/cli", "sim/studies") for p in sorted((REPO / room).rglob("*.py"))]
    bad = [f"{p.relative_to(REPO)}:{line}: {text}" for p in files
           for line, text in name_comparisons(p.read_text(), names)]
    assert not bad, "study names compared in the CLI or the studies:\n" + "\n".join(bad)


# Comparisons of engine, patch, context, router or study names with string literals in shared
# code (tests/identity_branches.py counts them): 42 before the rooms, this many after; the rest
# are engine knobs in sim/config.py, sim/run/kinds.py, sim/fleet/checks.py and kvsim run's
# title.
IDENTITY_BRANCHES = 10


def test_branches_on_identity_stay_few() -> None:
    from tests.identity_branches import count, identity_names

    found = count(REPO, identity_names())
    assert len(found) <= IDENTITY_BRANCHES, "new branches on identity:\n" + "\n".join(found)


def test_the_name_checks_can_fail() -> None:
    from tests.identity_branches import branches

    assert name_comparisons("if name == 'fleet':\n    pass\n", {"fleet"}) == [
        (1, "name == 'fleet'")]
    assert name_comparisons("x = k in ('pool', 'a')\n", {"pool"})
    assert not name_comparisons("x = name == 'other'\n", {"fleet"})
    assert branches("if cfg.engine == 'vllm':\n    pass\n", {"vllm"}) == [
        (1, "cfg.engine == 'vllm'")]
    assert branches("x = preset == 'vllm'\n", {"vllm"}) == []  # a preset is no identity
    assert cycle_through({"a": {"b"}, "b": {"a"}}, "a") == ["a", "b", "a"]
    assert cycle_through({"a": {"b"}, "b": set()}, "a") is None


PACKAGES = ("sim", "policies", "traces", "costmodel", "calibration")


def package_folders() -> list[Path]:
    return sorted({p.parent for pkg in PACKAGES for p in (REPO / pkg).rglob("__init__.py")})


@pytest.mark.parametrize("folder", [str(p.relative_to(REPO)) for p in package_folders()])
def test_every_package_folder_explains_itself(folder: str) -> None:
    """A README.md or the package docstring says what the folder owns, what it may import,
    and its data in and out (style: SGLang's mem_cache/README.md layer table)."""
    d = REPO / folder
    readme = d / "README.md"
    text = readme.read_text() if readme.exists() else (
        ast.get_docstring(ast.parse((d / "__init__.py").read_text())) or "")
    assert text.strip(), f"{folder}: no README.md and no package docstring"
    assert re.search(r"may import", text, re.IGNORECASE), f"{folder}: what may it import?"
    assert re.search(r"in -> out|\|\s*in\s*\||^in:", text, re.IGNORECASE | re.MULTILINE), \
        f"{folder}: its data in and out?"


def room_of(path: Path) -> str:
    """A room: a folder of ``sim/`` (``sim/engines``, ``sim/fleet``...), ``sim`` for its own
    modules, or a top-level package."""
    parts = path.relative_to(REPO).parts
    return "/".join(parts[:2]) if parts[0] == "sim" and len(parts) > 2 else parts[0]


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        raw = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        raw = [node.target]
    else:
        return []
    return [e for t in raw for e in (t.elts if isinstance(t, ast.Tuple) else [t])]


Module = tuple[str, str, str]  # (file, room, source)


def owned_attributes(modules: list[Module]) -> dict[str, set[str]]:
    """attribute -> the rooms whose classes own it (assign ``self.attr`` or declare it in the
    class body)."""
    owners: dict[str, set[str]] = {}
    for _, room, source in modules:
        for cls in ast.walk(ast.parse(source)):
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in ast.walk(cls):
                for t in _targets(node):
                    if isinstance(t, ast.Name) and isinstance(node, ast.AnnAssign):
                        owners.setdefault(t.id, set()).add(room)
                    elif (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                          and t.value.id == "self"):
                        owners.setdefault(t.attr, set()).add(room)
    return owners


def foreign_writes(modules: list[Module]) -> list[str]:
    """``file:line: target`` for each ``x.attr = ...`` on an object other than self/cls whose
    attribute only other rooms' classes own."""
    owners = owned_attributes(modules)
    out = []
    for file, room, source in modules:
        for node in ast.walk(ast.parse(source)):
            for t in _targets(node):
                if (isinstance(t, ast.Attribute)
                        and not (isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"))
                        and owners.get(t.attr) and room not in owners[t.attr]):
                    out.append(f"{file}:{node.lineno}: {ast.unparse(t)} "
                               f"(owned by {', '.join(sorted(owners[t.attr]))})")
    return out


def test_no_attribute_written_on_another_rooms_object() -> None:
    """A room changes another room's objects only through their methods: the replay builds a
    request with everything it carries, a fleet adopts session times through the recorder."""
    modules = [(str(p.relative_to(REPO)), room_of(p), p.read_text())
               for package in (*PRODUCT, "calibration")
               for p in sorted((REPO / package).rglob("*.py"))]
    bad = foreign_writes(modules)
    assert not bad, "attributes written on another room's objects:\n" + "\n".join(bad)


def test_the_foreign_write_check_can_fail() -> None:
    req = ("sim/engines/request.py", "sim/engines",
           "class Req:\n    def __init__(self):\n        self.arrival = 0\n")
    send = ("sim/replay.py", "sim", "def send(req, now):\n    req.arrival = now\n")
    assert foreign_writes([req, send]) == ["sim/replay.py:2: req.arrival (owned by sim/engines)"]
    assert foreign_writes([req, (*send[:2], "def send(req, now):\n    req.send(now)\n")]) == []


def _imports_of(path: Path) -> list[str]:
    rel = path.relative_to(REPO)
    return _all_imports(path.read_text(), ".".join(rel.with_suffix("").parts[:-1]))


def _under(mod: str, packages: tuple[str, ...]) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in packages)


def test_the_config_imports_no_engine_fleet_or_context() -> None:
    """The run's vocabulary knows no room that reads it: each engine checks what it cannot
    run, the fleet and the context strategies theirs (sim/run/check.py asks them)."""
    rooms = ("sim.engines", "sim.fleet", "sim.context", "sim.run")
    bad = [m for m in _imports_of(REPO / "sim" / "config.py") if _under(m, rooms)]
    assert not bad, f"sim/config.py imports {bad}"


def test_the_run_room_sits_above_the_fleet_and_the_engines_and_reads_no_report() -> None:
    """One run builds every kind of run (sim/run/): the fleet and the engines below it never
    import it, and progress reaches it as a callback, not through ``sim.report``."""
    bad = [f"{p.relative_to(REPO)}: {m}" for room in ("fleet", "engines", "kvcache", "context")
           for p in sorted((REPO / "sim" / room).rglob("*.py"))
           for m in _imports_of(p) if _under(m, ("sim.run",))]
    bad += [f"{p.relative_to(REPO)}: {m}" for p in sorted((REPO / "sim" / "run").rglob("*.py"))
            for m in _imports_of(p) if _under(m, ("sim.report", "sim.sweep", "sim.studies"))]
    assert not bad, "imports against the run room's place:\n" + "\n".join(bad)


ROOT_MODULES = tuple(f"sim.{p.stem}" for p in sorted((REPO / "sim").glob("*.py"))
                     if p.stem != "__init__")


def test_the_rooms_below_the_run_read_only_the_config_of_sims_root() -> None:
    """The parts of a run at sim's root (the replay, SLOs, the timeline, the deployment) sit
    above the fleet and the engines: those and the rooms below them import only the config
    from there. The recorder is the engines' own (sim/engines/recorder.py) and prices nothing:
    the engine tells it numbers, so it imports neither ``costmodel`` nor the cache."""
    parts = tuple(m for m in ROOT_MODULES if m != "sim.config")
    bad = [f"{p.relative_to(REPO)}: {m}" for room in ("fleet", "engines", "kvcache", "context")
           for p in sorted((REPO / "sim" / room).rglob("*.py"))
           for m in _imports_of(p) if _under(m, parts)]
    bad += [f"sim/engines/recorder.py: {m}" for m in
            _imports_of(REPO / "sim" / "engines" / "recorder.py")
            if _under(m, ("costmodel", "sim.kvcache"))]
    assert len(parts) >= 5 and not bad, "imports against the rooms' order:\n" + "\n".join(bad)


def policy_part_tests(source: str) -> list[tuple[int, str]]:
    """``is``/``is not`` comparisons and ``isinstance``/``issubclass``/``type`` calls with a
    name imported from ``policies`` (or a module constant bound to one) as an operand."""
    tree = ast.parse(source)
    names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             and (n.module or "").split(".")[0] == "policies" for a in n.names}
    for n in ast.walk(tree):  # aliases such as ``_LRU: Final = lru``
        if isinstance(n, ast.Assign | ast.AnnAssign) and isinstance(n.value, ast.Name) \
                and n.value.id in names:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Compare) and any(isinstance(op, ast.Is | ast.IsNot)
                                              for op in n.ops):
            operands = [n.left, *n.comparators]
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) \
                and n.func.id in ("isinstance", "issubclass", "type"):
            operands = n.args
        else:
            continue
        if any(isinstance(o, ast.Name) and o.id in names for o in operands):
            out.append((n.lineno, ast.unparse(n)))
    return out


def test_the_cache_asks_the_policy_and_never_tests_which_part_it_was_given() -> None:
    """The planner asks each start, order and granularity through its one method (issue 52
    item 2): a user's part takes the path the built-in ones take."""
    bad = [f"{p.relative_to(REPO)}:{line}: {text}"
           for p in sorted((REPO / "sim" / "kvcache").rglob("*.py"))
           for line, text in policy_part_tests(p.read_text())]
    assert not bad, "policy parts told apart by identity:\n" + "\n".join(bad)


def test_the_policy_part_check_can_fail() -> None:
    src = ("from policies import BLOCK, TAIL, Blocks\nfrom typing import Final\n"
           "_B: Final = BLOCK\nx = g is _B\ny = s is not TAIL\nz = type(g) is Blocks\n"
           "w = isinstance(g, Blocks)\nv = g is other\n")
    assert [line for line, _ in policy_part_tests(src)] == [4, 5, 6, 7]
