"""``kvsim run``'s report: each run's summary beside the first run's, as terminal tables."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from .tables import MAX_WIDTH, fmt_mean

if TYPE_CHECKING:
    from sim.run import RunResult

# Summary metrics shown in the table and compared against the first run (lower is better
# except the hit rate).
COMPARED = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "jct_mean_s", "hit_rate",
            "recomputed_tokens", "recompute_units", "queue_wait_mean_s",
            "preempted_recompute_tokens", "preempted_recompute_units",
            "tpot_mean_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p90_s")
# What users quote beside TTFT (sim/engines/recorder.py latency_fields, sim/run/summary.py
# answer_fields).
THROUGHPUT_ROWS = ("output_tokens_per_s", "total_tokens_per_s", "gpus",
                   "output_tokens_per_s_per_gpu")
# Rows of runs with --slo (sim/slo.py).
GOODPUT_ROWS = ("slo_attainment", "goodput_rps", "goodput_rps_per_gpu",
                "goodput_sessions_per_h", "slo_met")


def change(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a != a or b != b or a == 0:
        return None
    return b / a - 1.0


def compare_runs(results: list[RunResult]) -> list[dict[str, Any]]:
    first = results[0].summary
    out = []
    for r in results:
        c = r.config
        out.append({
            "policy": c.policy_label, "policy_spec": c.policy_spec, "engine": c.engine_label,
            "policy_params": c.policy.policy_params, "scheduler": c.policy.scheduler,
            "tiering": c.cache.tiering,
            "summary": r.summary,
            "change_vs_first": {k: change(first.get(k), r.summary.get(k)) for k in COMPARED},
        })
    return out


# Rows shown only when some run has a non-zero value (--lenient skips, drops).
WHEN_NONZERO = ("dropped_requests", "aborted", "over_context_requests", "trace_skipped_files",
                "trace_skipped_records")


LENIENT_ROWS = ("trace_skipped_files", "trace_skipped_records")
# Rows of runs under a context strategy (--context; absent under full).
CONTEXT_ROWS = ("request_latency_mean_s", "request_latency_p95_s", "input_tokens_per_s",
                "output_tokens_per_s", "kv_peak_tokens", "context_dropped_tokens",
                "reprefill_tokens", "rerotated_tokens", "summary_calls",
                "context_edits_blocked")
# Rows of fleet runs (--replicas/--router; sim/fleet/results.py fleet_metrics defines them).
FLEET_ROWS = ("reuse_available", "reuse_captured", "reuse_delivered", "affinity",
              "load_cv_busy", "load_cv_queue", "belief_error_mean_tokens", "idle_replicas")
# Rows of disaggregated runs (--prefill-replicas/--decode-replicas; sim/fleet/pd_run.py
# pd_summary): the TTFT's parts (means over the remotely prefilled requests), what moved
# and how busy the links and pools were.
PD_ROWS = ("pd_gpus", "prefilled_locally_share", "prealloc_wait_s_mean", "prealloc_waited",
           "prefill_s_mean", "transfer_queue_s_mean", "transfer_s_mean",
           "first_decode_s_mean", "transfer_bytes", "link_busy_share_max",
           "prefill_pool_busy_share", "decode_pool_busy_share", "decode_retractions",
           "recomputed_output_tokens_share", "idle_replicas")
# Rows of runs with a shared pool (--pool; sim/fleet/pooltier.py FleetPool.summary).
POOL_ROWS = ("pool_hit_rate", "pool_fetched_tokens", "pool_refused_fetches", "pool_fetch_s",
             "pool_bandwidth_utilization")


def within_interval(a: dict[str, Any], b: dict[str, Any], key: str) -> bool:
    """Whether two repeated runs' means of ``key`` differ by no more than their 95%
    intervals together (the intervals overlap): the tables mark such a change ``~``."""
    ca, cb = a.get(f"{key}_ci95"), b.get(f"{key}_ci95")
    va, vb = a.get(key), b.get(key)
    if None in (ca, cb, va, vb) or ca != ca or cb != cb or va != va or vb != vb:
        return False
    return abs(vb - va) <= ca + cb


def run_tables(runs: list[dict[str, Any]], title: str, width: int, lenient: bool = False
               ) -> list[Table]:
    """Metrics in the units every table uses (``fmt_metric``: rates in percent); changes
    against the first run in signed percent, the hit rate's in percentage points (pp). As
    many policies per table as ``width`` columns hold, the first (the baseline) in each."""
    extra = ("cpu_hit_rate", "bytes_h2d", "bytes_d2h", "swap_buffer_loads") if any(
        r["summary"].get("cpu_cache_tokens") for r in runs) else ()
    extra += FLEET_ROWS if any("replicas" in r["summary"] for r in runs) else ()
    extra += POOL_ROWS if any("pool_hit_rate" in r["summary"] for r in runs) else ()
    extra += tuple(k for k in PD_ROWS if k not in extra) if any(
        "pd_gpus" in r["summary"] for r in runs) else ()
    shown = [k for k in WHEN_NONZERO if any(r["summary"].get(k) for r in runs)
             or (lenient and k in LENIENT_ROWS)]
    ctx = CONTEXT_ROWS if any("context" in r["summary"] for r in runs) else ()
    slo = GOODPUT_ROWS if any("slo" in r["summary"] for r in runs) else ()
    keys = (*COMPARED, *THROUGHPUT_ROWS, *slo, *extra, "requests", "retractions",
            "evicted_tokens", *(k for k in ctx if k not in THROUGHPUT_ROWS), *shown)
    cells: list[list[tuple[str, str]]] = []  # per run, per key: (value, its change)
    for i, r in enumerate(runs):
        col = []
        for k in keys:
            s = fmt_mean(k, r["summary"].get(k), r["summary"].get(f"{k}_ci95"))
            ch = r["change_vs_first"].get(k)
            mark = ""
            if i > 0 and ch is not None and within_interval(runs[0]["summary"],
                                                            r["summary"], k):
                mark = "~ "  # the difference is inside the intervals: not a difference
            if i > 0 and k == "hit_rate" and s != "-" and runs[0]["summary"].get(k) is not None:
                mark += f"({100 * (r['summary'][k] - runs[0]['summary'][k]):+.1f} pp)"
            elif i > 0 and ch is not None:
                mark += f"({ch:+.1%})"
            col.append((s, mark.strip()))
        cells.append(col)
    width = min(width, MAX_WIDTH)
    room = width - max(map(len, ("metric", *keys))) - 4
    # A change goes below its value where even the baseline and one run do not fit a line.
    two_lines = any(_col_width(runs[0], cells[0], False) + _col_width(r, col, False) > room
                    for r, col in zip(runs[1:], cells[1:], strict=True))
    widths = [_col_width(r, col, two_lines) for r, col in zip(runs, cells, strict=True)]
    text = [[f"{v}\n{m}" if two_lines and m else f"{v} {m}".strip() for v, m in col]
            for col in cells]
    groups: list[list[int]] = [[0]]
    for i in range(1, len(runs)):
        if len(groups[-1]) > 1 and sum(widths[j] for j in (*groups[-1], i)) > room:
            groups.append([0])
        groups[-1].append(i)
    repeats = max(int(r["summary"].get("repeats") or 1) for r in runs)
    tables = []
    for g, group in enumerate(groups):
        t = Table(title=title if g == 0 else None, caption=(
            f"mean ±95% interval of {repeats} repeats (no ± where they agree); ~ within "
            "the intervals" if repeats > 1 and g == len(groups) - 1 else None),
            caption_justify="left")
        t.add_column("metric", no_wrap=True)
        for i in group:
            t.add_column(runs[i]["policy"], justify="right", no_wrap=True)
        for row, k in enumerate(keys):
            t.add_row(k, *(text[i][row] for i in group))
        tables.append(t)
    return tables


def _col_width(run: dict[str, Any], col: list[tuple[str, str]], two_lines: bool) -> int:
    """A run's column in characters, with the 3 of its border and padding."""
    cells = [max(len(v), len(m)) if two_lines else len(f"{v} {m}".strip()) for v, m in col]
    return max(len(run["policy"]), *cells) + 3
