"""The ``kvsim`` command: the one place that knows every package. Each subcommand lives in
its own module; add one ``add_command`` line per command."""

from __future__ import annotations

import click

from .calibrate import calibrate_cmd
from .capacity import capacity_cmd
from .common import KvsimGroup
from .microbench import microbench_cmd
from .models import models_cmd
from .plan import plan_cmd
from .plot import plot_cmd
from .reproduce import reproduce_cmd
from .run import run_cmd
from .sweep import sweep_cmd
from .trace import trace_cmd
from .validate import validate_cmd


@click.group(cls=KvsimGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvsim")
@click.option("--debug", is_flag=True,
              help="Show the whole traceback of an error (also accepted after the command).")
def cli(debug: bool) -> None:
    """kvsim: what a KV-cache eviction policy costs on real coding-agent traffic."""


cli.add_command(models_cmd)
cli.add_command(calibrate_cmd)
cli.add_command(microbench_cmd)
cli.add_command(run_cmd)
cli.add_command(sweep_cmd)
cli.add_command(plan_cmd)
cli.add_command(plot_cmd)
cli.add_command(reproduce_cmd)
cli.add_command(trace_cmd)
cli.add_command(capacity_cmd)
cli.add_command(validate_cmd)


def main() -> None:
    cli()
