"""Attention rates per kind (MLA, DSA, Gated DeltaNet) fitted to aiconfigurator-core's H100
kernel tables (issue 54; docs/hybrid.md, Profiles).

kvsim prices an attention unit of each KV cache group kind at that kind's kernel rate
(``costmodel/profile.py`` ``Profile.attention_rates``). The derived profiles read the rates as
effective bf16 FLOP/s per kind (``costmodel/derive.py`` ``KIND_FLOPS_H100``): what this module
fits, ``2 x MACs / seconds`` of each kernel at the shapes of the catalog models, one layer on
one GPU, so a model's rate per unit is ``2 x macs_per_unit / FLOP/s``:

- ``mla``: ``mla/sglang/0.5.14/context_mla_perf`` (flash_attention, bf16, bf16 KV, 128 heads,
  TP 1: DeepSeek-V3 / Kimi K2): ``latency = c + t x pairs``, pairs ``= batch x isl (isl - 1)
  / 2``, one pair ``128 x (192 + 128)`` MACs.
- ``dsa``: ``sparse_attention/trtllm/1.3.0rc23/dsa_context_module_perf`` (DeepSeek-V3.2, bf16
  GEMMs and KV, 128 heads, TP 1): the whole attention module, so the projections, priced at the
  derived linear rate (``EFF_LINEAR`` of the bf16 peak), are taken off first; the rest is ``c
  + t x units`` with kvsim's DSA units (top-k ``position_sum(0, isl, 2047)`` plus the fp8
  indexer, ``costmodel/units.py``) in 40,960-MAC units.
- ``linear``: ``linear_attention/sglang/0.5.14/gdn_perf`` (chunk_gated_delta_rule, context, 16
  key and 32 value heads of 128: Qwen3-Next's shape at TP 1): ``latency = c + t x tokens``,
  one token ``3 x 32 x 128 x 128`` MACs (``ModelSpec.state_update_macs``); the causal conv1d
  kernel beside it is left to the linear projections, as kvsim's W counts it.

Rows with at least ``MIN_ISL`` tokens per sequence (where the quadratic or per-token term
dominates the launch; DSA: twice its top-k, 4,096, since the sparse kernel costs the same
per token at any position below that, as if every top-k slot were filled); least squares on
relative residuals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from costmodel.specs import get_spec
from costmodel.units import attention_units

from .tables import MS

MIN_ISL = 1024
TABLES = {
    "mla": "mla/sglang/0.5.14/context_mla_perf.parquet",
    "dsa": "sparse_attention/trtllm/1.3.0rc23/dsa_context_module_perf.parquet",
    "linear": "linear_attention/sglang/0.5.14/gdn_perf.parquet",
}


@dataclass(frozen=True)
class KindFit:
    """One kind's fit: effective bf16 FLOP/s, seconds per unit of the model it was fitted at,
    the table, the rows used and their median relative error."""

    kind: str
    flops: float
    seconds_per_unit: float
    model: str
    table: str
    rows: int
    median_abs_rel_error: float


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """``y = c + t x`` on relative residuals: (c, t, median |relative error|)."""
    a = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    (c, t), *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
    err = np.abs((c + t * x) / y - 1)
    return float(c), float(t), float(np.median(err))


def _read(root: Path, system: str, kind: str):
    import pandas as pd

    return pd.read_parquet(root / "data" / system / TABLES[kind])


def fit_kinds(root: Path, system: str = "h100_sxm") -> dict[str, KindFit]:
    """The three fits (module docstring) from the tables under ``root`` (aiconfigurator-core's
    ``systems`` folder)."""
    from costmodel.derive import EFF_LINEAR, H100_BF16_DENSE_FLOPS

    out: dict[str, KindFit] = {}
    mla = get_spec("deepseek-v3")
    df = _read(root, system, "mla")
    d = df[(df.kernel_source == "flash_attention") & (df.mla_dtype == "bfloat16")
           & (df.kv_cache_dtype == "bfloat16") & (df.num_heads == mla.q_heads)
           & (df.tp_size == 1) & (df.isl >= MIN_ISL)]
    isl, b = d.isl.to_numpy(np.float64), d.batch_size.to_numpy(np.float64)
    _, t, err = _fit(b * isl * (isl - 1) / 2, d.latency.to_numpy(np.float64) * MS)
    out["mla"] = KindFit("mla", 2 * mla.macs_per_unit / t, t, mla.name, TABLES["mla"],
                         len(d), err)

    dsa = get_spec("deepseek-v3.2")
    df = _read(root, system, "dsa")
    d = df[(df.model == "deepseek-ai/DeepSeek-V3.2") & (df.gemm_type == "bfloat16")
           & (df.kv_cache_dtype == "bfloat16") & (df.num_heads == dsa.q_heads)
           & (df.tp_size == 1) & (df.step == 0) & (df.isl >= 2 * dsa.index_topk)]
    units = np.array([bs * attention_units(dsa, 0, n) / dsa.layers
                      for bs, n in zip(d.batch_size, d.isl, strict=True)], dtype=np.float64)
    tokens = (d.batch_size * d.isl).to_numpy(np.float64)
    from costmodel.specs import AttentionKind

    proj_s = 2 * dsa.projection_macs(AttentionKind.DSA) / (H100_BF16_DENSE_FLOPS * EFF_LINEAR)
    _, t, err = _fit(units, d.latency.to_numpy(np.float64) * MS - proj_s * tokens)
    out["dsa"] = KindFit("dsa", 2 * dsa.macs_per_unit / t, t, dsa.name, TABLES["dsa"],
                         len(d), err)

    gdn = get_spec("qwen3-next-80b-a3b")
    df = _read(root, system, "linear")
    d = df[(df.phase == "context") & (df.kernel_source == "chunk_gated_delta_rule")
           & (df.num_k_heads == gdn.linear_key_heads)
           & (df.num_v_heads == gdn.linear_value_heads)
           & (df.head_k_dim == gdn.linear_key_dim) & (df.head_v_dim == gdn.linear_value_dim)
           & (df.seq_len >= MIN_ISL)]
    _, t_token, err = _fit(d.num_tokens.to_numpy(np.float64),
                           d.latency.to_numpy(np.float64) * MS)
    flops = 2 * gdn.state_update_macs / t_token
    out["linear"] = KindFit("linear", flops, 2 * gdn.macs_per_unit / flops, gdn.name,
                            TABLES["linear"], len(d), err)
    return out


def main() -> None:  # pragma: no cover - prints the fits (docs/hybrid.md's table)
    from importlib import resources

    root = Path(str(resources.files("aiconfigurator_core") / "systems"))
    for f in fit_kinds(root).values():
        print(f"{f.kind:7s} {f.flops:.4e} FLOP/s  {f.seconds_per_unit:.3e} s/unit "
              f"({f.model})  {f.rows} rows  median |err| {f.median_abs_rel_error:.1%}  "
              f"{f.table}")


if __name__ == "__main__":
    main()
