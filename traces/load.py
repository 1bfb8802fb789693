"""``load_trace``: one entry point for every format, generator and loading option."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

from costmodel.registry import Registry

from .builder import TraceBuilder, parse_select
from .errors import OptionError, TraceFormatError
from .files import read_log, strip_gz
from .model import Trace


def load_trace(spec: str | list[str], format: str | None = None, block_size: int = 64,
               shared_prefix: int | str | None = None, max_context: int | None = None,
               select: str | None = None, seed: int = 0, lenient: bool = False,
               cache_dir: str | None = None, rebuild_sessions: bool = False) -> Trace:
    """Load a trace file/folder (or several), or generate ``synthetic:NAME[?k=v&...]``.

    format: cc-traces | mooncake | tracelab | tracelab-duckdb | freeinference (None = detect).
    block_size: the cache's block size; other trace block sizes are mapped onto it.
    shared_prefix: tokens, or "auto" (system + tool tokens of each session), None = no sharing.
    max_context: a session ends before its first request with prompt_tokens > max_context.
    select: "top-requests:K" (the K sessions with most requests after the cut) or "first:K".
    seed: synthetic generators only. lenient: skip bad records, count them in trace.skipped.
    cache_dir: reuse/write an npz copy of the parsed files there (see traces.cache): one
    copy serves every max_context, select and shared_prefix; the Trace each of them built
    is kept beside it.
    rebuild_sessions: Mooncake only: chain requests into sessions by prefix continuation.
    """
    specs = [spec] if isinstance(spec, str | Path) else list(spec)
    if not specs:
        raise OptionError("no trace given")
    specs = [str(s) for s in specs]
    if shared_prefix is not None and shared_prefix != "auto" and (
            isinstance(shared_prefix, bool) or not isinstance(shared_prefix, int)
            or shared_prefix < 0):
        raise OptionError(f"bad shared prefix {shared_prefix!r}: expected auto or tokens")
    if max_context is not None and (not isinstance(max_context, int) or max_context < 1):
        raise OptionError(f"bad max context {max_context!r}: expected a positive token count")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise OptionError(f"bad block size {block_size!r}: expected a positive integer")
    parse_select(select)
    if cache_dir is not None and Path(cache_dir).exists() and not Path(cache_dir).is_dir():
        raise OptionError(f"trace cache folder {cache_dir} (--cache-dir, $KVSIM_CACHE_DIR) is "
                          "a file; give a folder, or off for no cache")
    build = {"shared_prefix": shared_prefix, "max_context": max_context, "select": select}
    extra = {"rebuild_sessions": True} if rebuild_sessions else {}
    if specs[0].startswith("synthetic:"):
        if len(specs) > 1:
            raise OptionError("a synthetic trace cannot be combined with files")
        _check_rebuild_sessions(rebuild_sessions, "synthetic", specs)
        from .synthetic import generate

        return generate(specs[0], block_size=block_size, seed=seed, build=build)
    fmt = format or detect_format(specs)
    if fmt not in READERS:
        raise READERS.unknown(fmt)
    _check_rebuild_sessions(rebuild_sessions, fmt, specs)
    if cache_dir is not None:
        from .cache import cached_load

        return cached_load(specs, fmt, block_size, lenient, cache_dir, extra, build,
                           lambda: _parse(specs, fmt, block_size, lenient, extra),
                           lambda b: _build(b, build, specs))
    return _build(_parse(specs, fmt, block_size, lenient, extra), build, specs)


def _check_rebuild_sessions(rebuild_sessions: bool, fmt: str, specs: list[str]) -> None:
    """--rebuild-sessions only means something for Mooncake (its requests carry no session);
    on another format it would do nothing, silently."""
    if rebuild_sessions and fmt != "mooncake":
        raise OptionError(f"--rebuild-sessions chains Mooncake requests into sessions; "
                          f"{specs[0]} is a {fmt} trace, which carries its own sessions")


def check_shared_prefix(trace: Trace, shared_prefix: int | str | None) -> Trace:
    """Refuse a shared prefix longer than every session's first prompt: capped at each first
    prompt, it would make every whole first prompt one global prefix, sharing across sessions
    that the trace does not have (a typo such as 10m for 10k). A prefix longer than only some
    first prompts shares all of those (the builder caps it). The commands call this on what
    the user typed (``kvsim run``, ``trace stats``, sweep points); ``kvsim reproduce`` applies
    the paper's 15.6K to any trace on purpose."""
    if not isinstance(shared_prefix, int) or isinstance(shared_prefix, bool):
        return trace
    firsts = [int(trace.prompt_tokens[s.first]) for s in trace.sessions if s.parent < 0]
    bs = trace.block_size
    if firsts and shared_prefix // bs > max(firsts) // bs:
        raise OptionError(f"--shared-prefix {shared_prefix:,} tokens is longer than every "
                          f"session's first prompt (the longest has {max(firsts):,} tokens): "
                          "it would share whole first prompts across sessions")
    return trace


def read_trace_files(spec: str | list[str], format: str | None = None, block_size: int = 64,
                     lenient: bool = False, rebuild_sessions: bool = False) -> TraceBuilder:
    """Parse trace files once into a builder; ``builder.build(max_context=..., select=...,
    shared_prefix=...)`` then makes Traces under several option sets without re-reading."""
    specs = [str(s) for s in ([spec] if isinstance(spec, str | Path) else spec)]
    fmt = format or detect_format(specs)
    if fmt not in READERS:
        raise READERS.unknown(fmt)
    extra = {"rebuild_sessions": True} if rebuild_sessions else {}
    return _parse(specs, fmt, block_size, lenient, extra)


def _build(b: TraceBuilder, build: dict, specs: list[str]) -> Trace:
    """The trace ``build`` makes of a parse; one without requests is refused."""
    trace = b.build(**build)
    if len(trace) == 0:
        why = "no requests" + (" left after the options" if b.n_sessions else "")
        files = b.base_options.get("skipped_files", 0)
        if files or b.skipped:
            why += f" ({files} files and {b.skipped} records skipped under --lenient)"
        raise TraceFormatError(";".join(specs), None, None, why)
    return trace


def _parse(specs: list[str], fmt: str, block_size: int, lenient: bool,
           extra: dict) -> TraceBuilder:
    name = Path(specs[0].rstrip("/")).name + (f"+{len(specs) - 1}" if len(specs) > 1 else "")
    b = TraceBuilder(name=name, format=fmt, source=";".join(specs), block_size=block_size)
    b.base_options = {"format": fmt, "lenient": lenient, **extra}
    with read_log() as log:
        _read_format(specs, fmt, b, lenient, extra)
    # Files skipped whole under --lenient (unreadable, truncated, empty); bad records inside
    # readable files are counted apart in ``skipped``.
    b.base_options["skipped_files"] = len(log.skipped_files)
    if log.skipped_files:
        b.base_options["skipped_file_names"] = log.skipped_files[:20]
    return b


def _cc_traces(specs: list[str], b: TraceBuilder, lenient: bool, extra: dict) -> None:
    from .cctraces import load_cc_traces

    load_cc_traces(specs, b, lenient)


def _mooncake(specs: list[str], b: TraceBuilder, lenient: bool, extra: dict) -> None:
    from .mooncake import load_mooncake

    load_mooncake(specs, b, lenient, bool(extra.get("rebuild_sessions")))


def _tracelab(specs: list[str], b: TraceBuilder, lenient: bool, extra: dict) -> None:
    from .tracelab import load_tracelab_jsonl

    load_tracelab_jsonl(specs, b, lenient)


def _tracelab_duckdb(specs: list[str], b: TraceBuilder, lenient: bool, extra: dict) -> None:
    from .tracelab import load_tracelab_duckdb

    load_tracelab_duckdb(specs, b, lenient)


def _freeinference(specs: list[str], b: TraceBuilder, lenient: bool, extra: dict) -> None:
    from .freeinference import load_freeinference

    load_freeinference(specs, b, lenient)


# --format NAME -> the reader that fills a builder from its files (each loads on demand)
READERS: Registry[Callable[[list[str], TraceBuilder, bool, dict], None]] = Registry(
    "trace format", OptionError)
READERS.register("cc-traces", _cc_traces)
READERS.register("mooncake", _mooncake)
READERS.register("tracelab", _tracelab)
READERS.register("tracelab-duckdb", _tracelab_duckdb)
READERS.register("freeinference", _freeinference)
FORMATS = READERS.names()


def _read_format(specs: list[str], fmt: str, b: TraceBuilder, lenient: bool,
                 extra: dict) -> None:
    READERS.get(fmt)(specs, b, lenient, extra)


def _head(path: Path) -> bytes:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read(1 << 16)
        with open(path, "rb") as f:
            return f.read(1 << 16)
    except (OSError, EOFError) as e:
        raise TraceFormatError(str(path), None, None, f"cannot read: {e}") from None


def _first_record_keys(path: Path) -> set[str]:
    head = _head(path)
    line = head.split(b"\n", 1)[0].strip() or head.strip()
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        # a long first line (cc-traces .json, wide sessions): look for key names instead
        keys = set()
        for k in ("hash_ids", "timestamp", "input_length", "round_index", "requests",
                  "input_tokens_total", "session_id", "block_size", "hash_id_scope", "step",
                  "block_ids"):
            if f'"{k}"'.encode() in head:
                keys.add(k)
        return keys
    return set(obj) if isinstance(obj, dict) else set()


def detect_format(specs: list[str]) -> str:
    """Guess the format from names and the first record's fields."""
    p = Path(specs[0])
    if p.is_dir():
        names = {f.name for f in p.iterdir()}
        if "requests.parquet" in names or "manifest.json" in names or (p / "traces").is_dir():
            return "freeinference"
        if any(n.endswith((".duckdb", ".db")) for n in names):
            return "tracelab-duckdb"
        files = sorted(f for f in p.iterdir() if f.is_file()
                       and strip_gz(f.name).endswith((".json", ".jsonl")))
        if not files:
            raise TraceFormatError(str(p), None, None,
                                   "empty folder: no trace files (.json, .jsonl, .parquet)")
        p = files[0]
    elif not p.exists():
        raise TraceFormatError(str(p), None, None, "no such file or folder")
    name = strip_gz(p.name)
    if name.endswith((".duckdb", ".db")):
        return "tracelab-duckdb"
    if name.endswith(".parquet"):
        return "freeinference"
    if name.endswith(".json") and name != "manifest.json":
        return "cc-traces"
    keys = _first_record_keys(p)
    if "timestamp" in keys and ("input_length" in keys or "hash_ids" in keys):
        return "mooncake"
    if "round_index" in keys or "input_tokens_total" in keys:
        return "tracelab"
    if "session_id" in keys and "requests" in keys:
        return "freeinference"
    if "requests" in keys or "block_size" in keys or "hash_id_scope" in keys:
        return "cc-traces"
    if p.stat().st_size == 0:
        raise TraceFormatError(str(p), None, None, "empty file")
    raise TraceFormatError(str(p), None, None, "cannot detect the trace format; pass --format")
