"""A million requests on one server: time and peak memory of generating and running a synthetic
Claude Code trace of about 1M requests (target: peak RSS under 2 GiB).

    python -m benchmarks.bench_million [--json] [--sessions 28600]

The trace is ``synthetic:claude-code?sessions=N`` (about 35 requests per session, so the
default is about 1M requests), replayed on one server (penelope preset, --max-context 128k,
a 256K-token cache, 8 concurrent sessions, tool gaps) in a fresh interpreter so the peak is
its own: ``VmHWM`` of /proc/self/status (the process's peak resident set). Rows give the
requests, the seconds to generate the trace, the simulation's wall and CPU seconds, ms per
request and the peak in MiB. ``--sessions`` scales it down (a tenth: ``--sessions 2860``).
Figures (2-core shared box): docs/engine.md, Simulator speed on the pressured setup.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SESSIONS = 28600
TARGET_MIB = 2048

_CHILD = """
import json, sys, time

def peak_rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")
from sim.config import RunConfig
from sim.run import load_run_trace, run
cfg = RunConfig.from_flat(trace=f"synthetic:claude-code?sessions={int(sys.argv[1])}",
                          max_context=131072, gpu_cache=262144, sessions=8,
                          gaps="tool").with_preset("penelope")
t0 = time.perf_counter(); tr = load_run_trace(cfg); load_s = time.perf_counter() - t0
load_mib = peak_rss_mib()
c0, t0 = time.process_time(), time.perf_counter()
res = run(cfg, tr)
print(json.dumps({"requests": res.summary["requests"], "load_s": load_s, "load_peak_mib": load_mib,
                  "run_s": time.perf_counter() - t0, "run_cpu_s": time.process_time() - c0,
                  "peak_rss_mib": peak_rss_mib()}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=SESSIONS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.sessions < 1:
        ap.error(f"--sessions: must be at least 1, got {args.sessions}")
    out = subprocess.run([sys.executable, "-c", _CHILD, str(args.sessions)], cwd=REPO,
                         capture_output=True, text=True, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(sessions=args.sessions, ms_per_request=1e3 * row["run_s"] / row["requests"],
               cpu_ms_per_request=1e3 * row["run_cpu_s"] / row["requests"],
               under_target=row["peak_rss_mib"] < TARGET_MIB)
    if args.json:
        print(json.dumps(row, indent=2))
        return 0
    print(f"synthetic:claude-code?sessions={args.sessions}: {row['requests']:,} requests; "
          f"trace {row['load_s']:.1f} s (peak {row['load_peak_mib']:.0f} MiB); run "
          f"{row['run_s']:.1f} s wall, {row['run_cpu_s']:.1f} s CPU "
          f"({row['cpu_ms_per_request']:.3f} CPU ms/request); peak RSS "
          f"{row['peak_rss_mib']:.0f} MiB ({'under' if row['under_target'] else 'OVER'} the "
          f"{TARGET_MIB} MiB target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
