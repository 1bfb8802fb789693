"""``kvsim sweep CONFIG.yaml --out DIR``: a grid of runs on a local pool or a Ray cluster."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click

from .common import console, emit_json, stderr
from .tables import Col, narrow_table

# Shown only when some point has a non-zero value.
WHEN_NONZERO = ("dropped_requests", "over_context_requests", "trace_skipped_files",
                "trace_skipped_records", "idle_replicas")
METRIC_COLUMNS = [Col("TTFT\nmean (s)", "ttft_mean_s", "s"),
                  Col("TTFT\np90 (s)", "ttft_p90_s", "s"),
                  Col("JCT\nmean (s)", "jct_mean_s", "s"), Col("hit\nrate", "hit_rate", "rate")]
CHANGE_COLUMNS = [Col("TTFT\nchange", "ttft_mean_s_change", "change"),
                  Col("JCT\nchange", "jct_mean_s_change", "change"),
                  Col("hit rate\nchange", "hit_rate", "pp", minus="baseline_hit_rate")]


def print_table(df: Any, varied: list[str], title: str, lenient: bool = False) -> None:
    """Per point its metrics, then (with a baseline) its changes against it: rates in
    percent, changes in signed percent, the hit rate's in points (sim/cli/tables.py); counts
    of drops and --lenient skips when any point has some (the skips always under lenient)."""
    keys = [Col("policy", "policy"), *(Col(f, f) for f in varied)]
    counts = [Col(c, c, "int") for c in WHEN_NONZERO if c in df.columns and (
        (df[c].fillna(0) != 0).any() or (lenient and c.startswith("trace_skipped")))]
    rows = df.to_dict("records")
    con = console()
    con.print(narrow_table(title, [*keys, *(c for c in METRIC_COLUMNS if c.key in df.columns)],
                           rows))
    if "ttft_mean_s_change" in df.columns:
        for r in rows:  # the baseline point's hit rate, from the relative change tidy wrote
            c = r.get("hit_rate_change")
            r["baseline_hit_rate"] = (r["hit_rate"] / (1 + c) if c is not None and c == c
                                      and c != -1 else None)
        con.print()
        con.print(narrow_table("change against the baseline point", [*keys, *CHANGE_COLUMNS],
                               rows))
    if counts:
        con.print()
        con.print(narrow_table("dropped requests, skipped records, idle replicas",
                               [*keys, *counts], rows))


def warn_drops(df: Any) -> None:
    """One warning line per point that dropped requests, with the reasons, and per fleet
    point that left replicas without a request."""
    for row in df.to_dict("records"):
        idle = row.get("idle_replicas")
        if idle and idle == idle:
            stderr.print(f"[yellow]warning:[/yellow] point {row['point']} ({row['policy']}): "
                         f"{int(idle):,} of {int(row['replicas']):,} replicas served no "
                         f"request (router {row['router']})")
        n = row.get("dropped_requests") or 0
        if not n:
            continue
        why = [f"{row[k]:,} {label}" for k, label in (
            ("dropped_over_context", "with a prompt above the model's context"),
            ("dropped_cache_too_small", "that cannot fit the cache")) if row.get(k)]
        every = "; EVERY request was dropped" if not row.get("requests") else ""
        stderr.print(f"[yellow]warning:[/yellow] point {row['point']} ({row['policy']}): "
                     f"dropped {n:,} requests: {', '.join(why)}{every}")


@click.command("sweep")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--out", "-o", required=True,
              help="Output folder: points/<id>/ per point, results.parquet/.csv; rerun the "
                   "same command to resume.")
@click.option("-j", "--jobs", type=click.IntRange(min=0), default=None,
              help="Local: parallel processes (1 = in this process). Ray: tasks in flight "
                   "(0 = no cap). [default: the config's executor.jobs, else 1]")
@click.option("--executor", type=click.Choice(["local", "ray"]), default=None,
              help="Where points run: a local process pool or Ray tasks. [default: the "
                   "config's executor.kind, else local]")
@click.option("--address", default=None, metavar="ADDR",
              help="Ray: the cluster to join (auto, ray://HOST:10001); default: start a "
                   "local Ray for this sweep.")
@click.option("--retries", type=click.IntRange(min=0), default=None,
              help="Times a point whose worker died runs again. [default: 3]")
@click.option("--json", "as_json", is_flag=True,
              help="Print the results table as one JSON document.")
def sweep_cmd(config: str, out: str, jobs: int | None, executor: str | None,
              address: str | None, retries: int | None, as_json: bool) -> None:
    """Run every point of CONFIG's grid; skip finished points; write results.parquet/.csv.

    The YAML format, resume and running on a Ray cluster: docs/sweeps.md."""
    from sim.io import check_out_dir
    from sim.progress import progress
    from sim.sweep import COLUMN, POLICY_FIELDS, load_sweep, run_sweep

    sweep = load_sweep(config)  # every check before any work: fields, profiles, baseline
    check_out_dir(out)
    spec = sweep.executor
    spec = replace(spec, kind=executor or spec.kind, address=address or spec.address,
                   jobs=spec.jobs if jobs is None else jobs,
                   max_retries=spec.max_retries if retries is None else retries)
    if spec.address and spec.kind != "ray":
        raise click.UsageError("--address is for --executor ray")
    if not sweep.has_grid:
        stderr.print(f"{config} has no grid: running one point (the base config)")
    ex = spec.make()
    try:
        with progress(f"kvsim sweep ({ex.name})", "points", len(sweep.points), stderr) as bar:
            reports = iter([bar.resume])  # the first report: points finished before this run

            def report(done: int, total: int) -> None:
                next(reports, bar.update)(done, total)

            df = run_sweep(sweep, out, ex, progress=report)
    finally:
        ex.close()
    warn_drops(df)
    if as_json:
        emit_json({"config": config, "out": out, "rows": df.to_dict("records")})
        return
    varied = [COLUMN.get(k, k) for k in (sweep.points[0].values if sweep.points else {})
              if k not in POLICY_FIELDS]
    print_table(df, varied, f"kvsim sweep {config} ({len(df)} points)",
                lenient=any(p.cfg.lenient for p in sweep.points))
    stderr.print(f"wrote {out}/results.parquet and results.csv ({len(df)} points)")
