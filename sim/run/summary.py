"""The summary every run starts from, whatever its kind: the recorder's metrics over the
run's requests table, the configuration fields beside them (``run_fields``) and the answers
in GPUs and SLOs (``answer_fields``). A kind of run adds its own fields after these."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from policies import EvictionPolicy
from sim.config import RunConfig
from sim.deploy import deployment_fields
from sim.engines import ENGINES
from sim.engines.recorder import RunRecorder
from sim.slo import slo_fields

if TYPE_CHECKING:  # pandas where a table is made: none before a run's first request (issue 55)
    import pandas as pd


def run_fields(cfg: RunConfig, policy: EvictionPolicy, profile, spec, trace,
               table: pd.DataFrame) -> dict[str, Any]:
    """The configuration fields a run summary carries beside its metrics."""
    return {
        "policy": policy.label, "model": cfg.cache.model, "profile": profile.name,
        "profile_provenance": profile.provenance, "gpu_cache_tokens": cfg.cache.gpu_cache,
        "cpu_cache_tokens": cfg.cache.cpu_cache, "n_sessions": cfg.traffic.sessions,
        "gaps": cfg.traffic.gaps,
        "scheduler": cfg.policy.scheduler, "engine": cfg.engine.name, "trace": trace.name,
        "trace_requests": len(trace),
        # --lenient: records and whole files the loader skipped
        "trace_skipped_records": int(trace.skipped),
        "trace_skipped_files": int(trace.options.get("skipped_files", 0)),
        # replayed although a real server would refuse them (cut with --max-context)
        "over_context_requests": int(((table["prompt_tokens"] > spec.max_context)
                                      & ~table["dropped"].astype(bool)).sum())
        if len(table) else 0,
    } | ({"model_config_sha256": spec.config_sha256} if spec.config_sha256 else {}) \
        | ENGINES[cfg.engine.name].summary_fields(cfg)


def answer_fields(cfg: RunConfig, profile, table: pd.DataFrame, summary: dict[str, Any],
                  completed_sessions: set[int], parents: list[int]) -> dict[str, Any]:
    """GPUs used, rates per GPU and, with an SLO, goodput (sim/deploy.py, sim/slo.py);
    ``parents``: each session's parent session (-1: a job), as the trace says."""
    out = deployment_fields(cfg, profile)
    gpus = out["gpus"]
    out["output_tokens_per_s_per_gpu"] = summary["output_tokens_per_s"] / gpus
    out["total_tokens_per_s_per_gpu"] = summary["total_tokens_per_s"] / gpus
    if cfg.slo is not None:
        out.update(slo_fields(cfg.slo, table, summary, completed_sessions, gpus, parents))
    return out


def summarize(cfg: RunConfig, rec: RunRecorder, duration_s: float, table: pd.DataFrame,
              policy: EvictionPolicy, profile, spec, trace) -> dict[str, Any]:
    """``rec``'s summary over ``table`` (the run's requests; a fleet's merged recorder), then
    the configuration fields and the answers."""
    summary = rec.summary(duration_s, cfg.cache.block_size, table)
    summary.update(run_fields(cfg, policy, profile, spec, trace, table))
    summary.update(answer_fields(cfg, profile, table, summary, set(rec.session_end),
                                 [s.parent for s in trace.sessions]))
    return summary
