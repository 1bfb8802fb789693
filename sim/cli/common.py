"""Helpers every CLI command shares: sizes, JSON output, input errors, atomic writes.

Conventions (the CLI contract in DESIGN.md):
- with ``--json`` a command prints exactly one JSON document on stdout; progress and logs go to
  stderr;
- bad input raises an exception carrying ``exit_code = 2`` (ProfileError, TraceFormatError,
  ConfigError, ...); the group prints its message on stderr and exits with that status;
- results are written to a temporary file and renamed into place.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import click
from rich.console import Console

from sim.io import atomic_write_text, dumps

__all__ = ["SIZE", "KvsimGroup", "atomic_write_text", "console", "dumps", "emit_json",
           "parse_size", "stderr"]

stderr = Console(stderr=True)


def console() -> Console:
    """Stdout console; wide when piped so tables are not truncated in logs and notes."""
    return Console() if sys.stdout.isatty() else Console(width=200)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")


def parse_size(text: str | int, what: str = "size") -> int:
    """``256k`` = 262,144 tokens (K = 1024), ``1m`` = 1,048,576, ``15.6k`` = 15,974, or a plain
    integer. Raises ``click.BadParameter`` (exit 2) on anything else."""
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise click.BadParameter(f"{what} must look like 256k, 1m or 262144, got {text!r}")
        mult = {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
        value = round(float(m.group(1)) * mult)
    if value < 0:
        raise click.BadParameter(f"{what} must be >= 0, got {text!r}")
    return value


class SizeType(click.ParamType):
    name = "TOKENS"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value, param.name if param else "size")
        except click.BadParameter as e:
            self.fail(e.message, param, ctx)


SIZE = SizeType()


def emit_json(doc: Any) -> None:
    """Print one JSON document on stdout."""
    click.echo(dumps(doc))


class KvsimGroup(click.Group):
    """A click group that turns input errors into one stderr line and their exit status."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as e:
            code = getattr(e, "exit_code", None)
            if isinstance(code, int):
                print(f"kvsim: error: {e}", file=sys.stderr)
                sys.exit(code)
            raise
