"""Engine speed and memory: replay all shared cc-traces sessions at N = 8, one configuration
per fresh subprocess so peak RSS is its own.

    python -m benchmarks.bench_engine [--json] [--cases 128k,512k] [--trace DIR]
    python -m benchmarks.bench_engine --cases 128k --engine sglang,vllm --repeat 3
    python -m benchmarks.bench_engine --cases 128k --policy ttl,tlru,... [--scheduler S]
    python -m benchmarks.bench_engine --cases 128k --against c9547e1 --repeat 3

Cases: ``128k`` = --max-context 128k with a 256K-token cache; ``512k`` = --max-context 512k
with a 1M-token cache. Goal: at most 30 s each on one core, under 2 GiB peak RSS. Trace
loading is timed separately from the simulation.

Variants: every engine of ``--engine`` (default sglang) x (``--preset`` and every policy of
``--policy``). Each is run ``--repeat`` times, interleaved (the machine may be shared:
interleaving exposes all to the same load); each row reports the median wall and CPU seconds
of the simulation and its ratio to the first variant (the first engine with ``--preset``).
Issue targets: vllm engine / sglang engine <= 1.5; each zoo policy / penelope <= 2.

``--against REV`` checks REV out in a temporary git worktree and runs the same case there,
interleaved with this checkout's runs, and reports each run and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
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
PRESETS = ("sglang", "vllm", "penelope")
trace, max_ctx, cache, policy, profile, engine, scheduler = sys.argv[1:8]
extra = {}  # only what was asked: older revisions (--against) lack newer fields
if engine:
    extra["engine"] = engine
if scheduler:
    extra["scheduler"] = scheduler
cfg = RunConfig(trace=trace, max_context=int(max_ctx), gpu_cache=int(cache), sessions=8,
                gaps="recorded", profile=profile or None, **extra)
cfg = cfg.with_preset(policy) if policy in PRESETS else cfg.with_policy(policy)
t0 = time.perf_counter(); tr = load_run_trace(cfg); t_load = time.perf_counter() - t0
c0 = time.process_time(); t0 = time.perf_counter(); res = run(cfg, tr)
t_run = time.perf_counter() - t0; c_run = time.process_time() - c0
print(json.dumps({"requests": res.summary["requests"], "load_s": t_load, "run_s": t_run,
                  "run_cpu_s": c_run, "ttft_mean_s": res.summary["ttft_mean_s"],
                  "hit_rate": res.summary["hit_rate"], "peak_rss_mib": peak_rss_mib()}))
"""


def run_case(trace: str, name: str, policy: str, tree: Path = REPO, profile: str | None = None,
             engine: str | None = None, scheduler: str | None = None) -> dict:
    max_ctx, cache = CASES[name]
    args = [trace, str(max_ctx), str(cache), policy, profile or "", engine or "",
            scheduler or ""]
    out = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True,
                         cwd=tree, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(case=name, preset=policy, engine=engine or "sglang", max_context=max_ctx,
               gpu_cache=cache, scheduler=scheduler or "default")
    return row


def _supported(args: argparse.Namespace, engine: str | None, policy: str,
               scheduler: str | None) -> bool:
    """False (with a note on stderr) for a variant the engine refuses, e.g. a zoo policy on
    the vllm engine."""
    from sim.config import ConfigError, RunConfig

    fields = {"engine": engine} if engine else {}
    if scheduler:
        fields["scheduler"] = scheduler
    cfg = RunConfig(**fields)
    cfg = cfg.with_preset(policy) if policy in ("sglang", "vllm", "penelope") \
        else cfg.with_policy(policy)
    try:
        cfg.validate()
    except (ConfigError, ValueError) as e:
        print(f"skipped {engine or 'sglang'} x {policy}: {e}", file=sys.stderr)
        return False
    return True


def variant_rows(args: argparse.Namespace) -> list[dict]:
    """Every (engine, policy) variant per case, ``--repeat`` times interleaved; medians."""
    engines = args.engine.split(",") if args.engine else [None]
    policies = [(args.preset, None)] + [(p, args.scheduler) for p in args.policy.split(",") if p]
    variants = [v for v in ((e, p, s) for e in engines for p, s in policies)
                if _supported(args, *v)]
    rows = []
    for case in args.cases.split(","):
        wall: dict[int, list[float]] = {i: [] for i in range(len(variants))}
        cpu: dict[int, list[float]] = {i: [] for i in range(len(variants))}
        last: dict[int, dict] = {}
        for _ in range(max(1, args.repeat)):
            for i, (engine, policy, sched) in enumerate(variants):
                last[i] = run_case(args.trace, case, policy, profile=args.profile,
                                   engine=engine, scheduler=sched)
                wall[i].append(last[i]["run_s"])
                cpu[i].append(last[i]["run_cpu_s"])
        base_wall, base_cpu = statistics.median(wall[0]), statistics.median(cpu[0])
        for i in range(len(variants)):
            row = last[i]
            row.update(run_s=statistics.median(wall[i]), run_cpu_s=statistics.median(cpu[i]),
                       runs_s=wall[i])
            row.update(ratio=row["run_s"] / base_wall, cpu_ratio=row["run_cpu_s"] / base_cpu,
                       requests_per_s=row["requests"] / row["run_s"])
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--cases", default="128k,512k")
    ap.add_argument("--preset", default="penelope")
    ap.add_argument("--policy", default="",
                    help="comma-separated policies to time beside --preset")
    ap.add_argument("--scheduler", default=None, help="scheduler of the --policy runs")
    ap.add_argument("--engine", default=None, help="comma-separated engines: sglang, vllm")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--against", metavar="REV", help="also time git revision REV, interleaved")
    ap.add_argument("--repeat", type=int, default=1, help="runs per variant, interleaved")
    ap.add_argument("--profile", default=None, help="time profile (default: the model's)")
    ap.add_argument("--against-profile", default=None,
                    help="profile name at REV (profiles were renamed over time)")
    args = ap.parse_args(argv)
    if not Path(args.trace).exists():
        print(f"skipped: {args.trace} not present")
        return 0
    if args.against:
        return compare(args)
    rows = variant_rows(args)
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
        return 0
    print(f"{'case':>6} {'engine':>7} {'policy':>14} {'requests':>9} {'load s':>7} "
          f"{'run s':>7} {'cpu s':>6} {'ratio':>6} {'req/s':>7} {'peak MiB':>9} "
          f"{'TTFT s':>8} {'hit':>6}")
    for r in rows:
        print(f"{r['case']:>6} {r['engine']:>7} {r['preset'][:14]:>14} {r['requests']:>9} "
              f"{r['load_s']:>7.1f} {r['run_s']:>7.1f} {r['run_cpu_s']:>6.1f} "
              f"{r['ratio']:>6.2f} {r['requests_per_s']:>7.0f} {r['peak_rss_mib']:>9.0f} "
              f"{r['ttft_mean_s']:>8.3f} {r['hit_rate']:>6.1%}")
    return 0


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
