"""The run room: one ``run()`` for one server, N replicas behind a router, or a
disaggregated fleet, and the files of its result.

- ``check``: every check of a config before it runs (its own fields, then its engine's,
  context strategy's and fleet's); config -> config or ConfigError.
- ``driver``: ``run``: check, price, load, build the kind, let it serve, assemble;
  in -> out: (trace, config, seed) -> ``RunResult``.
- ``kinds``: the kinds of run (one server, a fleet, a disaggregated fleet): their front, the
  replay, what they served (``Served``); replicas, trace -> requests table, own fields.
- ``build``: the replicas (engine, bound policy, recorder, timeline track); config -> engines.
- ``summary``: the one result assembly of every kind (``summarize``); Served -> RunResult.
- ``repeats``: repeats of a run, their means and 95% intervals; RunResults -> one RunResult.
- ``trace``: the trace a config replays, loaded once per process; config -> Trace.
- ``result``: ``RunResult``, ``write_result``, ``clear_run_outputs``; RunResult -> run folder.

May import: ``sim.config``, ``sim.engines`` (and its recorder), ``sim.fleet``, ``sim.context``,
``sim.replay``, ``sim.deploy``, ``sim.slo``, ``sim.io``, ``policies``, ``costmodel``,
``traces``; never ``sim.report`` (progress arrives as the ``on_reply`` callback), the sweeps,
the studies or the CLI. Nothing below it (engines, fleet) imports it.
"""

from .check import check
from .driver import run
from .result import (
    RESULT_FILES,
    RUN_FOLDER_FILES,
    RUN_FOLDER_PLOTS,
    RunResult,
    clear_run_outputs,
    write_result,
)
from .trace import load_run_trace, trace_loads, trace_options

__all__ = ["RESULT_FILES", "RUN_FOLDER_FILES", "RUN_FOLDER_PLOTS", "RunResult",
           "check", "clear_run_outputs", "load_run_trace", "run", "trace_loads", "trace_options",
           "write_result"]
