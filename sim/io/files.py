"""Files in and out: atomic, deterministic output and input errors that name the file.

Output: every result goes to a temporary file ``.NAME.<random>.tmp`` in the target folder and is
renamed into place, so a reader (or a resumed sweep) sees either the old file or the whole new
one. Files are created with mode 0644 (``mkstemp`` alone would give 0600, unlike the PNGs that
matplotlib writes). A process killed between the two steps leaves a ``.tmp`` file behind:
``remove_stale_tmp`` deletes them when no writer can be running (a sweep's start and end).

Input: ``read_text`` and ``read_yaml`` raise ``InputError`` (exit status 2, one line naming the
file) for unreadable, binary (non-UTF-8) or malformed files; ``check_out_dir`` refuses an output
folder (``check_out_file`` an output file) that cannot be written BEFORE any work starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import socket
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

FILE_MODE = 0o644
TMP_SUFFIX = ".tmp"
# Pseudo file systems: writing there is never a results folder (and may have side effects).
_PSEUDO_FS = (Path("/proc"), Path("/sys"), Path("/dev"))


class InputError(ValueError):
    """A user mistake in a file or option: the CLI prints the message and exits with 2."""

    exit_code = 2


def clean_json(obj: Any) -> Any:
    """JSON has no NaN/inf: write them as null; numpy scalars become Python numbers."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [clean_json(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return clean_json(obj.item())
    return obj


def dumps(doc: Any) -> str:
    return json.dumps(clean_json(doc), indent=2, sort_keys=False)


def _tmp_for(path: Path) -> tuple[int, str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    os.fchmod(fd, FILE_MODE)
    return fd, tmp


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    fd, tmp = _tmp_for(path)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_parquet(df: Any, path: str | Path) -> None:
    path = Path(path)
    fd, tmp = _tmp_for(path)
    os.close(fd)
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """A matplotlib figure as PNG, written like every other result (temp file, rename)."""
    path = Path(path)
    fd, tmp = _tmp_for(path)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=dpi, bbox_inches="tight")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def is_tmp_name(name: str) -> bool:
    """Names ``atomic_write_*`` gives its temporary files."""
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


def remove_stale_tmp(root: str | Path) -> int:
    """Delete leftover temporary files under ``root`` (a killed writer's); returns how many.
    Call only when no writer is running in ``root``."""
    n = 0
    root = Path(root)
    if not root.is_dir():
        return 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if is_tmp_name(name):
                Path(dirpath, name).unlink(missing_ok=True)
                n += 1
    return n


# --- input ------------------------------------------------------------------------------
def read_text(path: str | Path, what: str = "file") -> str:
    """A UTF-8 text file; unreadable or binary content is an ``InputError`` naming it."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, expected a {what}") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read the {what}: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not a text {what} (binary content: byte {e.start} is not "
                         "UTF-8)") from None


def read_json(path: str | Path, what: str = "JSON file") -> Any:
    """A JSON document; a missing, binary, truncated or malformed file is one ``InputError``
    line naming it (and the line and column where the JSON stops making sense)."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: line {e.lineno}, column {e.colno}: not valid JSON "
                         f"({e.msg}; truncated by a killed writer?)") from None


def read_parquet(path: str | Path, columns: list[str] | None = None) -> Any:
    """A Parquet table as a DataFrame; an unreadable or truncated file is one ``InputError``
    line naming it."""
    import pandas as pd

    try:
        return pd.read_parquet(path, columns=columns)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise InputError(f"{path}: not a readable Parquet table ({' '.join(str(e).split())}"
                         "; truncated by a killed writer?)") from None


def yaml_error(path: str | Path, e: Exception) -> InputError:
    """One line for a PyYAML error: file, line and column (both from 1), the problem."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e)
    problem = " ".join(str(problem).split())
    where = f"{path}: line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
    return InputError(f"{where}: not valid YAML: {problem}")


def read_yaml(path: str | Path, what: str = "YAML file") -> Any:
    """``yaml.safe_load`` of a UTF-8 file; every failure is one ``InputError`` line."""
    import yaml

    text = read_text(path, what)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise yaml_error(path, e) from None


# --- output folders ---------------------------------------------------------------------
LOCK_NAME = "sweep.lock"


@contextmanager
def folder_lock(folder: str | Path, what: str) -> Iterator[None]:
    """Hold ``folder``'s lock file while the block runs: one writer (``what``, e.g. ``kvsim
    sweep``) per folder. The file holds the owner's pid and host; the lock itself is the
    kernel's (``flock``), so a killed owner releases it and its file is taken over. A lock
    held by a live process is refused (``InputError``, exit status 2)."""
    path = Path(folder) / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = " ".join(os.read(fd, 200).decode(errors="replace").split()) or "unknown"
        os.close(fd)
        raise InputError(f"{folder}: another {what} is writing here (pid and host: {owner}; "
                         f"{path}); wait for it to end or use another --out") from None
    try:
        stale = " ".join(os.read(fd, 200).decode(errors="replace").split())
        if stale:  # its owner died without removing it
            print(f"kvsim: notice: {path}: taken over from {stale} (no longer running)",
                  file=sys.stderr)
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)  # releases the lock after the file is gone


def _under_pseudo_fs(p: Path) -> bool:
    return any(p == root or root in p.parents for root in _PSEUDO_FS)


def check_out_dir(path: str | Path, option: str = "--out") -> Path:
    """Make sure ``path`` is (or can become) a folder we can write results into; create it.

    Refused, with one line naming the option: an empty name, an existing file, a folder
    under /proc, /sys or /dev, and a folder that cannot be written. "Read-only" means no
    write permission bit on the folder (or its nearest existing parent), even for root, who
    could write there anyway: a folder made read-only on purpose is not a place for results.
    """
    if not str(path).strip():
        raise InputError(f"{option} {str(path)!r}: empty folder name")
    p = Path(path).expanduser()
    ap = Path(os.path.abspath(p))
    if _under_pseudo_fs(ap):
        raise InputError(f"{option} {path}: not a place for results (under "
                         f"{next(r for r in _PSEUDO_FS if r == ap or r in ap.parents)})")
    if p.exists() and not p.is_dir():
        raise InputError(f"{option} {path}: exists and is not a folder")
    existing = ap
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{option} {path}: {existing} is a file, not a folder")
    if not os.stat(existing).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) \
            or not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path}: read-only folder {existing}")
    try:
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=p, prefix=".kvsim-probe.", suffix=TMP_SUFFIX)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise InputError(f"{option} {path}: cannot write there: "
                         f"{e.strerror or e.__class__.__name__}") from None
    return p


def check_out_file(path: str | Path, option: str) -> Path:
    """Make sure ``path`` can be written as one file (``atomic_write_text``: a temp file in its
    folder, then a rename) BEFORE any work starts; create its folder. Refused, with one line
    naming the option and ``path``: an empty name, an existing folder, and a folder that
    ``check_out_dir`` refuses (under /proc, /sys or /dev, read-only, a file)."""
    if not str(path).strip():
        raise InputError(f"{option} {str(path)!r}: empty file name")
    p = Path(path).expanduser()
    if p.is_dir():
        raise InputError(f"{option} {path}: is a folder, not a file")
    check_out_dir(p.parent, f"{option} {path}: its folder")
    return p
