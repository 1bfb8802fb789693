"""Engine speed and memory: replay all shared cc-traces sessions at N = 8, one configuration
per fresh subprocess so peak RSS is its own.

    python -m benchmarks.bench_engine [--json] [--cases 128k,512k] [--trace DIR]
    python -m benchmarks.bench_engine --cases 128k --engine sglang,vllm --repeat 3
    python -m benchmarks.bench_engine --cases 128k --policy ttl,tlru,... [--scheduler S]
    python -m benchmarks.bench_engine --cases 128k --against c9547e1 --repeat 3
    python -m benchmarks.bench_engine --cases pressured --against 8f628e0 --engine sglang,vllm
    python -m benchmarks.bench_engine --cases pressured --engine sglang,vllm --repeat 5

Cases: ``128k`` = --max-context 128k with a 256K-token cache; ``512k`` = --max-context 512k
with a 1M-token cache (both with the recorded gaps, where pressure is low). Goal: at most 30 s
each on one core, under 2 GiB peak RSS. ``pressured`` = the paper's pressured setup, ``kvsim run
--max-context 128k --shared-prefix 15.6k --gaps cap:10 --gpu-cache 256k --sessions 8`` (12,790
requests; nearly every prefill chunk evicts): goal at least 2,000 requests/s end to end. Without
the shared traces it runs on a synthetic stand-in of similar pressure (``STANDIN``; the 128k
and 512k cases are skipped). ``fleet8`` = the pressured setup on a fleet: 8 replicas (each a
256K-token cache) behind ``dynamo-kv`` with 64 concurrent sessions. Trace loading is timed
separately from the simulation; ``total`` is the whole child process (interpreter start,
imports, trace load from its cache, run), the ``end to end`` of a ``kvsim run`` without
writing results.

Variants: every engine of ``--engine`` (default sglang) x (``--preset`` and every policy of
``--policy``). Each is run ``--repeat`` times, interleaved (the machine may be shared:
interleaving exposes all to the same load); each row reports the median wall and CPU seconds
of the simulation and its ratio to the first variant (the first engine with ``--preset``).
Issue targets: vllm engine / sglang engine <= 1.5; each zoo policy / penelope <= 2.

``--against REV`` checks REV out in a temporary git worktree and runs the same case there,
interleaved with this checkout's runs, and reports each run and the ratio of the medians
(per engine of ``--engine``). Each side says which path it ran: this checkout the compiled
core where the install or ``make core`` built it (sim/native.py; ``KVSIM_PURE=1`` times the Python
path), a worktree always Python (it has no build).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "cc-traces"
# case -> (max_context, gpu_cache, gaps, shared_prefix); None: the config's default
CASES = {"128k": (131072, 262144, "recorded", None), "512k": (524288, 1048576, "recorded", None),
         "pressured": (131072, 262144, "cap:10", "15974"),
         "fleet8": (131072, 262144, "cap:10", "15974")}
# case -> (replicas, router, sessions) of a fleet case (the others: one server, 8 sessions)
FLEETS = {"fleet8": (8, "dynamo-kv", 64)}
# The pressured case's trace when the shared traces are absent: ~4,100 requests, ~31% hits,
# ~44K tokens recomputed per request (the real set: 19%, ~61K), about the same CPU per request.
STANDIN = "synthetic:claude-code?sessions=120"

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
try:
    from sim.run import load_run_trace, run
except ImportError:  # a revision before sim/run/ (--against)
    from sim.runner import load_run_trace, run
try:  # which path the simulator runs (sim/native.py, before it sim/kvcache's, else Python)
    try:
        from sim import native
    except ImportError:
        from sim.kvcache import native
    core = "compiled" if native.current()[0] else "python"
except ImportError:
    core = "python"
PRESETS = ("sglang", "vllm", "penelope")
trace, max_ctx, cache, policy, profile, engine, scheduler, gaps, shared = sys.argv[1:10]
replicas, router, sessions = int(sys.argv[10]), sys.argv[11], int(sys.argv[12])
extra = {}  # only what was asked: older revisions (--against) lack newer fields
if router:
    extra.update(replicas=replicas, router=router)
if shared:
    extra["shared_prefix"] = shared if shared == "auto" else int(shared)
if engine:
    extra["engine"] = engine
if scheduler:
    extra["scheduler"] = scheduler
# a revision before the config sections (--against) builds its flat RunConfig directly
make = getattr(RunConfig, "from_flat", RunConfig)
cfg = make(trace=trace, max_context=int(max_ctx), gpu_cache=int(cache), sessions=sessions,
           gaps=gaps, profile=profile or None, **extra)
cfg = cfg.with_preset(policy) if policy in PRESETS else cfg.with_policy(policy)
t0 = time.perf_counter(); tr = load_run_trace(cfg); t_load = time.perf_counter() - t0
c0 = time.process_time(); t0 = time.perf_counter(); res = run(cfg, tr)
t_run = time.perf_counter() - t0; c_run = time.process_time() - c0
print(json.dumps({"core": core, "requests": res.summary["requests"], "load_s": t_load,
                  "run_s": t_run, "run_cpu_s": c_run, "ttft_mean_s": res.summary["ttft_mean_s"],
                  "hit_rate": res.summary["hit_rate"], "peak_rss_mib": peak_rss_mib()}))
"""


def case_trace(trace: str, name: str) -> str | None:
    """The trace a case replays: ``trace`` when present, else the pressured case's stand-in
    (None: the case is skipped)."""
    if Path(trace).exists():
        return trace
    return STANDIN if name in ("pressured", "fleet8") else None


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_case(trace: str, name: str, policy: str, tree: Path = REPO, profile: str | None = None,
             engine: str | None = None, scheduler: str | None = None) -> dict:
    max_ctx, cache, gaps, shared = CASES[name]
    if shared and trace.startswith("synthetic:"):
        shared = "auto"  # the synthetic sessions' system + tool prefix
    replicas, router, sessions = FLEETS.get(name, (1, "", 8))
    args = [trace, str(max_ctx), str(cache), policy, profile or "", engine or "",
            scheduler or "", gaps, shared or "", str(replicas), router, str(sessions)]
    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True,
                         cwd=tree, check=True)
    total_s, total_cpu_s = time.perf_counter() - t0, _children_cpu_s() - cpu0
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(case=name, preset=policy, engine=engine or "sglang", max_context=max_ctx,
               gpu_cache=cache, scheduler=scheduler or "default", trace=trace,
               total_s=total_s, total_cpu_s=total_cpu_s)
    return row


def _supported(args: argparse.Namespace, engine: str | None, policy: str,
               scheduler: str | None) -> bool:
    """False (with a note on stderr) for a variant the engine refuses, e.g. a zoo policy on
    the vllm engine."""
    from sim.config import ConfigError, RunConfig

    fields = {"engine": engine} if engine else {}
    if scheduler:
        fields["scheduler"] = scheduler
    cfg = RunConfig.from_flat(**fields)
    cfg = cfg.with_preset(policy) if policy in ("sglang", "vllm", "penelope") \
        else cfg.with_policy(policy)
    try:
        cfg.validate()
    except (ConfigError, ValueError) as e:
        print(f"skipped {engine or 'sglang'} x {policy}: {e}", file=sys.stderr)
        return False
    return True


TIMES = ("run_s", "run_cpu_s", "total_s", "total_cpu_s")  # medians over the repeats


def _cases(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(case, trace) of every case that runs (a note on stderr for a skipped one)."""
    out = []
    for case in args.cases.split(","):
        trace = case_trace(args.trace, case)
        if trace is None:
            print(f"skipped {case}: {args.trace} not present", file=sys.stderr)
        else:
            out.append((case, trace))
    return out


def _medians(row: dict, runs: list[dict]) -> dict:
    """``row`` with the median of each of ``TIMES`` over ``runs`` and the request rates."""
    row.update({k: statistics.median(r[k] for r in runs) for k in TIMES})
    row.update(runs_s=[r["run_s"] for r in runs], runs_cpu_s=[r["run_cpu_s"] for r in runs],
               requests_per_s=row["requests"] / row["run_s"],
               requests_per_s_end_to_end=row["requests"] / row["total_s"],
               requests_per_cpu_s=row["requests"] / row["run_cpu_s"])
    return row


def variant_rows(args: argparse.Namespace) -> list[dict]:
    """Every (engine, policy) variant per case, ``--repeat`` times interleaved; medians."""
    engines = args.engine.split(",") if args.engine else [None]
    policies = [(args.preset, None)] + [(p, args.scheduler) for p in args.policy.split(",") if p]
    variants = [v for v in ((e, p, s) for e in engines for p, s in policies)
                if _supported(args, *v)]
    rows = []
    for case, trace in _cases(args):
        runs: dict[int, list[dict]] = {i: [] for i in range(len(variants))}
        for _ in range(max(1, args.repeat)):
            for i, (engine, policy, sched) in enumerate(variants):
                runs[i].append(run_case(trace, case, policy, profile=args.profile,
                                        engine=engine, scheduler=sched))
        first = None
        for i in range(len(variants)):
            row = _medians(dict(runs[i][-1]), runs[i])
            first = first or row
            row.update(ratio=row["run_s"] / first["run_s"],
                       cpu_ratio=row["run_cpu_s"] / first["run_cpu_s"])
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--cases", default="128k,512k,pressured")
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
    # the children run in other folders (--against: a worktree of REV); a path given relative
    # to where the benchmark was started means that folder
    if Path(args.trace).exists():
        args.trace = str(Path(args.trace).resolve())
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)}; expected some of {', '.join(CASES)}")
    if args.against:
        return compare(args)
    rows = variant_rows(args)
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
        return 0
    print(f"{'case':>9} {'engine':>7} {'policy':>14} {'requests':>9} {'load s':>7} "
          f"{'run s':>7} {'cpu s':>6} {'ratio':>6} {'req/s':>7} {'total s':>8} "
          f"{'e2e req/s':>9} {'peak MiB':>9} {'TTFT s':>8} {'hit':>6}")
    for r in rows:
        print(f"{r['case']:>9} {r['engine']:>7} {r['preset'][:14]:>14} {r['requests']:>9} "
              f"{r['load_s']:>7.1f} {r['run_s']:>7.2f} {r['run_cpu_s']:>6.2f} "
              f"{r['ratio']:>6.2f} {r['requests_per_s']:>7.0f} {r['total_s']:>8.2f} "
              f"{r['requests_per_s_end_to_end']:>9.0f} {r['peak_rss_mib']:>9.0f} "
              f"{r['ttft_mean_s']:>8.3f} {r['hit_rate']:>6.1%}")
    if any(r["trace"] != args.trace for r in rows):
        print(f"(pressured: the synthetic stand-in {STANDIN})")
    return 0


def compare(args: argparse.Namespace) -> int:
    """This checkout against ``args.against``, interleaved, per case."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvsim-bench-") as tmp:
        other = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(other),
                        args.against], check=True, capture_output=True)
        try:
            out = []
            engines = args.engine.split(",") if args.engine else [None]
            for (case, trace), engine in ((c, e) for c in _cases(args) for e in engines):
                runs: dict[str, list[dict]] = {"this": [], args.against: []}
                for _ in range(max(1, args.repeat)):
                    sides = (("this", REPO, args.profile),
                             (args.against, other, args.against_profile or args.profile))
                    for side, tree, profile in sides:
                        runs[side].append(run_case(trace, case, args.preset, tree, profile,
                                                   engine=engine))
                med = {k: _medians(dict(v[-1]), v) for k, v in runs.items()}
                this, that = med["this"], med[args.against]
                out.append({"case": case, "preset": args.preset, "trace": trace,
                            "engine": engine or "sglang",
                            "runs_s": {k: v["runs_s"] for k, v in med.items()},
                            "runs_cpu_s": {k: v["runs_cpu_s"] for k, v in med.items()},
                            "medians": {k: {t: v[t] for t in TIMES} for k, v in med.items()},
                            "requests": this["requests"],
                            "cores": {k: v["core"] for k, v in med.items()},
                            "ratio": this["run_s"] / that["run_s"],
                            "cpu_ratio": this["run_cpu_s"] / that["run_cpu_s"],
                            "total_ratio": this["total_s"] / that["total_s"],
                            "same_ttft": this["ttft_mean_s"] == that["ttft_mean_s"]})
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(other)], check=False, capture_output=True)
    if args.json:
        print(json.dumps({"rows": out}, indent=2))
        return 0
    for r in out:
        print(f"{r['case']} {r['engine']} {r['preset']} ({r['requests']:,} requests, "
              f"{r['trace']}):")
        for side, m in r["medians"].items():
            runs = ", ".join(f"{t:.2f}" for t in r["runs_s"][side])
            side = f"{side} ({r['cores'][side]})"
            print(f"  {side:>19}: run {m['run_s']:.2f} s ({runs}), CPU {m['run_cpu_s']:.2f} s, "
                  f"total {m['total_s']:.2f} s, {r['requests'] / m['total_s']:,.0f} req/s "
                  f"end to end")
        print(f"  ratio {r['ratio']:.2f} (CPU {r['cpu_ratio']:.2f}, total "
              f"{r['total_ratio']:.2f}); same mean TTFT: {r['same_ttft']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
