"""Cache speed: one cc-traces op stream through SGLang's RadixCache and our three presets.

The stream (match + lock, evict the shortfall + allocate, insert + unlock, fcfs touches) of the
360 shared cc-traces sessions, 4 sessions active at a time (round-robin closed loop, 2
requests in flight), under 256K tokens = 4096 blocks of 64 tokens. Every side replays the
same stream in this process; only time inside cache calls is counted (SGLang's token arrays
and KV tensors are built outside the timer, as our id arrays are; torch runs on one thread,
SGLang's fastest CPU setting, see sglang_ref.torch_single_thread). Targets (issue 4): our
`sglang` preset >= 5x SGLang's requests/s; `penelope` within 1.5x of our `sglang`.

    python -m benchmarks.bench_cache [--sessions K] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.opreplay import OursSide, SglangSide, Timing, timed_replay
from benchmarks.opstream import trace_stream
from benchmarks.sglang_ref import torch_single_thread

REPO = Path(__file__).resolve().parent.parent
CC_TRACES = REPO.parent / "shared" / "data" / "cc-traces"
PRESETS = ("sglang", "vllm", "penelope")
TARGET_VS_SGLANG = 5.0
TARGET_PENELOPE = 1.5


def run(
    trace_dir: Path = CC_TRACES,
    sessions: int | None = None,
    active: int = 4,
    in_flight: int = 2,
    capacity_blocks: int = 4096,
    max_requests: int | None = None,
    with_sglang: bool = True,
) -> dict[str, Any]:
    """Replay the stream through every side; return a JSON-ready summary."""
    t0 = time.perf_counter()
    stream = trace_stream(
        trace_dir,
        sessions=sessions,
        active=active,
        in_flight=in_flight,
        capacity_blocks=capacity_blocks,
        max_requests_per_session=max_requests,
    )
    build_s = time.perf_counter() - t0
    timings: list[Timing] = []
    if with_sglang:
        with torch_single_thread():
            side = SglangSide(capacity_blocks, stream.block_size, record=False)
            timings.append(timed_replay(stream, side))
    for preset in PRESETS:
        timings.append(timed_replay(stream, OursSide(capacity_blocks, preset, record=False)))
    by_name = {t.name: t for t in timings}
    ours = by_name["kvsim sglang"].requests_per_s
    rows = []
    for t in timings:
        rows.append(
            {
                "side": t.name,
                "requests": t.requests,
                "ops": t.ops,
                "seconds": round(t.seconds, 4),
                "requests_per_s": round(t.requests_per_s, 1),
                "vs_sglang_radixcache": (
                    round(t.requests_per_s / by_name["SGLang RadixCache"].requests_per_s, 2)
                    if with_sglang
                    else None
                ),
                "vs_kvsim_sglang": round(t.requests_per_s / ours, 2),
                "hit_blocks": t.hit_blocks,
                "aborted": t.aborted,
            }
        )
    summary: dict[str, Any] = {
        "stream": stream.name,
        "sessions": sessions if sessions is not None else "all",
        "active": active,
        "in_flight": in_flight,
        "capacity_blocks": capacity_blocks,
        "block_size": stream.block_size,
        "build_seconds": round(build_s, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rows": rows,
    }
    pen = by_name["kvsim penelope"].requests_per_s
    summary["penelope_slowdown_vs_kvsim_sglang"] = round(ours / pen, 2)
    summary["penelope_target_met"] = ours / pen <= TARGET_PENELOPE
    if with_sglang:
        speedup = ours / by_name["SGLang RadixCache"].requests_per_s
        summary["kvsim_sglang_speedup"] = round(speedup, 2)
        summary["speedup_target_met"] = speedup >= TARGET_VS_SGLANG
    return summary


def format_table(summary: dict[str, Any]) -> str:
    head = (
        f"{'side':<20} {'requests':>9} {'ops':>8} {'seconds':>9} {'req/s':>10} "
        f"{'vs SGLang':>10} {'vs ours':>8} {'hit blocks':>12} {'aborted':>8}"
    )
    lines = [
        f"stream {summary['stream']}: {summary['capacity_blocks']} blocks x "
        f"{summary['block_size']} tokens, {summary['active']} sessions active, "
        f"{summary['in_flight']} in flight (built in {summary['build_seconds']} s)",
        head,
        "-" * len(head),
    ]
    for r in summary["rows"]:
        vs = r["vs_sglang_radixcache"]
        lines.append(
            f"{r['side']:<20} {r['requests']:>9} {r['ops']:>8} {r['seconds']:>9.3f} "
            f"{r['requests_per_s']:>10.1f} {'' if vs is None else f'{vs:.2f}x':>10} "
            f"{r['vs_kvsim_sglang']:>7.2f}x {r['hit_blocks']:>12} {r['aborted']:>8}"
        )
    if "kvsim_sglang_speedup" in summary:
        ok = "met" if summary["speedup_target_met"] else "MISSED"
        lines.append(
            f"kvsim sglang / SGLang RadixCache: {summary['kvsim_sglang_speedup']:.2f}x "
            f"(target >= {TARGET_VS_SGLANG}x: {ok})"
        )
    ok = "met" if summary["penelope_target_met"] else "MISSED"
    lines.append(
        f"kvsim sglang / kvsim penelope: {summary['penelope_slowdown_vs_kvsim_sglang']:.2f}x "
        f"(target <= {TARGET_PENELOPE}x: {ok})"
    )
    lines.append(f"peak RSS {summary['peak_rss_mb']} MB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_cache", description=__doc__)
    ap.add_argument("--trace-dir", type=Path, default=CC_TRACES)
    ap.add_argument("--sessions", type=int, default=None, help="first K sessions (default all)")
    ap.add_argument("--active", type=int, default=4, help="sessions replayed at a time")
    ap.add_argument("--in-flight", type=int, default=2, help="requests running at a time")
    ap.add_argument("--capacity", type=int, default=4096, help="capacity in 64-token blocks")
    ap.add_argument("--max-requests", type=int, default=None, help="per session")
    ap.add_argument("--no-sglang", action="store_true", help="skip SGLang's RadixCache")
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = ap.parse_args(argv)
    if not args.trace_dir.is_dir():
        print(f"bench_cache: skipped, {args.trace_dir} absent", file=sys.stderr)
        return 0
    summary = run(
        args.trace_dir,
        sessions=args.sessions,
        active=args.active,
        in_flight=args.in_flight,
        capacity_blocks=args.capacity,
        max_requests=args.max_requests,
        with_sglang=not args.no_sglang,
    )
    print(json.dumps(summary, indent=2) if args.json else format_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
