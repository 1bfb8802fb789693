"""``kvsim plot DIR``: PNG plots of a run or sweep directory."""

from __future__ import annotations

import click

from .common import stderr


class PlotInputError(ValueError):
    exit_code = 2


@click.command("plot")
@click.argument("directory", type=click.Path(file_okay=False))
def plot_cmd(directory: str) -> None:
    """TTFT CDFs per policy and bar charts of mean TTFT/JCT change (PNG)."""
    from sim.plots import plot_dir

    try:
        paths = plot_dir(directory)
    except FileNotFoundError as e:
        raise PlotInputError(str(e)) from None
    for p in paths:
        stderr.print(f"wrote {p}")
        click.echo(str(p))
