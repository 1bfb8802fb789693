"""Every peer comparison of issue 55 in one command, both sides of each run side by side:
kvsim against NVIDIA Dynamo's offline replay (``benchmarks/bench_dynamo.py``: Mooncake, 4
workers x 256K tokens, round robin and the KV router, at each engine shape and block size
that benchmark runs) and ``kvsim capacity`` against the C++ ``kvcache-simulator``
(``benchmarks/bench_capacity_peer.py``: the 12-size LRU sweep on the Mooncake trace and a
``--scale`` times larger one).

    python -m benchmarks.bench_peers [--repeat 3] [--scale 3] [--only dynamo,capacity] [--json]

Each benchmark runs in its own interpreter with ``--json``, one after the other (their own
runs interleave kvsim and the peer, medians of ``--repeat``); this prints one table: per
comparison, each side's whole process and simulation-only seconds and kvsim / peer for each,
with the machine's load average (``os.getloadavg``, 1 minute) before and after that
benchmark and its CPU count. What each column holds is the benchmark's own definition (its
docstring): whole process = ``process_s`` (Dynamo's) or the subprocess wall (capacity's);
simulation = the run with the trace loaded (kvsim), ``run_trace_replay`` (Dynamo, which
parses its trace itself) or ``run_cpp_sweep`` (the capacity peer). ``-`` where a benchmark
does not report that figure; a peer that is not installed is named in one line (``make
bench`` installs both) and its comparison left out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BENCHES = ("dynamo", "capacity")


def run_bench(name: str, args: list[str]) -> tuple[dict | None, str, dict]:
    """``benchmarks.bench_<name> --json ARGS`` in a subprocess: its JSON document (None
    when it printed none: a peer missing), what it said besides, and the machine's load
    and wall around it."""
    module = {"dynamo": "benchmarks.bench_dynamo", "capacity": "benchmarks.bench_capacity_peer"}
    load0, t0 = os.getloadavg(), time.perf_counter()
    res = subprocess.run([sys.executable, "-m", module[name], "--json", *args], cwd=REPO,
                         capture_output=True, text=True, check=False)
    around = {"load_before": load0[0], "load_after": os.getloadavg()[0],
              "wall_s": time.perf_counter() - t0, "rc": res.returncode}
    lines = res.stdout.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("{")), None)
    said = "\n".join(lines[:start] if start is not None else lines).strip()
    if res.returncode or start is None:
        return None, (said + "\n" + res.stderr[-600:]).strip(), around
    return json.loads("\n".join(lines[start:])), said, around


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def row(comparison: str, ours: tuple[float | None, float | None],
        theirs: tuple[float | None, float | None], around: dict) -> dict[str, Any]:
    """One comparison: (whole process, simulation) seconds of kvsim and of the peer."""
    return {"comparison": comparison, "kvsim_process_s": ours[0], "peer_process_s": theirs[0],
            "process_ratio": _ratio(ours[0], theirs[0]), "kvsim_sim_s": ours[1],
            "peer_sim_s": theirs[1], "sim_ratio": _ratio(ours[1], theirs[1]),
            "load_before": around["load_before"], "load_after": around["load_after"]}


def dynamo_rows(doc: dict, around: dict) -> list[dict[str, Any]]:
    """Per router and variant of ``bench_dynamo``'s JSON, its kvsim and Dynamo sides."""
    out = []
    for r in doc["rows"]:
        for side in (k for k in r if k.startswith("kvsim-")):
            variant = side.removeprefix("kvsim-")
            theirs = r.get(f"dynamo-{variant}")
            if not isinstance(theirs, dict):
                continue
            ours = r[side]
            engine = "vllm" if variant.startswith("vllm-") else "sglang"
            block = variant.removeprefix("vllm-")
            out.append(row(f"Dynamo replay, {r['router']}, kvsim {engine} "
                           f"({r.get('kvsim_core', '?')}), {block}-token blocks",
                           (ours.get("process_s"), ours["wall_s"]),
                           (theirs.get("process_s"), theirs["wall_s"]), around))
    return out


def capacity_rows(doc: dict, around: dict) -> list[dict[str, Any]]:
    """Per trace of ``bench_capacity_peer``'s JSON: kvsim with its trace cache warm (a
    user's second run) and off (the first run, which parses as the peer always does)."""
    out = []
    for r in doc["results"]:
        peer = (r["wall_s"]["kvcache-simulator"], r["sim_s"]["kvcache-simulator"])
        name = f"capacity 12 LRU sizes, {r['trace']} ({r['requests']:,} requests)"
        out.append(row(f"{name}, trace cache warm", (r["wall_s"]["kvsim"], r["sim_s"]["kvsim"]),
                       peer, around))
        out.append(row(f"{name}, --cache-dir off",
                       (r["wall_s"]["kvsim --cache-dir off"], r["sim_s"]["kvsim"]), peer,
                       around))
    return out


def _s(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'comparison':<72} {'process s':>17} {'ratio':>6} {'simulation s':>17} "
            f"{'ratio':>6} {'load':>9}")
    lines = [head, f"{'':<72} {'kvsim':>8} {'peer':>8} {'':>6} {'kvsim':>8} {'peer':>8}"]
    for r in rows:
        lines.append(
            f"{r['comparison']:<72} {_s(r['kvsim_process_s']):>8} {_s(r['peer_process_s']):>8}"
            f" {_s(r['process_ratio'], '{:.2f}'):>6} {_s(r['kvsim_sim_s']):>8} "
            f"{_s(r['peer_sim_s']):>8} {_s(r['sim_ratio'], '{:.2f}'):>6} "
            f"{r['load_before']:>4.1f}-{r['load_after']:<4.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs per side (median)")
    ap.add_argument("--scale", type=int, default=3, help="copies in capacity's larger trace")
    ap.add_argument("--only", default=",".join(BENCHES),
                    help=f"comparisons to run, comma-separated (default: {','.join(BENCHES)})")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    only = [b for b in args.only.split(",") if b]
    if not only or set(only) - set(BENCHES) or args.repeat < 1 or args.scale < 1:
        ap.error(f"--only: choose from {','.join(BENCHES)}; --repeat and --scale >= 1")
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for name in only:
        extra = (["--repeat", str(args.repeat)] if name == "dynamo"
                 else ["--runs", str(args.repeat), "--scale", str(args.scale)])
        doc, said, around = run_bench(name, extra)
        if said:
            notes.append(f"{name}: {said}")
        if doc is not None:
            rows += (dynamo_rows if name == "dynamo" else capacity_rows)(doc, around)
    if args.json:
        print(json.dumps({"cpus": os.cpu_count(), "rows": rows, "notes": notes}, indent=1))
        return 0
    print(f"kvsim / its peers, medians of {args.repeat} interleaved runs per side; "
          f"{os.cpu_count()} CPUs, load average (1 min) before-after each benchmark")
    print(table(rows))
    for n in notes:
        print(n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
