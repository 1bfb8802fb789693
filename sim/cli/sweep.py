"""``kvsim sweep CONFIG.yaml --out DIR [-j N]``: a grid of runs in parallel processes."""

from __future__ import annotations

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from .common import console, stderr


@click.command("sweep")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--out", "-o", required=True, help="Output directory (resumable).")
@click.option("-j", "--jobs", type=int, default=1, show_default=True, help="Parallel processes.")
def sweep_cmd(config: str, out: str, jobs: int) -> None:
    """Run every point of CONFIG's grid; skip finished points; write results.parquet/.csv."""
    from sim.sweep import LocalPoolExecutor, SerialExecutor, load_sweep, run_sweep

    points, _ = load_sweep(config)  # validate before starting any process
    executor = SerialExecutor() if jobs <= 1 else LocalPoolExecutor(jobs)
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=stderr) as bar:
        task = bar.add_task("sweep", total=len(points))
        df = run_sweep(config, out, executor,
                       progress=lambda i, n: bar.update(task, completed=i))
    cols = [c for c in df.columns if c in ("policy", "model", "gpu_cache", "sessions", "trace",
                                           "gaps", "ttft_mean_s", "jct_mean_s", "hit_rate",
                                           "ttft_mean_s_change", "jct_mean_s_change")]
    console().print(df[cols].to_string(index=False))
    stderr.print(f"wrote {out}/results.parquet and results.csv ({len(df)} points)")
