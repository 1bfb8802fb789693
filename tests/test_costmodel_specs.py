"""Model specs: W and KV bytes are exact for the shipped models."""

from __future__ import annotations

import pytest

from costmodel.specs import AttentionKind, ModelSpec, get_spec, model_names


@pytest.mark.parametrize(
    ("model", "w", "kv_bytes"),
    [("qwen3-8b", 23_552, 147_456), ("qwen3-32b", 29_760, 262_144),
     ("qwen3-235b-a22b", 13_568, 192_512)],
)
def test_paper_W_and_kv_bytes(model: str, w: int, kv_bytes: int) -> None:
    spec = get_spec(model)
    assert spec.W == w
    assert spec.kv_bytes_per_token == kv_bytes


def test_registry_has_required_models() -> None:
    names = set(model_names())
    assert {"qwen3-8b", "qwen3-32b", "qwen3-235b-a22b", "llama-3.1-8b", "llama-3.1-70b"} <= names
    mixed = [n for n in names if AttentionKind.SLIDING in get_spec(n).attention_kinds()]
    assert mixed, "at least one model mixes full and sliding-window attention"
    for n in mixed:
        assert AttentionKind.FULL in get_spec(n).attention_kinds()


def test_sliding_models_layer_patterns() -> None:
    oss = get_spec("gpt-oss-120b")
    assert oss.windows()[:4] == (128, None, 128, None)
    gemma = get_spec("gemma-3-27b")
    assert gemma.windows()[:6] == (1024,) * 5 + (None,)
    assert gemma.window_groups() == {1024: 52, None: 10}


def test_qwen3_235b_active_parameters_near_22b() -> None:
    # ~22B active of which ~1.2B is embeddings/head (left out here).
    assert 19e9 < get_spec("qwen3-235b-a22b").active_params < 22.5e9
    assert 225e9 < get_spec("qwen3-235b-a22b").total_params < 240e9


def test_unknown_model_and_bad_windows() -> None:
    with pytest.raises(KeyError, match="unknown model"):
        get_spec("gpt-17")
    with pytest.raises(ValueError, match="layer_windows"):
        ModelSpec("x", layers=2, hidden=8, q_heads=1, kv_heads=1, head_dim=8, layer_windows=(None,))
