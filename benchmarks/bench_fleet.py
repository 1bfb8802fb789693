"""Fleet speed: eight replicas replaying the Mooncake trace cost what one replica replaying it
alone costs (issue target: at most 1.5x its wall time).

    python -m benchmarks.bench_fleet [--json] [--repeat 3] [--routers round-robin,least-load]
                                     [--replicas 8] [--trace PATH]

The Mooncake synthetic trace (3,993 requests, ~15K-token prompts, 512-token blocks) is replayed
open loop at its timestamps on the sglang engine (sglang preset, 1M-token cache per replica).
Each variant runs ``--repeat`` times, interleaved (the machine may be shared); rows give the
median wall seconds of the simulation, its ratio to the single replica, and the fleet layer's
own seconds per request (routing, beliefs and the read-only truth probes: ``Fleet.submit``
minus the engine's ``submit``), which must stay flat in the number of replicas' work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = REPO.parent / "shared" / "data" / "mooncake" / "synthetic_trace.jsonl.gz"


class _Timer:
    """Accumulates the fleet layer's time: Fleet.submit minus the engines' submit."""

    def __init__(self) -> None:
        self.fleet = 0.0
        self.engine = 0.0
        self.calls = 0

    def install(self):
        from sim.engines import EngineBase
        from sim.fleet.fleet import Fleet

        timer = self
        fleet_submit, engine_submit = Fleet.submit, EngineBase.submit

        def timed_fleet(self, req):
            t0 = time.perf_counter()
            fleet_submit(self, req)
            timer.fleet += time.perf_counter() - t0
            timer.calls += 1

        def timed_engine(self, req):
            t0 = time.perf_counter()
            engine_submit(self, req)
            timer.engine += time.perf_counter() - t0

        Fleet.submit, EngineBase.submit = timed_fleet, timed_engine
        return lambda: (setattr(Fleet, "submit", fleet_submit),
                        setattr(EngineBase, "submit", engine_submit))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--routers", default="round-robin,least-load,session-affinity,"
                    f"{REPO}/docs/examples/prefix_or_least_load.py:PrefixOrLeastLoad")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not Path(args.trace).is_file():
        print(f"{args.trace}: no Mooncake trace here; nothing to measure")
        return 0

    from sim.config import RunConfig
    from sim.run import load_run_trace, run

    base = RunConfig.from_flat(trace=args.trace, replay="open", gpu_cache=1 << 20,
                               max_context=131072).with_preset("sglang")
    trace = load_run_trace(base)
    variants = [("single", base)] + [
        (r, base.with_fields(replicas=args.replicas, router=r)) for r in args.routers.split(",")]
    walls: dict[str, list[float]] = {k: [] for k, _ in variants}
    layer: dict[str, list[float]] = {k: [] for k, _ in variants}
    info: dict[str, dict] = {}
    for _ in range(args.repeat):
        for key, cfg in variants:
            timer = _Timer()
            undo = timer.install()
            try:
                t0 = time.perf_counter()
                res = run(cfg, trace)
                walls[key].append(time.perf_counter() - t0)
            finally:
                undo()
            if timer.calls:
                layer[key].append((timer.fleet - timer.engine) / timer.calls)
            s = res.summary
            info[key] = {"requests": s["requests"], "ttft_mean_s": s["ttft_mean_s"],
                         "hit_rate": s["hit_rate"]}
    single = statistics.median(walls["single"])
    rows = []
    for key, cfg in variants:
        wall = statistics.median(walls[key])
        rows.append({
            "variant": key, "replicas": cfg.fleet.replicas, "wall_s": wall,
            "ratio_to_single": wall / single,
            "fleet_layer_us_per_request": (statistics.median(layer[key]) * 1e6
                                           if layer[key] else None),
            **info[key]})
    if args.json:
        print(json.dumps({"trace": args.trace, "repeat": args.repeat, "rows": rows}))
        return 0
    print(f"{'variant':<18}{'replicas':>9}{'wall s':>9}{'x single':>10}{'layer us/req':>14}"
          f"{'requests':>10}{'ttft s':>10}{'hit':>7}")
    for r in rows:
        us = r["fleet_layer_us_per_request"]
        print(f"{r['variant'].rpartition('/')[2]:<18}{r['replicas']:>9}{r['wall_s']:>9.2f}"
              f"{r['ratio_to_single']:>10.2f}{'' if us is None else f'{us:.0f}':>14}"
              f"{r['requests']:>10}{r['ttft_mean_s']:>10.2f}{r['hit_rate']:>7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
