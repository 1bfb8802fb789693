"""Loading one real module of a big package without its dependencies (the reference loaders).

`StubModule` stands in for a module that is imported at load time but never called on the
simulated path; `real_definitions` compiles chosen top-level definitions of an installed source
file, so a stub can carry the few real pieces the loaded code does use (never re-implemented).
"""

from __future__ import annotations

import ast
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Module-level imports the compiled definitions may use (these roots only).
_IMPORT_ROOTS = frozenset({"typing", "collections", "enum", "dataclasses", "abc", "torch"})


class StubModule(types.ModuleType):
    """A module whose every public attribute is an inert placeholder class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        placeholder = type(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, placeholder)
        return placeholder


def real_definitions(
    source: Path,
    names: Iterable[str],
    error: type[Exception] = RuntimeError,
    scope: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Compile only the named top-level definitions (functions, classes, assignments) of
    `source`, with its `from __future__` and stdlib/torch imports in scope plus `scope`.
    Raises `error` naming the file when a definition is missing."""
    tree = ast.parse(source.read_text())
    wanted = set(names)
    body: list[ast.stmt] = []
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            mods = (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            )
            if all(m and (m == "__future__" or m.split(".")[0] in _IMPORT_ROOTS) for m in mods):
                body.append(node)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in wanted:
            body.append(node)
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            targets = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if targets & wanted:
                body.append(node)
                found |= targets & wanted
    missing = wanted - found
    if missing:
        raise error(f"{source}: definitions {sorted(missing)} not found")
    namespace: dict[str, Any] = {"__name__": f"_real_{source.stem}", **(scope or {})}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(source), "exec"), namespace)
    return {name: namespace[name] for name in wanted}
