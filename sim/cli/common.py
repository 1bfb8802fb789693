"""Helpers every CLI command shares: size options, JSON output, input errors, atomic writes.

Conventions (the CLI contract, README.md):
- with ``--json`` a command prints exactly one JSON document on stdout; progress and logs go to
  stderr;
- bad input raises an exception carrying ``exit_code = 2`` (ProfileError, TraceFormatError,
  ConfigError, ...); the group prints its message on stderr and exits with that status;
- results are written to a temporary file and renamed into place.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

if TYPE_CHECKING:
    from rich.console import Console

    from sim.io import atomic_write_text, dumps, tokens

    stderr: Console

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["KV_SIZE", "SIZE", "SLO_TEXT", "KvsimGroup", "atomic_write_text", "config_options",
           "console", "dumps", "emit_json", "fail", "one_line", "parse_size", "stderr", "tokens",
           "trace_load_progress", "trace_options"]

# Taken at their first use (``__getattr__``), not when ``kvsim --help`` imports this module
# through ``main.py``: rich, and sim.io (whose size grammar imports the trace package).
_LAZY_IO = ("atomic_write_text", "dumps", "tokens")


@functools.cache
def _stderr() -> Console:
    from rich.console import Console

    # soft_wrap: a warning or progress line stays one line in logs (no wrapping at 80 columns).
    return Console(stderr=True, soft_wrap=True)


def __getattr__(name: str) -> Any:
    """``stderr`` (one rich Console on stderr for every command) and sim.io's helpers."""
    if name == "stderr":
        return _stderr()
    if name in _LAZY_IO:
        import sim.io

        return getattr(sim.io, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def console() -> Console:
    """Stdout console; wide when piped so tables are not truncated in logs and notes."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def parse_size(text: str | int, what: str = "size") -> int:
    """A size in tokens (sim/io/sizes.py's grammar); anything else is ``click.BadParameter``
    (exit 2) naming ``what``."""
    from sim.io import SizeError, sizes

    try:
        return sizes.parse_size(text, what)
    except SizeError as e:
        raise click.BadParameter(str(e)) from None


class SizeType(click.ParamType):
    name = "TOKENS"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_size(value, param.opts[0] if param and param.opts else "size")
        except click.BadParameter as e:
            self.fail(e.message, param, ctx)


SIZE = SizeType()


class SLOType(click.ParamType):
    """An SLO text (sim/slo.py ``parse_slo``), checked when parsed so that a bad one is one
    line naming the option; kept as written (``run`` and ``plan`` share it)."""

    name = "KEY=VALUE,..."

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from sim.slo import SLOError, parse_slo

        try:
            parse_slo(value)
        except SLOError as e:
            self.fail(str(e), param, ctx)
        return value


SLO_TEXT = SLOType()


class KVSizeType(SizeType):
    """Tokens (``256k``) or bytes of KV per GPU (``40GiB``: kept as text for
    ``sim.deploy.resolve_gpu_fields``)."""

    name = "TOKENS|BYTES"

    def convert(self, value: Any, param: Any, ctx: Any) -> int | str:
        from sim.deploy import parse_kv_bytes

        if parse_kv_bytes(value) is not None:
            return str(value)
        return super().convert(value, param, ctx)


KV_SIZE = KVSizeType()


def _shared_prefix(ctx: Any, param: Any, value: str | None) -> int | str | None:
    if value is None or value == "auto":
        return value
    return parse_size(value, "--shared-prefix")


def _gap_model(ctx: Any, param: Any, value: str) -> str:
    from traces import parse_gap_model

    try:
        parse_gap_model(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value


# option kinds (sim/config.py ``option``) read by a callback, the value staying text
_CALLBACKS = {"prefix": _shared_prefix, "gaps": _gap_model}


def config_options(section: str | None = None, only: tuple[str, ...] = (),
                   loader: bool = False, required: tuple[str, ...] = (),
                   defaults: dict[str, Any] | None = None) -> Callable[[F], F]:
    """One option per flat field (sim/config.py ``FIELDS``) of the config section ``section``
    (``engine``: the engine's name and every engine's knobs; ``run``: RunConfig's own fields;
    None: all) that declares one (``option``), in ``FLAT``'s order: the command's parameter is
    named as the flat name, so ``RunConfig.from_flat`` takes it as is. ``only``: just those
    flat names; ``loader``: just the trace-loading ones (``trace_options``). A command that
    needs a field where a run does not (``required``), or another default (``defaults``:
    the field's type, e.g. ``kvsim plan``'s repeats), says so here, the option staying the
    field's."""
    from dataclasses import MISSING

    from sim.config import FIELDS

    opts = []
    for flat, (sec, f) in FIELDS.items():
        spec = f.metadata.get("option")
        if (spec is None or (section is not None and sec != section)
                or (only and flat not in only) or (loader and not spec["loader"])):
            continue
        kind, choices, words = spec["kind"], spec["choices"], spec["words"]
        # a section chosen by its class (the engine's knobs): the option names it
        default = f.default if f.default is not MISSING else getattr(f.default_factory, "name",
                                                                       None)
        ptype: Any = None  # text
        callback = _CALLBACKS.get(kind)
        if words is not None:  # a bool as its (true, false) word
            ptype, default = click.Choice(words), words[not default]
            callback = lambda ctx, p, v, yes=words[0]: v == yes  # noqa: E731
        elif choices is not None:
            ptype = click.Choice(list(choices() if callable(choices) else choices))
        elif kind in ("size", "kv_size"):
            ptype = SIZE if kind == "size" else KV_SIZE
            default = None if default is None else str(default)
        elif kind in ("count", "positive"):
            ptype = click.IntRange(min=0 if kind == "count" else 1)
        elif kind in ("fraction", "slo"):
            ptype = click.FloatRange(0, 1, min_open=True) if kind == "fraction" else SLO_TEXT
        elif kind is None:
            ptype = {"int": int, "float": float}.get(str(f.type).split(" |")[0])
        names = ["--" + (spec["name"] or flat).replace("_", "-"), *filter(None, [spec["short"]])]
        if defaults and flat in defaults:
            default = defaults[flat]
        given = ({"multiple": True} if kind == "many"
                 else {"is_flag": True} if f.type == "bool" and words is None
                 else {"required": True} if flat in required
                 else {"default": None} if spec["derived"]
                 else {"default": default, "show_default": True})
        opts.append(click.option(*names, flat, type=ptype, callback=callback,
                                 metavar=spec["metavar"], help=spec["help"], **given))

    def decorate(f: F) -> F:
        for opt in reversed(opts):
            f = opt(f)
        return f

    return decorate


def trace_options(f: F) -> F:
    """The trace-loading options every command that reads a trace takes (sim/cli/trace.py
    ``load_from_options`` turns them into a ``Trace``)."""
    return config_options(loader=True)(f)


# Loading a trace: no progress lines in a log for a load this short (most are; a bad trace's
# error then stays the only line).
TRACE_LOAD_QUIET_S = 2.0


@contextmanager
def trace_load_progress(label: str = "loading trace") -> Iterator[None]:
    """Progress on stderr (kB or MB of trace files read, with an ETA) while a trace is parsed
    inside the block; nothing at all when the trace comes from a cache or a generator."""
    from sim.report.progress import Tracker
    from traces.files import report_progress

    bars: list[tuple[Tracker, float]] = []

    def update(done: int, total: int) -> None:
        if not bars:
            unit, scale = ("MB", 1e6) if total >= 1e6 else ("kB", 1e3)
            bars.append((Tracker(label, unit, 0, _stderr(), TRACE_LOAD_QUIET_S), scale))
            bars[0][0].start()
        bar, scale = bars[0]
        bar.update(round(done / scale, 1), round(total / scale, 1))

    try:
        with report_progress(update):
            yield
    except BaseException:
        if bars:
            bars[0][0].stop(failed=True)
        raise
    if bars:
        bars[0][0].stop()


def emit_json(doc: Any) -> None:
    """Print one JSON document on stdout."""
    from sim.io import dumps

    click.echo(dumps(doc))


def one_line(message: object) -> str:
    """A message on one line (YAML and numpy errors span several)."""
    return " ".join(str(message).split())


def fail(message: object, code: int = 2) -> NoReturn:
    """Print ``kvsim: error: MESSAGE`` (one line) on stderr and exit."""
    print(f"kvsim: error: {one_line(message)}", file=sys.stderr)
    sys.exit(code)


def repeated_option(cmd: click.Command, args: list[str]) -> str | None:
    """A message for the first option that ``args`` give twice although it takes one value
    (click would keep the last one silently), or None. Options that collect every value
    (``multiple``) and flags may repeat. Nested groups are followed to their subcommand."""
    while isinstance(cmd, click.Group):
        at = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
        if at is None:
            return None
        sub = cmd.get_command(click.Context(cmd), args[at])
        if sub is None:
            return None
        cmd, args = sub, args[at + 1:]
    opts: dict[str, click.Option] = {}
    for p in cmd.params:
        if isinstance(p, click.Option):
            for o in (*p.opts, *p.secondary_opts):
                opts[o] = p
    seen: dict[str, str] = {}  # parameter name -> how it was first given
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            break
        name, value = (a.partition("=")[0], a) if a.startswith("--") else (a, a)
        p = opts.get(name)
        if p is None and len(a) > 2 and a[0] == "-" and a[1] != "-":
            p = opts.get(a[:2])  # -n4: a short option with its value attached
            name = a[:2] if p is not None else name
        elif p is not None and not p.is_flag and "=" not in a and i + 1 < len(args):
            i += 1  # the option's value is the next word
            value = f"{a} {args[i]}"
        if p is not None and not p.multiple and not p.is_flag and p.name is not None:
            if p.name in seen:
                return (f"{name} is given twice ({seen[p.name]}, then {value}): it takes one "
                        "value, and the last would win silently")
            seen[p.name] = value
        i += 1
    return None


INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


class KvsimGroup(click.Group):
    """A click group that turns input errors into one stderr line and their exit status.

    An exception with an integer ``exit_code`` (ConfigError, TraceFormatError, ProfileError,
    InputError, ...) is a user mistake: its message is printed on one line, as are click's own
    usage errors (a bad option value names the option). An ``OSError`` that escapes a command
    (a full disk, a folder removed under a running sweep) names its file the same way, exit 2.
    Anything else is a bug and keeps its traceback. Ctrl-C ends the command with status 130
    (``INTERRUPTED``). ``--debug`` (the group's flag, accepted anywhere on the line) keeps
    every traceback.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """``--debug`` anywhere before ``--`` is the group's flag (``kvsim run ... --debug``)."""
        end = args.index("--") if "--" in args else len(args)
        if "--debug" in args[:end]:
            args = ["--debug", *(a for a in args[:end] if a != "--debug"), *args[end:]]
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        """The subcommand, after refusing an option it takes once given twice."""
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None:
            problem = repeated_option(cmd, rest)
            if problem is not None:
                raise click.UsageError(problem, click.Context(cmd, info_name=name, parent=ctx))
        return name, cmd, rest

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:  # Ctrl-C: stop now, with the shell's status for SIGINT
            if ctx.params.get("debug"):
                raise
            print("kvsim: interrupted", file=sys.stderr)
            sys.exit(INTERRUPTED)
        except click.UsageError as e:  # click prints usage + hint + error: one line instead
            path = e.ctx.command_path if e.ctx is not None else "kvsim"
            fail(f"{e.format_message()} (see '{path} --help')", e.exit_code)
        except click.ClickException as e:
            fail(e.format_message(), e.exit_code)
        except Exception as e:
            if ctx.params.get("debug"):
                raise  # --debug: every frame, kvsim's included
            code = getattr(e, "exit_code", None)
            if isinstance(code, int) and not isinstance(code, bool):
                # ``detail``: a user's policy's own traceback frames, under the line
                detail = getattr(e, "detail", "")
                print(f"kvsim: error: {one_line(e)}" + (f"\n{detail.rstrip()}" if detail
                                                        else ""), file=sys.stderr)
                sys.exit(code)
            if isinstance(e, OSError):
                where = f"{e.filename}: " if e.filename else ""
                fail(f"{where}{e.strerror or e}")
            raise
