"""Reading trace files: gzip transparently, JSON/JSONL records with named errors."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import TraceFormatError


def read_bytes(path: Path) -> bytes:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise TraceFormatError(str(path), None, None, f"cannot read: {e}") from None


def load_json(path: Path) -> Any:
    data = read_bytes(path)
    if not data.strip():
        raise TraceFormatError(str(path), None, None, "empty file")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceFormatError(str(path), 0, None, f"malformed JSON: {e}") from None


def load_json_ids(data: bytes, file: str, record: int | str) -> tuple[Any, list]:
    """Parse one JSON document whose id lists are read by numpy (see blocks)."""
    from .blocks import parse_json_with_id_lists

    try:
        return parse_json_with_id_lists(data)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as e:
        raise TraceFormatError(file, record, None, f"malformed JSON: {e}") from None


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line index, raw line) per non-blank line."""
    data = read_bytes(path)
    if not data.strip():
        raise TraceFormatError(str(path), None, None, "empty file")
    for i, line in enumerate(data.splitlines()):
        if line.strip():
            yield i, line


def iter_jsonl(path: Path, lenient: bool, skipped: list[int]) -> Iterator[tuple[int, Any]]:
    """(line index, parsed object) per non-blank line; a malformed line raises, or is counted
    in ``skipped[0]`` when lenient."""
    data = read_bytes(path)
    if not data.strip():
        raise TraceFormatError(str(path), None, None, "empty file")
    for i, line in enumerate(data.splitlines()):
        if not line.strip():
            continue
        try:
            yield i, json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            if lenient:
                skipped[0] += 1
                continue
            raise TraceFormatError(str(path), i, None, f"malformed JSON: {e}") from None


def iter_jsonl_ids(path: Path, lenient: bool,
                   skipped: list[int]) -> Iterator[tuple[int, Any, list]]:
    """Like ``iter_jsonl`` with id lists parsed by numpy: (line, object, id table)."""
    for i, line in iter_lines(path):
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
    return out
