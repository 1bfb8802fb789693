"""Render the tables of docs/reproduction.md from full-size results.

    python docs/report.py [results/reproduce] > /tmp/tables.md
    python docs/report.py --sweeps results/gpu_only_qwen3-8b results/gpu_only_qwen3-32b ...
    python docs/report.py --fleet results/reproduce/fleet.json   # docs/fleet.md's tables

Reads the JSON documents the notebooks write at full size (``kvsim reproduce NAME --json``
gives the same documents) and prints one markdown table per experiment, ours beside the
paper's numbers. ``--sweeps`` instead reads the ``results.csv`` of the GPU-only sweeps
(docs/sweeps/*.yaml) and prints the "All gap models" table.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def pct(v) -> str:
    return "-" if v is None else f"{v:+.1%}"


def frac(v) -> str:
    return "-" if v is None or v != v else f"{v:.1%}"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


GAP_ORDER = ("recorded", "tool", "cap:10")


def sweeps(dirs: list[str]) -> None:
    """One row per (model, gap model, N, tree shape): SGLang's absolute TTFT and hit rate,
    vLLM's and Penelope's changes against it (the sweep's own ``*_change`` columns)."""
    rows = []
    for d in dirs:
        if not (Path(d) / "results.csv").is_file():
            print(f"report.py: error: {d}: no results.csv (a finished kvsim sweep folder)",
                  file=sys.stderr)
            sys.exit(2)
        with open(Path(d) / "results.csv", newline="") as f:
            rows += list(csv.DictReader(f))
    by = {(r["model"], r["gaps"], int(r["sessions"]), r["checkpoint_chunks"], r["policy"]): r
          for r in rows}
    models = list(dict.fromkeys(r["model"] for r in rows))
    out = []
    for model in models:
        for gaps in sorted({r["gaps"] for r in rows if r["model"] == model},
                           key=lambda g: (GAP_ORDER.index(g) if g in GAP_ORDER else 99, g)):
            for n in sorted({int(r["sessions"]) for r in rows if r["model"] == model}):
                for chunks, tree in (("True", "chunked"), ("False", "whole")):
                    ref = by[(model, gaps, n, chunks, "sglang")]
                    vllm, pen = (by[(model, gaps, n, chunks, p)] for p in ("vllm", "penelope"))
                    out.append([model.removeprefix("qwen3-"), gaps, tree, n,
                                f"{float(ref['ttft_mean_s']):.2f}", frac(float(ref["hit_rate"])),
                                *(c for r in (vllm, pen) for c in (
                                    pct(float(r["ttft_mean_s_change"])),
                                    pct(float(r["jct_mean_s_change"])),
                                    frac(float(r["hit_rate"]))))])
    print(table(["model", "gaps", "tree", "N", "sglang TTFT s", "sglang hit", "vllm TTFT",
                 "vllm JCT", "vllm hit", "penelope TTFT", "penelope JCT", "penelope hit"],
                out))


def fleet(path: str) -> None:
    """One table per workload of ``kvsim reproduce fleet --json`` (sim/exp_fleet.py)."""
    doc = json.loads(Path(path).read_text())

    def sec(v) -> str:
        return "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:,.1f}"

    for note in doc.get("notes", []):
        print(f"Note: {note}\n")
    rows = doc["rows"]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        print(f"\n#### {workload}\n")
        print(table(["router", "eviction", "replicas", "TTFT mean s", "TTFT p90 s",
                     "JCT mean s", "hit rate", "reuse available", "reuse captured",
                     "affinity", "load CV"],
                    [[r["router"], r["policy"], r["replicas"], sec(r["ttft_mean_s"]),
                      sec(r["ttft_p90_s"]), sec(r["jct_mean_s"]), frac(r["hit_rate"]),
                      frac(r["reuse_available"]), frac(r["reuse_captured"]),
                      frac(r["affinity"]), "-" if r["load_cv"] is None else
                      f"{r['load_cv']:.2f}"]
                     for r in sorted((r for r in rows if r["workload"] == workload),
                                     key=lambda r: r["replicas"])]))


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--sweeps":
        sweeps(argv[1:])
        return
    if argv and argv[0] == "--fleet":
        fleet(argv[1] if len(argv) > 1 else "results/reproduce/fleet.json")
        return
    d = Path(argv[0] if argv else "results/reproduce")
    if not d.is_dir():
        print(f"report.py: error: {d}: no such folder (the JSON documents of kvsim reproduce "
              "NAME --json, or the notebooks at full size)", file=sys.stderr)
        sys.exit(2)
    docs = {p.stem: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))}
    if not docs:
        print(f"report.py: error: {d}: no *.json results in this folder", file=sys.stderr)
        sys.exit(2)
    if "figure1" in docs:
        print("### Figure 1\n")
        print(table(["context", "kvsim units", "kvsim seconds", "paper measured", "difference"],
                    [[f"{r['context_tokens'] // 1024}K", f"{r['speedup']:.3f}",
                      f"{r['speedup_seconds']:.3f}",
                      "-" if r["paper_speedup"] is None else f"{r['paper_speedup']:.2f}",
                      pct(r["difference"])] for r in docs["figure1"]["rows"]]))
    if "gpu-only" in docs:
        print("\n### GPU-only (gaps: tool)\n")
        print(table(["engine", "tree", "model", "N", "policy", "vs", "TTFT change",
                     "JCT change", "hit rate", "baseline hit rate", "paper TTFT", "paper JCT"],
                    [[r["engine"], r["prompt_nodes"] or "-", r["model"], r["sessions"],
                      r["policy"], r["baseline"], pct(r["ttft_change"]),
                      pct(r["jct_change"]), frac(r["hit_rate"]), frac(r["baseline_hit_rate"]),
                      r["paper_ttft_change"] or "", r["paper_jct_change"] or ""]
                     for r in docs["gpu-only"]["rows"]]))
    if "ablation" in docs:
        print("\n### Ablation (qwen3-8b, N=4, gaps: tool)\n")
        print(table(["tree", "start", "granularity", "TTFT change", "paper", "hit rate",
                     "paper hit", "recompute share lost>=90%", "paper share"],
                    [[r["prompt_nodes"], r["evict"], r["granularity"], pct(r["ttft_change"]),
                      pct(r["paper_ttft_change"]), frac(r["hit_rate"]),
                      frac(r["paper_hit_rate"]), frac(r["recompute_share_lost90"]),
                      r["paper_recompute_share_lost90"]] for r in docs["ablation"]["rows"]]))
    if "fcfs" in docs:
        print("\n### Scheduling, tool waits, sliding windows (penelope vs sglang)\n")
        print(table(["case", "gaps", "TTFT change", "JCT change", "hit rate", "sglang hit",
                     "paper TTFT", "paper JCT"],
                    [[r["case"], r["gaps"], pct(r["ttft_change"]), pct(r["jct_change"]),
                      frac(r["hit_rate"]), frac(r["sglang_hit_rate"]),
                      pct(r["paper_ttft_change"]), pct(r["paper_jct_change"])]
                     for r in docs["fcfs"]["rows"]]))
    if "two-tier" in docs:
        print("\n### Two tiers (GPU tier 3/4 of the GPU-only cap + equal CPU tier)\n")
        print(table(["model", "N", "GPU+CPU tokens", "hicache lpm TTFT s",
                     "lpm-cpu change", "paper", "penelope vs lpm-cpu", "paper",
                     "penelope vs write-back lpm-cpu", "hit (hicache)",
                     "hit (write-back)", "hit (penelope)", "swap-buffer loads"],
                    [[r["model"], r["sessions"], f"{r['gpu_tokens']:,}+{r['cpu_tokens']:,}",
                      f"{r['hicache_lpm_ttft_s']:.2f}", pct(r["lpm_cpu_change"]),
                      r["paper_lpm_cpu_change"], pct(r["penelope_change_vs_lpm_cpu"]),
                      r["paper_penelope_change"], pct(r["penelope_change_vs_write_back"]),
                      frac(r["hicache_hit_rate"]), frac(r["hicache_write_back_hit_rate"]),
                      frac(r["penelope_hit_rate"]), r["penelope_swap_buffer_loads"]]
                     for r in docs["two-tier"]["rows"]]))
    if "cpu-sweep" in docs:
        print("\n### CPU-tier sweep (qwen3-8b, N=8, fcfs, GPU 128K)\n")
        print(table(["CPU/GPU", "sglang TTFT s", "penelope TTFT s", "TTFT change", "paper",
                     "sglang hit", "paper sglang hit", "penelope hit"],
                    [[f"{r['cpu_over_gpu']}x", f"{r['sglang_ttft_s']:.2f}",
                      f"{r['penelope_ttft_s']:.2f}", pct(r["ttft_change"]),
                      pct(r["paper_ttft_change"]), frac(r["sglang_hit_rate"]),
                      frac(r["paper_sglang_hit_rate"]), frac(r["penelope_hit_rate"])]
                     for r in docs["cpu-sweep"]["rows"]]))


if __name__ == "__main__":
    main(sys.argv[1:])
