"""Engine speed and memory (issue 5): replay all shared cc-traces sessions at N = 8 under
penelope, one configuration per fresh subprocess so peak RSS is its own.

    python -m benchmarks.bench_engine [--json] [--cases 128k,512k] [--trace DIR]
    python -m benchmarks.bench_engine --cases 128k --against c9547e1 --repeat 3
    python -m benchmarks.bench_engine --cases 128k --policy ttl,tlru,... [--scheduler S]

``--against REV`` checks REV out in a temporary git worktree and runs the same case there,
interleaved with this checkout's runs (the machine may be shared: interleaving exposes both to
the same load), and reports each run and the ratio of the medians (this / REV).

``--policy NAME[,NAME...]`` times any registered policy (the zoo: ``ttl,tlru,greedydual,
memdecay,clairvoyant,random``) beside ``--preset``, every run ``--repeat`` times, interleaved;
the ``ratio`` column is each policy's median run time over the preset's.

Cases: ``128k`` = --max-context 128k with a 256K-token cache; ``512k`` = --max-context 512k
with a 1M-token cache. Goal: at most 30 s each on one core, under 2 GiB peak RSS. Trace
loading is timed separately from the simulation.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "cc-traces"
CASES = {"128k": (131072, 262144), "512k": (524288, 1048576)}

_CHILD = """
import json, sys, time

def peak_rss_mib():
    # VmHWM is per address space, so it restarts at exec (ru_maxrss would carry the
    # parent's peak over a fork + exec).
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")
from sim.config import RunConfig
from sim.runner import load_run_trace, run
trace, max_ctx, cache, preset = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
profile = sys.argv[5] or None
extra = {"scheduler": sys.argv[6]} if len(sys.argv) > 6 else {}
cfg = RunConfig(trace=trace, max_context=max_ctx, gpu_cache=cache, sessions=8,
                gaps="recorded", profile=profile, **extra)
# presets the old way (older revisions, --against), any other policy by name
cfg = cfg.with_preset(preset) if preset in ("sglang", "vllm", "penelope") \
    else cfg.with_policy(preset)
t0 = time.perf_counter(); tr = load_run_trace(cfg); t_load = time.perf_counter() - t0
t0 = time.perf_counter(); res = run(cfg, tr); t_run = time.perf_counter() - t0
print(json.dumps({"requests": res.summary["requests"], "load_s": t_load, "run_s": t_run,
                  "requests_per_s": res.summary["requests"] / t_run,
                  "ttft_mean_s": res.summary["ttft_mean_s"], "hit_rate": res.summary["hit_rate"],
                  "peak_rss_mib": peak_rss_mib()}))
"""


def run_case(trace: str, name: str, preset: str, tree: Path = REPO,
             profile: str | None = None, scheduler: str | None = None) -> dict:
    max_ctx, cache = CASES[name]
    sched = [scheduler] if scheduler else []
    out = subprocess.run([sys.executable, "-c", _CHILD, trace, str(max_ctx), str(cache), preset,
                          profile or "", *sched], capture_output=True, text=True, cwd=tree,
                         check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(case=name, preset=preset, max_context=max_ctx, gpu_cache=cache)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--cases", default="128k,512k")
    ap.add_argument("--preset", default="penelope")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--against", metavar="REV", help="also time git revision REV, interleaved")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per side (--against) or per policy (--policy), interleaved")
    ap.add_argument("--policy", default="",
                    help="comma-separated policies to time beside --preset")
    ap.add_argument("--scheduler", default=None, help="scheduler of the --policy runs")
    ap.add_argument("--profile", default=None, help="time profile (default: the model's)")
    ap.add_argument("--against-profile", default=None,
                    help="profile name at REV (profiles were renamed over time)")
    args = ap.parse_args(argv)
    if not Path(args.trace).exists():
        print(f"skipped: {args.trace} not present")
        return 0
    if args.against:
        return compare(args)
    rows = policy_rows(args)
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
        return 0
    print(f"{'case':>6} {'policy':>12} {'requests':>9} {'load s':>7} {'run s':>7} "
          f"{'ratio':>6} {'req/s':>7} {'peak RSS MiB':>13} {'mean TTFT s':>12} {'hit':>6}")
    for r in rows:
        print(f"{r['case']:>6} {r['preset']:>12} {r['requests']:>9} {r['load_s']:>7.1f} "
              f"{r['run_s']:>7.1f} {r['ratio']:>6.2f} {r['requests_per_s']:>7.0f} "
              f"{r['peak_rss_mib']:>13.0f} {r['ttft_mean_s']:>12.3f} {r['hit_rate']:>6.1%}")
    return 0


def policy_rows(args: argparse.Namespace) -> list[dict]:
    """The preset and every ``--policy``, each ``--repeat`` times, interleaved (noise hits all
    alike); per run the median time and its ratio to the preset's median."""
    import statistics

    runs = [(args.preset, None)] + [(p, args.scheduler) for p in args.policy.split(",") if p]
    rows = []
    for case in args.cases.split(","):
        times: dict[int, list[float]] = {i: [] for i in range(len(runs))}
        last: dict[int, dict] = {}
        for _ in range(max(1, args.repeat)):
            for i, (policy, sched) in enumerate(runs):
                last[i] = run_case(args.trace, case, policy, profile=args.profile,
                                   scheduler=sched)
                times[i].append(last[i]["run_s"])
        base = statistics.median(times[0])
        for i, (_, sched) in enumerate(runs):
            row = last[i]
            row.update(run_s=statistics.median(times[i]), runs_s=times[i],
                       scheduler=sched or "lpm")
            row.update(ratio=row["run_s"] / base, requests_per_s=row["requests"] / row["run_s"])
            rows.append(row)
    return rows


def compare(args: argparse.Namespace) -> int:
    """This checkout against ``args.against``, interleaved, per case."""
    import statistics
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvsim-bench-") as tmp:
        other = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(other),
                        args.against], check=True, capture_output=True)
        try:
            out = []
            for case in args.cases.split(","):
                times: dict[str, list[float]] = {"this": [], args.against: []}
                rows = {}
                for _ in range(args.repeat):
                    sides = (("this", REPO, args.profile),
                             (args.against, other, args.against_profile or args.profile))
                    for side, tree, profile in sides:
                        row = run_case(args.trace, case, args.preset, tree, profile)
                        times[side].append(row["run_s"])
                        rows[side] = row
                med = {k: statistics.median(v) for k, v in times.items()}
                out.append({"case": case, "preset": args.preset, "runs_s": times,
                            "median_s": med, "ratio": med["this"] / med[args.against],
                            "same_ttft": rows["this"]["ttft_mean_s"]
                            == rows[args.against]["ttft_mean_s"]})
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(other)], check=False, capture_output=True)
    if args.json:
        print(json.dumps({"rows": out}, indent=2))
        return 0
    for r in out:
        runs = " ".join(f"{k}: {', '.join(f'{t:.2f}' for t in v)}" for k, v in r["runs_s"].items())
        print(f"{r['case']} {r['preset']}: {runs}  ratio {r['ratio']:.2f}"
              f"  (same mean TTFT: {r['same_ttft']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
