"""Reports: what the commands show a person (terminal tables, progress, PNG plots).

===========  ============================================  ===================================
module       owns                                          in -> out
===========  ============================================  ===================================
tables.py    one unit convention for every table; narrow   rows (dicts) + columns -> Table
             tables that fit 100 columns (``Col``)
runs.py      ``kvsim run``'s comparison of runs            RunResults -> rows -> Tables
sweeps.py    ``kvsim sweep``'s tables of the tidy table    DataFrame -> Tables
plots.py     PNGs of run, sweep and capacity folders       files -> PNG files
fleet_load   a fleet's per-replica load heatmap            load.parquet -> PNG
plan.py      ``kvsim plan``'s tables and plot              plan document -> Tables, PNG
progress.py  progress bars and log lines on stderr; the    "done" reports -> stderr
             work reports, the tracker only observes
===========  ============================================  ===================================

May import: ``sim.io``, ``sim.sweep`` (a sweep's column names), rich and matplotlib; never the
CLI (the commands print what these build). The run, the sweep and the studies report progress
to ``progress.current()``; nothing flows back from a report into a result.
"""
