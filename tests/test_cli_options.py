"""Every option of ``kvsim run`` / ``plan`` / ``capacity`` keeps its name, type, default and
choices (issue 52 item 3: the options are generated from the config's section fields, so a
renamed field must not silently rename an option). ``tests/cli_options.json`` is the pinned
list; rewrite it with ``python tests/test_cli_options.py`` only for an intended change."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

PINNED = Path(__file__).with_name("cli_options.json")
COMMANDS = ("run", "plan", "capacity")


def describe(command: click.Command) -> dict[str, dict]:
    """Each option by its longest spelling: its other spellings, type, default, choices."""
    out: dict[str, dict] = {}
    for p in command.params:
        t = p.type
        out[max(p.opts, key=len) if p.opts else p.name] = {
            "kind": "argument" if isinstance(p, click.Argument) else "option",
            "opts": sorted(p.opts),
            "type": type(t).__name__ if t.name != "text" else "text",
            "choices": list(getattr(t, "choices", []) or []),
            "default": None if callable(p.default) else repr(p.default),
            "flag": bool(getattr(p, "is_flag", False)),
            "multiple": bool(getattr(p, "multiple", False)),
            "required": bool(p.required),
        }
    return out


def current() -> dict[str, dict]:
    from sim.cli.main import cli

    ctx = click.Context(cli)
    return {name: describe(cli.get_command(ctx, name)) for name in COMMANDS}


def test_options_pinned() -> None:
    want = json.loads(PINNED.read_text())
    got = current()
    for name in COMMANDS:
        assert sorted(got[name]) == sorted(want[name]), name  # no option lost or added
        for opt, doc in want[name].items():
            assert got[name][opt] == doc, f"kvsim {name} {opt}"


def test_declared_fields_are_run_options() -> None:
    """Each section field declared with ``option`` (sim/config.py) is a ``kvsim run`` option
    whose parameter is named as the flat field; engine and patch names are the registries'."""
    from dataclasses import fields

    from sim.cli.main import cli
    from sim.config import ENGINE_NAMES, FLAT, KNOBS, SECTIONS
    from sim.engines import ENGINES, VLLM_PATCHES

    params = {p.name: p for p in cli.get_command(click.Context(cli), "run").params}
    where = {v: k for k, v in FLAT.items()}
    declared = [where[s, f.name] for s, classes in (("engine", KNOBS.values()),
                                                    *((s, [c]) for s, c in SECTIONS.items()))
                for c in classes for f in fields(c) if "option" in f.metadata]
    assert {"chunk_size", "vllm_patch", "pool", "pd_rule"} <= set(declared)
    assert all(name in params for name in declared)
    assert params["checkpoint_chunks"].opts == ["--prompt-nodes"]
    assert ENGINE_NAMES == ENGINES.names() == tuple(params["engine"].type.choices)
    assert tuple(params["vllm_patch"].type.choices) == VLLM_PATCHES.names()


def render(doc: dict[str, dict]) -> str:
    """The pinned list, one option a line."""
    return "{\n" + ",\n".join(
        f" {json.dumps(name)}: {{\n" + ",\n".join(
            f"  {json.dumps(opt)}: {json.dumps(d, sort_keys=True)}" for opt, d in sorted(
                opts.items())) + "\n }" for name, opts in sorted(doc.items())) + "\n}\n"


if __name__ == "__main__":
    PINNED.write_text(render(current()))
    print(f"wrote {PINNED}", file=sys.stderr)
