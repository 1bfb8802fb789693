"""The tiny stand-in spec that ``kvsim calibrate --quick`` times on a CPU.

Same depth, same GQA ratio, same FFN-to-hidden ratio, same MoE active-expert count and layer
window pattern (windows / 16) as the named model, but hidden 512 with 8 query heads of 64:
about 3M MACs per token per layer instead of ~200M, so a grid runs in seconds on two cores.
Coefficients fitted on it are rescaled to the named model's units by MACs (see
:func:`rescale_factors`): a smoke test of the pipeline, not a forecast of the big model.
"""

from __future__ import annotations

from costmodel.specs import ModelSpec

TINY_HIDDEN = 512
TINY_Q_HEADS = 8
TINY_HEAD_DIM = 64
WINDOW_SCALE = 16


def _round(x: float, to: int = 64) -> int:
    return max(to, round(x / to) * to)


def tiny_spec(spec: ModelSpec) -> ModelSpec:
    ratio = TINY_HIDDEN / spec.hidden
    kv = max(1, TINY_Q_HEADS * spec.kv_heads // spec.q_heads)
    windows = tuple(None if w is None else max(8, w // WINDOW_SCALE)
                    for w in spec.layer_windows)
    return ModelSpec(
        name=f"tiny-{spec.name}", layers=spec.layers, hidden=TINY_HIDDEN,
        q_heads=TINY_Q_HEADS, kv_heads=kv, head_dim=TINY_HEAD_DIM,
        ffn=_round(spec.ffn * ratio) if spec.ffn else 0,
        experts=spec.active_experts, active_experts=spec.active_experts,
        expert_ffn=_round(spec.expert_ffn * ratio) if spec.expert_ffn else 0,
        max_context=spec.max_context, dtype_bytes=spec.dtype_bytes, layer_windows=windows,
        source=f"kvsim calibrate --quick stand-in for {spec.name}",
    )


def rescale_factors(timed: ModelSpec, target: ModelSpec) -> dict[str, float]:
    """Multiply a coefficient fitted on ``timed`` by these to price ``target``'s units:
    per-unit seconds scale with MACs per unit, per-sequence decode work with linear MACs per
    token, weight streaming with active parameters, KV reads with KV bytes per token."""
    return {
        "per_unit": target.macs_per_unit / timed.macs_per_unit,
        "per_token_linear": (target.linear_macs_per_token * target.layers)
        / (timed.linear_macs_per_token * timed.layers),
        "weights": target.active_params / timed.active_params,
        "kv": target.kv_bytes_per_token / timed.kv_bytes_per_token,
    }
