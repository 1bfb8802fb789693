"""Start-up of ``kvsim`` as a user runs it (issue 55 item 2): ``kvsim --help``, ``kvsim
models`` and a small run, whole process, and the small run's time to its first request.
Goal: ``kvsim --help`` under 0.3 s wall on a quiet machine.

    python -m benchmarks.bench_startup [--runs 7] [--tree DIR ...] [--json]

Each case is a fresh interpreter running what the ``kvsim`` script runs (``from
sim.cli.main import main; main()``), ``--runs`` times, the cases interleaved (the machine may
be shared), medians. ``--tree DIR`` (repeatable) times another checkout beside this one, the
same way (``PYTHONPATH=DIR``; e.g. ``git archive REV | tar -x -C DIR`` for an earlier
revision): the before/after of docs/engine.md's Start-up paragraph. Bytecode is cached as in a
user's environment (``PYTHONPYCACHEPREFIX`` in a temporary folder, filled by an untimed run
of each case, whatever ``PYTHONDONTWRITEBYTECODE`` says; without it every run recompiles
kvsim's modules); the trace cache is a temporary folder too (``KVSIM_CACHE_DIR``).

Per case: wall seconds (``perf_counter`` around the child) and CPU seconds (user + system of
the child, ``RUSAGE_CHILDREN``): CPU is the steadier figure on a loaded machine. For the run,
also the wall and CPU seconds until the replay's clock starts (the first call of
``simpy.Environment.run``, the child reports it): imports, checks, the trace load and the
servers built. Also a bare interpreter (``python -c pass``: the floor) and ``import sim``.
The machine's load (``os.getloadavg``) is printed before and after, and which path each tree
runs (compiled core or Python source, ``sim.native``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN = ["run", "--trace", "synthetic:claude-code?sessions=4", "--max-context", "32k", "--gaps",
       "tool", "--sessions", "2", "--gpu-cache", "64k", "--preset", "sglang", "--json"]
CASES: dict[str, list[str] | None] = {
    "python -c pass": None, "import sim": None,
    "kvsim --help": ["--help"], "kvsim models": ["models"], "kvsim run (small)": RUN}
GOAL_S = 0.3  # kvsim --help, wall, quiet machine

# What the kvsim script runs; the run case also reports when the replay's clock starts.
LAUNCH = "import sys\nsys.argv[0] = 'kvsim'\nfrom sim.cli.main import main\nmain()\n"
FIRST = ("import sys, time, resource, simpy\n_run = simpy.Environment.run\n"
         "def _first(self, *a, **k):\n"
         "    if _first.wall is None:\n"
         "        r = resource.getrusage(resource.RUSAGE_SELF)\n"
         "        _first.wall = time.time()\n"
         "        print(f'FIRST-REQUEST {_first.wall!r} {r.ru_utime + r.ru_stime!r}', "
         "file=sys.stderr, flush=True)\n"
         "    return _run(self, *a, **k)\n"
         "_first.wall = None\nsimpy.Environment.run = _first\n")


def argv_of(case: str) -> list[str]:
    args = CASES[case]
    if case == "python -c pass":
        return [sys.executable, "-c", "pass"]
    if case == "import sim":
        return [sys.executable, "-c", "import sim"]
    assert args is not None
    return [sys.executable, "-c", (FIRST if args is RUN else "") + LAUNCH, *args]


def once(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """One run: wall and CPU seconds, and for the run its first request's."""
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0, t0 = time.time(), time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, cwd="/")
    wall = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode:
        raise SystemExit(f"{' '.join(argv[-3:])} failed ({res.returncode}): {res.stderr[-800:]}")
    out = {"wall_s": wall, "cpu_s": c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime}
    for line in res.stderr.splitlines():
        if line.startswith("FIRST-REQUEST "):
            at, cpu = line.split()[1:]
            out["first_request_wall_s"] = float(at) - w0
            out["first_request_cpu_s"] = float(cpu)
    return out


def path_of(env: dict[str, str]) -> str:
    """Compiled core or Python source, and why (``sim.native.decide``)."""
    res = subprocess.run([sys.executable, "-W", "ignore", "-c",
                          "from sim import native; print(native.decide()[1])"],
                         env=env, capture_output=True, text=True, check=True, cwd="/")
    return res.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tree", action="append", default=[], type=Path,
                    help="another checkout to time beside this one (repeatable)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    trees = {"this": REPO, **{str(t): t.resolve() for t in args.tree}}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kvsim-startup-") as tmp:
        envs = {}
        for i, (name, root) in enumerate(trees.items()):
            env = {**os.environ, "PYTHONPATH": str(root),
                   "KVSIM_CACHE_DIR": str(Path(tmp) / f"traces{i}"),
                   "PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache")}
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            envs[name] = env
        paths = {name: path_of(env) for name, env in envs.items()}
        for env in envs.values():  # untimed: bytecode and trace cache filled
            for case in CASES:
                once(argv_of(case), env)
        samples: dict[tuple[str, str], list[dict[str, float]]] = {
            (t, c): [] for t in trees for c in CASES}
        for _ in range(args.runs):
            for case in CASES:
                for name, env in envs.items():
                    samples[name, case].append(once(argv_of(case), env))
    load1 = os.getloadavg()
    rows = []
    for (tree, case), runs in samples.items():
        row: dict[str, object] = {"tree": tree, "case": case}
        for key in runs[0]:
            row[key] = statistics.median(r[key] for r in runs)
        rows.append(row)
    doc = {"runs": args.runs, "cores": os.cpu_count(), "load_before": load0,
           "load_after": load1, "paths": paths, "goal_help_wall_s": GOAL_S, "rows": rows}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"load average before {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, after "
          f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} ({os.cpu_count()} cores); medians of "
          f"{args.runs} interleaved runs")
    for name, why in paths.items():
        print(f"  {name}: {trees[name]} ({why})")
    print(f"{'tree':<24} {'case':<18} {'wall s':>7} {'CPU s':>7} {'1st req wall':>13} "
          f"{'1st req CPU':>12}")
    for r in rows:
        first = (f"{r['first_request_wall_s']:>13.3f} {r['first_request_cpu_s']:>12.3f}"
                 if "first_request_wall_s" in r else "")
        print(f"{str(r['tree'])[-24:]:<24} {r['case']:<18} {r['wall_s']:>7.3f} "
              f"{r['cpu_s']:>7.3f} {first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
