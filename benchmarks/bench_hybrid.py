"""Speed of vLLM's hybrid KV cache in kvsim (issue 54: a hybrid run costs at most 2x the same
run on a full-attention model): the same ``kvsim run --engine vllm`` on the synthetic Claude
Code sessions under pressure, for

    full        a full-attention model (``--full``, default qwen3-32b): one ``BlockPool``
    as-full     gpt-oss-120b with its cache as one full-attention group (kvsim before the
                hybrid cache: the same model, schedule and prices, ``BlockPool``)
    hybrid      gpt-oss-120b as vLLM keeps it: a sliding-window group (128) and a full one
                (``sim.kvcache.hybridpool.HybridPool``) in the same KV bytes as ``as-full``
                (``costmodel.gpus.kv_capacity``: twice the blocks, each of 18 layers)
    hybrid-eq   the hybrid in as many blocks as ``as-full`` (half the bytes)

    python -m benchmarks.bench_hybrid [--sessions 40] [--repeat 3] [--async on|off] [--json]

Each variant runs ``--repeat`` times in this process, interleaved (a shared machine's load
falls on all alike); rows give the median wall and CPU seconds of the simulation (trace loaded
once, outside the timing), requests per second, and the ratio to ``full`` and to ``as-full``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager
from typing import Any


@contextmanager
def _as_full_attention():
    """gpt-oss-120b's cache as one full-attention group (the vLLM engine's pool choice)."""
    import sim.engines.vllm as vllm_engine

    keep = vllm_engine.vllm_kv_groups
    vllm_engine.vllm_kv_groups = lambda spec: None
    try:
        yield
    finally:
        vllm_engine.vllm_kv_groups = keep


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=40, help="synthetic sessions (default 40)")
    ap.add_argument("--gpu-cache", type=int, default=262144,
                    help="KV tokens of the full-attention variants (default 256K)")
    ap.add_argument("--full", default="qwen3-32b", help="the full-attention model")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--async", dest="asynchronous", choices=["on", "off"], default="on")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from sim.config import RunConfig
    from sim.run import run
    from traces import load_trace

    trace_spec = f"synthetic:claude-code?sessions={args.sessions}"
    flat = dict(engine="vllm", trace=trace_spec, max_context=131072, gaps="cap:10",
                sessions=8, vllm_async=args.asynchronous == "on")
    trace = load_trace(trace_spec, block_size=64, max_context=131072, cache_dir=None)
    from costmodel.gpus import kv_capacity
    from costmodel.specs import get_spec

    oss = get_spec("gpt-oss-120b")
    same_bytes = kv_capacity(oss, args.gpu_cache * oss.kv_bytes_per_token, engine="vllm").tokens
    variants = [("full", args.full, False, args.gpu_cache),
                ("as-full", "gpt-oss-120b", True, args.gpu_cache),
                ("hybrid", "gpt-oss-120b", False, same_bytes),
                ("hybrid-eq", "gpt-oss-120b", False, args.gpu_cache)]
    wall: dict[str, list[float]] = {v[0]: [] for v in variants}
    cpu: dict[str, list[float]] = {v[0]: [] for v in variants}
    summaries: dict[str, dict[str, Any]] = {}
    for _ in range(args.repeat):
        for name, model, as_full, tokens in variants:
            cfg = RunConfig.from_flat(**flat, model=model, gpu_cache=tokens).with_preset("vllm")
            w0, c0 = time.perf_counter(), time.process_time()
            if as_full:
                with _as_full_attention():
                    res = run(cfg, trace)
            else:
                res = run(cfg, trace)
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
            summaries[name] = res.summary
    rows = []
    base = {k: statistics.median(cpu[k]) for k in ("full", "as-full")}
    for name, model, _, tokens in variants:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        s = summaries[name]
        rows.append({"variant": name, "model": model, "gpu_cache": tokens, "wall_s": round(w, 3),
                     "cpu_s": round(c, 3), "requests": s["requests"],
                     "requests_per_cpu_s": round(s["requests"] / c, 1),
                     "hit_rate": round(float(s["hit_rate"]), 4),
                     "cpu_vs_full": round(c / base["full"], 2),
                     "cpu_vs_as_full": round(c / base["as-full"], 2)})
    if args.json:
        print(json.dumps({"trace": trace_spec, "gpu_cache": args.gpu_cache,
                          "async": args.asynchronous, "repeat": args.repeat, "rows": rows},
                         indent=2))
        return
    print(f"{trace_spec}, --gpu-cache {args.gpu_cache}, N=8, gaps cap:10, vllm engine, async "
          f"{args.asynchronous}, median of {args.repeat} (CPU seconds of the simulation)")
    print(f"{'variant':9} {'model':13} {'tokens':>7} {'wall s':>7} {'cpu s':>7} {'req':>6} "
          f"{'req/cpu s':>9} {'hit':>6} {'vs full':>7} {'vs as-full':>10}")
    for r in rows:
        print(f"{r['variant']:9} {r['model']:13} {r['gpu_cache']:7d} {r['wall_s']:7.2f} "
              f"{r['cpu_s']:7.2f} "
              f"{r['requests']:6d} {r['requests_per_cpu_s']:9.1f} {r['hit_rate']:6.1%} "
              f"{r['cpu_vs_full']:7.2f} {r['cpu_vs_as_full']:10.2f}")


if __name__ == "__main__":
    main()
