"""``kvsim capacity`` side by side with its C++ peer, ``kvcache-simulator`` (PyPI 0.1.3: a
Python trace parser in front of a C++ replay core, LRU/FIFO/Belady, budgets in GiB of a
model's KV), on the same trace and the same 12 LRU sizes (issue 55 items 3 and 5).

    python -m benchmarks.bench_capacity_peer [--runs 5] [--scale 3] [--json]

Installs nothing: ``make bench`` installs the pinned peer (Makefile, bench stamp); without it
the benchmark says so and exits 2. Traces: the shared Mooncake trace (512-token blocks: its
hash ids) and a ``--scale`` times larger one made from it (copies one after the other, each
with its own hash ids and times: new traffic, not repeats), written to a temporary file.

Sizes: ``--cache 256k..64m:12`` in tokens for kvsim; for the peer the same sizes in GiB of
Qwen3-8B's KV (its calculator's bytes per token, which must equal kvsim's for the model),
each the middle of its block so that the peer's ``floor(GiB / bytes per block)`` is kvsim's
``tokens // 512``, checked before any run.

Timed, ``--runs`` times, interleaved (the machine may be shared), medians:
- whole process, as users run them (subprocess, JSON output on both sides): ``kvsim capacity``
  with its trace cache warm (the default ``~/.cache/kvsim``, here a temporary folder filled
  by an untimed run), ``kvsim capacity --cache-dir off`` (parses the file, as the peer does
  every time), and ``kvcache-simulator run --policies lru`` (its C++ binary built beforehand
  by an untimed run), both with Python's bytecode cached (``PYTHONPYCACHEPREFIX`` in a
  temporary folder the untimed run fills, whatever ``PYTHONDONTWRITEBYTECODE`` says); wall
  and CPU seconds (user + system, children included);
- simulation only, in this process, the trace loaded: ``sim.studies.capacity.capacity_curve``
  against the peer's ``run_cpp_sweep`` (binary trace written, C++ process run and read).
The machine's load (``os.getloadavg``) is printed before and after.

Hit rates differ by definition, and the benchmark shows why: the peer counts only the last
half of the requests (a warm-up window), every hash id of a prompt (its partial last block
too) and no output; kvsim counts every request, full blocks up to ``(prompt - 1) // 512`` and
caches each reply. Fed the peer's terms (its blocks, token weights and window, no output),
kvsim's LRU replay (``LruReplay``) must give the peer's hit tokens at every size it reports:
the ``same on the peer's terms`` column.
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
from importlib.util import find_spec
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MOONCAKE = REPO.parent / "shared" / "data" / "mooncake" / "synthetic_trace.jsonl.gz"
PEER = "kvcache-simulator==0.1.3"
MODEL = "qwen3-8b"  # the peer's model id; kvsim's spec has the same name
BS = 512
SWEEP = "256k..64m:12"
BIN = Path(sys.executable).parent


def larger_trace(src: Path, copies: int, dst: Path) -> Path:
    """``copies`` of ``src`` one after the other: copy ``c`` starts after the previous one
    ends and its hash ids are shifted past every id before it."""
    with gzip.open(src, "rt") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    span = max(r["timestamp"] for r in recs) + 1
    ids = max(max(r["hash_ids"]) for r in recs) + 1
    with gzip.open(dst, "wt", compresslevel=1) as f:
        for c in range(copies):
            for r in recs:
                f.write(json.dumps({**r, "timestamp": r["timestamp"] + c * span,
                                    "hash_ids": [h + c * ids for h in r["hash_ids"]]}) + "\n")
    return dst


def budgets_gib(caches: list[int], bytes_per_token: float) -> list[float]:
    """The peer's budget for each kvsim size: the middle of its last block, in GiB."""
    from kvcache_sim.simulator import cache_blocks_for_gib

    gib = [((c // BS) * BS + BS / 2) * bytes_per_token / 2**30 for c in caches]
    got = [cache_blocks_for_gib(g, bytes_per_token * BS) for g in gib]
    if got != [c // BS for c in caches]:
        raise SystemExit(f"budgets do not map onto the sizes: {got}")
    return gib


def commands(path: Path, gib: list[float], cache_dir: str) -> dict[str, tuple[list[str], dict]]:
    kvsim = [str(BIN / "kvsim"), "capacity", str(path), "--block-size", str(BS), "--cache",
             SWEEP, "--json"]
    # bytecode cached as in a user's environment (kvsim is installed editable: without it a
    # PYTHONDONTWRITEBYTECODE environment recompiles its modules every run; the peer's
    # wheel came with its bytecode): in a temporary folder, filled by the untimed run
    env = {**os.environ, "KVSIM_CACHE_DIR": cache_dir,
           "PYTHONPYCACHEPREFIX": str(Path(cache_dir) / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return {
        "kvsim": (kvsim, env),
        "kvsim --cache-dir off": ([*kvsim, "--cache-dir", "off"], env),
        "kvcache-simulator": ([str(BIN / "kvcache-simulator"), "run", "--trace", str(path),
                               "--model", MODEL, "--block-size", str(BS), "--budgets-gib",
                               ",".join(repr(g) for g in gib), "--policies", "lru",
                               "--no-progress", "--format", "json"], env),
    }


def run_once(argv: list[str], env: dict) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system, the process and its children: the peer's
    C++ binary) and stdout of one run."""
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    sec = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode:
        raise SystemExit(f"{' '.join(argv[:2])} failed ({res.returncode}): {res.stderr[-800:]}")
    return sec, c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime, res.stdout


def sim_only(path: Path, caches: list[int], runs: int) -> dict[str, float]:
    """Median seconds of each side's simulation, the trace already loaded, interleaved."""
    from kvcache_sim.cpp_backend import run_cpp_sweep
    from kvcache_sim.simulator import warmup_requests_for_trace
    from kvcache_sim.trace import parse_trace_file

    from sim.studies.capacity import capacity_curve
    from traces import load_trace

    trace = load_trace(str(path), format="mooncake", block_size=BS, cache_dir=None)
    data = parse_trace_file(path, block_size=BS)
    warm = warmup_requests_for_trace(data, 0.5)
    sides = {"kvsim": lambda: capacity_curve(trace, caches),
             "kvcache-simulator": lambda: run_cpp_sweep(
                 data, capacities=[c // BS for c in caches], policies=["lru"],
                 warmup_requests=warm)}
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(runs):
        for k, fn in sides.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def on_peer_terms(path: Path, peer: dict) -> list[bool]:
    """Per size the peer reports: does kvsim's LRU replay, fed the peer's blocks (every hash
    id), token weights and window and no output, hit the peer's tokens exactly?"""
    import numpy as np
    from kvcache_sim.trace import block_tokens

    from sim.studies.capacity import LruReplay

    with gzip.open(path, "rt") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    reqs = []
    for r in recs:
        n = len(r["hash_ids"])
        tok = np.cumsum([0] + [block_tokens(r["input_length"], BS, i, n) for i in range(n)])
        reqs.append((np.asarray(r["hash_ids"], np.int64), tok))
    warm = peer["metadata"]["warmupRequests"]
    same = []
    for point in peer["points"]:
        replay = LruReplay(point["cacheBlocks"])
        hit = 0
        for i, (ids, tok) in enumerate(reqs):
            h = replay.request(ids)
            hit += int(tok[h]) if i >= warm else 0
        same.append(hit == point["results"]["lru"]["hitTokens"])
    return same


def bench_trace(name: str, path: Path, runs: int) -> dict:
    from sim.cli.capacity import parse_caches

    caches = parse_caches(SWEEP)
    probe = subprocess.run([str(BIN / "kvcache-simulator"), "run", "--trace", str(path),
                            "--model", MODEL, "--block-size", str(BS), "--budgets-gib", "1",
                            "--policies", "lru", "--no-progress", "--format", "json"],
                           capture_output=True, text=True, check=True)  # builds the binary
    bpt = json.loads(probe.stdout)["metadata"]["bytesPerToken"]
    from costmodel.specs import get_spec

    ours = get_spec(MODEL).kv_bytes_per_token
    if ours != bpt:
        raise SystemExit(f"{MODEL}: kvsim's KV is {ours} bytes per token, the peer's {bpt}")
    gib = budgets_gib(caches, bpt)
    with tempfile.TemporaryDirectory(prefix="kvsim-cache-") as cache_dir:
        cmds = commands(path, gib, cache_dir)
        outs = {k: run_once(*c)[2] for k, c in cmds.items()}  # untimed: fills kvsim's cache
        walls: dict[str, list[float]] = {k: [] for k in cmds}
        cpus: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(runs):
            for k, c in cmds.items():
                sec, cpu, _out = run_once(*c)
                walls[k].append(sec)
                cpus[k].append(cpu)
    rows = json.loads(outs["kvsim"])
    peer = json.loads(outs["kvcache-simulator"])
    sim = sim_only(path, caches, runs)
    wall = {k: statistics.median(v) for k, v in walls.items()}
    return {
        "trace": name, "requests": peer["metadata"]["requestCount"], "runs": runs,
        "wall_s": wall, "wall_range_s": {k: [min(v), max(v)] for k, v in walls.items()},
        "cpu_s": {k: statistics.median(v) for k, v in cpus.items()},
        "sim_s": sim,
        "wall_ratio": wall["kvsim"] / wall["kvcache-simulator"],
        "wall_ratio_cache_off": wall["kvsim --cache-dir off"] / wall["kvcache-simulator"],
        "cpu_ratio": (statistics.median(cpus["kvsim"])
                      / statistics.median(cpus["kvcache-simulator"])),
        "sim_ratio": sim["kvsim"] / sim["kvcache-simulator"],
        "cache_tokens": caches, "bytes_per_token": bpt,
        "kvsim_hit_rate": [r["hit_rate"] for r in rows],
        "peer_cache_blocks": [p["cacheBlocks"] for p in peer["points"]],
        "peer_hit_rate": [p["results"]["lru"]["hitRate"] for p in peer["points"]],
        "same_on_peer_terms": on_peer_terms(path, peer),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="timed runs per side (median)")
    ap.add_argument("--scale", type=int, default=3, help="copies in the larger trace")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if find_spec("kvcache_sim") is None or not (BIN / "kvcache-simulator").exists():
        print(f"the peer is not installed: make bench installs it (pip install {PEER})")
        return 2
    if not MOONCAKE.is_file() or shutil.which("c++") is None:
        print(f"needs {MOONCAKE} and a C++ compiler (the peer builds its core)")
        return 2
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="capacity-peer-") as tmp:
        big = larger_trace(MOONCAKE, args.scale, Path(tmp) / "mooncake_x.jsonl.gz")
        results = [bench_trace("mooncake", MOONCAKE, args.runs),
                   bench_trace(f"mooncake x{args.scale}", big, args.runs)]
    load1 = os.getloadavg()
    doc = {"cpus": os.cpu_count(), "load_before": load0, "load_after": load1,
           "results": results}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"{os.cpu_count()} CPUs; load average (1, 5, 15 min) before "
          f"{', '.join(f'{x:.1f}' for x in load0)}, after {', '.join(f'{x:.1f}' for x in load1)}")
    print(f"{'trace':<13} {'requests':>8}  {'side':<22} {'wall s (min-max)':>18} "
          f"{'CPU s':>6} {'sim s':>6}")
    for r in results:
        for k, w in r["wall_s"].items():
            lo, hi = r["wall_range_s"][k]
            sim = r["sim_s"].get(k)
            print(f"{r['trace']:<13} {r['requests']:>8,}  {k:<22} {w:>6.3f} ({lo:.2f}-{hi:.2f})"
                  f" {r['cpu_s'][k]:6.3f} {'' if sim is None else f'{sim:6.3f}'}")
        print(f"{'':<13} {'':>8}  kvsim / peer: wall {r['wall_ratio']:.2f} (cache off "
              f"{r['wall_ratio_cache_off']:.2f}), CPU {r['cpu_ratio']:.2f}, simulation "
              f"{r['sim_ratio']:.2f}")
        n = len(r["peer_hit_rate"])
        print(f"{'':<13} {'':>8}  hit rates (kvsim | peer, last half, {n} of 12 sizes "
              f"reported): " + ", ".join(
                  f"{a:.1%}|{b:.1%}" for a, b in zip(r["kvsim_hit_rate"], r["peer_hit_rate"],
                                                     strict=False)))
        print(f"{'':<13} {'':>8}  same on the peer's terms: "
              f"{sum(r['same_on_peer_terms'])} of {n} sizes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
