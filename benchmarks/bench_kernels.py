"""Time of one model's whole ``kvsim calibrate --from-kernels`` fit on one core.

Each model runs in a fresh child process pinned to one CPU (``os.sched_setaffinity``) with
one BLAS/OpenMP thread, so the time includes importing kvsim, reading and validating the
parquet tables (cold: no cache shared between models), composing every grid point and both
fits. Budget (issue 14): under 30 s per model.
``python -m benchmarks.bench_kernels [--system S] [--models m1,m2] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

BUDGET_S = 30.0

_CHILD = r"""
import json, os, sys, time
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
t0, c0 = time.perf_counter(), time.process_time()
from calibration.kernels.run import calibrate_from_kernels
prof, rep = calibrate_from_kernels(sys.argv[1], sys.argv[2])
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "holdout_median_abs_rel_error": rep["fit"]["holdout_median_abs_rel_error"]}))
"""


def measure(system: str, model: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _CHILD, system, model], capture_output=True,
                         text=True, check=True, env=env)
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    from costmodel.specs import model_names

    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_kernels")
    ap.add_argument("--system", default="h100_sxm")
    ap.add_argument("--models", default=",".join(model_names()))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = {m: measure(args.system, m) for m in args.models.split(",")}
    worst = max(r["wall_s"] for r in rows.values())
    if args.json:
        print(json.dumps({"system": args.system, "budget_s": BUDGET_S, "models": rows}))
    else:
        print(f"{'model':18s} {'wall s':>8s} {'cpu s':>8s}  (one core, cold; budget "
              f"{BUDGET_S:.0f} s)")
        for m, r in rows.items():
            print(f"{m:18s} {r['wall_s']:8.2f} {r['cpu_s']:8.2f}")
    return 0 if worst < BUDGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
