"""What a disaggregated run adds to a run (sim/run/kinds.py's ``PDRun`` assembles it):
its requests table (``pd_table``) and its summary fields (``pd_summary``).

Results: one row per request (its decode worker's record: TTFT, end, decode, retractions),
with, for a request prefilled on the prefill pool, that worker's cache accounting in place of
the decode worker's (``hit_gpu_tokens``, ``recomputed_tokens``, ... : where the prefix cache
that eviction manages lives; ``queue_wait_s`` and ``admit_s`` are the prefill worker's), the
prefill units of both workers summed (the decode worker's first forward computes the prompt's
last block again), and the PD columns (``PD_COLUMNS``). The summary is computed over that
table with the single server's code, counters summed over both pools, plus the PD metrics
(``pd_summary``, docs/pd.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .pd import PDFleet

if TYPE_CHECKING:  # pandas where a table is made: none before a run's first request (issue 55)
    import pandas as pd

PD_STREAM = 0x5044  # "PD": the PD rule's RNG stream, apart from the router's

# Per-request columns a disaggregated run adds (docs/pd.md).
PD_COLUMNS = ("pd_prefill_worker", "pd_decode_worker", "prefilled_locally", "prealloc_wait_s",
              "prefill_s",
              "transfer_queue_s", "transfer_s", "transfer_bytes", "first_decode_s",
              "landing_failed", "landed_lost_tokens", "pd_overloaded", "returned_bytes",
              "recomputed_output_tokens")
# Columns of a remotely prefilled request taken from its prefill worker's record.
PREFILL_SIDE = ("admit_s", "queue_wait_s", "hit_gpu_tokens", "loaded_cpu_tokens",
                "recomputed_tokens", "hole_tokens", "new_tokens", "ideal_hit_tokens",
                "private_lost", "recompute_units")
SUMMED = ("prefill_units", "attention_units")


def _records_by_rid(engines) -> dict[int, object]:
    return {r.request: r for e in engines for r in e.rec.records}


def pd_table(fleet: PDFleet, prefill, decode, trace, bs: int) -> pd.DataFrame:
    """One row per request: its decode record, the prefill side's accounting, PD columns."""
    import pandas as pd  # (not at import: issue 55 start-up)

    frames = [e.rec.table() for e in decode]
    served = [t for t in frames if len(t)] or frames[:1]
    table = pd.concat(served, ignore_index=True) if len(served) > 1 else served[0].copy()
    table = table.sort_values(["send_s", "request"], kind="stable").reset_index(drop=True)
    pre = _records_by_rid(prefill)
    rid = table["request"].to_numpy()
    decode_hit = table["hit_gpu_tokens"].to_numpy().copy()
    recs = [fleet.records[int(r)] for r in rid]
    remote = [pre.get(int(r)) if rec.prefill_worker >= 0 else None
              for r, rec in zip(rid, recs, strict=True)]
    for col in PREFILL_SIDE:
        own = table[col].to_numpy()
        table[col] = np.asarray([getattr(p, col) if p is not None else own[i]
                                 for i, p in enumerate(remote)], dtype=own.dtype)
    for col in SUMMED:
        own = table[col].to_numpy()
        table[col] = own + np.asarray([getattr(p, col) if p is not None else 0
                                       for p in remote], dtype=own.dtype)
    first = table["first_token_s"].to_numpy(dtype=float)
    landed = np.asarray([r.landed_at for r in recs], dtype=float)
    cols = {
        "pd_prefill_worker": np.asarray([r.prefill_worker for r in recs], dtype=np.int64),
        "pd_decode_worker": np.asarray([r.decode_worker for r in recs], dtype=np.int64),
        "prefilled_locally": np.asarray([r.local for r in recs], dtype=bool),
        "prealloc_wait_s": np.asarray([r.prealloc_wait_s for r in recs], dtype=float),
        "prefill_s": np.asarray([r.prefill_s for r in recs], dtype=float),
        "transfer_queue_s": np.asarray([r.transfer_queue_s for r in recs], dtype=float),
        "transfer_s": np.asarray([r.transfer_s for r in recs], dtype=float),
        "transfer_bytes": np.asarray([r.transfer_bytes for r in recs], dtype=np.int64),
        "first_decode_s": first - landed,
        "landing_failed": np.asarray([r.landing_failed for r in recs], dtype=bool),
        # landed prompt blocks the decode worker evicted before it admitted the request
        "landed_lost_tokens": np.maximum(0, np.asarray(
            [min(r.landed_blocks * bs, (p - 1) // bs * bs) for r, p in
             zip(recs, table["prompt_tokens"].to_numpy(), strict=True)], dtype=np.int64)
            - decode_hit) * ~table["dropped"].to_numpy(dtype=bool),
        "pd_overloaded": np.asarray([r.overloaded for r in recs], dtype=bool),
        "returned_bytes": np.asarray([r.returned_bytes for r in recs], dtype=np.int64),
        "recomputed_output_tokens": recomputed_output(table, recs, trace, bs),
    }
    for k in PD_COLUMNS:
        table[k] = cols[k]
    return table


def recomputed_output(table: pd.DataFrame, recs, trace, bs: int) -> np.ndarray:
    """Per request, prompt tokens its prefill worker computed only because the session's
    previous turn decoded on a decode worker: when the prefill worker's hit reaches the end
    of the previous prompt (the history is cached up to where that turn's output begins),
    the computed part of the previous output's full blocks (up to what a hit may cover).
    Zero for a first turn, a local prefill, or a hit that stops earlier (then eviction, not
    the split, lost the output)."""
    out = np.zeros(len(table), dtype=np.int64)
    hit = (table["hit_gpu_tokens"].to_numpy() + table["loaded_cpu_tokens"].to_numpy())
    prompt = table["prompt_tokens"].to_numpy()
    sess = table["session_index"].to_numpy()
    for i, (r, rec) in enumerate(zip(table["request"].to_numpy(), recs, strict=True)):
        r = int(r)
        if rec.prefill_worker < 0 or r == 0 or int(trace.session[r - 1]) != int(sess[i]):
            continue
        prev_prompt = int(trace.block_ids(r - 1).size) * bs
        prev_end = int(trace.finish_block_ids(r - 1).size) * bs
        usable = (int(prompt[i]) - 1) // bs * bs
        if hit[i] >= prev_prompt:
            out[i] = max(0, min(prev_end, usable) - int(hit[i]))
    return out


def _busy_share(engines, duration: float) -> list[float]:
    return [(e.rec.counters["prefill_seconds"] + e.rec.counters["decode_seconds"]) / duration
            if duration else 0.0 for e in engines]


def pd_summary(fleet: PDFleet, prefill, decode, table: pd.DataFrame, duration: float,
               cfg) -> dict:
    ok = table[~table["dropped"].astype(bool)] if len(table) else table
    remote = ok[~ok["prefilled_locally"]] if len(ok) else ok
    prompt = int(ok["prompt_tokens"].sum()) if len(ok) else 0
    links = [q.busy_s / duration if duration else 0.0 for q in fleet.queues.values()
             if q.transfers]
    dret = sum(e.rec.counters["retractions"] for e in decode)
    ptime = _busy_share(prefill, duration)
    dtime = _busy_share(decode, duration)
    link = fleet.link
    return {
        "pd_prefill_replicas": cfg.pd.prefill_replicas,
        "pd_decode_replicas": cfg.pd.decode_replicas,
        "pd_gpus": (cfg.pd.prefill_replicas + cfg.pd.decode_replicas)
        * fleet.gpus_per_replica,
        "pd_rule": cfg.pd.pd_rule, "pd_rule_follows": fleet.rule.follows,
        "router": cfg.fleet.router or "round-robin",
        "pd_link": cfg.pd.pd_link, "pd_link_gb_s": link.bandwidth_gb_s,
        "pd_link_latency_us": link.latency_us, "pd_link_scope": cfg.pd.pd_link_scope,
        "pd_streaming": cfg.pd.pd_streaming, "pd_local_threshold": cfg.pd.pd_local_threshold,
        "decode_cache": cfg.pd.decode_cache, "pd_return": cfg.pd.pd_return,
        "pd_prealloc": cfg.pd.pd_prealloc,
        "prefilled_locally_share": float(ok["prefilled_locally"].mean()) if len(ok) else 0.0,
        "prefill_pool_busy_share": float(np.mean(ptime)) if ptime else 0.0,
        "decode_pool_busy_share": float(np.mean(dtime)) if dtime else 0.0,
        "transfer_bytes": int(ok["transfer_bytes"].sum()) if len(ok) else 0,
        "transfers": len(remote),
        "prefill_pool_requests": sum(len(e.rec.records) for e in prefill),
        # workers of either pool that served no request (as a fleet's idle_replicas)
        "idle_replicas": sum(1 for e in [*prefill, *decode] if not e.rec.records),
        "transfer_s_mean": float(remote["transfer_s"].mean()) if len(remote) else 0.0,
        "transfer_queue_s_mean": (float(remote["transfer_queue_s"].clip(lower=0).mean())
                                  if len(remote) else 0.0),
        "prefill_s_mean": float(remote["prefill_s"].mean()) if len(remote) else 0.0,
        # pre-allocation: how long remote requests waited for their decode worker's room
        "prealloc_wait_s_mean": (float(remote["prealloc_wait_s"].fillna(0.0).mean())
                                 if len(remote) else 0.0),
        "prealloc_waited": int((remote["prealloc_wait_s"] > 0).sum()) if len(remote) else 0,
        "first_decode_s_mean": float(ok["first_decode_s"].mean()) if len(ok) else 0.0,
        "link_busy_share_max": float(max(links)) if links else 0.0,
        "link_busy_share_mean": float(np.mean(links)) if links else 0.0,
        "returned_bytes": int(ok["returned_bytes"].sum()) if len(ok) else 0,
        "landing_failed": int(ok["landing_failed"].sum()) if len(ok) else 0,
        "landed_lost_tokens": int(ok["landed_lost_tokens"].sum()) if len(ok) else 0,
        "pd_overloaded": int(ok["pd_overloaded"].sum()) if len(ok) else 0,
        "decode_retractions": int(dret),
        "decode_preempted_recompute_tokens": int(ok["preempted_recompute_tokens"].sum())
        if len(ok) else 0,
        "recomputed_output_tokens": int(ok["recomputed_output_tokens"].sum()) if len(ok) else 0,
        "recomputed_output_tokens_share": (float(ok["recomputed_output_tokens"].sum() / prompt)
                                           if prompt else 0.0),
    }
