"""Render the tables of docs/reproduction.md from full-size results.

    python docs/report.py [results/reproduce] > /tmp/tables.md
    python docs/report.py --sweeps results/gpu_only_qwen3-8b results/gpu_only_qwen3-32b ...
    python docs/report.py --fleet results/reproduce/fleet.json   # docs/fleet.md's tables
    python docs/report.py --cache-engineering results/reproduce/cache-engineering.json
    python docs/report.py --policies results/reproduce/policies.json   # docs/policies.md's
    python docs/report.py --pd results/reproduce/pd.json   # docs/pd.md's table
    python docs/report.py --moved OLD.md NEW.md   # every cell that moved between two renderings
    python docs/report.py --moved --headlines OLD.md NEW.md   # only the change columns

Reads the JSON documents the notebooks write at full size (``kvsim reproduce NAME --json``
gives the same documents) and prints one markdown table per experiment, ours beside the
paper's numbers. ``--sweeps`` instead reads the ``results.csv`` of the GPU-only sweeps
(docs/sweeps/*.yaml) and prints the "All gap models" table. ``--moved`` compares the tables
of two markdown files (e.g. the published docs/reproduction.md and a fresh rendering) and
prints one row per cell that moved, ``before -> after``, rows matched by their key columns.
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


def table(header: list[str], rows: list[list[str]], right: set[int] = frozenset()) -> str:
    """A markdown table; the columns numbered in ``right`` are right-aligned."""
    out = ["| " + " | ".join(header) + " |",
           "|" + "".join("---:|" if i in right else "---|" for i in range(len(header)))]
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


def sec(v) -> str:
    """Seconds: three decimals below 10, then thousands separated; ``-`` for none."""
    return "-" if v is None else f"{v:.3f}" if v < 10 else f"{v:,.1f}"


def study_workloads(path: str) -> list[tuple[str, list[dict]]]:
    """A study's ``--json`` document (sim/studies/) as (workload, its rows), in the order the
    workloads first appear; its notes are printed first."""
    doc = json.loads(Path(path).read_text())
    for note in doc.get("notes", []):
        print(f"Note: {note}\n")
    rows = doc["rows"]
    return [(w, [r for r in rows if r["workload"] == w])
            for w in dict.fromkeys(r["workload"] for r in rows)]


def fleet(path: str) -> None:
    """One table per workload of ``kvsim reproduce fleet --json`` (sim/studies/fleet.py)."""
    for workload, rows in study_workloads(path):
        print(f"\n#### {workload}\n")
        print(table(["router", "eviction", "replicas", "TTFT mean s", "TTFT p90 s",
                     "JCT mean s", "hit rate", "reuse available", "reuse captured",
                     "affinity", "load CV"],
                    [[r["router"], r["policy"], r["replicas"], sec(r["ttft_mean_s"]),
                      sec(r["ttft_p90_s"]), sec(r["jct_mean_s"]), frac(r["hit_rate"]),
                      frac(r["reuse_available"]), frac(r["reuse_captured"]),
                      frac(r["affinity"]), "-" if r["load_cv"] is None else
                      f"{r['load_cv']:.2f}"]
                     for r in sorted(rows, key=lambda r: r["replicas"])]))


def pd_tables(path: str) -> None:
    """One table per workload of ``kvsim reproduce pd --json`` (sim/studies/pd.py)."""
    for workload, rows in study_workloads(path):
        print(f"\n#### {workload} ({rows[0]['gpus']} GPUs)\n")
        print(table(["arrangement", "engine", "eviction", "router", "rule", "local below",
                     "decode cache", "return", "prealloc", "TTFT mean s", "TTFT p90 s",
                     "JCT mean s", "hit rate",
                     "output recomputed", "local", "moved GB", "link busy max",
                     "prefill busy", "decode busy", "prealloc wait s", "prefill s",
                     "transfer s", "first decode s", "retractions"],
                    [[r["arrangement"], r["engine"], r["policy"], r["router"], r["rule"],
                      f"{r['threshold']:,}", r["decode_cache"], r["pd_return"],
                      r["prealloc"],
                      sec(r["ttft_mean_s"]), sec(r["ttft_p90_s"]), sec(r["jct_mean_s"]),
                      frac(r["hit_rate"]), frac(r["recomputed_output_share"]),
                      frac(r["local_share"]), f"{r['transfer_gb']:,.1f}",
                      frac(r["link_busy_max"]),
                      "-" if r["prefill_busy"] is None else frac(r["prefill_busy"]),
                      "-" if r["decode_busy"] is None else frac(r["decode_busy"]),
                      sec(r["prealloc_wait_s_mean"]),
                      sec(r["prefill_s_mean"]), sec(r["transfer_s_mean"]),
                      sec(r["first_decode_s_mean"]), f"{r['decode_retractions']:,}"]
                     for r in rows], right=set(range(9, 24))))


def cache_engineering(path: str) -> None:
    """docs/cache-engineering.md's results table from ``kvsim reproduce cache-engineering
    --json``: one row per model, concurrency and strategy; latency mean and TTFT for both
    evictions (sglang / penelope), every other column SGLang's eviction."""
    if not Path(path).is_file():
        print(f"report.py: error: {path}: no such file (kvsim reproduce cache-engineering "
              "--json)", file=sys.stderr)
        sys.exit(2)
    rows = json.loads(Path(path).read_text())["rows"]
    by = {(r["model"], r["concurrency"], r["strategy"], r["eviction"]): r for r in rows}
    out = []
    for model, n, strategy in dict.fromkeys((r["model"], r["concurrency"], r["strategy"])
                                            for r in rows):
        ref, pen = by[(model, n, strategy, "sglang")], by[(model, n, strategy, "penelope")]
        out.append([model, n, strategy,
                    f"{ref['request_latency_mean_s']:.2f} / {pen['request_latency_mean_s']:.2f}",
                    f"{ref['request_latency_p95_s']:.1f}",
                    f"{ref['ttft_mean_s']:.2f} / {pen['ttft_mean_s']:.2f}",
                    f"{ref['input_tokens_per_s']:,.0f}", f"{ref['output_tokens_per_s']:.1f}",
                    f"{ref['kv_peak_tokens']:,}", f"{ref['recomputed_tokens'] / 1e6:.1f}M",
                    f"{ref['api_cost_usd']:.2f}"])
    print(table(["model", "N", "strategy", "latency mean s (sglang / penelope)", "latency P95 s",
                 "TTFT s (sglang / penelope)", "input tok/s", "output tok/s", "KV peak tokens",
                 "recomputed tokens", "API cost USD"], out, right={1, *range(3, 11)}))


def policies(path: str) -> None:
    """docs/policies.md's two tables from ``kvsim reproduce policies --json``: each policy's
    mean over the configurations, and each configuration's best deployable policy against
    the oracle."""
    if not Path(path).is_file():
        print(f"report.py: error: {path}: no such file (kvsim reproduce policies --json)",
              file=sys.stderr)
        sys.exit(2)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from sim.studies.zoo import winners

    rows = json.loads(Path(path).read_text())["rows"]
    out = []
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]

        def mean(key: str, mine=mine) -> float:
            return sum(r[key] for r in mine) / len(mine)

        changes = [r["ttft_change"] for r in mine]
        out.append([f"`{policy}`", pct(mean("ttft_change")), pct(min(changes)),
                    pct(max(changes)), f"{mean('gap_closed'):.2f}", pct(mean("jct_change")),
                    frac(mean("hit_rate"))])
    print(table(["policy", "mean TTFT change", "best", "worst", "mean gap closed",
                 "mean JCT change", "mean hit rate"], out))
    rules = {(r["model"], r["sessions"], r["gaps"], r["tree"]): r["oracle_rule"]
             for r in rows if r["oracle"]}
    print("\nThe best deployable policy of each configuration, against the oracle:\n")
    print(table(["configuration", "best deployable", "its change", "oracle", "oracle rule"],
                [[f"{w['model'].removeprefix('qwen3-')} N={w['sessions']} {w['gaps']} "
                  f"{w['tree']}", f"`{w['best']}`", pct(w["best_ttft_change"]),
                  pct(w["oracle_ttft_change"]),
                  rules[(w["model"], w["sessions"], w["gaps"], w["tree"])]]
                 for w in winners(rows)]))


# Tables --moved compares: heading prefix -> how many leading columns identify a row. The
# paper's columns never move and are left out.
KEY_COLUMNS = {"Figure 1": 1, "GPU-only": 6, "Ablation": 3, "Scheduling": 2, "Two tiers": 2,
               "CPU-tier sweep": 1, "All gap models": 4, "Cache engineering": 3,
               "Policies": 1, "Best deployable": 1}


def read_tables(path: str) -> dict[str, dict[tuple[str, ...], dict[str, str]]]:
    """The markdown tables under each ``###``/``##`` heading that KEY_COLUMNS names: heading
    -> row key -> {column: cell}."""
    tables: dict[str, dict[tuple[str, ...], dict[str, str]]] = {}
    heading, header = None, None
    for line in Path(path).read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip()
            heading = next((h for h in KEY_COLUMNS if title.startswith(h)), None)
            header = None
        elif not line.startswith("|"):
            header = None  # a new table starts after any other line
        elif heading:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(line) <= set("|-"):
                row = dict(zip(header, cells, strict=False))
                tables.setdefault(heading, {})[tuple(cells[:KEY_COLUMNS[heading]])] = row
    return tables


def is_headline(column: str) -> bool:
    """A column that compares two systems (a change), not an absolute time or hit rate."""
    return ("change" in column or column.startswith("penelope vs")
            or "(sglang / penelope)" in column or column in ("best deployable", "oracle")
            or column.endswith((" TTFT", " JCT")))  # the sweep table's changes


def moved(old_path: str, new_path: str, headlines: bool = False) -> None:
    """One row per cell that differs between the same row of the same table in the two files
    (rows only in the new file are listed as new, rows only in the old one as gone); with
    ``headlines`` only the change columns."""
    for path in (old_path, new_path):
        if not Path(path).exists():
            print(f"report.py: error: {path}: no such file", file=sys.stderr)
            sys.exit(2)
    old, new = read_tables(old_path), read_tables(new_path)
    out = []
    for heading in KEY_COLUMNS:
        if heading not in old or heading not in new:
            continue
        for key, row in new[heading].items():
            before = old[heading].get(key)
            if before is None:
                out.append([heading, " / ".join(key), "(new row)", "-", "-"])
                continue
            out += [[heading, " / ".join(key), col, before.get(col, "-"), cell]
                    for col, cell in list(row.items())[KEY_COLUMNS[heading]:]
                    if not col.startswith("paper") and before.get(col) != cell
                    and (not headlines or is_headline(col))]
        out += [[heading, " / ".join(key), "(row gone)", "-", "-"]
                for key in old[heading] if key not in new[heading]]
    print(table(["table", "row", "column", "before", "after"], out) if out else
          "No published cell moved.")


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--policies":
        policies(argv[1] if len(argv) > 1 else "results/reproduce/policies.json")
        return
    if argv and argv[0] == "--cache-engineering":
        cache_engineering(argv[1] if len(argv) > 1 else
                          "results/reproduce/cache-engineering.json")
        return
    if argv and argv[0] == "--moved":
        headlines = "--headlines" in argv
        files = [a for a in argv[1:] if a != "--headlines"]
        if len(files) != 2:
            print("report.py: error: --moved needs two files, OLD.md NEW.md", file=sys.stderr)
            sys.exit(2)
        moved(files[0], files[1], headlines)
        return
    if argv and argv[0] == "--sweeps":
        sweeps(argv[1:])
        return
    if argv and argv[0] == "--fleet":
        fleet(argv[1] if len(argv) > 1 else "results/reproduce/fleet.json")
        return
    if argv and argv[0] == "--pd":
        pd_tables(argv[1] if len(argv) > 1 else "results/reproduce/pd.json")
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
