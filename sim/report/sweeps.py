"""``kvsim sweep``'s report: the tidy table's points as narrow terminal tables."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from .tables import Col, narrow_table

# Shown only when some point has a non-zero value.
WHEN_NONZERO = ("dropped_requests", "aborted", "over_context_requests", "trace_skipped_files",
                "trace_skipped_records", "idle_replicas")
METRIC_COLUMNS = [Col("TTFT\nmean (s)", "ttft_mean_s", "s"),
                  Col("TTFT\np90 (s)", "ttft_p90_s", "s"),
                  Col("JCT\nmean (s)", "jct_mean_s", "s"), Col("hit\nrate", "hit_rate", "rate")]
# per-token latency, throughput and goodput (sim/engines/recorder.py, sim/slo.py): shown when
# present
ANSWER_COLUMNS = [Col("TPOT\nmean (ms)", "tpot_mean_s", "ms"),
                  Col("ITL\np99 (ms)", "itl_p99_s", "ms"),
                  Col("output\ntok/s/GPU", "output_tokens_per_s_per_gpu", "per_s"),
                  Col("GPUs", "gpus", "int"),
                  Col("SLO\nmet", "slo_attainment", "rate"),
                  Col("goodput\nreq/s/GPU", "goodput_rps_per_gpu", "float3")]
CHANGE_COLUMNS = [Col("TTFT\nchange", "ttft_mean_s_change", "change"),
                  Col("JCT\nchange", "jct_mean_s_change", "change"),
                  Col("hit rate\nchange", "hit_rate", "pp", minus="baseline_hit_rate")]


def sweep_tables(df: Any, varied: list[str], title: str, lenient: bool = False) -> list[Table]:
    """Per point its metrics, then (with a baseline) its changes against it: rates in
    percent, changes in signed percent, the hit rate's in points (tables.py); counts of drops
    and --lenient skips when any point has some (the skips always under lenient)."""
    keys = [Col("policy", "policy"), *(Col(f, f) for f in varied)]
    counts = [Col(c, c, "int") for c in WHEN_NONZERO if c in df.columns and (
        (df[c].fillna(0) != 0).any() or (lenient and c.startswith("trace_skipped")))]
    rows = df.to_dict("records")
    tables = [narrow_table(title, [*keys, *(c for c in METRIC_COLUMNS if c.key in df.columns)],
                           rows)]
    answers = [c for c in ANSWER_COLUMNS if c.key in df.columns]
    if answers:
        tables.append(narrow_table("per-token latency, throughput and goodput",
                                   [*keys, *answers], rows))
    if "ttft_mean_s_change" in df.columns:
        for r in rows:  # the baseline point's hit rate, from the relative change tidy wrote
            c = r.get("hit_rate_change")
            r["baseline_hit_rate"] = (r["hit_rate"] / (1 + c) if c is not None and c == c
                                      and c != -1 else None)
        tables.append(narrow_table("change against the baseline point",
                                   [*keys, *CHANGE_COLUMNS], rows))
    if counts:
        tables.append(narrow_table("dropped requests, skipped records, idle replicas",
                                   [*keys, *counts], rows))
    return tables
