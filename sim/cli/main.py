"""The ``kvsim`` command: the one place that knows every package. Each subcommand lives in
its own module; add one line per command to ``COMMANDS``. A command's module is imported
when that command runs (or ``--help`` lists it), so ``kvsim capacity`` does not load the
timed run, sweeps, plots or calibration (issue 55 start-up)."""

from __future__ import annotations

import importlib

import click

from .common import KvsimGroup

# name -> (module under sim.cli, its click command)
COMMANDS = {
    "models": ("models", "models_cmd"),
    "calibrate": ("calibrate", "calibrate_cmd"),
    "microbench": ("microbench", "microbench_cmd"),
    "run": ("run", "run_cmd"),
    "sweep": ("sweep", "sweep_cmd"),
    "plan": ("plan", "plan_cmd"),
    "plot": ("plot", "plot_cmd"),
    "reproduce": ("reproduce", "reproduce_cmd"),
    "trace": ("trace", "trace_cmd"),
    "capacity": ("capacity", "capacity_cmd"),
    "validate": ("validate", "validate_cmd"),
}


class LazyGroup(KvsimGroup):
    """``KvsimGroup`` whose commands are imported by name, at their first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(f"{__package__}.{module}"),
                                     attr), cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvsim")
@click.option("--debug", is_flag=True,
              help="Show the whole traceback of an error (also accepted after the command).")
def cli(debug: bool) -> None:
    """kvsim: what a KV-cache eviction policy costs on real coding-agent traffic."""


def main() -> None:
    cli()
