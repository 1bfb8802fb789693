"""``kvsim trace stats``: characterize a trace; ``--compare`` shows two side by side.

``trace_options`` (sim/cli/common.py: the config fields declared ``loader``) is the shared set of
trace-reading options (every command that reads a trace uses it) and ``load_from_options`` turns
their values into a ``Trace``.
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from traces import REGION_NAMES, load_trace

from .common import console, emit_json, trace_options


def load_from_options(spec: str | list[str], trace_format: str | None, block_size: int,
                      shared_prefix: int | str | None, max_context: int | None,
                      select: str | None, lenient: bool, seed: int,
                      trace_cache_dir: str | None = None, rebuild_sessions: bool = False,
                      **_: Any) -> Any:
    from traces.cache import resolve_cache_dir
    from traces.load import check_shared_prefix

    from .common import trace_load_progress

    with trace_load_progress():
        trace = load_trace(spec, format=trace_format, block_size=block_size,
                           shared_prefix=shared_prefix, max_context=max_context, select=select,
                           seed=seed, lenient=lenient, cache_dir=resolve_cache_dir(trace_cache_dir),
                           rebuild_sessions=rebuild_sessions)
    return check_shared_prefix(trace, shared_prefix)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if abs(v) < 1 and v != 0:
            return f"{v:.4f}"
        return f"{v:,.1f}" if v != int(v) else f"{int(v):,}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


ROWS: list[tuple[str, tuple[str, ...]]] = [
    ("sessions", ("sessions",)),
    ("main-agent requests", ("requests",)),
    ("sub-agent sessions", ("subagent_sessions",)),
    ("sub-agent requests", ("subagent_requests",)),
    ("skipped records", ("skipped",)),
    ("skipped files", ("options", "skipped_files")),
    ("prompt tokens median", ("prompt_tokens", "median")),
    ("prompt tokens p90", ("prompt_tokens", "p90")),
    ("prompt tokens max", ("prompt_tokens", "max")),
    ("first prompt median", ("first_prompt_tokens_median",)),
    ("output tokens median", ("output_tokens", "median")),
    ("append-only fraction", ("append_only_fraction",)),
    ("shrink fraction", ("shrink_fraction",)),
    ("append tokens median", ("append_tokens_median",)),
    ("infinite-cache hit, full blocks (kvsim)", ("infinite_cache_block_hit_rate",)),
    ("infinite-cache hit, full blocks, all tokens", ("infinite_cache_hit_rate",)),
    ("infinite-cache hit, file's hash ids", ("hash_id_hit_rate",)),
    ("shared prefix tokens (median)", ("shared_prefix", "tokens_median")),
    ("system+tool tokens (median)", ("shared_prefix", "prefix_hint_tokens_median")),
    ("tool gap median (s)", ("gap_s", "tool_median")),
    ("human gap median (s)", ("gap_s", "human_median")),
    ("tool-gap fraction", ("gap_s", "tool_fraction")),
    ("requests/session median", ("requests_per_session", "median")),
    ("requests/session mean", ("requests_per_session", "mean")),
    ("requests/session max", ("requests_per_session", "max")),
    ("session duration median (s)", ("session_duration_s_median",)),
    ("distinct blocks", ("distinct_blocks",)),
    ("block references", ("block_references",)),
]


def _region_cell(d: dict, name: str) -> str:
    """'prompt share / distinct share' of one region."""
    r = d.get("regions") or {}
    a = (r.get("prompt_share") or {}).get(name)
    b = (r.get("distinct_share") or {}).get(name)
    return "-" if a is None or b is None else f"{a:.3f} / {b:.3f}"


def _get(d: dict, path: tuple[str, ...]) -> Any:
    for k in path:
        d = d.get(k) if isinstance(d, dict) else None
    return d


@click.group("trace")
def trace_cmd() -> None:
    """Trace tools: characterize real and synthetic traces."""


@trace_cmd.command("stats")
@click.argument("paths", nargs=-1, required=True)
@trace_options
@click.option("--compare", "compare", default=None, metavar="PATH2",
              help="A second trace (same options) printed side by side.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def stats_cmd(paths: tuple[str, ...], compare: str | None, as_json: bool,
              gaps: str, **opts: Any) -> None:
    """Sessions, requests, prompt/output sizes, append-only fraction, infinite-cache hit rates,
    shared prefix, tool and human gaps, and region shares (of all prompt tokens / of distinct
    blocks) of PATH (files, a folder, or synthetic:NAME).

    Two infinite-cache figures: kvsim's over full prompt blocks at --block-size (what the
    engines can cache: a partial last block never is), and the file's own over every hash id
    it lists, partial last blocks included (what Mooncake and Dynamo quote for their traces)."""
    from traces.stats import trace_stats

    traces = [load_from_options(list(paths), **opts)]
    if compare:
        traces.append(load_from_options(compare, **opts))
    docs = [trace_stats(t, gap_model=gaps) for t in traces]
    if as_json:
        emit_json(docs[0] if len(docs) == 1 else {"traces": docs})
        return
    t = Table(title=f"kvsim trace stats (gaps: {gaps})")
    t.add_column("")
    for d in docs:
        t.add_column(f"{d['name']} ({d['format']})", justify="right")
    for label, path in ROWS:
        t.add_row(label, *[_fmt(_get(d, path)) for d in docs])
    for name in REGION_NAMES:  # shares of prompt tokens / of distinct blocks' tokens
        t.add_row(f"region {name} (prompts / distinct)", *[_region_cell(d, name) for d in docs])
    console().print(t)
