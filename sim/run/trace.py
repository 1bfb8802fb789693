"""The trace a config replays, loaded once per process (sweeps reuse it across points)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sim.config import RunConfig


@lru_cache(maxsize=8)
def _load(trace: str, fmt: str | None, block_size: int, shared_prefix: Any, max_context: Any,
          select: str | None, seed: int, lenient: bool, cache_dir: str | None,
          rebuild_sessions: bool):
    from traces import load_trace

    spec = trace if trace.startswith("synthetic:") else trace.split(",")
    return load_trace(spec, format=fmt, block_size=block_size, shared_prefix=shared_prefix,
                      max_context=max_context, select=select, seed=seed, lenient=lenient,
                      cache_dir=cache_dir, rebuild_sessions=rebuild_sessions)


def trace_options(cfg: RunConfig) -> tuple:
    """Everything that decides which trace a config replays (the key of the memo and of the
    executors' per-worker trace store). The npz cache folder defaults to the user cache
    (``traces.cache.resolve_cache_dir``: ``$KVSIM_CACHE_DIR`` or ``~/.cache/kvsim``)."""
    from traces.cache import resolve_cache_dir

    t = cfg.traffic
    return (t.trace, t.trace_format, cfg.cache.block_size, t.shared_prefix, t.max_context,
            t.select, cfg.trace_draw_seed, t.lenient, resolve_cache_dir(t.trace_cache_dir),
            t.rebuild_sessions)


def load_run_trace(cfg: RunConfig):
    """The trace a config replays (memoized per process: sweeps reuse it across points)."""
    return _load(*trace_options(cfg))


def trace_loads() -> int:
    """Traces this process has loaded (not served from its memo) so far."""
    return _load.cache_info().misses

