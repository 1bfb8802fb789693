"""Write the reproduction notebooks (one per experiment) from this file's templates.

    python notebooks/build.py            # (re)write the .ipynb files without outputs
    python notebooks/build.py --execute  # and execute them at full size (commits outputs)

The tests execute every notebook with ``QUICK = True`` injected into its parameters cell.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

PARAMS = """# Parameters (tests inject QUICK = True)
QUICK = False
TRACE = None  # None: ../shared/data/cc-traces when present, else synthetic:claude-code
GAPS = "tool"  # the paper replays the recorded tool time
JOBS = 2
PROFILES = {profiles!r}  # {profiles_note}"""

# The profile family each notebook prices with: the one its document's tables state
# (docs/reproduction.md: derived; docs/policies.md and docs/cache-engineering.md: the
# default measured-kernel profiles).
PROFILES = {"policies": None, "cache-engineering": None, "fleet": None, "pd": None,
            "accuracy": None, "hybrid": None}
PROFILE_NOTES = {
    "derived": "docs/reproduction.md's family (derived-h100-MODEL); None: the default",
    None: "None: the default (kernels-h100_sxm-MODEL); 'derived': derived-h100-MODEL",
}

SETUP = """import sys, pathlib
sys.path.insert(0, str(pathlib.Path.cwd().parent))  # run from notebooks/ without installing
import pandas as pd
import matplotlib.pyplot as plt
from sim.studies import reproduce
pd.set_option("display.width", 200)
pd.set_option("display.max_columns", 30)"""

RUN = """doc = reproduce({name!r}, trace=TRACE, quick=QUICK, jobs=JOBS, gaps=GAPS,
                profiles=PROFILES)
if not QUICK:  # full-size results feed docs/reproduction.md (python docs/report.py)
    from sim.io import atomic_write_text, dumps
    atomic_write_text(f"../results/reproduce/{{doc['experiment']}}.json", dumps(doc))
print(f"trace: {{doc['trace']}} ({{doc['trace_kind']}}), gaps: {{doc['gaps']}}, "
      f"profiles: {{PROFILES or 'default'}}, quick: {{doc['quick']}}")
df = pd.DataFrame(doc["rows"])
df"""

# The fleet grid takes hours of CPU at full size: the notebook shows the document of a full
# run when one is saved (``kvsim reproduce fleet --json > results/reproduce/fleet.json``, or
# this notebook's own full-size run) and runs the experiment otherwise.
FLEET_RUN = """import json, pathlib
saved = pathlib.Path("../results/reproduce/fleet.json")
if not QUICK and saved.is_file():
    doc = json.loads(saved.read_text())
else:
    doc = reproduce("fleet", trace=TRACE, quick=QUICK, jobs=JOBS, gaps=GAPS, profiles=PROFILES)
    if not QUICK:
        from sim.io import atomic_write_text, dumps
        atomic_write_text(str(saved), dumps(doc))
print(f"trace: {doc['trace']} ({doc['trace_kind']}), quick: {doc['quick']}, "
      f"rows: {len(doc['rows'])}")
df = pd.DataFrame(doc["rows"])
df"""
# The accuracy study replays the shipped ground truth (no trace, no gap model, its own
# profiles per measured GPU).
ACCURACY_RUN = """doc = reproduce("accuracy", quick=QUICK)
if not QUICK:
    from sim.io import atomic_write_text, dumps
    atomic_write_text("../results/reproduce/accuracy.json", dumps(doc))
print(f"{len(doc['runs'])} ground-truth runs, {doc['replays']} replays in {doc['seconds']} s, "
      f"quick: {doc['quick']}")
df = pd.DataFrame(doc["rows"])
df["fit"] = df.calibration.where(df.calibration == "none", "leave-one-out")
head = df[df.metric.isin(["ttft_mean", "tpot_mean", "latency_mean"])]
head.pivot_table(index=["run", "metric"], columns="fit", values="error", sort=False).round(3)"""
RUNS = {"fleet": FLEET_RUN, "pd": FLEET_RUN.replace('"fleet"', '"pd"').replace(
    "fleet.json", "pd.json"), "accuracy": ACCURACY_RUN}

# Cells after a notebook's plot: (markdown, code) pairs.
CONTINUUM_INTRO = (
    "## Continuum on its own engine\n\n"
    "Continuum is a vLLM patch measured against vLLM's FCFS scheduler; here it runs as "
    "`--vllm-patch` variants of the vLLM engine (`reproduce policies --engine vllm`, "
    "docs/policies.md): `continuum` (learned TTL pins + program-level FCFS), "
    "`continuum-fixed` (the public code's 2 s threshold), the pins alone and program FCFS "
    "alone, against `vllm` at N = 4, 8, 16, 32 sessions (Qwen3-8B, 256K KV tokens, recorded "
    "tool waits). Continuum reports over 8x better mean JCT.")
CONTINUUM_RUN = """vdoc = reproduce("policies", trace=TRACE, quick=QUICK, jobs=JOBS, gaps=GAPS,
                 profiles=PROFILES, engine="vllm")
vdf = pd.DataFrame(vdoc["rows"])
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for policy, g in vdf.groupby("policy", sort=False):
    axes[0].plot(g.sessions, g.jct_speedup, "o-", label=policy)
    axes[1].plot(g.sessions, 100 * g.ttft_change, "o-", label=policy)
axes[0].set_ylabel("mean JCT speedup vs vllm (x)"); axes[1].set_ylabel("TTFT change vs vllm (%)")
for ax in axes:
    ax.set_xscale("log", base=2); ax.set_xlabel("sessions N"); ax.grid(alpha=.3)
axes[0].legend(fontsize=7); fig.tight_layout()
vdf[["sessions", "policy", "jct_mean_s", "jct_change", "jct_p90_s", "ttft_mean_s",
     "ttft_change", "recomputed_saved_tokens", "queue_saved_s"]].round(3)"""
EXTRA = {"policies": [(CONTINUUM_INTRO, CONTINUUM_RUN)]}

NOTEBOOKS = {
    "figure1": (
        "# Figure 1: deleting from the front vs from the end\n\n"
        "A cached context of 8K..128K tokens loses 30% of its KV either as a segment starting "
        "at position 2K or from the end; 512 tokens are appended and the next request "
        "recomputes the deleted tokens and the new ones. Both recompute the same number of "
        "tokens, so the linear work is identical and the difference is attention: a token at "
        "position p costs W + p units (Section 2.2). The paper measured 1.14x at 8K and 2.93x "
        "at 128K on one H100 with Qwen3-8B.",
        """fig, ax = plt.subplots(figsize=(5, 3.5))
ax.plot(df.context_tokens // 1024, df.speedup, "o-", label="kvsim: units (Section 2.2)")
ax.plot(df.context_tokens // 1024, df.speedup_seconds, "s--", label="kvsim: seconds (profile)")
paper = df.dropna(subset=["paper_speedup"])
ax.plot(paper.context_tokens // 1024, paper.paper_speedup, "k*", ms=12, label="paper (measured)")
ax.set_xscale("log", base=2); ax.set_xlabel("context (K tokens)"); ax.set_ylabel("tail / front")
ax.legend(); ax.grid(alpha=.3)"""),
    "gpu-only": (
        "# GPU-only: Penelope and vLLM against SGLang on Claude Code traffic\n\n"
        "The 24 sessions with most requests, 15.6K shared prefix tokens, lpm for every "
        "system, KV caps 256K / 192K / 384K tokens for Qwen3 8B / 32B / 235B-A22B, N = 2, 4, 8 "
        "sessions at once. The paper reports mean TTFT -36% to -60% and JCT -27% to -37% for "
        "Penelope against stock SGLang. Both tree shapes are run: `chunked` (SGLang inserts "
        "every 8K prefill chunk, so whole-node eviction frees at most 8K tokens) and `whole` "
        "(one node per prompt, where whole-node eviction frees entire prompts).",
        """fig, ax = plt.subplots(figsize=(7, 3.5))
for (shape, policy), g in df.groupby(["prompt_nodes", "policy"]):
    labels = g.model.str.replace("qwen3-", "") + " N=" + g.sessions.astype(str)
    ax.plot(labels, 100 * g.ttft_change, "o-", label=f"{policy} TTFT ({shape} nodes)")
ax.axhspan(-60, -36, color="green", alpha=.1, label="paper TTFT range")
ax.axhline(0, color="k", lw=.8); ax.set_ylabel("change vs sglang (%)"); ax.legend(fontsize=7)
plt.xticks(rotation=30)"""),
    "ablation": (
        "# Ablation: where deletion starts x how much is deleted\n\n"
        "Qwen3-8B, 4 sessions. Start position: tail, head of the leaf node, or head of the "
        "private history; granularity: whole nodes or only the needed blocks. The paper: "
        "block + leaf-head -43%, block + tail -45%, block + private-head -63% TTFT vs SGLang; "
        "with whole-node deletion, requests that lost >= 90% of their private history carry "
        "90-94% of recomputation (block: 16-23%).",
        """fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
for ax, (shape, g) in zip(axes, df.groupby("prompt_nodes", sort=False)):
    x = range(len(g))
    ax.bar(x, 100 * g.ttft_change, label="kvsim")
    ax.scatter(x, 100 * g.paper_ttft_change.astype(float), color="k", marker="*", s=120,
               label="paper", zorder=3)
    ax.set_xticks(list(x), g.evict + " / " + g.granularity, rotation=35, ha="right")
    ax.axhline(0, color="k", lw=.8); ax.set_title(f"tree: {shape} nodes")
axes[0].set_ylabel("TTFT change vs sglang (%)"); axes[0].legend()"""),
    "fcfs": (
        "# Scheduling, tool waits and sliding windows\n\n"
        "Three limits the paper names: (1) under FCFS the 235B gain falls from -43% to -17%; "
        "(2) on Codex-style traffic with long tool waits (FreeInference, 8B, N = 3, 4) TTFT "
        "falls 30-32% but JCT only ~2%; (3) with sliding-window layers late tokens are not "
        "expensive, so front eviction helps much less.",
        """fig, ax = plt.subplots(figsize=(7, 3.5))
x = range(len(df))
ax.bar([i - .2 for i in x], 100 * df.ttft_change, .4, label="TTFT")
ax.bar([i + .2 for i in x], 100 * df.jct_change, .4, label="JCT")
ax.scatter(x, 100 * df.paper_ttft_change.astype(float), color="k", marker="*", s=120,
           label="paper TTFT", zorder=3)
ax.set_xticks(list(x), df.case, rotation=30, ha="right"); ax.axhline(0, color="k", lw=.8)
ax.set_ylabel("penelope vs sglang (%)"); ax.legend()"""),
    "two-tier": (
        "# Two tiers: GPU and CPU as one cache\n\n"
        "A GPU tier half the GPU-only cap plus an equally large CPU tier. The baseline is "
        "SGLang with HiCache (write-through host copies, per-tier LRU), first with lpm, then "
        "with lpm-cpu, a scheduler that also counts CPU-resident prefixes (the paper: -13% to "
        "-37% TTFT). Penelope keeps every block in one tier and decides deletions across both "
        "with one order (the paper: a further -46% to -76%).",
        """fig, ax = plt.subplots(figsize=(7, 3.5))
labels = df.model.str.replace("qwen3-", "") + " N=" + df.sessions.astype(str)
x = range(len(df))
ax.bar([i - .2 for i in x], 100 * df.lpm_cpu_change, .4, label="hicache lpm-cpu vs lpm")
ax.bar([i + .2 for i in x], 100 * df.penelope_change_vs_lpm_cpu, .4,
       label="penelope vs hicache lpm-cpu")
ax.set_xticks(list(x), labels, rotation=30); ax.axhline(0, color="k", lw=.8)
ax.set_ylabel("TTFT change (%)"); ax.legend()"""),
    "cpu-sweep": (
        "# How much CPU memory until the policies tie?\n\n"
        "Qwen3-8B, 8 sessions, FCFS for both, a 128K-token GPU tier and a CPU tier of 1x to 4x "
        "the GPU tier. The paper: at 4x SGLang reaches a 92% hit rate and the systems tie; "
        "with equal tiers TTFT falls only 10%.",
        """fig, ax1 = plt.subplots(figsize=(5.5, 3.5))
ax1.plot(df.cpu_over_gpu, 100 * df.ttft_change, "o-", label="penelope TTFT change (%)")
ax1.axhline(0, color="k", lw=.8); ax1.set_xlabel("CPU tier / GPU tier")
ax1.set_ylabel("TTFT change vs sglang (%)")
ax2 = ax1.twinx()
ax2.plot(df.cpu_over_gpu, 100 * df.sglang_hit_rate, "s--", color="gray", label="sglang hit %")
ax2.plot(df.cpu_over_gpu, 100 * df.penelope_hit_rate, "^--", color="green",
         label="penelope hit %")
ax2.set_ylabel("hit rate (%)"); fig.legend(loc="lower right", fontsize=7)"""),
    "policies": (
        "# The policy zoo against the clairvoyant oracle\n\n"
        "Every policy kvsim ships (docs/policies.md) on the paper's Claude Code setup: the 24 "
        "shared sessions with most requests, 15.6K shared prefix tokens, 128K context cut, "
        "lpm (Continuum: its program-level FCFS), Qwen3 8B / 32B at 256K / 192K KV tokens, "
        "N = 4 and 8, tool waits and waits capped at 10 s, both tree shapes. Zoo orders whose "
        "own start differs also run on Penelope's (`@private-head+block`); `ttl(tau_s=...)` "
        "rows are the fixed-tau sensitivity sweep of the learned TTL rule.\n\n"
        "**`clairvoyant-oracle` reads the replay's future** (when each session sends its next "
        "request): it is not a deployable policy but a clairvoyant *heuristic* -- the better "
        "of Belady's rule and its cost-aware form per configuration -- that every policy is "
        "measured against (`gap_closed` = (sglang - policy) / (sglang - oracle) on mean "
        "TTFT). It is not a proven bound: sizes, position-dependent costs, batching and the "
        "closed loop make the offline problem hard (policies/zoo/clairvoyant.py).",
        """df["config"] = (df.model.str.replace("qwen3-", "") + " N=" + df.sessions.astype(str)
                + " " + df.gaps + " " + df.tree)
configs = list(dict.fromkeys(df.config))
fig, ax = plt.subplots(figsize=(13, 5.5))
x = range(len(configs))
colors = iter(plt.cm.tab20.colors)
for policy, g in df.groupby("policy", sort=False):
    g = g.set_index("config").reindex(configs)
    if policy == "clairvoyant-oracle":
        ax.plot(x, 100 * g.ttft_change, "k-", lw=3, zorder=5,
                label="clairvoyant-oracle (reads the future)")
    elif policy.startswith("ttl("):
        ax.plot(x, 100 * g.ttft_change, color="0.8", lw=.8)
    else:
        ax.plot(x, 100 * g.ttft_change, "o-", ms=3, lw=1, color=next(colors), label=policy,
                ls="--" if "@" in policy else "-")
ax.plot([], [], color="0.8", label="ttl, fixed tau (sensitivity)")
ax.axhline(0, color="k", lw=.6); ax.set_ylabel("mean TTFT change vs sglang (%)")
ax.set_xticks(list(x), configs, rotation=40, ha="right", fontsize=8)
ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1)); ax.grid(alpha=.3)
fig.tight_layout()
from sim.studies.zoo import winners
display(pd.DataFrame(winners(doc["rows"])))
df.pivot_table(index="policy", columns="config", values="gap_closed", sort=False).round(2)"""),
    "cache-engineering": (
        "# Cache engineering against context engineering (seed 003)\n\n"
        "How a session's history is managed on purpose: text trimming and summarization "
        "(context engineering, re-prefill), AKV's rolling drop with and without "
        "repositioning, Leyline's in-place splice, a MemDecay-style region budget; each "
        "under SGLang's and Penelope's eviction, GPT-OSS-120B and Qwen3-32B, 8 and 10 "
        "sessions at once on the shared Claude Code traces. AKV's Table 2 (its own traffic, "
        "8 A800s) is shown beside ours for direction only.\n\n"
        "**kvsim prices serving only: it does not model what trimming, summarizing, dropping "
        "or pruning does to task accuracy.**",
        """print(doc["note"])
display(pd.DataFrame(doc["akv_table2"]))
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
for ax, col in zip(axes, ["request_latency_mean_s", "api_cost_usd"]):
    for (model, n, ev), g in df.groupby(["model", "concurrency", "eviction"], sort=False):
        ax.plot(g.strategy, g[col], "o-", label=f"{model} N={n} {ev}")
    ax.set_ylabel(col); ax.tick_params(axis="x", rotation=30)
axes[0].legend(fontsize=6)
fig.suptitle("serving cost only: task accuracy is not modelled", fontsize=9)"""),
    "fleet": (
        "# A fleet: the field's routers x eviction x replicas\n\n"
        "N replicas of a Qwen3-8B SGLang engine on one clock behind a router "
        "(docs/fleet.md): every built-in router (round-robin, random, least-load, "
        "power-of-two, session-affinity, and the field's sglang-cache-aware, dynamo-kv, "
        "llm-d, mooncake, preble with the defaults their sources ship) under SGLang's and "
        "Penelope's eviction, on 2, 4 and 8 replicas, for three workloads: the shared Claude "
        "Code sessions (8 at once per replica, closed loop), the Mooncake trace at its "
        "arrival times, and SGLang's shared-prefix benchmark shape "
        "(`synthetic:prefix-groups`). `reuse_available`: the longest GPU-resident prefix "
        "on any replica at decision time; `reuse_captured`: on the chosen one; `affinity`: "
        "follow-ups routed where the session's previous request went; `load_cv`: the "
        "coefficient of variation of busy time across replicas.",
        """for note in doc.get("notes", []):
    print("note:", note)
workloads = list(dict.fromkeys(df.workload))
fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4), squeeze=False)
colors = dict(zip(dict.fromkeys(df.router), plt.cm.tab10.colors))
for ax, w in zip(axes[0], workloads):
    for (router, policy), g in df[df.workload == w].groupby(["router", "policy"], sort=False):
        ax.plot(g.replicas, g.ttft_mean_s, "o-" if policy == "sglang" else "s--",
                color=colors[router], ms=3, label=f"{router} ({policy})")
    ax.set_yscale("log"); ax.set_title(w); ax.set_xlabel("replicas")
    ax.set_xticks(sorted(df.replicas.unique())); ax.set_ylabel("mean TTFT (s)")
    ax.grid(alpha=.3)
axes[0][-1].legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
fig.tight_layout()
df.pivot_table(index=["workload", "router"], columns=["policy", "replicas"],
               values="ttft_mean_s", sort=False).round(3)"""),
    "accuracy": (
        "# Accuracy: kvsim against measured vLLM servers\n\n"
        "Every shipped ground-truth run (LLMServingSim's four vLLM 0.19 runs: Llama-3.1-8B on "
        "an RTX 4090 and an RTX PRO 6000, Qwen3-32B on two PRO 6000s at TP 2, Qwen3-30B-A3B "
        "at DP 2 x EP 2) replayed as `kvsim validate` replays it: uncalibrated (kernel tables "
        "or the datasheet roofline alone) and calibrated leave-one-out (the server terms of "
        "`kvsim calibrate --from-measurements` fitted on the other dense runs only), beside "
        "the measurement and the publisher's own simulator error (docs/accuracy.md). The "
        "dotted lines are issue 53's 5% bound for the dense runs.",
        """fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
for ax, (metric, g) in zip(axes, head.groupby("metric", sort=False)):
    piv = g.pivot_table(index="run", columns="fit", values="error")
    piv["publisher"] = g.groupby("run").publisher_error.first() if "publisher_error" in g \
        else float("nan")
    (100 * piv).plot.barh(ax=ax, legend=ax is axes[0])
    for x in (-5, 5):
        ax.axvline(x, ls=":", c="k")
    ax.set_xlabel(f"{metric} error (%)"); ax.grid(alpha=.3)
fig.tight_layout()
pd.DataFrame(doc["acceptance"])"""),
    "pd": (
        "# Prefill/decode disaggregation: where the prefix cache lives\n\n"
        "Aggregated replicas against prefill and decode pools at the same GPU count "
        "(docs/pd.md): every P:D split, Penelope against SGLang eviction on the prefill "
        "pool, conditional disaggregation (prefill on the decode worker below 2,048 "
        "uncached tokens), decode caching off, the output KV sent back, and the field's PD "
        "rules (Dynamo, SGLang's gateway, llm-d, Mooncake's Conductor), on the Claude Code "
        "sessions and the Mooncake trace. Qwen3-8B on H100s (measured-kernel profile), KV "
        "over 400 Gb/s RDMA. `output recomputed`: the share of prompt tokens a prefill "
        "worker computed only because the previous turn's output lived on a decode worker.",
        """for note in doc.get("notes", []):
    print("note:", note)
df["label"] = (df.arrangement + " " + df.policy + " " + df.rule + " thr=" + df.threshold.astype(str)
               + " cache=" + df.decode_cache + " ret=" + df.pd_return)
workloads = list(dict.fromkeys(df.workload))
fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 5), squeeze=False)
for ax, w in zip(axes[0], workloads):
    g = df[df.workload == w]
    ax.barh(g.label, g.ttft_mean_s, color=["tab:gray" if a.startswith("agg") else "tab:blue"
                                           for a in g.arrangement])
    ax.set_xscale("log"); ax.set_xlabel("mean TTFT (s)"); ax.set_title(w)
    ax.tick_params(axis="y", labelsize=6); ax.invert_yaxis(); ax.grid(alpha=.3)
fig.tight_layout()
df[["workload", "label", "ttft_mean_s", "ttft_p90_s", "jct_mean_s", "hit_rate",
    "recomputed_output_share", "local_share", "transfer_gb", "prefill_busy", "decode_busy",
    "first_decode_s_mean", "decode_retractions"]].round(3)"""),
    "hybrid": (
        "# Penelope on hybrid models\n\n"
        "Penelope against SGLang's and vLLM's eviction (the paper's GPU-only setup: lpm on "
        "the sglang engine, fcfs on the vllm engine with the Penelope patch, 4 sessions at "
        "once) for a full-attention model (Qwen3-32B), a sliding-window hybrid "
        "(gpt-oss-120b), a Gated DeltaNet hybrid (Qwen3-Next-80B-A3B) and an MLA+DSA model "
        "(DeepSeek-V3.2) at **equal cache pressure**: each model's KV memory in bytes holds "
        "as many sessions at the context cut as Qwen3-32B's 192K tokens do (docs/hybrid.md, "
        "Penelope on hybrid models). A row's `note` says where an engine keeps the model's "
        "groups as one full-attention cache, or refuses the combination. Beside the runs: "
        "Figure 1 per model (the deletion-position speedup) and hit rate against KV memory "
        "in bytes per model.",
        """for r in doc["rows"]:
    if r["note"]:
        print(f"{r['model']} / {r['engine']} / {r['preset']}: {r['note']}")
fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
for (engine, preset), g in df[df.preset != df.baseline].groupby(["engine", "preset"]):
    axes[0].plot(g.model, 100 * g.ttft_change, "o-", label=f"{preset} vs {g.baseline.iloc[0]} "
                 f"({engine} engine)")
axes[0].axhline(0, color="k", lw=.8); axes[0].set_ylabel("TTFT change (%)")
axes[0].tick_params(axis="x", rotation=20); axes[0].legend(fontsize=7)
f1 = pd.DataFrame(doc["figure1"])
for model, g in f1.groupby("model", sort=False):
    axes[1].plot(g.context_k, g.speedup_seconds, "o-", label=model)
axes[1].set_xscale("log", base=2); axes[1].set_xlabel("context (K tokens)")
axes[1].set_ylabel("Figure 1: tail / front (s)"); axes[1].legend(fontsize=7)
cap = pd.DataFrame(doc["capacity"])
for model, g in cap.groupby("model", sort=False):
    axes[2].plot(g.cache_gib, 100 * g.hit_rate, "o-", label=model)
axes[2].set_xscale("log", base=2); axes[2].set_xlabel("KV memory (GiB)")
axes[2].set_ylabel("hit rate (%), sglang, no clock"); axes[2].legend(fontsize=7)
for ax in axes:
    ax.grid(alpha=.3)
fig.tight_layout()
df[["model", "engine", "preset", "cache_gib", "cache_tokens", "ttft_mean_s", "ttft_change",
    "hit_rate", "recomputed_tokens"]].round(3)"""),
}


def build(name: str) -> nbformat.NotebookNode:
    intro, plot = NOTEBOOKS[name]
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell(intro),
        new_code_cell(PARAMS.format(profiles=(profiles := PROFILES.get(name, "derived")),
                                    profiles_note=PROFILE_NOTES[profiles]),
                      metadata={"tags": ["parameters"]}),
        new_code_cell(SETUP),
        new_code_cell(RUNS.get(name) or RUN.format(name=name)),
        new_code_cell(plot),
    ]
    for intro_more, code in EXTRA.get(name, []):
        nb.cells += [new_markdown_cell(intro_more), new_code_cell(code)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def path_of(name: str) -> Path:
    return HERE / f"{name.replace('-', '_')}.ipynb"


def main(argv: list[str]) -> None:
    execute = "--execute" in argv
    names = [a for a in argv if not a.startswith("--")] or list(NOTEBOOKS)
    for name in names:
        nb = build(name)
        if execute:
            from nbclient import NotebookClient

            NotebookClient(nb, timeout=3600, resources={"metadata": {"path": str(HERE)}}).execute()
        nbformat.write(nb, path_of(name))
        print(f"wrote {path_of(name)}")


if __name__ == "__main__":
    main(sys.argv[1:])
