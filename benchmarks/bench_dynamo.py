"""kvsim against NVIDIA Dynamo's offline replay on the Mooncake synthetic trace, both routers,
at the same block size on both sides.

    python -m benchmarks.bench_dynamo [--json] [--repeat 3] [--trace PATH] [--peer-python PY]

The same workload on both sides: 4 workers with 256K-token caches behind round robin (Dynamo
``round_robin`` / kvsim ``round-robin``) and the KV router (Dynamo ``kv_router`` / kvsim
``dynamo-kv``), at two block sizes, each the same on both sides: kvsim's default 64 (Dynamo's
mocker engines ``{"engine": {"block_size": 64, "num_gpu_blocks": 4096}}``, the trace's
512-token hashes split in eight as kvsim's loader splits them) and the trace's own 512
(``{"block_size": 512, "num_gpu_blocks": 512}``; kvsim ``block_size=512``), with
``trace_block_size=512`` on Dynamo's side and ``RunConfig.from_flat(trace, replay="open",
gpu_cache=262144, replicas=4, router=R)`` on the sglang preset on kvsim's. Every run is a
fresh interpreter; the variants run interleaved ``--repeat`` times (the machine may be
shared) and each row gives the median wall and CPU seconds and ms per request; the header
says which path kvsim ran (the compiled core, or the Python source where ``make core`` has
not built it or a source changed since). kvsim's times are the simulation with the trace
loaded (``run``); Dynamo's are its whole ``dynamo.replay.run_trace_replay`` call, which
parses the (decompressed) trace itself. The Dynamo side runs in ``--peer-python`` (default:
this interpreter); without an importable ``dynamo.replay`` there it is skipped with one line
(``make bench`` installs ai-dynamo and ai-dynamo-runtime 1.6.1 into .venv).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "mooncake" / "synthetic_trace.jsonl.gz"
ROUTERS = (("round-robin", "round_robin"), ("dynamo-kv", "kv_router"))
WORKERS, CACHE_TOKENS, TRACE_BLOCK = 4, 262144, 512
# The block sizes both sides run at: kvsim's default (every run's), and the trace's own
BLOCKS = (64, TRACE_BLOCK)
SIDES = tuple(f"{side}-{b}" for b in BLOCKS for side in ("kvsim", "dynamo"))

_KVSIM = """
import json, sys, time
from sim import native
from sim.config import RunConfig
from sim.run import load_run_trace, run
trace, router, workers, cache, block = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
cfg = RunConfig.from_flat(trace=trace, replay="open", gpu_cache=cache, replicas=workers,
                router=router, block_size=block).with_preset("sglang")
tr = load_run_trace(cfg)
c0, t0 = time.process_time(), time.perf_counter()
res = run(cfg, tr)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "requests": res.summary["requests"],
                  "core": "compiled" if native.current()[0] else "python"}))
"""

_DYNAMO = """
import json, sys, time
from dynamo.replay import run_trace_replay
trace, mode = sys.argv[1], sys.argv[2]
workers, blocks, bs, trace_bs = map(int, sys.argv[3:7])
args = {"engine": {"block_size": bs, "num_gpu_blocks": blocks}}
c0, t0 = time.process_time(), time.perf_counter()
run_trace_replay([trace], extra_engine_args=args, num_workers=workers, router_mode=mode,
                 trace_block_size=trace_bs)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}))
"""


def _child(python: str, code: str, *args: object) -> dict:
    out = subprocess.run([python, "-c", code, *map(str, args)], capture_output=True, text=True,
                         cwd=REPO, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def peer_available(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import dynamo.replay"], capture_output=True,
                           cwd=REPO)
    return probe.returncode == 0


def measure(trace: str, repeat: int, peer: str | None) -> list[dict]:
    """Per router, the medians of each side over ``repeat`` interleaved runs."""
    plain = None
    if peer is not None:
        tmp = tempfile.mkdtemp(prefix="kvsim-bench-dynamo-")
        plain = str(Path(tmp) / "trace.jsonl")
        with gzip.open(trace, "rb") as src, open(plain, "wb") as dst:
            shutil.copyfileobj(src, dst)
    runs: dict[tuple[str, str], list[dict]] = {}
    try:
        for _ in range(max(1, repeat)):
            for ours, theirs in ROUTERS:
                for block in BLOCKS:
                    runs.setdefault((ours, f"kvsim-{block}"), []).append(
                        _child(sys.executable, _KVSIM, trace, ours, WORKERS, CACHE_TOKENS,
                               block))
                    if peer is not None:
                        runs.setdefault((ours, f"dynamo-{block}"), []).append(
                            _child(peer, _DYNAMO, plain, theirs, WORKERS,
                                   CACHE_TOKENS // block, block, TRACE_BLOCK))
    finally:
        if plain is not None:
            shutil.rmtree(Path(plain).parent, ignore_errors=True)
    rows = []
    for ours, _ in ROUTERS:
        requests = runs[(ours, f"kvsim-{BLOCKS[0]}")][-1]["requests"]
        row: dict = {"router": ours, "requests": requests,
                     "kvsim_core": ",".join(sorted({r["core"] for b in BLOCKS
                                                    for r in runs[(ours, f"kvsim-{b}")]}))}
        for side in SIDES:
            if (ours, side) not in runs:
                continue
            rs = runs[(ours, side)]
            wall = statistics.median(r["wall_s"] for r in rs)
            cpu = statistics.median(r["cpu_s"] for r in rs)
            row[side] = {"wall_s": wall, "cpu_s": cpu, "runs_wall_s": [r["wall_s"] for r in rs],
                         "runs_cpu_s": [r["cpu_s"] for r in rs],
                         "wall_ms_per_request": 1e3 * wall / requests,
                         "cpu_ms_per_request": 1e3 * cpu / requests}
        for b in BLOCKS:  # kvsim / Dynamo at the same block size
            ours_b, theirs_b = row.get(f"kvsim-{b}"), row.get(f"dynamo-{b}")
            if theirs_b is not None:
                row[f"wall_ratio_{b}"] = ours_b["wall_s"] / theirs_b["wall_s"]
                row[f"cpu_ratio_{b}"] = ours_b["cpu_s"] / theirs_b["cpu_s"]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peer-python", default=sys.executable,
                    help="the interpreter that has dynamo installed (default: this one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not Path(args.trace).is_file():
        print(f"{args.trace}: no Mooncake trace here; nothing to measure")
        return 0
    peer: str | None = args.peer_python
    if not peer_available(peer):
        print(f"dynamo.replay is not importable by {peer}: Dynamo's side skipped "
              "(`make bench` installs it)")
        peer = None
    rows = measure(args.trace, args.repeat, peer)
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
        return 0
    print(f"Mooncake synthetic trace, {WORKERS} workers x {CACHE_TOKENS // 1024}K tokens, "
          f"median of {max(1, args.repeat)} interleaved runs; kvsim on its "
          f"{'/'.join(sorted({r['kvsim_core'] for r in rows}))} path (sim/native.py)")
    print(f"{'router':>12} {'side':>10} {'wall s':>7} {'CPU s':>7} {'wall ms/req':>12} "
          f"{'CPU ms/req':>11}")
    for r in rows:
        for side in SIDES:
            if side in r:
                m = r[side]
                print(f"{r['router']:>12} {side:>10} {m['wall_s']:>7.2f} {m['cpu_s']:>7.2f} "
                      f"{m['wall_ms_per_request']:>12.3f} {m['cpu_ms_per_request']:>11.3f}")
        for b in BLOCKS:
            if f"wall_ratio_{b}" in r:
                print(f"{r['router']:>12} kvsim / dynamo at {b}-token blocks: wall "
                      f"{r[f'wall_ratio_{b}']:.2f}x, CPU {r[f'cpu_ratio_{b}']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
