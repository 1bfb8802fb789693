"""Running the ``kvsim`` command in-process for the CLI tests (click's CliRunner)."""

from __future__ import annotations

from click.testing import CliRunner, Result

from sim.cli.main import cli


def invoke_result(*args) -> Result:
    """``kvsim *args`` (each arg made a string): click's whole result."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def invoke(*args) -> tuple[int, str, str]:
    """``kvsim *args``: (exit code, stdout, stderr)."""
    res = invoke_result(*args)
    return res.exit_code, res.stdout, res.stderr


def one_line_error(args: list[str], needle: str) -> str:
    """Run kvsim; assert exit 2 with ONE stderr line 'kvsim: error: ...' containing needle."""
    res = CliRunner().invoke(cli, args)
    shown = f"kvsim {' '.join(args)}\n--- stderr:\n{res.stderr}"
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2, shown
    assert isinstance(res.exception, SystemExit), shown
    assert "Traceback" not in res.stdout + res.stderr, shown
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), shown
    assert needle in lines[0], shown
    return lines[0]
