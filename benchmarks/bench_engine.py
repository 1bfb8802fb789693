"""Engine speed and memory (issue 5): replay all shared cc-traces sessions at N = 8 under
penelope, one configuration per fresh subprocess so peak RSS is its own.

    python -m benchmarks.bench_engine [--json] [--cases 128k,512k] [--trace DIR]
    python -m benchmarks.bench_engine --cases 128k --against c9547e1 --repeat 3
    python -m benchmarks.bench_engine --cases 128k --engine sglang,vllm --repeat 3

``--against REV`` checks REV out in a temporary git worktree and runs the same case there,
interleaved with this checkout's runs (the machine may be shared: interleaving exposes both to
the same load), and reports each run and the ratio of the medians (this / REV).

``--engine sglang,vllm`` runs each case on both engines (issue 12), interleaved (sglang,
vllm, sglang, vllm, ... ``--repeat`` times each), and reports the ratio vllm / sglang of the
median wall times and of the median CPU times of the simulation (CPU time is steadier on a
shared machine). Issue 12's target: at most 1.5.

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
engine = {} if len(sys.argv) < 7 else {"engine": sys.argv[6]}  # older revisions: sglang only
cfg = RunConfig(trace=trace, max_context=max_ctx, gpu_cache=cache, sessions=8,
                gaps="recorded", profile=profile, **engine).with_preset(preset)
t0 = time.perf_counter(); tr = load_run_trace(cfg); t_load = time.perf_counter() - t0
c0 = time.process_time(); t0 = time.perf_counter(); res = run(cfg, tr)
t_run = time.perf_counter() - t0; c_run = time.process_time() - c0
print(json.dumps({"requests": res.summary["requests"], "load_s": t_load, "run_s": t_run,
                  "run_cpu_s": c_run,
                  "requests_per_s": res.summary["requests"] / t_run,
                  "ttft_mean_s": res.summary["ttft_mean_s"], "hit_rate": res.summary["hit_rate"],
                  "peak_rss_mib": peak_rss_mib()}))
"""


def run_case(trace: str, name: str, preset: str, tree: Path = REPO,
             profile: str | None = None, engine: str | None = None) -> dict:
    max_ctx, cache = CASES[name]
    args = [trace, str(max_ctx), str(cache), preset, profile or ""] + ([engine] if engine else [])
    out = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True,
                         cwd=tree, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(case=name, preset=preset, engine=engine or "sglang", max_context=max_ctx,
               gpu_cache=cache)
    return row


def engine_ratios(rows: list[dict]) -> list[dict]:
    """Per case: the median wall and CPU seconds of each engine and vllm / sglang."""
    import statistics

    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        wall: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        for r in rows:
            if r["case"] == case:
                wall.setdefault(r["engine"], []).append(r["run_s"])
                cpu.setdefault(r["engine"], []).append(r["run_cpu_s"])
        if {"sglang", "vllm"} <= wall.keys():
            w = {e: statistics.median(v) for e, v in wall.items()}
            c = {e: statistics.median(v) for e, v in cpu.items()}
            out.append({"case": case, "sglang_run_s": w["sglang"], "vllm_run_s": w["vllm"],
                        "ratio": w["vllm"] / w["sglang"], "sglang_cpu_s": c["sglang"],
                        "vllm_cpu_s": c["vllm"], "cpu_ratio": c["vllm"] / c["sglang"]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--cases", default="128k,512k")
    ap.add_argument("--preset", default="penelope")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--against", metavar="REV", help="also time git revision REV, interleaved")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per side (with --against) or per engine (with --engine)")
    ap.add_argument("--engine", default=None, help="comma-separated engines: sglang, vllm")
    ap.add_argument("--profile", default=None, help="time profile (default: the model's)")
    ap.add_argument("--against-profile", default=None,
                    help="profile name at REV (profiles were renamed over time)")
    args = ap.parse_args(argv)
    if not Path(args.trace).exists():
        print(f"skipped: {args.trace} not present")
        return 0
    if args.against:
        return compare(args)
    engines = args.engine.split(",") if args.engine else [None]
    repeat = args.repeat if args.engine else 1
    rows = [run_case(args.trace, c, args.preset, profile=args.profile, engine=e)
            for c in args.cases.split(",") for _ in range(repeat) for e in engines]
    ratios = engine_ratios(rows)
    if args.json:
        print(json.dumps({"rows": rows, "engine_ratios": ratios}, indent=2))
        return 0
    print(f"{'case':>6} {'engine':>7} {'preset':>9} {'requests':>9} {'load s':>7} {'run s':>7} "
          f"{'cpu s':>6} {'req/s':>7} {'peak RSS MiB':>13} {'mean TTFT s':>12} {'hit':>6}")
    for r in rows:
        print(f"{r['case']:>6} {r['engine']:>7} {r['preset']:>9} {r['requests']:>9} "
              f"{r['load_s']:>7.1f} {r['run_s']:>7.1f} {r['run_cpu_s']:>6.1f} "
              f"{r['requests_per_s']:>7.0f} {r['peak_rss_mib']:>13.0f} "
              f"{r['ttft_mean_s']:>12.3f} {r['hit_rate']:>6.1%}")
    for r in ratios:
        print(f"{r['case']}: vllm / sglang = {r['vllm_run_s']:.2f} / {r['sglang_run_s']:.2f} s "
              f"= {r['ratio']:.2f} wall, {r['vllm_cpu_s']:.2f} / {r['sglang_cpu_s']:.2f} s = "
              f"{r['cpu_ratio']:.2f} CPU (medians of {repeat} interleaved runs each)")
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
