"""Sweeps: a grid of runs, handed to an executor, resumable, one tidy table at the end.

::

    CONFIG.yaml --points.py--> Sweep [Point ...] --resume.py--> out/points/<id>/ --table.py-->
                               (every check first)   executors.py:  summary.json      results.csv
                                                     here, a pool, Ray

============  ==============================================  ===============================
module        owns                                            in -> out
============  ==============================================  ===============================
points.py     the YAML format and every check before any      CONFIG.yaml -> Sweep
              point runs (fields, sizes, baseline, traces)
identity.py   a point's id (one rule), label and row          RunConfig -> id; summary -> row
resume.py     running the unfinished points, one writer per   Sweep -> points/<id>/ folders
              folder, failures that let the others finish
executors.py  where jobs run: this process, a local pool,     (cfg, arg) jobs -> results
              Ray; worker deaths retried, results unchanged
table.py      the tidy table in grid order, ``*_change``      folders -> DataFrame
plan.py       ``kvsim plan``: rounds of points searched for   trace + SLO -> answers, curves
              the smallest deployment that meets SLOs
plan_runner   a plan's points, each started once proven      requests -> points/<id>/
              needed, on one executor for the whole plan
============  ==============================================  ===============================

May import: ``sim.config``, ``sim.io``, ``sim.checks``, ``sim.run`` (a point is one run),
``traces``, ``policies``; never ``sim.studies``, ``sim.report`` or the CLI. The studies run
their grids on these executors too.
"""

from .executors import EXECUTORS, Executor, ExecutorSpec
from .identity import COLUMN, POLICY_FIELDS, Point, grid_columns, point_id
from .points import SECTIONS, SIZE_FIELDS, Sweep, load_sweep
from .resume import SweepError, point_done, run_point, run_sweep
from .table import CHANGE_METRICS, relative_change, summary_path, tidy

__all__ = ["CHANGE_METRICS", "COLUMN", "EXECUTORS", "POLICY_FIELDS", "SECTIONS", "SIZE_FIELDS",
           "Executor", "ExecutorSpec", "Point", "Sweep", "SweepError", "grid_columns",
           "load_sweep", "point_done", "point_id", "relative_change", "run_point", "run_sweep",
           "summary_path", "tidy"]
