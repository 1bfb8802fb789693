"""``kvsim plan`` on all 360 shared Claude Code sessions, once: wall, CPU seconds, the pick.

The workload of issue 55 (item 4) and of the new-user review (Part A, task 10)::

    kvsim plan ../shared/data/cc-traces --max-context 128k --gaps tool --sessions 32 \\
        --replicas 1..16 --routers session-affinity,sglang-cache-aware,dynamo-kv \\
        --policies sglang,penelope --slo ttft_p90=2s,ttft=5s --repeats 2 -j 2

It runs in a child process into a fresh folder (nothing resumed); CPU seconds are the
child's and its pool workers' (``RUSAGE_CHILDREN``), so they hold on a loaded machine where
wall does not: the load average before and after is printed beside them. Not run in tests.
``python -m benchmarks.bench_plan [--files N] [--jobs J] [--executor ray] [--search S] [--json]``
(``--files N``: the first N trace files only, for a quick look). ``--against REV [--repeat
N]`` also times git revision REV (a temporary worktree given this checkout's compiled core,
which sim/native.py uses only where REV's sources are the same), interleaved this, REV,
REV, this, ..., and reports the medians, their ratios and whether every run gave the same
plan (plan.json but for its figure's path).

Measured (docs/sweeps.md, Plan): on a shared 2-core machine, Python path, both started
together at load 2-9: 646 CPU-s with ``--search bisect`` (41 points in 7 rounds), 202 with
``--search up`` (37 points, 29 stopped early); the same pick (5 x H100, sglang-cache-aware +
penelope) and answers.
``--search bisect`` times the search before issue 55 item 4 (run it beside the default, at
the same load, for a ratio).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the child runs this checkout's kvsim
DATA = ROOT.parent / "shared" / "data" / "cc-traces"
ROUTERS = "session-affinity,sglang-cache-aware,dynamo-kv"


def plan_args(trace: str, out: str, jobs: int, executor: str, search: str) -> list[str]:
    return ["plan", trace, "--search", search, "--max-context", "128k", "--gaps", "tool",
            "--sessions", "32", "--replicas", "1..16", "--routers", ROUTERS, "--policies",
            "sglang,penelope", "--slo", "ttft_p90=2s,ttft=5s", "--repeats", "2", "-j", str(jobs),
            "--executor", executor, "--out", out, "--json"]


def core(tree: Path) -> str:
    """Which path the simulator of checkout ``tree`` runs (sim/native.py)."""
    res = subprocess.run([sys.executable, "-c", "from sim import native; "
                          "print('compiled' if native.current()[0] else 'python')"],
                         capture_output=True, text=True, cwd=tree, env=_env(tree))
    return res.stdout.strip() or f"unknown ({res.stderr.strip()[-200:]})"


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}  # its sources, not the installed ones


def measure(trace: str, jobs: int = 2, executor: str = "local", search: str = "up",
            tree: Path = ROOT) -> dict:
    """One plan of checkout ``tree`` in a child process: wall, CPU seconds (child and
    workers), the pick."""
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        before = os.getloadavg()
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", "from sim.cli.main import main; main()",
                              *plan_args(trace, f"{tmp}/plan", jobs, executor, search)],
                             capture_output=True, text=True, cwd=tree, env=_env(tree))
        wall = time.perf_counter() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if res.returncode != 0:
            raise SystemExit(f"kvsim plan failed ({res.returncode}): {res.stderr[-2000:]}")
        doc = json.loads(res.stdout)
    chosen = doc["chosen"] or {}
    return {"wall_s": round(wall, 2),
            "cpu_s": round(cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime, 2),
            "load_before": [round(x, 2) for x in before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "cpus": os.cpu_count(), "jobs": jobs, "executor": executor, "search": search,
            "points_run": doc["points_run"], "points_stopped": doc.get("points_stopped", 0),
            "rounds": doc["rounds"],
            "pick": {k: chosen.get(k) for k in ("router", "policy", "size", "gpus",
                                                "usd_per_h", "ttft_p90_s", "margin")},
            "answers": {a["question"]: a.get("size") for a in doc["answers"]},
            # the whole document but for where its figure went: the same plan, or not
            "plan": {k: v for k, v in doc.items() if k != "plot"}}


def compare(trace: str, rev: str, repeat: int, jobs: int, executor: str, search: str
            ) -> dict:
    """This checkout against git revision ``rev`` (a temporary worktree with this
    checkout's compiled core, used where its sources are the same at ``rev``:
    sim/native.py checks), interleaved this, rev, rev, this, ... so both see the same
    load; every run, the medians and their ratios, and whether the plans are the same."""
    import shutil
    import statistics

    with tempfile.TemporaryDirectory(prefix="bench-plan-tree-") as tmp:
        other = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(other),
                        rev], check=True, capture_output=True)
        try:
            for built in [*ROOT.glob("sim/**/*.so"), ROOT / "sim" / "core-manifest.json"]:
                if built.exists():
                    shutil.copy2(built, other / built.relative_to(ROOT))
            sides = {"this": ROOT, rev: other}
            runs: dict[str, list[dict]] = {k: [] for k in sides}
            for i in range(max(1, repeat)):
                for side in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
                    runs[side].append(measure(trace, jobs, executor, search, sides[side]))
            cores = {k: core(t) for k, t in sides.items()}
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                            str(other)], check=False, capture_output=True)
    med = {k: {t: statistics.median(r[t] for r in v) for t in ("wall_s", "cpu_s")}
           for k, v in runs.items()}
    plans = [r.pop("plan") for v in runs.values() for r in v]
    return {"runs": runs, "medians": med, "cores": cores,
            "wall_ratio": med["this"]["wall_s"] / med[rev]["wall_s"],
            "cpu_ratio": med["this"]["cpu_s"] / med[rev]["cpu_s"],
            "same_plan": all(p == plans[0] for p in plans)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=0, help="only the first N trace files")
    ap.add_argument("--jobs", "-j", type=int, default=2)
    ap.add_argument("--executor", choices=["local", "ray"], default="local")
    ap.add_argument("--search", choices=["up", "bisect", "full"], default="up",
                    help="kvsim plan --search (bisect: the default before issue 55 item 4)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--against", metavar="REV", help="also time git revision REV, interleaved")
    ap.add_argument("--repeat", type=int, default=2, help="runs per side with --against")
    args = ap.parse_args(argv)
    if not DATA.is_dir():
        print(f"bench_plan: {DATA} not found: skipped")
        return 0
    files = sorted(DATA.glob("*.json.gz"))
    trace = ",".join(map(str, files[:args.files])) if args.files else str(DATA)
    if args.against:
        c = compare(trace, args.against, args.repeat, args.jobs, args.executor, args.search)
        if args.json:
            print(json.dumps(c))
            return 0
        for side, runs in c["runs"].items():
            each = ", ".join(f"{r['wall_s']:.1f} s / {r['cpu_s']:.1f} CPU-s (load "
                             f"{r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f})"
                             for r in runs)
            print(f"{side} ({c['cores'][side]}): median wall {c['medians'][side]['wall_s']:.1f}"
                  f" s, CPU {c['medians'][side]['cpu_s']:.1f} s; runs: {each}")
        print(f"this / {args.against}: wall {c['wall_ratio']:.2f}, CPU {c['cpu_ratio']:.2f}; "
              f"the same plan: {c['same_plan']}")
        return 0
    r = measure(trace, args.jobs, args.executor, args.search)
    r.pop("plan")
    if args.json:
        print(json.dumps(r))
        return 0
    p = r["pick"]
    print(f"kvsim plan --search {r['search']} on {args.files or len(files)} cc-traces sessions "
          f"({r['executor']}, "
          f"-j {r['jobs']}, {r['cpus']} CPUs): wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} "
          f"s; load {r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f}")
    print(f"{r['points_run']} points ({r['points_stopped']} stopped early), {r['rounds']} "
          f"rounds; pick: {p['size']} x "
          f"{p['router']} {p['policy']} ({p['gpus']} GPUs, ${p['usd_per_h']}/h, TTFT p90 "
          f"{p['ttft_p90_s']}, margin {p['margin']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
