"""A hybrid run's cost against the same run on a full-attention model (issue 54: at most 2x):
each hybrid of ``kvsim reproduce hybrid`` (sim/studies/hybrid.py) against Qwen3-32B on the
same synthetic Claude Code sessions, the same KV tokens, preset and schedule, on both engines,
one server, a fleet (2 replicas, dynamo-kv) and PD (1 prefill + 1 decode worker); a
combination the engine refuses, or that fails, is listed as such (``not_run``).
benchmarks/bench_hybrid.py times vLLM's hybrid pool on its own (gpt-oss-120b as one
full-attention group and as vLLM keeps it).

    python -m benchmarks.bench_hybrid_runs [--sessions 48] [--repeat 3] [--engines vllm]
        [--shapes single,fleet] [--json]

Variants run interleaved, ``--repeat`` times each (a shared machine's load falls on all
alike); rows give the median CPU seconds of the simulation (trace loaded once, outside the
timing) and the ratio to the full-attention run of the same engine and shape.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

FULL = "qwen3-32b"
HYBRIDS = ("gpt-oss-120b", "qwen3-next-80b-a3b", "deepseek-v3.2")
SHAPES: dict[str, dict[str, Any]] = {
    "single": {}, "fleet": {"replicas": 2, "router": "dynamo-kv"},
    "pd": {"prefill_replicas": 1, "decode_replicas": 1}}
ENGINES = {"sglang": ("sglang", "lpm"), "vllm": ("vllm", "fcfs")}  # engine: (preset, scheduler)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=48, help="synthetic sessions (default 48)")
    ap.add_argument("--gpu-cache", type=int, default=131072, help="KV tokens (default 128K)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma list (default both)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list: single,fleet,pd")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from sim.config import ConfigError, RunConfig
    from sim.run import run
    from traces import load_trace

    spec = f"synthetic:claude-code?sessions={args.sessions}"
    trace = load_trace(spec, block_size=64, max_context=65536, cache_dir=None)
    cpu: dict[tuple[str, str, str], list[float]] = {}
    refused: dict[tuple[str, str, str], str] = {}
    for rep in range(args.repeat + 1):  # the first pass warms every path up, untimed
        for engine in args.engines.split(","):
            preset, scheduler = ENGINES[engine]
            for shape in args.shapes.split(","):
                fields = SHAPES[shape]
                for model in (FULL, *HYBRIDS):
                    key = (engine, shape, model)
                    if key in refused:
                        continue
                    cfg = RunConfig.from_flat(trace=spec, max_context=65536, gaps="tool",
                                              sessions=8, gpu_cache=args.gpu_cache,
                                              model=model, engine=engine,
                                              scheduler=scheduler, **fields).with_preset(preset)
                    c0 = time.process_time()
                    try:
                        run(cfg, trace)
                    except ConfigError as e:
                        refused[key] = f"refused: {e}"
                        continue
                    except Exception as e:  # a failure is a row, not the end
                        refused[key] = f"failed: {type(e).__name__}: {e}"
                        continue
                    if rep:
                        cpu.setdefault(key, []).append(time.process_time() - c0)
    rows = []
    for (engine, shape, model), times in cpu.items():
        full = statistics.median(cpu[(engine, shape, FULL)])
        c = statistics.median(times)
        rows.append({"engine": engine, "shape": shape, "model": model, "cpu_s": round(c, 3),
                     "vs_full": round(c / full, 2)})
    rows += [{"engine": e, "shape": s, "model": m, "not_run": why}
             for (e, s, m), why in refused.items()]
    worst = max((r["vs_full"] for r in rows if "vs_full" in r), default=float("nan"))
    if args.json:
        print(json.dumps({"trace": spec, "gpu_cache": args.gpu_cache, "repeat": args.repeat,
                          "worst_vs_full": worst, "rows": rows}, indent=2))
        return
    print(f"{spec}, {args.gpu_cache} KV tokens, 8 sessions at once, median CPU s of "
          f"{args.repeat}; ratio to {FULL} on the same engine and shape (target <= 2)")
    print(f"{'engine':7} {'shape':7} {'model':19} {'cpu s':>7} {'vs full':>8}")
    for r in rows:
        tail = (f"{r['cpu_s']:7.2f} {r['vs_full']:8.2f}" if "vs_full" in r
                else r["not_run"][:70])
        print(f"{r['engine']:7} {r['shape']:7} {r['model']:19} {tail}")
    print(f"worst ratio: {worst:.2f}")


if __name__ == "__main__":
    main()
