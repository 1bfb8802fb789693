"""On-disk cache of loaded traces (npz, never pickle) for fast reloads.

The key hashes the source files' absolute paths, sizes, modification and change times, the
format, every loading option, ``CACHE_VERSION`` (the npz layout: bump it when the Trace's
arrays change) and a hash of this package's source (a loader fix changes the traces it makes),
so a changed file, option or loader loads afresh. A cache file that cannot be read back
(truncated, edited, another version) is ignored and rewritten; a cache folder that cannot be
written only costs the speed.

Where: ``resolve_cache_dir`` (the CLI and ``sim.runner`` use it): an explicit folder, else
``$KVSIM_CACHE_DIR``, else ``~/.cache/kvsim``; ``off`` (option or variable) disables it.
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

from .model import Session, Trace

CACHE_VERSION = 3  # 2: block regions (_pool_region); 3: hash-id counts; older: never served
_ARRAYS = ("session", "prompt_tokens", "output_tokens", "send_time_s", "gap_s", "gap_kind",
           "model", "input_kinds", "prefix_blocks", "_pool", "_seg_ptr", "_seg_start",
           "_seg_len", "_out_ptr", "_pool_region")


CACHE_OFF = "off"


def resolve_cache_dir(cache_dir: str | None) -> str | None:
    """The npz cache folder to use, or None for no cache (see the module docstring)."""
    if cache_dir is None:
        cache_dir = os.environ.get("KVSIM_CACHE_DIR") or str(Path("~/.cache/kvsim").expanduser())
    return None if cache_dir.strip().lower() == CACHE_OFF else cache_dir


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


def cache_key(specs: list[str], fmt: str, block_size: int, build: dict, lenient: bool,
              extra: dict) -> str:
    doc = {"v": CACHE_VERSION, "code": _code_hash(), "files": _fingerprint(specs),
           "format": fmt, "bs": block_size, "build": build, "lenient": lenient, "extra": extra}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def save_trace(trace: Trace, path: Path) -> None:
    meta = {"v": CACHE_VERSION, "name": trace.name, "block_size": trace.block_size,
            "format": trace.format, "source": trace.source, "models": trace.models,
            "skipped": trace.skipped, "options": trace.options,
            "sessions": [dataclasses.astuple(s) for s in trace.sessions]}
    arrays, scalars = trace.storage()
    meta["fresh_base"] = scalars["_fresh_base"]
    meta["hash_ids"] = [scalars["hash_id_refs"], scalars["hash_id_distinct"]]
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **{k.lstrip("_"): v for k, v in arrays.items()})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_trace(path: Path) -> Trace | None:
    """The cached trace, or None when the file is missing or unusable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("v") != CACHE_VERSION:
                return None
            arrs = {k: z[k.lstrip("_")] for k in _ARRAYS}
    except (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError,
            UnicodeDecodeError):
        return None
    R = arrs["prompt_tokens"].shape[0]
    if any(arrs[k].shape != (R,) for k in _ARRAYS[:9]) or arrs["_seg_ptr"].shape != (R + 1,):
        return None
    if arrs["_pool_region"].shape != arrs["_pool"].shape or arrs["_pool_region"].dtype != np.uint8:
        return None
    arrs["_pool"].setflags(write=False)
    arrs["_pool_region"].setflags(write=False)
    try:
        sessions = [Session(*s) for s in meta["sessions"]]
        refs, distinct = (int(x) for x in meta["hash_ids"])
    except (TypeError, KeyError, ValueError):
        return None
    return Trace(name=meta["name"], block_size=meta["block_size"], format=meta["format"],
                 source=meta["source"], sessions=sessions, models=meta["models"],
                 skipped=meta["skipped"], options=meta["options"],
                 _fresh_base=meta["fresh_base"], hash_id_refs=refs,
                 hash_id_distinct=distinct, **arrs)


def cached_load(specs: list[str], fmt: str, block_size: int, build: dict, lenient: bool,
                cache_dir: str, extra: dict, parse: Callable[[], Trace]) -> Trace:
    """The trace from the cache folder, else ``parse()`` (then cached)."""
    key = cache_key(specs, fmt, block_size, build, lenient, extra)
    path = Path(cache_dir) / f"trace-{key[:24]}.npz"
    trace = read_trace(path) if path.is_file() else None
    if trace is None and path.is_file():
        print(f"kvsim: notice: trace cache {path}: does not load (truncated or damaged): "
              "rebuilding it", file=sys.stderr)
    if trace is None:
        trace = parse()
        # A read-only or full cache folder costs the next load its speed, nothing else.
        with contextlib.suppress(OSError):
            save_trace(trace, path)
    return trace
