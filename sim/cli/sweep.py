"""``kvsim sweep CONFIG.yaml --out DIR``: a grid of runs on a local pool or a Ray cluster."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click

from sim.report.sweeps import sweep_tables

from .common import console, emit_json, stderr


def print_table(df: Any, varied: list[str], title: str, lenient: bool = False) -> None:
    con = console()
    for i, t in enumerate(sweep_tables(df, varied, title, lenient)):
        if i:
            con.print()
        con.print(t)


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
    from sim.report.progress import progress
    from sim.sweep import grid_columns, load_sweep, run_sweep

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
    varied = grid_columns(sweep.points[0].values if sweep.points else {})
    print_table(df, varied, f"kvsim sweep {config} ({len(df)} points)",
                lenient=any(p.cfg.traffic.lenient for p in sweep.points))
    stderr.print(f"wrote {out}/results.parquet and results.csv ({len(df)} points)")
