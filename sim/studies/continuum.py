"""``kvsim reproduce policies --engine vllm``: Continuum on its own engine.

Continuum (arXiv 2511.02230) is a patch of vLLM, measured against vLLM's FCFS scheduler with
lazy block eviction. This experiment replays the paper's Claude Code setup (the top sessions
by requests, 15.6K shared prefix, 128K cut, qwen3-8b with a 256K-token cache, recorded tool
waits) on the vLLM engine at increasing load, N = 4, 8, 16, 32 concurrent sessions (N = 32
selects the top 32 sessions, the others the top 24; ``--quick``: N = 4 and 8 on the quick
subset, 96K cache), under every variant in ``VARIANTS``:

- ``vllm``: vLLM as deployed (the baseline);
- ``continuum``: TTL pins (the paper's learned TTL) and program-level FCFS;
- ``continuum-fixed``: the same with the public code's fixed 2 s threshold;
- ``pins``: the learned pins alone, on vLLM's FCFS;
- ``program-fcfs``: program-level FCFS alone.

One row per (N, variant): mean and p90 job completion time (a job: a session, first send to
last reply) and TTFT, their changes against ``vllm`` and the JCT speedup (vllm / variant),
and where a gain comes from: prompt tokens recomputed (``recomputed_saved_tokens``: fewer
than vllm, the pins' share) and the mean queue wait (``queue_saved_s``: the order's share);
for pinning variants, how the pins ended (``pins``) and the mean tau.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.table import Table

from sim.report.tables import Col, narrow_table
from sim.sweep import relative_change as change

from .study import Experiment, StudySetup, run_all

if TYPE_CHECKING:
    from collections.abc import Callable

    from sim.config import RunConfig

# (row label, --vllm-patch)
VARIANTS: list[tuple[str, str]] = [
    ("vllm", "none"),
    ("continuum", "continuum"),
    ("continuum-fixed", "continuum-fixed"),
    ("pins", "continuum-pins"),
    ("program-fcfs", "continuum-fcfs"),
]
LOADS = (4, 8, 16, 32)
QUICK_LOADS = (4, 8)
MODEL = "qwen3-8b"
PAPER_JCT_SPEEDUP = 8.0  # CacheTTL v4 abstract: "over 8x better average JCT"


def configs(ctx: StudySetup) -> tuple[list[tuple[int, str]], list[RunConfig]]:
    keys, cfgs = [], []
    for n in QUICK_LOADS if ctx.quick else LOADS:
        base = ctx.base(MODEL, n).with_fields(engine="vllm", scheduler="fcfs",
                                              checkpoint_chunks=True).with_preset("vllm")
        if not ctx.quick and not ctx.is_synthetic and n > 24:
            base = base.with_fields(select=f"top-requests:{n}")
        for label, patch in VARIANTS:
            keys.append((n, label))
            cfgs.append(base.with_fields(vllm_patch=patch))
    return keys, cfgs


def job_times(requests) -> np.ndarray:
    """Completion time of every top-level session: its first send to its last reply."""
    df = requests[~requests["subagent"].astype(bool) & ~requests["dropped"].astype(bool)]
    if not len(df):
        return np.empty(0)
    g = df.groupby("session", sort=True)
    return (g["end_s"].max() - g["send_s"].min()).to_numpy(dtype=float)


def _run_one(cfg: RunConfig, _arg: Any, get_trace: Callable[[], Any]) -> dict[str, Any]:
    from sim.run import run

    res = run(cfg, get_trace())
    jct = job_times(res.requests)
    return {**res.summary, "jct_p90_s": float(np.percentile(jct, 90)) if jct.size
            else math.nan}


def continuum(ctx: StudySetup) -> list[dict[str, Any]]:
    keys, cfgs = configs(ctx)
    sums = dict(zip(keys, run_all(ctx, cfgs, job=_run_one), strict=True))
    rows = []
    for (n, label), s in sums.items():
        ref = sums[(n, "vllm")]
        row = {
            "policy": label, "engine": "vllm", "vllm_patch": s.get("vllm_patch", "none"),
            "model": MODEL, "sessions": n, "gaps": ctx.gaps,
            "jct_mean_s": s["jct_mean_s"], "jct_p90_s": s["jct_p90_s"],
            "ttft_mean_s": s["ttft_mean_s"], "ttft_p90_s": s["ttft_p90_s"],
            "jct_change": change(s["jct_mean_s"], ref["jct_mean_s"]),
            "jct_p90_change": change(s["jct_p90_s"], ref["jct_p90_s"]),
            "ttft_change": change(s["ttft_mean_s"], ref["ttft_mean_s"]),
            "jct_speedup": ref["jct_mean_s"] / s["jct_mean_s"] if s["jct_mean_s"] else math.nan,
            "hit_rate": s["hit_rate"],
            "recomputed_tokens": s["recomputed_tokens"],
            "recomputed_saved_tokens": ref["recomputed_tokens"] - s["recomputed_tokens"],
            "queue_wait_mean_s": s["queue_wait_mean_s"],
            "queue_saved_s": ref["queue_wait_mean_s"] - s["queue_wait_mean_s"],
            "retractions": s["retractions"],
            "paper_jct_speedup": PAPER_JCT_SPEEDUP,
        }
        if "continuum_pins" in s:
            row["pins"] = s["continuum_pins"]
            row["tau_mean_s"] = s["continuum_tau_mean_s"]
        rows.append(row)
    return rows


# policies --engine vllm: Continuum's variants against vLLM, one table per load.
CONTINUUM_COLUMNS = [Col("variant", "policy"), Col("JCT\nmean (s)", "jct_mean_s", "s"),
                     Col("JCT\nchange", "jct_change", "change"),
                     Col("JCT p90\n(s)", "jct_p90_s", "s"),
                     Col("TTFT\nmean (s)", "ttft_mean_s", "s"),
                     Col("TTFT p90\n(s)", "ttft_p90_s", "s"),
                     Col("recomputed\nsaved", "recomputed_saved_tokens", "int"),
                     Col("queue wait\nsaved (s)", "queue_saved_s", "s")]


def continuum_tables(rows: list[dict[str, Any]]) -> list[Table | str]:
    """Per load (N sessions) every variant against vllm."""
    by_n: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_n.setdefault(r["sessions"], []).append(r)
    tables: list[Table | str] = [
        "kvsim reproduce policies --engine vllm: Continuum's TTL pins and program-level FCFS "
        "as vLLM patches, changes vs vllm; Continuum reports over 8x better mean JCT. "
        "recomputed saved: prompt tokens vllm recomputed and the variant did not (the "
        "pins' share); queue wait saved: mean queue wait vs vllm (the order's share). "
        "TTFT changes, p90 changes and how the pins ended: --json."]
    for n, rs in by_n.items():
        tables.append(narrow_table(f"{rs[0]['model']}, N = {n}, gaps {rs[0]['gaps']}",
                                   CONTINUUM_COLUMNS, rs))
    return tables


# ``kvsim reproduce policies --engine vllm``: the policies study's form on the vllm engine
CONTINUUM = Experiment("policies", continuum, engine="vllm",
                       tables=lambda doc: continuum_tables(doc["rows"]),
                       paper={"jct_speedup": PAPER_JCT_SPEEDUP})
