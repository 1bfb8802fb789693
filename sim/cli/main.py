"""The ``kvsim`` command: the one place that knows every package. Each subcommand lives in
its own module; add one entry per command to ``COMMANDS``. A command's module is imported
when that command runs, never to list it: ``kvsim --help`` prints each command's first
sentence from ``COMMANDS`` (tests/test_startup.py holds it to the command's own help) and
loads neither numpy nor pandas, rich or the trace loaders; ``kvsim capacity`` does not load
the timed run, sweeps, plots or calibration (issue 55 start-up)."""

from __future__ import annotations

import gc
import importlib

import click

from .common import KvsimGroup

# name -> (module under sim.cli, its click command, the first sentence of its help: what
# ``kvsim --help`` shows, cut to the terminal's width as click cuts the command's own)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "models": ("models", "models_cmd",
               "Model specs: architecture, shapes, W (Section 2.2), KV cache groups "
               "(docs/hybrid.md) and KV "
               "bytes per token: what one token writes over every group, and per token of a "
               "128K-token request (windowed groups hold only their window; linear-attention "
               "state left out)."),
    "calibrate": ("calibrate", "calibrate_cmd",
                  "Time a decoder stack with MODEL's shapes (random weights) on DEVICE and fit "
                  "a profile, or (--from-kernels SYSTEM) compose MODEL's times from measured "
                  "GPU kernel tables and fit."),
    "microbench": ("microbench", "microbench_cmd", "Microbenchmarks of the cost model."),
    "run": ("run", "run_cmd", "Replay a trace through the simulated server under each policy; "
            "report TTFT, JCT, hits."),
    "sweep": ("sweep", "sweep_cmd", "Run every point of CONFIG's grid; skip finished points; "
              "write results.parquet/.csv."),
    "plan": ("plan", "plan_cmd",
             "Find the smallest and cheapest deployments (replicas x GPU x router x policy) "
             "whose runs of TRACE meet the SLOs, with repeats and 95% intervals "
             "(docs/sweeps.md, Plan)."),
    "plot": ("plot", "plot_cmd",
             "TTFT CDFs and changes of a run folder (kvsim run --out); mean TTFT per grid field "
             "and changes against the baseline of a sweep folder; the plan's curves and pick of "
             "a plan folder (kvsim plan --out: plan.png)."),
    "reproduce": ("reproduce", "reproduce_cmd",
                  "Run a named paper experiment and print ours beside the paper's numbers."),
    "trace": ("trace", "trace_cmd", "Trace tools: characterize real and synthetic traces."),
    "capacity": ("capacity", "capacity_cmd",
                 "Hit rate against cache size for PATH (files, a folder or synthetic:NAME), "
                 "without timing: requests in arrival order, each matched then inserted with "
                 "its output (the cache-only replay of Mooncake's capacity analysis)."),
    "validate": ("validate", "validate_cmd",
                 "Replay measured runs exactly and print, per metric, the measurement, kvsim "
                 "and the signed relative error (kvsim - measured) / measured."),
}


class LazyGroup(KvsimGroup):
    """``KvsimGroup`` whose commands are imported by name, at their first use; its help lists
    them from ``COMMANDS`` without importing one."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr, _ = COMMANDS[cmd_name]
            self.add_command(getattr(importlib.import_module(f"{__package__}.{module}"),
                                     attr), cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing (``Group.format_commands``), with the short help of a command not
        loaded yet made from its sentence in ``COMMANDS``."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = []
        for name in names:
            # a command not loaded yet: its sentence, cut by click as the command's own help
            cmd = self.commands.get(name) or click.Command(name, help=COMMANDS[name][2])
            if not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kvsim")
@click.option("--debug", is_flag=True,
              help="Show the whole traceback of an error (also accepted after the command).")
def cli(debug: bool) -> None:
    """kvsim: what a KV-cache eviction policy costs on real coding-agent traffic."""


def main() -> None:
    """The ``kvsim`` script. Once the command has ended (its files renamed into place, its
    output written; click's ``SystemExit`` carries the exit status through unchanged), the
    collector is frozen: the interpreter's exit then skips collecting what the command left
    (the memoized trace, a run's object graph), a quarter of a second of a fleet run's
    teardown; the OS takes the memory back. Exit handlers (``atexit``, ``weakref.finalize``:
    temporary folders, executors) still run. A process that imports ``cli`` keeps its
    collector."""
    try:
        cli()
    finally:
        gc.freeze()
