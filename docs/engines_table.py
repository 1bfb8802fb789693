"""Render docs/engine.md's "The two engines on the paper's Claude Code setup" table.

    python docs/engines_table.py [-j 2] > /tmp/engines.md

Runs the 24 runs (qwen3-8b, the 24 shared Claude Code sessions, 15.6K shared prefix, 128K
context cut, 256K-token cache, the default measured-kernel profile): per gap model (tool,
cap:10) and N (4, 8), penelope against each engine's default policy on the vllm engine (fcfs),
the sglang engine with fcfs and with lpm. Prints the markdown table: baseline mean TTFT ->
penelope's TTFT and JCT changes; baseline hit rate -> penelope's; the prompt tokens computed
again after preemptions or retractions (``preempted_recompute_tokens``), baseline -> penelope.
The first row names each quantity.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.studies.study import Context, default_trace, run_all

COLUMNS = (("vllm", "fcfs", "vllm engine (fcfs, async): vllm -> penelope"),
           ("sglang", "fcfs", "sglang engine, fcfs: sglang -> penelope"),
           ("sglang", "lpm", "sglang engine, lpm: sglang -> penelope"))
POINTS = [(gaps, n) for gaps in ("tool", "cap:10") for n in (4, 8)]


def main(argv: list[str]) -> None:
    jobs = int(argv[argv.index("-j") + 1]) if "-j" in argv else 1
    trace, _ = default_trace()
    ctx = Context(trace=trace, jobs=jobs)
    configs, keys = [], []
    for gaps, n in POINTS:
        for engine, sched, _ in COLUMNS:
            base = replace(ctx.base("qwen3-8b", n), gaps=gaps, engine=engine, scheduler=sched)
            for preset in (engine, "penelope"):
                configs.append(base.with_preset(preset))
                keys.append((gaps, n, engine, sched, preset))
    sums = dict(zip(keys, run_all(ctx, configs), strict=True))

    def sec(v: float) -> str:
        return f"{v:.3f} s" if v < 10 else f"{v:.2f} s"

    print("| gaps | N | " + " | ".join(c[2] for c in COLUMNS) + " |")
    print("|" + "---|" * (2 + len(COLUMNS)))
    for row, (gaps, n) in enumerate(POINTS):
        cells = []
        jct_label, hit_label, redone_label = ("JCT ", "hit ", "redone ") if row == 0 else ("",) * 3
        for engine, sched, _ in COLUMNS:
            ref, pen = (sums[(gaps, n, engine, sched, p)] for p in (engine, "penelope"))
            ttft = pen["ttft_mean_s"] / ref["ttft_mean_s"] - 1
            jct = pen["jct_mean_s"] / ref["jct_mean_s"] - 1
            redone = (ref["preempted_recompute_tokens"], pen["preempted_recompute_tokens"])
            cells.append(f"{sec(ref['ttft_mean_s'])} -> {ttft:+.1%}, {jct_label}{jct:+.1%}; "
                         f"{hit_label}{ref['hit_rate']:.1%} -> {pen['hit_rate']:.1%}; "
                         f"{redone_label}{redone[0]:,} -> {redone[1]:,}")
        print(f"| {gaps} | {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
