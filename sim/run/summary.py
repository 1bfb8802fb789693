"""The result of every run, whatever its kind (``summarize``: one assembly for one server, a
fleet and PD pools): the recorder's metrics over the run's requests table, the configuration
fields beside them (``run_fields``), the answers in GPUs and SLOs (``answer_fields``), then
the fields the kind adds (sim/run/kinds.py ``serve``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from policies import EvictionPolicy
from sim.config import RunConfig
from sim.deploy import deployment_fields
from sim.engines import ENGINES
from sim.engines.columns import ColumnTable, frame
from sim.engines.recorder import RunRecorder
from sim.slo import slo_fields

from .result import RunResult

if TYPE_CHECKING:  # pandas where a table is read as a DataFrame, never by a run (issue 55)
    import pandas as pd


@dataclass
class Served:
    """What a kind of run served (sim/run/kinds.py ``serve``), all ``summarize`` reads of it;
    ``seed_drawn``: whether its front (a router, a PD rule) drew from the decision seed."""

    rec: RunRecorder
    table: ColumnTable | pd.DataFrame
    fields: dict[str, Any]
    tables: dict[str, ColumnTable | pd.DataFrame]
    seed_drawn: bool


def reads_seed(policy: type) -> bool:
    """A policy that may read the decision seed: one that says so, or a user's file."""
    return policy.uses_seed or not policy.__module__.startswith("policies.")


def run_fields(cfg: RunConfig, policy: EvictionPolicy, profile, spec, trace,
               table: ColumnTable | pd.DataFrame) -> dict[str, Any]:
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
        "over_context_requests": int(((np.asarray(table["prompt_tokens"]) > spec.max_context)
                                      & ~np.asarray(table["dropped"]).astype(bool)).sum())
        if len(table) else 0,
    } | ({"model_config_sha256": spec.config_sha256} if spec.config_sha256 else {}) \
        | ENGINES[cfg.engine.name].summary_fields(cfg)


def answer_fields(cfg: RunConfig, profile, table: ColumnTable | pd.DataFrame,
                  summary: dict[str, Any],
                  completed_sessions: set[int], parents: list[int]) -> dict[str, Any]:
    """GPUs used, rates per GPU and, with an SLO, goodput (sim/deploy.py, sim/slo.py);
    ``parents``: each session's parent session (-1: a job), as the trace says."""
    out = deployment_fields(cfg, profile)
    gpus = out["gpus"]
    out["output_tokens_per_s_per_gpu"] = summary["output_tokens_per_s"] / gpus
    out["total_tokens_per_s_per_gpu"] = summary["total_tokens_per_s"] / gpus
    if cfg.slo is not None:
        out.update(slo_fields(cfg.slo, frame(table), summary, completed_sessions, gpus,
                              parents))
    return out


def recompute_by_group(spec, ranges: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """``ranges`` (recomputed ``[a, b)``) priced per KV cache group of ``spec`` (the run's
    pricing spec, ``Profile.pricing_spec``): per group its kind, layers, window, the
    recomputed tokens (every group computes each of them) and its attention units by the
    group's own formula (costmodel/units.py with the other kinds weighted 0: one source of
    truth; in the profile's one-rate units, as ``recompute_units``). Groups of one kind share
    a weight, so they are priced together (no catalog model has two windows of one kind)."""
    from costmodel.units import range_units

    tokens = sum(b - a for a, b in ranges)
    weights = dict(spec.attention_weights)
    kinds = list(dict.fromkeys(str(g.kind) for g in spec.groups))
    out = []
    for kind in kinds:
        only = spec.with_attention_weights(
            {k: (weights.get(k, 1.0) if k == kind else 0.0) for k in kinds})
        mine = [g for g in spec.groups if str(g.kind) == kind]
        out.append({"kind": kind, "layers": sum(g.layers for g in mine),
                    "window": mine[0].window, "tokens": tokens,
                    "attention_units": float(sum(range_units(only, a, b).attention
                                                 for a, b in ranges))})
    return out


def summarize(built, served: Served) -> RunResult:
    """The result of ``built`` (a kind of run, sim/run/kinds.py) from what it ``served``: the
    recorder's summary over the run's requests, the configuration fields, the answers, then
    the kind's own fields; its tables."""
    cfg, spec, trace = built.cfg, built.spec, built.trace
    rec, table = served.rec, served.table
    summary = rec.summary(built.env.now, cfg.cache.block_size, table)
    # recompute per KV cache group, each by its own formula (``spec``: the run's pricing spec,
    # each kind at its rate; issue 54 item 5)
    summary["recompute_by_group"] = recompute_by_group(spec, rec.recomputed_ranges)
    summary.update(run_fields(cfg, built.policies[0], built.profile, spec, trace, table))
    summary.update(answer_fields(cfg, built.profile, table, summary, set(rec.session_end),
                                 [s.parent for s in trace.sessions]))
    summary.update(served.fields)
    # the run's own policies (another made here would be one more instance of a user's class)
    drew = served.seed_drawn or any(reads_seed(type(p)) for p in built.policies)
    return RunResult(cfg, table, summary, served.tables, drew)
