"""Cache speed: kvsim's vLLM block pool against kvsim's radix cache (sglang preset).

Both replay the op stream of benchmarks/bench_cache.py (the 360 shared cc-traces sessions, 4
active, 2 in flight, 4096 blocks of 64 tokens) with their own engine's protocol:

  radix (sglang)   ARRIVE match+lock, ALLOC make room+reserve, FINISH insert+unlock, TOUCH
  block pool       ARRIVE nothing (vLLM looks a request up only when it schedules it), ALLOC
                   admit the whole prompt (lookup + allocate; refused: the request is
                   dropped), FINISH decode the output in one extend (out - 1 tokens; refused:
                   no decode blocks) then free; TOUCH has no vLLM counterpart

Only time inside cache calls counts. The target the engine must meet (issue 12) is the vLLM
engine within 1.5x of the SGLang engine's time; this is the cache share of it. A second row
runs the full V1 protocol driver (benchmarks/vllm_ops.py: chunked prefill of 8192 tokens,
64-token decode steps, preemption, 2 running) on the same sessions, timing the whole drive
(driver included; "refused" there counts refused admission attempts, retried each step).

    python -m benchmarks.bench_vllm_cache [--sessions K] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.opreplay import OursSide, timed_replay
from benchmarks.opstream import ALLOC, ARRIVE, FINISH, OpStream, trace_stream
from benchmarks.vllm_ops import DriverConfig, ModelSide, drive

REPO = Path(__file__).resolve().parent.parent
CC_TRACES = REPO.parent / "shared" / "data" / "cc-traces"
TARGET = 1.5


def blockpool_replay(stream: OpStream, free_order: str = "vllm") -> dict[str, Any]:
    """The stream through the block pool with vLLM's protocol; seconds inside pool calls."""
    from sim.kvcache.blockpool import BlockPool

    pool = BlockPool(stream.capacity_blocks, stream.block_size, free_order)
    perf = time.perf_counter
    live: dict[int, Any] = {}
    admitted: set[int] = set()
    spent = 0.0
    hits = refused = 0
    for op, rid in stream.ops:
        if op == ARRIVE:
            live[rid] = stream.request(rid)
            continue
        if op == ALLOC:
            req = live[rid]
            t0 = perf()
            h = pool.admit(rid, req.finish_ids, req.in_tokens, req.in_tokens)
            if h is None:
                refused += 1
            else:
                hits += h
                admitted.add(rid)
        elif op == FINISH:
            req = live.pop(rid)
            t0 = perf()
            if rid in admitted:
                admitted.discard(rid)
                if req.out_tokens > 1:
                    pool.extend(rid, req.out_tokens - 1)
                pool.free(rid)
        else:
            continue
        spent += perf() - t0
    return {
        "side": f"kvsim blockpool ({free_order})",
        "seconds": spent,
        "hit_blocks": hits,
        "refused": refused,
    }


def run(
    trace_dir: Path = CC_TRACES,
    sessions: int | None = None,
    capacity_blocks: int = 4096,
    with_driver: bool = True,
    repeat: int = 1,
) -> dict[str, Any]:
    """Each side replays the stream `repeat` times, interleaved; the fastest run counts (the
    machine is shared: the minimum is the least disturbed)."""
    stream = trace_stream(
        trace_dir, sessions=sessions, active=4, in_flight=2, capacity_blocks=capacity_blocks
    )
    best: dict[str, dict[str, Any]] = {}
    for _ in range(max(1, repeat)):
        radix = timed_replay(stream, OursSide(capacity_blocks, "sglang", record=False))
        runs = [
            {
                "side": "kvsim radix (sglang)",
                "seconds": radix.seconds,
                "hit_blocks": radix.hit_blocks,
                "refused": radix.aborted,
            }
        ]
        runs += [blockpool_replay(stream, order) for order in ("vllm", "penelope")]
        for r in runs:
            if r["side"] not in best or r["seconds"] < best[r["side"]]["seconds"]:
                best[r["side"]] = r
    rows = list(best.values())
    if with_driver:
        side = ModelSide(capacity_blocks, stream.block_size)
        t0 = time.perf_counter()
        st = drive(stream, [side], DriverConfig(max_running=2, active=4, chunk=8192, decode=64))
        rows.append(
            {
                "side": "vLLM V1 driver + blockpool",
                "seconds": time.perf_counter() - t0,
                "hit_blocks": sum(st.hits.values()),
                "refused": st.by_op.get("ADMIT", 0) - st.admitted,
                "preempted": st.by_op.get("PREEMPT", 0),
                "ops": st.ops,
            }
        )
    base = rows[0]["seconds"]
    for r in rows:
        r["vs_radix"] = round(r["seconds"] / base, 2)
        r["seconds"] = round(r["seconds"], 3)
    ratio = rows[1]["seconds"] / base
    return {
        "stream": stream.name,
        "requests": stream.n_requests,
        "ops": len(stream.ops),
        "capacity_blocks": capacity_blocks,
        "repeat": repeat,
        "rows": rows,
        "blockpool_vs_radix": round(ratio, 2),
        "target_met": ratio <= TARGET,
    }


def format_table(summary: dict[str, Any]) -> str:
    lines = [
        f"stream {summary['stream']}: {summary['requests']} requests, {summary['ops']} ops, "
        f"{summary['capacity_blocks']} blocks, best of {summary['repeat']}",
        f"{'side':<28} {'seconds':>9} {'vs radix':>9} {'hit blocks':>12} {'refused':>8}",
    ]
    for r in summary["rows"]:
        lines.append(
            f"{r['side']:<28} {r['seconds']:>9.3f} {r['vs_radix']:>8.2f}x "
            f"{r['hit_blocks']:>12} {r['refused']:>8}"
        )
    ok = "met" if summary["target_met"] else "MISSED"
    lines.append(
        f"blockpool (vllm) / radix (sglang): {summary['blockpool_vs_radix']:.2f}x "
        f"(target <= {TARGET}x: {ok})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_vllm_cache", description=__doc__)
    ap.add_argument("--trace-dir", type=Path, default=CC_TRACES)
    ap.add_argument("--sessions", type=int, default=None, help="first K sessions (default all)")
    ap.add_argument("--capacity", type=int, default=4096, help="capacity in 64-token blocks")
    ap.add_argument("--no-driver", action="store_true", help="skip the V1 driver row")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side (the fastest counts)")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args(argv)
    if not args.trace_dir.is_dir():
        print(f"bench_vllm_cache: skipped, {args.trace_dir} absent", file=sys.stderr)
        return 0
    summary = run(args.trace_dir, args.sessions, args.capacity, not args.no_driver, args.repeat)
    print(json.dumps(summary, indent=2) if args.json else format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
