"""``kvsim plot DIR [--out DIR2]``: PNG plots of a run or sweep folder."""

from __future__ import annotations

from pathlib import Path

import click


class PlotInputError(ValueError):
    exit_code = 2


@click.command("plot")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--out", "-o", default=None,
              help="Folder for the PNGs (checked before plotting). [default: DIRECTORY]")
def plot_cmd(directory: str, out: str | None) -> None:
    """TTFT CDFs and changes of a run folder (kvsim run --out); mean TTFT per grid field and
    changes against the baseline of a sweep folder; the plan's curves and pick of a plan
    folder (kvsim plan --out: plan.png). Prints each PNG's path once."""
    from sim.io import check_out_dir
    from sim.report.plots import plot_dir

    if not Path(directory).is_dir():
        raise PlotInputError(f"{directory}: no such folder")
    check_out_dir(directory if out is None else out, "DIRECTORY" if out is None else "--out")
    try:
        paths = plot_dir(directory, out)
    except FileNotFoundError as e:
        raise PlotInputError(str(e)) from None
    for p in paths:
        click.echo(str(p))
