"""Branches on identity in shared code: a comparison of an engine, vLLM patch, context
strategy, router or study NAME with a string literal, outside the room that owns the name.

    python tests/identity_branches.py [--root DIR] [--list]

Shared code is ``sim/`` less the owners (``sim/engines/``: an engine may know its own name;
``sim/context/``: the strategies' own kinds). A branch is an ``ast.Compare`` with a string
literal (or a tuple, list or set of them) on one side that is such a name, and on the other an
expression that reads an identity (its text names ``engine``, ``patch``, ``context``,
``router``, ``experiment``, ``study`` or is a plain ``name``). tests/test_structure.py bounds
the count; ``--root`` counts another checkout with this checkout's names.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OWNERS = ("sim/engines", "sim/context")
WORDS = re.compile(r"\b\w*(engine|patch|context|router|experiment|study)\w*\b|^name$")


def identity_names() -> set[str]:
    """Every name an engine, patch, context strategy, router or study is known by."""
    sys.path.insert(0, str(REPO))
    from policies.routing import ROUTERS
    from sim.context.strategies import KINDS
    from sim.engines import ENGINES
    from sim.engines.vllm_patch import VLLM_PATCHES
    from sim.studies import STUDIES

    return {*ENGINES, *VLLM_PATCHES, *KINDS, *ROUTERS, *STUDIES}


def _literals(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]  # type: ignore[union-attr]
    return None


def branches(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, text)`` of each comparison of an identity with one of ``names``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for i, side in enumerate(sides):
            lits = _literals(side)
            if not lits or not set(lits) & names:
                continue
            others = [ast.unparse(s) for j, s in enumerate(sides) if j != i
                      and _literals(s) is None]
            if any(WORDS.search(o) for o in others):
                out.append((node.lineno, ast.unparse(node)))
                break
    return out


def shared_files(root: Path) -> list[Path]:
    return [p for p in sorted((root / "sim").rglob("*.py"))
            if not any(str(p.relative_to(root)).startswith(o + "/") for o in OWNERS)]


def count(root: Path, names: set[str]) -> list[str]:
    return [f"{p.relative_to(root)}:{line}: {text}" for p in shared_files(root)
            for line, text in branches(p.read_text(), names)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=REPO)
    ap.add_argument("--list", action="store_true", help="print every branch")
    args = ap.parse_args(argv)
    found = count(args.root, identity_names())
    if args.list:
        print("\n".join(found))
    print(f"{len(found)} branches on identity in {args.root}/sim (owners aside)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
