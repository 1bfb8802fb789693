"""Small kernel-table fixtures with aiconfigurator-core's schema and known latencies.

``build(root)`` writes a system ``toy`` laid out like the wheel's ``systems/`` folder, whose
latencies follow closed forms chosen so that every composed time is *exactly* of the profile's
form (GEMM ~ m*n*k, attention ~ query-key pairs, decode attention ~ batch*step): a fit to them
must be exact, and interpolation must return the formula off the grid. Columns and dtypes are
those of the real tables (see ``COLUMNS``); tests break them one at a time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

SYSTEM = "toy"
FW, VERSION = "sglang", "0.5.14"
GEMM_MS_PER_MNK = 2e-12  # latency (ms) = GEMM_MS_PER_MNK * m * n * k
ATTN_MS_PER_PAIR = 3e-8  # context: latency (ms) = ATTN_FIXED_MS + ATTN_MS_PER_PAIR * pairs(isl)
ATTN_FIXED_MS = 0.01
GEN_FIXED_MS = 0.005  # generation: latency (ms) = GEN_FIXED_MS + GEN_MS * batch * step
GEN_MS = 4e-8
NK = (1024, 4096, 16384, 32768)
MS = (1, 16, 256, 1024, 4096, 32768)
ISL = (1, 16, 256, 1024, 4096, 16384)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STEPS = (255, 1023, 4095, 16383, 65535)
HEADS = ((32, 8, 128), (16, 2, 128))

SYSTEM_YAML = """\
data_dir: data/toy
gpu:
  mem_bw: 2000000000000
  mem_bw_empirical_scaling_factor: 0.5
  mem_empirical_constant_latency: 0.000002
  mem_capacity: 85899345920
node:
  num_gpus_per_node: 8
  intra_node_bw: 450000000000
  pcie_bw: 50000000000
  p2p_latency: 0.00002
"""


def pairs(s: int, window: int | None = None) -> float:
    return s * (s + 1) / 2 if window is None or s <= window else \
        window * (window + 1) / 2 + (s - window) * window


def _meta(fw: str = FW, version: str = VERSION) -> dict:
    return {"framework": "SGLang", "version": version, "device": "Toy GPU"}


def gemm_frame() -> pd.DataFrame:
    rows = [{**_meta(), "op_name": "gemm", "kernel_source": "sglang_torch_linear",
             "gemm_dtype": "bfloat16", "m": m, "n": n, "k": k,
             "latency": GEMM_MS_PER_MNK * m * n * k} for m in MS for n in NK for k in NK]
    # An fp8 row the reader must ignore.
    rows.append({**rows[0], "gemm_dtype": "fp8", "latency": 1e6})
    return pd.DataFrame(rows)


def _attn_row(op: str, batch: int, isl: int, step: int, heads, window: int,
              latency: float) -> dict:
    h, kv, hd = heads
    return {**_meta(), "op_name": op, "kernel_source": "fa3", "batch_size": batch,
            "isl": isl, "num_heads": h, "num_key_value_heads": kv, "head_dim": hd,
            "beam_width": 1, "attn_dtype": "bfloat16", "kv_cache_dtype": "bfloat16",
            "step": step, "window_size": window, "latency": latency}


def context_frame() -> pd.DataFrame:
    rows = []
    for heads in HEADS:
        for isl in ISL:
            lat = ATTN_FIXED_MS + ATTN_MS_PER_PAIR * pairs(isl) * heads[0] / 32
            rows.append(_attn_row("context_attention", 1, isl, 0, heads, 0, lat))
            rows.append(_attn_row("context_attention", 2, isl, 0, heads, 0, 2 * lat))
    return pd.DataFrame(rows)


def generation_frame() -> pd.DataFrame:
    rows = [_attn_row("generation_attention", b, 1, s, heads, 0,
                      GEN_FIXED_MS + GEN_MS * b * s * heads[1] / 8)
            for heads in HEADS for b in BATCHES for s in STEPS]
    return pd.DataFrame(rows)


def allreduce_frame() -> pd.DataFrame:
    rows = [{**_meta(), "op_name": "all_reduce", "kernel_source": "custom", "allreduce_dtype":
             "bfloat16", "num_gpus": g, "message_size": s, "latency": 0.003 + s * 1e-9,
             "backend": f"sglang_{mode}"}
            for g in (2, 4, 8) for s in (128, 65536, 8388608, 536870912)
            for mode in ("eager", "graph")]
    return pd.DataFrame(rows)


TABLES = {
    ("gemm", "gemm_perf"): gemm_frame,
    ("attention", "context_attention_perf"): context_frame,
    ("attention", "generation_attention_perf"): generation_frame,
    ("comm", "custom_allreduce_perf"): allreduce_frame,
}


def table_path(root: Path, op: str, table: str, version: str = VERSION) -> Path:
    return root / "data" / SYSTEM / op / FW / version / f"{table}.parquet"


def build(root: Path) -> Path:
    """Write the toy system under ``root``; returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{SYSTEM}.yaml").write_text(SYSTEM_YAML)
    for (op, table), frame in TABLES.items():
        path = table_path(root, op, table)
        path.parent.mkdir(parents=True, exist_ok=True)
        frame().to_parquet(path, index=False)
    return root


def rewrite(path: Path, change) -> None:
    """Apply ``change(df) -> df`` to one fixture table in place."""
    df = change(pd.read_parquet(path))
    df.to_parquet(path, index=False)


__all__ = ["build", "np", "pairs", "rewrite", "table_path"]
