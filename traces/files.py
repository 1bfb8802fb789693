"""Reading trace files: gzip transparently, JSON/JSONL records with named errors.

Lines are numbered from 1 (as editors do): a record label ``line 3`` is the third line.

Every file a loader reads goes through ``read_bytes``, which keeps two things for the load in
progress (context variables, so loaders need no extra arguments):
- progress: ``report_progress(callback)`` makes each file read call ``callback(done, total)``
  in bytes on disk (the CLI draws a bar on stderr from it);
- skipped files: under ``lenient``, a file that cannot be read whole (unreadable, a truncated
  gzip, empty, not JSON at all) is skipped and its name kept in the ``ReadLog`` that
  ``read_log()`` opens around a load.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import TraceFormatError

Progress = Callable[[int, int], None]


@dataclass
class ReadLog:
    """What reading one trace's files did: bytes read of the total, files skipped."""

    total_bytes: int = 0
    done_bytes: int = 0
    skipped_files: list[str] = field(default_factory=list)


_LOG: ContextVar[ReadLog | None] = ContextVar("kvsim_trace_read_log", default=None)
_PROGRESS: ContextVar[Progress | None] = ContextVar("kvsim_trace_progress", default=None)


@contextmanager
def read_log() -> Iterator[ReadLog]:
    """Collect progress and skipped files of the reads inside the ``with`` block."""
    log = ReadLog()
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


@contextmanager
def report_progress(callback: Progress | None) -> Iterator[None]:
    """Call ``callback(done_bytes, total_bytes)`` after each trace file read in the block."""
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _count_total(files: list[Path]) -> None:
    log = _LOG.get()
    if log is not None:
        log.total_bytes += sum(_size(f) for f in files)


def _count_done(path: Path) -> None:
    log = _LOG.get()
    if log is None:
        return
    log.done_bytes += _size(path)
    cb = _PROGRESS.get()
    if cb is not None and log.total_bytes:
        cb(min(log.done_bytes, log.total_bytes), log.total_bytes)


def read_bytes(path: Path) -> bytes:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        what = "truncated" if isinstance(e, EOFError) else str(e.strerror or e) \
            if isinstance(e, OSError) else str(e)
        raise TraceFormatError(str(path), None, None, f"cannot read: {what}") from None
    finally:
        _count_done(path)
    return data


def skip_file(path: Path, lenient: bool, err: TraceFormatError) -> None:
    """Under ``lenient`` remember ``path`` as skipped; otherwise raise ``err``."""
    log = _LOG.get()
    if not lenient:
        raise err
    if log is not None:
        log.skipped_files.append(str(path))


def read_file(path: Path, lenient: bool) -> bytes | None:
    """A whole file's bytes; None when it is unreadable, truncated or empty and ``lenient``
    (the file is counted as skipped), a ``TraceFormatError`` naming it otherwise."""
    try:
        data = read_bytes(path)
        if not data.strip():
            raise TraceFormatError(str(path), None, None, "empty file")
    except TraceFormatError as e:
        skip_file(path, lenient, e)
        return None
    return data


def load_json(path: Path) -> Any:
    data = read_bytes(path)
    if not data.strip():
        raise TraceFormatError(str(path), None, None, "empty file")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceFormatError(str(path), None, None, f"malformed JSON: {e}") from None


def load_json_ids(data: bytes, file: str, record: str | None) -> tuple[Any, list]:
    """Parse one JSON document whose id lists are read by numpy (see blocks)."""
    from .blocks import parse_json_with_id_lists

    try:
        return parse_json_with_id_lists(data)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise TraceFormatError(file, record, None, f"malformed JSON: {e}") from None


def line_label(n: int) -> str:
    """The record label of line ``n`` (numbered from 1)."""
    return f"line {n}"


def iter_lines(path: Path, lenient: bool = False) -> Iterator[tuple[str, bytes]]:
    """(``line N`` label, raw line) per non-blank line, N from 1. An unreadable or empty file
    raises, or yields nothing when lenient (skipped and counted)."""
    data = read_file(path, lenient)
    if data is None:
        return
    for i, line in enumerate(data.splitlines(), 1):
        if line.strip():
            yield line_label(i), line


def iter_jsonl(path: Path, lenient: bool, skipped: list[int]) -> Iterator[tuple[str, Any]]:
    """(``line N`` label, parsed object) per non-blank line; a malformed line raises, or is
    counted in ``skipped[0]`` when lenient."""
    for where, line in iter_lines(path, lenient):
        try:
            yield where, json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if lenient:
                skipped[0] += 1
                continue
            raise TraceFormatError(str(path), where, None, f"malformed JSON: {e}") from None


def iter_jsonl_ids(path: Path, lenient: bool,
                   skipped: list[int]) -> Iterator[tuple[str, Any, list]]:
    """Like ``iter_jsonl`` with id lists parsed by numpy: (line label, object, id table)."""
    for i, line in iter_lines(path, lenient):
        try:
            obj, table = load_json_ids(line, str(path), i)
        except TraceFormatError:
            if lenient:
                skipped[0] += 1
                continue
            raise
        yield i, obj, table


def strip_gz(name: str) -> str:
    return name[:-3] if name.endswith(".gz") else name


def list_files(paths: list[str], suffixes: tuple[str, ...]) -> list[Path]:
    """Files named by ``paths``: a file, or every matching file of a folder (sorted)."""
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(f for f in path.iterdir()
                           if f.is_file() and strip_gz(f.name).endswith(suffixes))
            if not found:
                raise TraceFormatError(str(path), None, None,
                                       f"empty folder: no {'/'.join(suffixes)} files")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise TraceFormatError(str(path), None, None, "no such file or folder")
    _count_total(out)
    return out
