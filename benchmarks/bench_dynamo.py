"""kvsim against NVIDIA Dynamo's offline replay on the Mooncake synthetic trace, both routers,
at the same block size on both sides, on kvsim's SGLang engine and on its vLLM engine.

    python -m benchmarks.bench_dynamo [--json] [--repeat 3] [--trace PATH] [--peer-python PY]
                                      [--engines sglang,vllm] [--baseline CHECKOUT]

The same workload on both sides: 4 workers with 256K-token caches behind round robin (Dynamo
``round_robin`` / kvsim ``round-robin``) and the KV router (Dynamo ``kv_router`` / kvsim
``dynamo-kv``), at two block sizes, each the same on both sides: kvsim's default 64 (Dynamo's
mocker engines ``{"engine": {"block_size": 64, "num_gpu_blocks": 4096}}``, the trace's
512-token hashes split in eight as kvsim's loader splits them) and the trace's own 512
(``{"block_size": 512, "num_gpu_blocks": 512}``; kvsim ``block_size=512``), with
``trace_block_size=512`` on Dynamo's side and ``RunConfig.from_flat(trace, replay="open",
gpu_cache=262144, replicas=4, router=R)`` on the sglang preset on kvsim's. The vLLM engine
(Dynamo's mocker simulates a vLLM-style engine: the like-for-like comparison) runs the same
trace at 64-token blocks as ``kvsim run --engine vllm --preset vllm --max-running 256
--chunk-size 8192`` does, against Dynamo's ``max_num_seqs 256, max_num_batched_tokens 8192``.
Every run is a fresh interpreter; the variants run interleaved ``--repeat`` times (the
machine may be shared) and each row gives the median wall and CPU seconds and ms per
request; the header says which path kvsim ran (the compiled core, or the Python source where
``make core`` has not built it or a source changed since) and the machine's load
(``os.getloadavg``) before and after: on a shared machine, compare the ratios of one run.
kvsim's simulation times are the run with the trace loaded (``run``); Dynamo's are its whole
``dynamo.replay.run_trace_replay`` call, which parses the (decompressed) trace itself.
``process`` is each side's whole interpreter, start to exit, as the parent timed it (wall,
and CPU: user + system of the child, the steadier figure on a shared machine; imports
and kvsim's trace load included; ``kvsim run`` also writes result files, which this child
does not), exiting as the ``kvsim`` script does (the collector frozen: sim/cli/main.py
``main``). The Dynamo side runs in ``--peer-python`` (default: this interpreter); without an
importable ``dynamo.replay`` there it is skipped with one line (``make bench`` installs
ai-dynamo and ai-dynamo-runtime 1.6.1 into .venv). ``--baseline`` times another checkout's
kvsim (its own core, e.g. main's) interleaved with this one, as the ``base-`` rows.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "mooncake" / "synthetic_trace.jsonl.gz"
ROUTERS = (("round-robin", "round_robin"), ("dynamo-kv", "kv_router"))
WORKERS, CACHE_TOKENS, TRACE_BLOCK = 4, 262144, 512
# The block sizes both sides run at: kvsim's default (every run's), and the trace's own
BLOCKS = (64, TRACE_BLOCK)
# The vLLM engine's workload (issue 55): 64-token blocks, 256 sequences, 8192-token steps
VLLM_BLOCK, VLLM_SEQS, VLLM_TOKENS = 64, 256, 8192
ENGINES = ("sglang", "vllm")


def variants(engines: tuple[str, ...] = ENGINES) -> list[tuple[str, int]]:
    """(engine, block size) of each comparison, in run order; its sides are ``kvsim-<key>``
    and ``dynamo-<key>`` (``key``)."""
    out = [("sglang", b) for b in BLOCKS] if "sglang" in engines else []
    return out + ([("vllm", VLLM_BLOCK)] if "vllm" in engines else [])


def key(engine: str, block: int) -> str:
    """The SGLang rows keep their old names (``kvsim-64``); the vLLM ones say so."""
    return f"{block}" if engine == "sglang" else f"vllm-{block}"

_KVSIM = """
import json, sys, time
from sim import native
from sim.config import RunConfig
from sim.run import load_run_trace, run
trace, router, workers, cache, block = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
engine, seqs, tokens = sys.argv[6], *map(int, sys.argv[7:9])
more = dict(engine="vllm", max_running=seqs, chunk_size=tokens) if engine == "vllm" else {}
cfg = RunConfig.from_flat(trace=trace, replay="open", gpu_cache=cache, replicas=workers,
                router=router, block_size=block, **more).with_preset(engine)
tr = load_run_trace(cfg)
c0, t0 = time.process_time(), time.perf_counter()
res = run(cfg, tr)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "requests": res.summary["requests"],
                  "core": "compiled" if native.current()[0] else "python"}))
import gc
gc.freeze()  # the exit the kvsim script makes (sim/cli/main.py main)
"""

_DYNAMO = """
import json, sys, time
from dynamo.replay import run_trace_replay
trace, mode = sys.argv[1], sys.argv[2]
workers, blocks, bs, trace_bs, seqs, tokens = map(int, sys.argv[3:9])
args = {"engine": {"block_size": bs, "num_gpu_blocks": blocks}}
if seqs:  # the vLLM workload's batch limits
    args["engine"].update(max_num_seqs=seqs, max_num_batched_tokens=tokens)
c0, t0 = time.process_time(), time.perf_counter()
run_trace_replay([trace], extra_engine_args=args, num_workers=workers, router_mode=mode,
                 trace_block_size=trace_bs)
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}))
"""


def _child(python: str, code: str, *args: object, cwd: Path = REPO) -> dict:
    """One fresh interpreter running ``code`` in ``cwd`` (whose ``sim`` it imports first)."""
    c0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run([python, "-c", code, *map(str, args)], capture_output=True, text=True,
                         cwd=cwd, check=True)
    wall = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "process_s": wall,
            "process_cpu_s": cpu}


def peer_available(python: str) -> bool:
    probe = subprocess.run([python, "-c", "import dynamo.replay"], capture_output=True,
                           cwd=REPO)
    return probe.returncode == 0


def measure(trace: str, repeat: int, peer: str | None,
            engines: tuple[str, ...] = ENGINES, baseline: Path | None = None) -> list[dict]:
    """Per router, the medians of each side over ``repeat`` interleaved runs (``baseline``:
    another checkout's kvsim as the ``base-`` sides)."""
    runs_of = variants(engines)
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
                for engine, block in runs_of:
                    k = key(engine, block)
                    seqs, tokens = (VLLM_SEQS, VLLM_TOKENS) if engine == "vllm" else (0, 0)
                    argv = (trace, ours, WORKERS, CACHE_TOKENS, block, engine, seqs, tokens)
                    runs.setdefault((ours, f"kvsim-{k}"), []).append(
                        _child(sys.executable, _KVSIM, *argv))
                    if baseline is not None:
                        runs.setdefault((ours, f"base-{k}"), []).append(
                            _child(sys.executable, _KVSIM, *argv, cwd=baseline))
                    if peer is not None:
                        runs.setdefault((ours, f"dynamo-{k}"), []).append(
                            _child(peer, _DYNAMO, plain, theirs, WORKERS,
                                   CACHE_TOKENS // block, block, TRACE_BLOCK, seqs, tokens))
    finally:
        if plain is not None:
            shutil.rmtree(Path(plain).parent, ignore_errors=True)
    rows = []
    keys = [key(e, b) for e, b in runs_of]
    for ours, _ in ROUTERS:
        requests = runs[(ours, f"kvsim-{keys[0]}")][-1]["requests"]
        row: dict = {"router": ours, "requests": requests,
                     "kvsim_core": ",".join(sorted({r["core"] for k in keys
                                                    for r in runs[(ours, f"kvsim-{k}")]}))}
        if baseline is not None:
            row["base_core"] = ",".join(sorted({r["core"] for k in keys
                                                for r in runs[(ours, f"base-{k}")]}))
        for k in keys:
            for side in (f"kvsim-{k}", f"base-{k}", f"dynamo-{k}"):
                if (ours, side) not in runs:
                    continue
                rs = runs[(ours, side)]
                wall = statistics.median(r["wall_s"] for r in rs)
                cpu = statistics.median(r["cpu_s"] for r in rs)
                proc = statistics.median(r["process_s"] for r in rs)
                proc_cpu = statistics.median(r["process_cpu_s"] for r in rs)
                row[side] = {"wall_s": wall, "cpu_s": cpu, "process_s": proc,
                             "process_cpu_s": proc_cpu,
                             "runs_wall_s": [r["wall_s"] for r in rs],
                             "runs_cpu_s": [r["cpu_s"] for r in rs],
                             "runs_process_s": [r["process_s"] for r in rs],
                             "wall_ms_per_request": 1e3 * wall / requests,
                             "cpu_ms_per_request": 1e3 * cpu / requests}
            theirs_k = row.get(f"dynamo-{k}")
            for side, tag in ((f"kvsim-{k}", ""), (f"base-{k}", "base_")):
                ours_k = row.get(side)
                if ours_k is not None and theirs_k is not None:  # kvsim / Dynamo, same blocks
                    row[f"{tag}wall_ratio_{k}"] = ours_k["wall_s"] / theirs_k["wall_s"]
                    row[f"{tag}cpu_ratio_{k}"] = ours_k["cpu_s"] / theirs_k["cpu_s"]
                    row[f"{tag}process_ratio_{k}"] = ours_k["process_s"] / theirs_k["process_s"]
                    row[f"{tag}process_cpu_ratio_{k}"] = (ours_k["process_cpu_s"]
                                                          / theirs_k["process_cpu_s"])
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peer-python", default=sys.executable,
                    help="the interpreter that has dynamo installed (default: this one)")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help="kvsim engines to compare, comma-separated (default: sglang,vllm)")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another kvsim checkout (e.g. main's) timed beside this one")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.baseline is not None and not (args.baseline / "sim" / "__init__.py").is_file():
        ap.error(f"--baseline: {args.baseline} is not a kvsim checkout (no sim/__init__.py)")
    engines = tuple(e for e in args.engines.split(",") if e)
    if not engines or set(engines) - set(ENGINES):
        ap.error(f"--engines: choose from {','.join(ENGINES)}, got {args.engines!r}")
    if not Path(args.trace).is_file():
        print(f"{args.trace}: no Mooncake trace here; nothing to measure")
        return 0
    peer: str | None = args.peer_python
    if not peer_available(peer):
        print(f"dynamo.replay is not importable by {peer}: Dynamo's side skipped "
              "(`make bench` installs it)")
        peer = None
    load = os.getloadavg()
    rows = measure(args.trace, args.repeat, peer, engines, args.baseline)
    load_after = os.getloadavg()
    if args.json:
        print(json.dumps({"rows": rows, "load_before": load, "load_after": load_after},
                         indent=2))
        return 0
    base = sorted({r["base_core"] for r in rows if "base_core" in r})
    print(f"Mooncake synthetic trace, {WORKERS} workers x {CACHE_TOKENS // 1024}K tokens, "
          f"median of {max(1, args.repeat)} interleaved runs; kvsim on its "
          f"{'/'.join(sorted({r['kvsim_core'] for r in rows}))} path (sim/native.py"
          f"{''.join(f'; baseline {c}' for c in base)}); "
          f"load average {load[0]:.1f} before, {load_after[0]:.1f} after "
          f"({os.cpu_count()} CPUs)")
    print(f"{'router':>12} {'side':>15} {'wall s':>7} {'CPU s':>7} {'process s':>9} "
          f"{'wall ms/req':>12} {'CPU ms/req':>11}")
    keys = [key(e, b) for e, b in variants(engines)]
    for r in rows:
        for k in keys:
            for side in (f"kvsim-{k}", f"base-{k}", f"dynamo-{k}"):
                if side in r:
                    m = r[side]
                    print(f"{r['router']:>12} {side:>15} {m['wall_s']:>7.2f} {m['cpu_s']:>7.2f} "
                          f"{m['process_s']:>9.2f} {m['wall_ms_per_request']:>12.3f} "
                          f"{m['cpu_ms_per_request']:>11.3f}")
        for (engine, b), k in zip(variants(engines), keys, strict=True):
            for tag, who in (("", "kvsim"), ("base_", "baseline")):
                if f"{tag}wall_ratio_{k}" in r:
                    print(f"{r['router']:>12} {who} ({engine}) / dynamo at {b}-token blocks: "
                          f"simulation wall {r[f'{tag}wall_ratio_{k}']:.2f}x, CPU "
                          f"{r[f'{tag}cpu_ratio_{k}']:.2f}x, whole process "
                          f"{r[f'{tag}process_ratio_{k}']:.2f}x (CPU "
                          f"{r[f'{tag}process_cpu_ratio_{k}']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
