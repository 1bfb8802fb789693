"""Speed of context strategies against ``full`` (issue 16): the 360 shared cc-traces sessions
cut at 128K, 8 sessions at once, a 256K-token cache, each run in a fresh subprocess, runs of
the strategies interleaved (``full``, ``drop:4``, ``full``, ``drop:4``, ...) so that a noisy,
shared machine slows both alike. Goal: ``drop:4`` within 2x of ``full``.

    python -m benchmarks.bench_context [--contexts full,drop:4] [--repeat 2] [--preset P]
                                       [--trace DIR] [--json]

Reports per run the simulation's wall and CPU seconds (trace loading apart), and per strategy
the ratio of its median CPU time to ``full``'s (CPU time is what another process on the
machine disturbs least).
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

_CHILD = """
import json, sys, time
from sim.config import RunConfig
from sim.run import load_run_trace, run
trace, context, preset = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = RunConfig.from_flat(trace=trace, max_context=131072, gpu_cache=262144, sessions=8,
                gaps="recorded", context=context).with_preset(preset)
tr = load_run_trace(cfg)
w0, c0 = time.perf_counter(), time.process_time()
res = run(cfg, tr)
wall, cpu = time.perf_counter() - w0, time.process_time() - c0
s = res.summary
print(json.dumps({"requests": s["requests"], "wall_s": wall, "cpu_s": cpu,
                  "ttft_mean_s": s["ttft_mean_s"]}))
"""


def run_case(trace: str, context: str, preset: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, trace, context, preset],
                         capture_output=True, text=True, cwd=REPO, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(context=context, preset=preset)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--contexts", default="full,drop:4")
    ap.add_argument("--preset", default="penelope")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not Path(args.trace).exists():
        print(f"skipped: {args.trace} not present")
        return 0
    contexts = [c.strip() for c in args.contexts.split(",")]
    rows = [run_case(args.trace, c, args.preset)
            for _ in range(args.repeat) for c in contexts]
    med = {c: statistics.median(r["cpu_s"] for r in rows if r["context"] == c)
           for c in contexts}
    base = med.get("full")
    ratios = {c: (med[c] / base if base else None) for c in contexts}
    if args.json:
        print(json.dumps({"rows": rows, "median_cpu_s": med, "ratio_to_full": ratios},
                         indent=2))
        return 0
    print(f"{'context':>14} {'preset':>9} {'requests':>9} {'wall s':>7} {'cpu s':>7} "
          f"{'mean TTFT s':>12}")
    for r in rows:
        print(f"{r['context']:>14} {r['preset']:>9} {r['requests']:>9} {r['wall_s']:>7.2f} "
              f"{r['cpu_s']:>7.2f} {r['ttft_mean_s']:>12.3f}")
    for c in contexts:
        ratio = f"{ratios[c]:.2f}x full" if ratios[c] is not None else ""
        print(f"{c:>14}: median CPU {med[c]:.2f} s {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
