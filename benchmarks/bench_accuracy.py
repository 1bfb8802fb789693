"""``kvsim reproduce accuracy --json`` once: wall, CPU seconds, replays, and which path ran.

Issue 53's benchmark: the study (sim/studies/accuracy.py: every shipped ground-truth run,
uncalibrated and leave-one-out, 126 replays) within two minutes. It runs in a child process;
CPU seconds are the child's and its pool workers' (``RUSAGE_CHILDREN``), so they hold on a
loaded machine where wall does not: the load average before and after is printed beside
them. ``--pure`` runs the Python path (``KVSIM_PURE=1``, sim/native.py) where the compiled
core is built; ``--against FILE`` checks the document equals a saved one but for its
``seconds`` (a refactor must not move a number). Not run in tests.
``python -m benchmarks.bench_accuracy [--quick] [--pure] [--against FILE] [--json]``

Measured (docs/accuracy.md, ``kvsim reproduce accuracy``): on a shared 2-core machine, 126
replays: compiled core 29-32 CPU-s, 32 s wall at load 3.7-4.5 and 62 s at 5.6-6.0; Python
path 57-62 CPU-s, 74 s wall at load 0.3-2.9 and 110 s at 3.7-5.2.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the child runs this checkout's kvsim


def measure(quick: bool = False, pure: bool = False) -> tuple[dict, dict]:
    """One study in a child process: (wall, CPU seconds, path, load; the document)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if pure:
        env["KVSIM_PURE"] = "1"
    code = ("import sys, sim.native as n; from sim.cli.main import main; "
            "print('compiled' if n.COMPILED_ACTIVE else 'python', file=sys.stderr); "
            "sys.argv = ['kvsim', 'reproduce', 'accuracy', '--json'] + sys.argv[1:]; main()")
    before = os.getloadavg()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code, *(["--quick"] if quick else [])],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode:
        raise SystemExit(f"bench_accuracy: kvsim reproduce accuracy failed:\n{res.stderr}")
    doc = json.loads(res.stdout)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    path = res.stderr.splitlines()[0] if res.stderr else "?"
    return ({"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "replays": doc["replays"],
             "path": path, "quick": quick, "load_before": round(before[0], 2),
             "load_after": round(os.getloadavg()[0], 2)}, doc)


def same_document(a: dict, b: dict) -> bool:
    """Equal but for the wall time each records."""
    def strip(d: dict) -> str:
        return json.dumps({k: v for k, v in d.items() if k != "seconds"}, sort_keys=True)
    return strip(a) == strip(b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_accuracy")
    ap.add_argument("--quick", action="store_true", help="one fit iteration")
    ap.add_argument("--pure", action="store_true", help="the Python path (KVSIM_PURE=1)")
    ap.add_argument("--against", metavar="FILE", help="a saved --json document to equal")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    row, doc = measure(args.quick, args.pure)
    if args.against:
        row["identical"] = same_document(doc, json.loads(Path(args.against).read_text()))
    if args.json:
        print(json.dumps(row))
    else:
        print("  ".join(f"{k} {v}" for k, v in row.items()))
    return 0 if row.get("identical", True) else 1


if __name__ == "__main__":
    sys.exit(main())
