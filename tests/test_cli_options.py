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
    from sim.config import FLAT, KNOBS, SECTIONS
    from sim.engines import ENGINES, VLLM_PATCHES

    params = {p.name: p for p in cli.get_command(click.Context(cli), "run").params}
    where = {v: k for k, v in FLAT.items()}
    declared = [where[s, f.name] for s, classes in (("engine", KNOBS.values()),
                                                    *((s, [c]) for s, c in SECTIONS.items()))
                for c in classes for f in fields(c) if "option" in f.metadata]
    assert {"chunk_size", "vllm_patch", "pool", "pd_rule"} <= set(declared)
    assert all(name in params for name in declared)
    assert params["checkpoint_chunks"].opts == ["--prompt-nodes"]
    assert tuple(KNOBS) == ENGINES.names() == tuple(params["engine"].type.choices)
    assert tuple(params["vllm_patch"].type.choices) == VLLM_PATCHES.names()


def test_a_new_engine_knob_is_one_field(monkeypatch) -> None:
    """Issue 52 item 3: a field declared with ``option`` in a knobs class is the whole edit:
    the flat name, its default, the ``kvsim run`` option with its help, and config.json
    (after the names config.json has always had, whose order stays)."""
    from dataclasses import dataclass

    import sim.config as config
    from sim.cli.common import config_options

    @dataclass(frozen=True)
    class Knobs(config.SGLangKnobs):
        new_knob: int = config.option(7, "A new knob.", "count")

    legacy = list(config.RunConfig().to_dict())
    monkeypatch.setitem(config.KNOBS, "sglang", Knobs)
    fields = config._vocabulary()
    assert fields["new_knob"] == ("engine", next(f for f in config.fields(Knobs)
                                                 if f.name == "new_knob"))
    monkeypatch.setattr(config, "FIELDS", fields)
    monkeypatch.setattr(config, "FLAT", {n: (s, "name" if n == "engine" else f.name)
                                         for n, (s, f) in fields.items()})
    monkeypatch.setitem(config.DEFAULTS, "new_knob", 7)
    cmd = config_options("engine")(click.command()(lambda **kw: kw))
    opt = next(p for p in cmd.params if p.name == "new_knob")
    assert (opt.opts, opt.default, opt.help) == (["--new-knob"], 7, "A new knob.")
    cfg = config.RunConfig.from_flat(new_knob=3)
    assert cfg.engine.new_knob == 3 and cfg.value("new_knob") == 3
    d = cfg.to_dict()
    assert list(d) == [*legacy[:-1], "new_knob", "policy_label"] and d["new_knob"] == 3


def test_run_takes_its_config_options_by_flat_name() -> None:
    """``kvsim run``'s function names only the options that are no config field; every other
    parameter is a flat name (no rename table between the CLI and the config)."""
    import inspect

    from sim.cli.run import run_cmd
    from sim.config import FLAT

    named = [p for p in inspect.signature(run_cmd.callback).parameters.values()
             if p.kind is not p.VAR_KEYWORD]
    assert [p.name for p in named] == ["out", "timeline", "as_json"]
    config = {p.name for p in run_cmd.params if p.expose_value} - {p.name for p in named}
    assert config <= set(FLAT)


def render(doc: dict[str, dict]) -> str:
    """The pinned list, one option a line."""
    return "{\n" + ",\n".join(
        f" {json.dumps(name)}: {{\n" + ",\n".join(
            f"  {json.dumps(opt)}: {json.dumps(d, sort_keys=True)}" for opt, d in sorted(
                opts.items())) + "\n }" for name, opts in sorted(doc.items())) + "\n}\n"


if __name__ == "__main__":
    PINNED.write_text(render(current()))
    print(f"wrote {PINNED}", file=sys.stderr)
