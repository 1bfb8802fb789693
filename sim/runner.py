"""Run one configuration end to end: trace -> engine -> per-request table + summary.

``run(cfg)`` is a pure function of (trace, config, seed): the same inputs give byte-identical
outputs (``write_result`` writes Parquet, JSON and the resolved config, each atomically).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd
import simpy

from costmodel.profile import load_profile
from costmodel.specs import get_spec
from costmodel.units import Units, range_units
from policies import EvictionPolicy, PolicyContext, SessionInfo
from sim.config import ConfigError, RunConfig
from sim.context import ContextRun, context_summary, parse_context
from sim.engines import ENGINES
from sim.io import atomic_write_parquet, atomic_write_text, dumps, is_tmp_name
from sim.metrics import RunRecorder
from sim.replay import Replay
from sim.report.progress import current as current_progress


@dataclass
class RunResult:
    config: RunConfig
    requests: pd.DataFrame
    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # more: NAME.parquet


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

    return (cfg.trace, cfg.trace_format, cfg.block_size, cfg.shared_prefix, cfg.max_context,
            cfg.select, cfg.trace_draw_seed, cfg.lenient, resolve_cache_dir(cfg.trace_cache_dir),
            cfg.rebuild_sessions)


def load_run_trace(cfg: RunConfig):
    """The trace a config replays (memoized per process: sweeps reuse it across points)."""
    return _load(*trace_options(cfg))


def trace_loads() -> int:
    """Traces this process has loaded (not served from its memo) so far."""
    return _load.cache_info().misses


def bind_policy(env: simpy.Environment, cfg: RunConfig, spec, profile, policy: EvictionPolicy,
                sessions) -> None:
    """Give a policy its run context: the simulated clock, the recompute price of a token
    range at its positions, and the trace's sessions (read only)."""
    base = profile.prefill_seconds(Units())

    def recompute_seconds(a: int, b: int) -> float:
        """Marginal prefill seconds of tokens [a, b) at their positions."""
        return profile.prefill_seconds(range_units(spec, a, b)) - base

    policy.bind(PolicyContext(now=lambda: env.now, block_size=cfg.block_size, seed=cfg.seed,
                              recompute_seconds=recompute_seconds,
                              sessions=tuple(SessionInfo(s.id, s.parent, s.agent_type)
                                             for s in sessions)))


def run_fields(cfg: RunConfig, policy: EvictionPolicy, profile, spec, trace,
               table: pd.DataFrame) -> dict[str, Any]:
    """The configuration fields a run summary carries beside its metrics."""
    return {
        "policy": policy.label, "model": cfg.model, "profile": profile.name,
        "profile_provenance": profile.provenance, "gpu_cache_tokens": cfg.gpu_cache,
        "cpu_cache_tokens": cfg.cpu_cache, "n_sessions": cfg.sessions, "gaps": cfg.gaps,
        "scheduler": cfg.scheduler, "engine": cfg.engine, "trace": trace.name,
        "trace_requests": len(trace),
        # --lenient: records and whole files the loader skipped
        "trace_skipped_records": int(trace.skipped),
        "trace_skipped_files": int(trace.options.get("skipped_files", 0)),
        # replayed although a real server would refuse them (cut with --max-context)
        "over_context_requests": int(((table["prompt_tokens"] > spec.max_context)
                                      & ~table["dropped"].astype(bool)).sum())
        if len(table) else 0,
    } | ENGINES[cfg.engine].summary_fields(cfg)


def answer_fields(cfg: RunConfig, profile, table: pd.DataFrame, summary: dict[str, Any],
                  completed_sessions: set[int]) -> dict[str, Any]:
    """GPUs used, rates per GPU and, with an SLO, goodput (sim/deploy.py, sim/slo.py)."""
    from sim.deploy import deployment_fields

    out = deployment_fields(cfg, profile)
    gpus = out["gpus"]
    out["output_tokens_per_s_per_gpu"] = summary["output_tokens_per_s"] / gpus
    out["total_tokens_per_s_per_gpu"] = summary["total_tokens_per_s"] / gpus
    if cfg.slo is not None:
        from sim.slo import slo_fields

        out.update(slo_fields(cfg.slo, table, summary, completed_sessions, gpus))
    return out


def run(cfg: RunConfig, trace=None, timeline=None) -> RunResult:
    """``timeline``: a sim/timeline.py ``Timeline`` to record the run's batches into (the
    first repeat's, with repeats)."""
    if cfg.repeats > 1:
        from sim.repeats import run_repeats

        return run_repeats(cfg, trace, timeline)
    cfg.validate()
    try:
        spec = get_spec(cfg.model)
    except KeyError as e:
        raise ConfigError("config", "model", str(e.args[0])) from None
    profile = load_profile(cfg.profile, cfg.model)
    if trace is None:
        trace = load_run_trace(cfg)
    if cfg.is_pd:  # prefill and decode pools (sim/fleet/pd.py)
        from sim.fleet.pd_run import run_pd

        return run_pd(cfg, trace, spec, profile, timeline)
    if cfg.is_fleet:  # replicas behind a router (sim/fleet)
        from sim.fleet.run import run_fleet

        return run_fleet(cfg, trace, spec, profile, timeline)
    gaps = trace.gaps(cfg.gaps)
    policy = cfg.make_policy()
    strategy = parse_context(cfg.context)
    context = None if strategy.is_full else ContextRun(strategy, trace, cfg.block_size)
    sessions = trace.sessions
    rec = RunRecorder([s.id for s in sessions], [s.first for s in sessions],
                      [s.parent >= 0 for s in sessions],
                      [s.shared_prefix_blocks for s in sessions])
    env = simpy.Environment()
    bind_policy(env, cfg, spec, profile, policy, sessions)
    server = ENGINES[cfg.engine].build(env, cfg, spec, profile, policy, rec)
    if timeline is not None:
        timeline.use_clock(lambda: env.now)
        rec.observe(timeline.track(0, lambda: (len(server.waiting), len(server.running))))
    bar = current_progress()  # observes replies only (sim/report/progress.py)
    replay = Replay(env, trace, server, gaps, trace.start_offsets(cfg.gaps), cfg.sessions,
                    cfg.time_scale, context,
                    on_reply=bar.advance if bar.counts("requests") else None,
                    max_concurrency=cfg.max_concurrency)
    driver = env.process(replay.closed_loop() if cfg.replay == "closed" else replay.open_loop())
    env.run(until=driver)
    server.close()
    table = rec.table()
    summary = rec.summary(env.now, cfg.block_size, table)
    summary.update(run_fields(cfg, policy, profile, spec, trace, table))
    summary.update(answer_fields(cfg, profile, table, summary, set(rec.session_end)))
    if cfg.vllm_patch != "none":  # only then: unpatched summaries stay as they were
        summary["vllm_patch"] = cfg.vllm_patch
        summary.update(server.patch_summary())
    if context is not None:  # only then: results under ``full`` stay exactly as they were
        summary.update(context_summary(strategy, table, rec.counters, env.now,
                                       server.cache.working_peak_blocks * cfg.block_size,
                                       cfg.block_size))
    return RunResult(cfg, table, summary)


RESULT_FILES = ("requests.parquet", "config.json", "summary.json", "load.parquet",
                "routing.parquet", "pd_transfers.parquet")
# What ``kvsim run --out`` and ``kvsim plot`` write at the top of a run folder.
RUN_FOLDER_FILES = ("runs.json", "ttft_cdf.png", "change_vs_first.png")
RUN_FOLDER_PLOTS = "replica_load_*.png"  # a fleet run's per-replica load, one per policy


def clear_run_outputs(out: str | Path) -> list[str]:
    """Remove a previous ``kvsim run``'s outputs from ``out`` so that a reused folder holds
    only the new run: its runs.json and plots, every child folder that holds nothing but
    ``write_result`` files (a policy folder), and the temporary files of a killed run
    (``sim.io.is_tmp_name``) in both. Anything else stays. Returns what was removed (the
    temporary files are not named)."""
    out = Path(out)
    removed = []
    for child in sorted(out.iterdir()) if out.is_dir() else []:
        if child.is_dir() and not child.is_symlink():
            names = [f.name for f in child.iterdir()]
            results = [n for n in names if not is_tmp_name(n)]
            if names and set(results) <= set(RESULT_FILES) and (
                    not results or {"requests.parquet", "summary.json"} & set(results)):
                for name in names:
                    (child / name).unlink()
                child.rmdir()
                if results:
                    removed.append(child.name + "/")
        elif child.is_file() and (child.name in RUN_FOLDER_FILES or is_tmp_name(child.name)
                                  or child.match(RUN_FOLDER_PLOTS)):
            child.unlink()
            if not is_tmp_name(child.name):
                removed.append(child.name)
    return removed


def write_result(result: RunResult, out: str | Path) -> None:
    """requests.parquet, config.json, then summary.json under ``out`` (each atomically)."""
    out = Path(out)
    atomic_write_parquet(result.requests, out / "requests.parquet")
    for name, df in result.tables.items():  # a fleet's load.parquet
        atomic_write_parquet(df, out / f"{name}.parquet")
    atomic_write_text(out / "config.json", json.dumps(result.config.to_dict(), indent=2) + "\n")
    # Last: a sweep takes a folder with summary.json as a finished point.
    atomic_write_text(out / "summary.json", dumps(result.summary) + "\n")
