"""On-disk cache of parsed traces (npz, never pickle) for fast reloads.

What is cached is the parse: the ``TraceBuilder`` a loader filled from the files, before
``max_context``, ``select`` and ``shared_prefix`` are applied (``TraceBuilder.storage``).
Those options are applied after every load by the same ``build`` as after a parse, so one
cached parse serves every combination of them, and a trace loaded from the cache is identical
to one parsed afresh (tests/test_trace_cache.py). The Trace each option set built is kept
too (``built-*.npz``, keyed by the parse's key and the options): a repeated load reads its
arrays instead of building again (``cached_load``).

The key hashes the source files' absolute paths, sizes, modification and change times, the
format, the block size, ``lenient``, the loader's extra options (``rebuild_sessions``),
``CACHE_VERSION`` (the npz layout: bump it when the builder's storage changes) and a hash of
this package's source (a loader fix changes the traces it makes), so a changed file, option or
loader loads afresh. A cache file that cannot be read back (truncated, edited, another
version) is ignored and rewritten; a cache folder that cannot be written only costs the speed.

Where: ``resolve_cache_dir`` (the CLI and ``sim.run`` use it): an explicit folder, else
``$KVSIM_CACHE_DIR``, else ``~/.cache/kvsim``; ``off`` (option or variable) disables it.

Size: every key a changed file, option or loader makes is a new file, so after each write the
folder's cache files are pruned least recently used first (a hit renews a file's time) to
``$KVSIM_CACHE_MAX_MIB`` mebibytes (default ``DEFAULT_MAX_MIB``); the newest file always stays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .builder import TraceBuilder
from .errors import OptionError
from .model import Session, Trace

CACHE_VERSION = 4  # 4: the parsed builder (any build options); older files are never served
_ARRAYS = ("req_ptr", "new_ptr", "new_ids", "reg_ptr", "reg_vals", "reg_counts", "prompt",
           "output", "kind", "model", "kinds", "prefix", "send", "gap", "src_len", "src_shared",
           "src_ptr", "src_ids")


CACHE_OFF = "off"
DEFAULT_MAX_MIB = 2048
_CACHE_GLOBS = ("parsed-*.npz", "built-*.npz")
_STALE_TMP_S = 3600  # a writer's temporary file older than this was left by a crash
_SESSION_FIELDS = [f.name for f in dataclasses.fields(Session)]


def resolve_cache_dir(cache_dir: str | None) -> str | None:
    """The npz cache folder to use, or None for no cache (see the module docstring)."""
    if cache_dir is None:
        cache_dir = os.environ.get("KVSIM_CACHE_DIR") or str(Path("~/.cache/kvsim").expanduser())
    if cache_dir.strip().lower() == CACHE_OFF:
        return None
    max_cache_bytes()  # a bad limit is refused before any work
    return cache_dir


@functools.cache
def _code_hash() -> str:
    h = hashlib.sha256()
    for f in sorted(Path(__file__).parent.glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _fingerprint(specs: list[str]) -> list:
    out = []
    for s in specs:
        p = Path(s).resolve()
        files = sorted(p.rglob("*")) if p.is_dir() else [p]
        for f in files:
            if f.is_file():
                st = f.stat()
                out.append([str(f), st.st_size, st.st_mtime_ns, st.st_ctime_ns])
    return out


def cache_key(specs: list[str], fmt: str, block_size: int, lenient: bool, extra: dict) -> str:
    doc = {"v": CACHE_VERSION, "code": _code_hash(), "files": _fingerprint(specs),
           "format": fmt, "bs": block_size, "lenient": lenient, "extra": extra}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def save_parsed(builder: TraceBuilder, path: Path) -> None:
    arrays, meta = builder.storage()
    arrays["meta"] = np.frombuffer(json.dumps({"v": CACHE_VERSION, **meta}).encode(),
                                   dtype=np.uint8)
    _write_npz(arrays, path)


def _write_npz(arrays: dict[str, np.ndarray], path: Path) -> None:
    """``arrays`` to ``path`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def max_cache_bytes() -> int:
    """The folder's size limit (module docstring); a value that is not a non-negative
    integer is an error naming the variable."""
    text = os.environ.get("KVSIM_CACHE_MAX_MIB", "").strip()
    if not text:
        return DEFAULT_MAX_MIB << 20
    if not text.isdigit():
        raise OptionError(f"KVSIM_CACHE_MAX_MIB: expected a whole number of MiB, got {text!r}")
    return int(text) << 20


def prune(folder: Path, keep: Path, limit: int) -> None:
    """Delete the least recently used cache files of ``folder`` (never ``keep``, the one just
    written) until the rest fit in ``limit`` bytes, and temporary files a crashed writer left.
    Files another process removes meanwhile are skipped."""
    files = []
    for pattern in _CACHE_GLOBS:
        for f in folder.glob(pattern):
            with contextlib.suppress(OSError):
                st = f.stat()
                files.append((st.st_mtime_ns, f.name, st.st_size, f))
    now = max((m for m, *_ in files), default=0)
    for f in folder.glob(".*.tmp"):
        with contextlib.suppress(OSError):
            if now - f.stat().st_mtime_ns > _STALE_TMP_S * 10**9:
                f.unlink()
    total = sum(size for _, _, size, _ in files)
    for _, _, size, f in sorted(files):  # oldest first; the name breaks ties
        if total <= limit:
            break
        if f == keep:
            continue
        with contextlib.suppress(OSError):
            f.unlink()
            total -= size


def _renew(path: Path) -> None:
    """A hit: ``path`` becomes the most recently used (``prune``)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def _keep(write: Callable[[], None], path: Path) -> None:
    """``write()`` the cache file ``path``, then prune its folder. A read-only or full
    folder costs the next load its speed, nothing else."""
    with contextlib.suppress(OSError):
        write()
        prune(path.parent, path, max_cache_bytes())


def read_parsed(path: Path) -> TraceBuilder | None:
    """The cached parse, or None when the file is missing or unusable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("v") != CACHE_VERSION:
                return None
            arrays = {k: z[k] for k in _ARRAYS}
        return TraceBuilder.from_storage(arrays, meta)
    except (OSError, EOFError, ValueError, KeyError, TypeError, IndexError,
            zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError):
        return None


def _say_damaged(path: Path) -> None:
    print(f"kvsim: notice: trace cache {path}: does not load (truncated or damaged): "
          "rebuilding it", file=sys.stderr)


def cached_parse(specs: list[str], fmt: str, block_size: int, lenient: bool, cache_dir: str,
                 extra: dict, parse: Callable[[], TraceBuilder], key: str | None = None
                 ) -> TraceBuilder:
    """The parse from the cache folder, else ``parse()`` (then cached); ``key``: the
    ``cache_key`` of the arguments when the caller has it."""
    key = key or cache_key(specs, fmt, block_size, lenient, extra)
    path = Path(cache_dir) / f"parsed-{key[:24]}.npz"
    builder = read_parsed(path) if path.is_file() else None
    if builder is None and path.is_file():
        _say_damaged(path)
    if builder is None:
        built = builder = parse()
        _keep(lambda: save_parsed(built, path), path)
    else:
        _renew(path)
    return builder


# -- the built trace: a second copy per build option set ---------------------------------------
# ``build`` costs Python work per session (a Mooncake trace is one session per request: 0.1 s
# for 4,000), so the Trace it made is kept too, keyed by the parse's key and the options:
# reloading it is a few array reads. Arrays are the Trace's own; everything else is JSON.


def _trace_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(Trace) if f.init]


def save_built(trace: Trace, path: Path) -> None:
    """Write ``trace`` to ``path`` (npz); one that would not read back identical (an object
    array, which npz would pickle; a field JSON changes, such as a tuple) is not written
    (``TypeError``, which the caller ignores)."""
    arrays: dict[str, np.ndarray] = {}
    meta: dict = {"v": CACHE_VERSION}
    for k in _trace_fields():
        v = getattr(trace, k)
        if k == "sessions":
            meta[k] = [[getattr(s, f) for f in _SESSION_FIELDS] for s in v]
        elif isinstance(v, np.ndarray):
            if v.dtype.hasobject:
                raise TypeError(f"{k}: an object array")
            arrays[k] = v
        else:
            meta[k] = v
    text = json.dumps(meta)
    if json.loads(text) != meta:
        raise TypeError("a field does not survive JSON")
    arrays["meta"] = np.frombuffer(text.encode(), dtype=np.uint8)
    _write_npz(arrays, path)


def read_built(path: Path) -> Trace | None:
    """The cached Trace, or None when the file is missing or unusable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.pop("v", None) != CACHE_VERSION:
                return None
            kw = {k: z[k] for k in z.files if k != "meta"}
        kw["sessions"] = [Session(*row) for row in meta.pop("sessions")]
        kw.update(meta)
        for k in ("_pool", "_pool_region"):  # read-only, as ``build`` leaves them
            if isinstance(kw.get(k), np.ndarray):
                kw[k].setflags(write=False)
        return Trace(**kw)
    except (OSError, EOFError, ValueError, KeyError, TypeError, IndexError, AttributeError,
            zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError):
        return None


def cached_load(specs: list[str], fmt: str, block_size: int, lenient: bool, cache_dir: str,
                extra: dict, build: dict, parse: Callable[[], TraceBuilder],
                make: Callable[[TraceBuilder], Trace]) -> Trace:
    """The Trace ``make(parse())`` gives under the build options ``build``, from the cache
    folder when a copy is there (else made, from the cached parse, and kept)."""
    key = cache_key(specs, fmt, block_size, lenient, extra)
    built = hashlib.sha256(json.dumps([key, build], sort_keys=True, default=str).encode())
    path = Path(cache_dir) / f"built-{built.hexdigest()[:24]}.npz"
    trace = read_built(path) if path.is_file() else None
    if trace is not None:
        _renew(path)
        return trace
    if path.is_file():
        _say_damaged(path)
    made = make(cached_parse(specs, fmt, block_size, lenient, cache_dir, extra, parse, key))
    with contextlib.suppress(TypeError):  # a trace npz cannot hold is rebuilt each time
        _keep(lambda: save_built(made, path), path)
    return made
