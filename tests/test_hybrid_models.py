"""Hybrid attention: KV cache groups per model, their bytes, the cost formula per group and
the config.json reader's hybrid kinds and errors (issue 54 items 1-2; docs/hybrid.md).

The public check reads tests/fixtures/kvcache_simulator_0.1.3.yaml: numbers taken from the
kvcache-simulator 0.1.3 wheel on PyPI (its kvcache_sim/resources/models.yaml through
kvcache_sim/calculator.py), nothing of it vendored.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.errors import ModelConfigError
from costmodel.hfconfig import load_spec, safe_load, spec_fields
from costmodel.specs import (
    KV_DTYPE_BITS,
    AttentionKind,
    ModelSpec,
    all_model_names,
    get_spec,
)
from costmodel.units import attended_units, chunk_position_sum, range_units
from sim.cli.main import cli

HERE = Path(__file__).parent
PUBLIC = yaml.safe_load((HERE / "fixtures" / "kvcache_simulator_0.1.3.yaml").read_text())
CTX = 131072
TINY = ["--trace", "synthetic:claude-code?sessions=4", "--max-context", "32k", "--gaps", "tool",
        "--sessions", "2"]


# --- bytes against the public catalog --------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PUBLIC["catalog"]))
@pytest.mark.parametrize("dtype,key", [("bf16", "bf16"), ("fp8", "fp8")])
def test_kv_bytes_at_128k_agree_with_the_public_catalog(name: str, dtype: str, key: str) -> None:
    """Every model both catalogs have: KV bytes per token at 128K within 1% (all agree
    exactly: the same layers, KV heads and head dims, MLA's kv_lora_rank + rope and DSA's
    indexer key per layer; DeepSeek-V4's windows, compressed entries and fp4 indexer keys),
    and the Gated DeltaNet state per request where it gives one."""
    spec = get_spec(name, dtype)
    ours = spec.kv_bytes_per_token_at(CTX)
    theirs = PUBLIC["catalog"][name][key]
    assert abs(ours / theirs - 1) <= 0.01, (name, ours, theirs)
    assert ours == theirs, (name, ours, theirs)
    assert spec.state_bytes_per_request == PUBLIC["catalog"][name].get("state", 0), name


def _shape_spec(fields: dict[str, Any]) -> ModelSpec:
    """A spec with a public-catalog hybrid's KV fields (the rest of the shape is filler:
    bytes do not read it); a compressed model's through the config.json reader."""
    layers = fields["num_hidden_layers"]
    if "compress_ratios" in fields:
        raw = {**fields, "architectures": ["DeepseekV4ForCausalLM"], "hidden_size": 1024,
               "num_attention_heads": 64, "intermediate_size": 2048, "index_n_heads": 64,
               "num_nextn_predict_layers": len(fields["compress_ratios"]) - layers,
               "vocab_size": 1024, "max_position_embeddings": 1 << 20}
        return ModelSpec("x", **spec_fields(raw, "x"))
    every = fields["sliding_window_pattern"]  # one window, every n-th layer full
    windows = tuple(None if (i + 1) % every == 0 else fields["sliding_window"]
                    for i in range(layers))
    return ModelSpec("x", layers=layers, hidden=1024, q_heads=fields["num_attention_heads"],
                     kv_heads=fields["num_key_value_heads"], head_dim=fields["head_dim"],
                     layer_windows=windows)


@pytest.mark.parametrize("name", sorted(PUBLIC["shapes"]))
def test_group_formulas_agree_with_the_public_formulas(name: str) -> None:
    """Hybrids kvsim's catalog lacks, built from the public catalog's KV fields: the windows
    agree exactly."""
    entry = PUBLIC["shapes"][name]
    spec = _shape_spec(entry["fields"])
    ours = spec.kv_bytes_per_token_at(CTX)
    assert ours == entry["bf16"]
    if "fp8" in entry:
        assert spec.with_kv_dtype("fp8").kv_bytes_per_token_at(CTX) == entry["fp8"]
    assert spec.state_bytes_per_request == entry.get("state", 0)


# --- groups per model ------------------------------------------------------------------------
GROUPS = {
    "qwen3-8b": [{"kind": "full", "layers": 36, "kv_bytes_per_token": 147456,
                  "state_bytes_per_request": 0}],
    "gpt-oss-120b": [
        {"kind": "sliding", "layers": 18, "window": 128, "kv_bytes_per_token": 36864,
         "state_bytes_per_request": 0},
        {"kind": "full", "layers": 18, "kv_bytes_per_token": 36864,
         "state_bytes_per_request": 0}],
    "gemma-3-27b": [
        {"kind": "sliding", "layers": 52, "window": 1024, "kv_bytes_per_token": 425984,
         "state_bytes_per_request": 0},
        {"kind": "full", "layers": 10, "kv_bytes_per_token": 81920,
         "state_bytes_per_request": 0}],
    # 36 Gated DeltaNet layers: conv 3 x (2x16x128 + 32x128) bf16 + 32x128x128 fp32 each
    "qwen3-next-80b-a3b": [
        {"kind": "linear", "layers": 36, "kv_bytes_per_token": 0,
         "state_bytes_per_request": 36 * (3 * 8192 * 2 + 32 * 128 * 128 * 4)},
        {"kind": "full", "layers": 12, "kv_bytes_per_token": 12 * 2 * 2 * 256 * 2,
         "state_bytes_per_request": 0}],
    "deepseek-v3": [{"kind": "mla", "layers": 61, "kv_bytes_per_token": 61 * 576 * 2,
                     "state_bytes_per_request": 0}],
    "kimi-k2": [{"kind": "mla", "layers": 61, "kv_bytes_per_token": 61 * 576 * 2,
                 "state_bytes_per_request": 0}],
    # Gemma 4 31B: the global layers' own 4 KV heads of 512, K and V cached
    "gemma-4-31b": [
        {"kind": "sliding", "layers": 50, "window": 1024,
         "kv_bytes_per_token": 50 * 2 * 16 * 256 * 2, "state_bytes_per_request": 0},
        {"kind": "full", "layers": 10, "kv_bytes_per_token": 10 * 2 * 4 * 512 * 2,
         "state_bytes_per_request": 0}],
    "gemma-4-26b-a4b": [
        {"kind": "sliding", "layers": 25, "window": 1024,
         "kv_bytes_per_token": 25 * 2 * 8 * 256 * 2, "state_bytes_per_request": 0},
        {"kind": "full", "layers": 5, "kv_bytes_per_token": 5 * 2 * 2 * 512 * 2,
         "state_bytes_per_request": 0}],
    # Qwen3.5/3.6: 48 (27B) or 45 (397B) Gated DeltaNet layers beside every 4th full layer
    "qwen3.5-27b": [
        {"kind": "linear", "layers": 48, "kv_bytes_per_token": 0,
         "state_bytes_per_request": 48 * (3 * (2 * 16 * 128 + 48 * 128) * 2
                                          + 48 * 128 * 128 * 4)},
        {"kind": "full", "layers": 16, "kv_bytes_per_token": 16 * 2 * 4 * 256 * 2,
         "state_bytes_per_request": 0}],
    "qwen3.5-397b-a17b": [
        {"kind": "linear", "layers": 45, "kv_bytes_per_token": 0,
         "state_bytes_per_request": 45 * (3 * (2 * 16 * 128 + 64 * 128) * 2
                                          + 64 * 128 * 128 * 4)},
        {"kind": "full", "layers": 15, "kv_bytes_per_token": 15 * 2 * 2 * 256 * 2,
         "state_bytes_per_request": 0}],
    "kimi-k2.5": [{"kind": "mla", "layers": 61, "kv_bytes_per_token": 61 * 576 * 2,
                   "state_bytes_per_request": 0}],
    "deepseek-v3.2": [{"kind": "dsa", "layers": 61, "kv_bytes_per_token": 61 * (576 + 128) * 2,
                       "state_bytes_per_request": 0, "indexer_bytes_per_token": 61 * 128 * 2,
                       "indexer_layers": 61}],
    # GLM-5.2: layers 0, 1, 2, 6, 10, ..., 74 build an indexer, the other 57 reuse its top-k
    "glm-5.2": [{"kind": "dsa", "layers": 78, "kv_bytes_per_token": (78 * 576 + 21 * 128) * 2,
                 "state_bytes_per_request": 0, "indexer_bytes_per_token": 21 * 128 * 2,
                 "indexer_layers": 21}],
    # DeepSeek-V4-Flash: every layer's window of one 512-wide entry (K = V); 21 layers one
    # entry per 4 tokens and an fp4 indexer key of 128; 20 layers one entry per 128 tokens
    "deepseek-v4-flash": [
        {"kind": "sliding", "layers": 43, "window": 128, "kv_bytes_per_token": 43 * 512 * 2,
         "state_bytes_per_request": 0},
        {"kind": "compressed", "layers": 21, "compress_ratio": 4,
         "kv_bytes_per_token": 21 * 512 * 2 // 4 + 21 * 64 // 4, "state_bytes_per_request": 0,
         "indexer_bytes_per_token": 21 * 64 // 4, "indexer_layers": 21},
        {"kind": "compressed", "layers": 20, "compress_ratio": 128,
         "kv_bytes_per_token": 20 * 512 * 2 // 128, "state_bytes_per_request": 0}],
}


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_groups_and_bytes_per_model(name: str) -> None:
    spec = get_spec(name)
    assert [g.to_dict() for g in spec.groups] == GROUPS[name]
    assert spec.kv_bytes_per_token == sum(g["kv_bytes_per_token"] for g in GROUPS[name])


def test_windowed_groups_hold_their_window_only() -> None:
    """gpt-oss-120b at 128K: the full group's 36,864 bytes per token plus 128 tokens of the
    sliding group (36,864 x 128 / 131,072 = 36): 36,900, half the 73,728 every token writes."""
    spec = get_spec("gpt-oss-120b")
    assert spec.kv_bytes(CTX) == CTX * 36864 + 128 * 36864
    assert spec.kv_bytes_per_token_at(CTX) == 36900
    assert spec.kv_bytes(100) == 100 * 73728  # shorter than the window: every layer keeps all
    gemma = get_spec("gemma-3-27b")
    assert gemma.kv_bytes_per_token_at(CTX) == 81920 + 425984 * 1024 / CTX


def test_kv_dtype() -> None:
    for dtype, bits in KV_DTYPE_BITS.items():
        assert get_spec("qwen3-8b", dtype).kv_bytes_per_token == 147456 * bits // 16
        assert get_spec("deepseek-v3.2", dtype).kv_bytes_per_token == 61 * 704 * bits // 8
    # the Gated DeltaNet state keeps its own types (conv bf16, recurrent fp32)
    next_ = get_spec("qwen3-next-80b-a3b")
    assert get_spec(next_.name, "fp8").state_bytes_per_request == next_.state_bytes_per_request
    with pytest.raises(ValueError, match="kv_dtype 'int3'"):
        get_spec("qwen3-8b", "int3")


def test_full_attention_models_keep_one_full_group_and_their_numbers() -> None:
    for name in all_model_names():
        spec = get_spec(name)
        if set(spec.kinds) != {AttentionKind.FULL}:
            continue
        (g,) = spec.groups
        assert (g.kind, g.layers, g.window) == (AttentionKind.FULL, spec.layers, None)
        assert spec.kv_bytes_per_token == 2 * spec.kv_heads * spec.head_dim * spec.layers * 2
        # W as before the groups (specs.py at 7c77e61): projections and FFN per layer, the
        # dense layers' FFN in their place, over 2 x q_heads x head_dim MACs per unit
        old = ((spec.attention_macs_per_token + spec._ffn_macs) * spec.layers
               + spec.dense_layers * (3 * spec.hidden * spec.dense_ffn - spec._ffn_macs))
        assert spec.W == (old / spec.layers if spec.dense_layers else old // spec.layers) \
            / (2 * spec.q_heads * spec.head_dim), name


# --- the cost formula per group: closed form == brute force ----------------------------------
def _spec(kind: str, layers: int = 3, window: int = 7, topk: int = 5) -> ModelSpec:
    """A tiny model of one kind, or ``mixed``: one layer of each; ``dsa-shared``: DSA whose
    middle layer reuses the first one's top-k (no indexer of its own); ``wide-full``: sliding
    layers beside a full one of twice their head dim and its own KV heads (Gemma 4);
    ``compressed``: a sliding layer, one compressed 4x with an indexer, one compressed 2x
    (DeepSeek-V4's kinds)."""
    common: dict[str, Any] = dict(hidden=64, q_heads=4, kv_heads=2, head_dim=16,
                                  kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16,
                                  qk_rope_head_dim=8, v_head_dim=16, index_topk=topk,
                                  index_n_heads=3, index_head_dim=8, linear_key_heads=2,
                                  linear_key_dim=8, linear_value_heads=3, linear_value_dim=8,
                                  linear_conv_kernel=4, ffn=96)
    if kind == "mixed":
        kinds = ("full", "sliding", "chunked", "linear")
        windows = (None, window, window + 2, None)
    else:
        kinds = (kind,) * layers
        windows = tuple(window if kind in ("sliding", "chunked") else None for _ in kinds)
    if kind == "wide-full":
        return ModelSpec("t", layers=3, layer_windows=(window, None, window),
                         full_kv_heads=1, full_head_dim=32, **{**common, "kv_lora_rank": 0})
    if kind == "compressed":
        return ModelSpec("t", layers=3, layer_kinds=("sliding", "compressed", "compressed"),
                         layer_windows=(window,) * 3, compress_ratios=(0, 4, 2), o_lora_rank=8,
                         o_groups=2, indexer_kv_dtype="fp4", **{**common, "kv_lora_rank": 0})
    if kind == "dsa-shared":
        return ModelSpec("t", layers=layers, layer_kinds=("dsa",) * layers,
                         shared_indexer_layers=(1,), **common)
    if kind in ("mla", "dsa"):
        return ModelSpec("t", layers=layers, layer_kinds=kinds, **common)
    return ModelSpec("t", layers=len(kinds), layer_kinds=kinds,
                     layer_windows=windows if any(windows) else (),
                     **{**common, "kv_lora_rank": 0})


def _brute_units(spec: ModelSpec, a: int, b: int) -> int:
    """Per token, per layer: the position term of its kind, summed; the MAC-priced terms
    (linear state update, DSA indexer) summed exactly and floored once."""
    whole, macs = 0, Fraction(0)
    for i, (kind, w) in enumerate(zip(spec.kinds, spec.windows(), strict=True)):
        for p in range(a, b):
            if kind is AttentionKind.COMPRESSED:  # its window, and the entries before p
                r = spec.compress_ratios[i]
                whole += min(p, w - 1)
                if r == 4:  # the indexer scores every entry, attention reads its top-k
                    whole += min(p // r, spec.index_topk)
                    macs += p // r * spec.indexer_macs_per_key
                else:
                    whole += p // r
            elif kind in (AttentionKind.FULL, AttentionKind.MLA):  # wider heads: more MACs a pair
                whole += p * (spec.full_head_dim or spec.head_dim) // spec.head_dim
            elif kind is AttentionKind.SLIDING:
                whole += min(p, w - 1)
            elif kind is AttentionKind.CHUNKED:
                whole += p % w
            elif kind is AttentionKind.LINEAR:
                macs += spec.state_update_macs
            else:  # DSA: the top-k keys, and its indexer (if not shared) scores all p
                whole += min(p, spec.index_topk - 1)
                if i not in spec.shared_indexer_layers:
                    macs += p * spec.indexer_macs_per_key
    return whole + math.floor(macs / spec.macs_per_unit)


KINDS = ["full", "sliding", "chunked", "linear", "mla", "dsa", "dsa-shared", "wide-full",
         "compressed", "mixed"]


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(KINDS), a=st.integers(0, 60), n=st.integers(0, 60),
       window=st.integers(1, 12), topk=st.integers(1, 12))
def test_range_sums_equal_brute_force(kind: str, a: int, n: int, window: int, topk: int) -> None:
    spec = _spec(kind, window=window, topk=topk)
    u = range_units(spec, a, a + n)
    assert u.attention == _brute_units(spec, a, a + n)
    none = np.array([], dtype=np.int64)  # no key hidden: the context-edit pricing agrees
    assert attended_units(spec, a, a + n, none, none) == u.attention
    assert u.linear == pytest.approx(spec.layers * n * spec.W)
    # split anywhere: equal up to the one floor per range of the MAC-priced terms
    m = a + n // 2
    parts = range_units(spec, a, m) + range_units(spec, m, a + n)
    assert 0 <= u.attention - parts.attention <= 1


@given(a=st.integers(0, 300), n=st.integers(0, 300), c=st.integers(1, 40))
def test_chunk_position_sum(a: int, n: int, c: int) -> None:
    assert chunk_position_sum(a, a + n, c) == sum(p % c for p in range(a, a + n))


def test_w_of_hybrid_layers_is_the_mean_of_their_projections() -> None:
    spec = _spec("mixed")
    per_layer = [spec.projection_macs(k) for k in spec.kinds]
    assert spec.W == pytest.approx((sum(per_layer) / 4 + spec._ffn_macs) / spec.macs_per_unit)
    mla = get_spec("deepseek-v3")
    assert mla.macs_per_unit == 128 * (128 + 64 + 128)
    # Gemma 4's global layers project to their own KV heads and head dim
    wide = _spec("wide-full")
    assert wide.projection_macs(AttentionKind.FULL) == 64 * 4 * 32 + 2 * 64 * 1 * 32 + 4 * 32 * 64
    assert wide.projection_macs(AttentionKind.SLIDING) == wide.attention_macs_per_token
    # a layer sharing an earlier indexer's top-k runs no indexer projections
    shared, own = _spec("dsa-shared"), _spec("dsa")
    assert shared.W * 3 * shared.macs_per_unit == pytest.approx(
        own.W * 3 * own.macs_per_unit - own.indexer_projection_macs)


def test_deletion_position_speedup_per_kind() -> None:
    """Figure 1 at 128K: the window caps what a front deletion saves (gpt-oss: half its layers
    are windowed), DSA's top-k caps its attention but the indexer still grows with p."""
    from costmodel.figure1 import figure1_row
    from costmodel.profile import load_profile

    def speedup(name: str) -> float:
        return figure1_row(get_spec(name), load_profile(None, name), CTX)["speedup"]

    assert speedup("gpt-oss-120b") < speedup("qwen3-8b")
    assert 1.2 < speedup("deepseek-v3.2") < speedup("deepseek-v3")


# --- config.json: hybrid kinds read, bad ones refused by field -------------------------------
GPT_OSS = {"architectures": ["GptOssForCausalLM"], "hidden_size": 2880, "intermediate_size": 2880,
           "num_local_experts": 128, "num_experts_per_tok": 4, "num_hidden_layers": 36,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
           "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 18, "vocab_size": 201088,
           "max_position_embeddings": 131072, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
               "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
               "lm_head"]}}
GEMMA3 = {"architectures": ["Gemma3ForCausalLM"], "hidden_size": 5376, "intermediate_size": 21504,
          "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
          "head_dim": 128, "sliding_window": 1024, "sliding_window_pattern": 6,
          "vocab_size": 262208, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def _write_config(tmp_path: Path, raw: dict) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("raw,name", [(GPT_OSS, "gpt-oss-120b"), (GEMMA3, "gemma-3-27b")])
def test_reader_gives_the_hand_written_windowed_specs(raw: dict, name: str,
                                                       tmp_path: Path) -> None:
    """gpt-oss-120b's layer_types and Gemma 3's sliding_window_pattern read as the windows
    specs.py writes (config.json as published)."""
    spec, mine = load_spec(_write_config(tmp_path, raw)), get_spec(name)
    assert spec.groups == mine.groups
    assert spec.W == mine.W
    assert replace(spec, name=name, source=mine.source, config_sha256="", vocab=mine.vocab,
                   tied_embeddings=mine.tied_embeddings, architecture=mine.architecture) == mine


def test_qwen3_next_layer_types_and_interval_agree() -> None:
    """full_attention_interval 4: layers 3, 7, ... attend in full, the others are Gated
    DeltaNet; the same layer_types read alike, other ones are refused naming the interval."""
    doc = safe_load((HERE.parent / "costmodel" / "data" / "models.yaml").read_text())
    raw = doc["models"]["qwen3-next-80b-a3b"]["config"]
    fields = spec_fields(raw, "x")
    assert fields["layer_kinds"] == ("linear", "linear", "linear", "full") * 12
    assert fields["attn_output_gate"] is True
    types = ["linear_attention"] * 3 + ["full_attention"]
    assert spec_fields({**raw, "layer_types": types * 12}, "x") == fields
    with pytest.raises(ModelConfigError, match="field 'full_attention_interval': disagrees"):
        spec_fields({**raw, "layer_types": types[::-1] * 12}, "x")


CATALOG = safe_load((HERE.parent / "costmodel" / "data" / "models.yaml").read_text())["models"]
GLM52 = CATALOG["glm-5.2"]["config"]
GEMMA4 = CATALOG["gemma-4-31b"]["config"]
GEMMA4_MOE = CATALOG["gemma-4-26b-a4b"]["config"]
# GLM-5.2's config.json lists which layers build an indexer (as vLLM's and SGLang's rule gives)
GLM52_TYPES = ["full" if i < 3 or (i - 2) % 4 == 0 else "shared" for i in range(78)]


def test_gemma4_moe_block_runs_beside_the_dense_mlp() -> None:
    """Gemma 4 26B-A4B: 128 experts of 704 (top 8) beside every layer's dense MLP of 2,112,
    which every token runs as a shared expert (vLLM gemma4.py); about 25B parameters without
    the vision tower, 3.1B active without the embeddings."""
    spec = get_spec("gemma-4-26b-a4b")
    assert (spec.ffn, spec.experts, spec.active_experts, spec.expert_ffn, spec.dense_layers) \
        == (2112, 128, 8, 704, 0)
    assert round(spec.total_params / 1e9, 1) == 25.2
    assert round(spec.active_params / 1e9, 1) == 3.1


def test_shared_indexer_layers_read_as_the_engines_pick_them() -> None:
    """index_topk_freq 4, index_skip_topk_offset 3: layers 0, 1, 2, 6, ..., 74 build an
    indexer (21), as GLM-5.2's indexer_types lists; index_topk_pattern (S: shared) says the
    same; without these fields every DSA layer has its own indexer (DeepSeek-V3.2)."""
    fields = spec_fields(GLM52, "x")
    shared = fields["shared_indexer_layers"]
    assert len(shared) == 57 and shared[:4] == (3, 4, 5, 7) and 74 not in shared
    assert spec_fields({**GLM52, "indexer_types": GLM52_TYPES}, "x") == fields
    pattern = "".join("S" if t == "shared" else "F" for t in GLM52_TYPES)
    assert spec_fields({**GLM52, "index_topk_pattern": pattern}, "x") == fields
    # offset absent: 2, as vLLM (deepseek_v2.py) and SGLang (max(layer - 1, 0) % freq) read it
    no_offset = {k: v for k, v in GLM52.items() if k != "index_skip_topk_offset"}
    assert spec_fields(no_offset, "x")["shared_indexer_layers"][:3] == (2, 3, 4)
    assert "shared_indexer_layers" not in spec_fields(
        {**GLM52, "index_topk_freq": 1}, "x")


def _hybrid(**change: Any) -> dict:
    return {**GPT_OSS, **change}


LLAMA = json.loads((HERE / "fixtures" / "hf" / "llama-3.1-8b.json").read_text())


@pytest.mark.parametrize("raw,field", [
    (_hybrid(layer_types=["sliding_attention", "global"] * 18), "layer_types"),
    (_hybrid(layer_types=["sliding_attention", "full_attention"] * 17), "layer_types"),
    (_hybrid(sliding_window=None), "sliding_window"),
    (_hybrid(sliding_window=0), "sliding_window"),
    (_hybrid(use_sliding_window=False), "use_sliding_window"),
    (_hybrid(sliding_window_pattern=3), "sliding_window_pattern"),
    (_hybrid(layer_types=["full_attention", "chunked_attention"] * 18, sliding_window=None),
     "attention_chunk_size"),
    (_hybrid(layer_types=["full_attention", "linear_attention"] * 18, sliding_window=None),
     "linear_num_key_heads"),
    (_hybrid(layer_types=["full_attention", "linear_attention"] * 18), "sliding_window"),
    (_hybrid(kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
     "kv_lora_rank"),
    ({**LLAMA, "layer_types": ["full_attention"] * 32, "sliding_window": 4096}, "sliding_window"),
    ({**LLAMA, "kv_lora_rank": 512}, "qk_nope_head_dim"),
    ({**LLAMA, "index_topk": 2048}, "index_topk"),
    ({**LLAMA, "num_global_key_value_heads": 4}, "num_global_key_value_heads"),
    ({**GEMMA4, "layer_types": ["full_attention"] * 60, "sliding_window": None},
     "num_global_key_value_heads"),
    ({**GEMMA4, "num_global_key_value_heads": 5}, "num_global_key_value_heads"),
    ({**GEMMA4, "global_head_dim": 0}, "global_head_dim"),
    ({**GEMMA4, "num_kv_shared_layers": 20}, "num_kv_shared_layers"),
    ({**GEMMA4, "hidden_size_per_layer_input": 256}, "hidden_size_per_layer_input"),
    ({**GEMMA4, "enable_moe_block": True}, "enable_moe_block"),
    ({**GEMMA4_MOE, "enable_moe_block": False}, "enable_moe_block"),
    ({**GEMMA4_MOE, "top_k_experts": 129}, "top_k_experts"),
    ({**GPT_OSS, "swa_num_key_value_heads": 8}, "swa_num_key_value_heads"),
    ({**GLM52, "indexer_types": GLM52_TYPES[::-1]}, "indexer_types"),
    ({**GLM52, "indexer_types": GLM52_TYPES[:77]}, "indexer_types"),
    ({**GLM52, "index_topk_freq": 0}, "index_topk_freq"),
    ({**GLM52, "index_topk_pattern": "S" * 78}, "index_topk_pattern"),
    ({**GLM52, "index_topk_pattern": "FSX"}, "index_topk_pattern"),
    ({**{k: v for k, v in GLM52.items() if k != "index_topk"}}, "index_topk_freq"),
    ({**LLAMA, "linear_num_value_heads": 32}, "linear_num_value_heads"),
    ({**LLAMA, "full_attention_interval": 0}, "full_attention_interval"),
    ({**LLAMA, "attention_chunk_size": 8192}, "attention_chunk_size"),
    ({**LLAMA, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 28},
     "max_window_layers"),
])
def test_bad_hybrid_configs_one_line_naming_the_field(raw: dict, field: str,
                                                      tmp_path: Path) -> None:
    path = _write_config(tmp_path, raw)
    with pytest.raises(ModelConfigError) as e:
        load_spec(path)
    assert str(e.value).startswith(f"{path}: field {field!r}: "), str(e.value)
    assert "\n" not in str(e.value)


def test_chunked_and_all_sliding_layers_read() -> None:
    chunked = spec_fields({**LLAMA, "attention_chunk_size": 8192,
                           "layer_types": ["chunked_attention"] * 3 * 8
                           + ["full_attention"] * 8}, "x")
    assert chunked["layer_kinds"][:3] == ("chunked",) * 3
    assert chunked["layer_windows"][0] == 8192 and chunked["layer_windows"][-1] is None
    mistral = spec_fields({**LLAMA, "sliding_window": 4096}, "x")  # Mistral-7B-v0.1's one window
    assert mistral["layer_windows"] == (4096,) * 32 and "layer_kinds" not in mistral


def test_bad_config_exits_2_from_the_cli(tmp_path: Path) -> None:
    path = _write_config(tmp_path, _hybrid(layer_types=["sliding_attention", "global"] * 18))
    res = CliRunner().invoke(cli, ["run", *TINY, "--model", path])
    assert res.exit_code == 2, res.output
    line = res.stderr.strip().splitlines()[-1]
    assert "'layer_types'" in line and "'global'" in line, line


def test_kv_dtype_config_checks(tmp_path: Path) -> None:
    # --kv-dtype with --gpu sizing: tests/test_hybrid_sizing.py
    from sim.checks import check_model_and_profile
    from sim.config import ConfigError, RunConfig

    with pytest.raises(ConfigError, match="field 'kv_dtype': must be one of bf16, fp8, fp4"):
        check_model_and_profile(RunConfig.from_flat(kv_dtype="fp16"))


# --- kvsim models --json ---------------------------------------------------------------------
def test_models_json_schema() -> None:
    res = CliRunner().invoke(cli, ["models", "--json"])
    assert res.exit_code == 0, res.output
    models = {m["name"]: m for m in json.loads(res.stdout)["models"]}
    assert {"gpt-oss-120b", "gemma-3-27b", "qwen3-next-80b-a3b", "deepseek-v3.2",
            "kimi-k2", "glm-4.5"} <= set(models)
    for name, m in models.items():  # a compressed layer is in the sliding group too
        assert sum(g["layers"] for g in m["groups"] if g["kind"] != "compressed") \
            == m["layers"], name
        assert m["kv_bytes_per_token"] == sum(g["kv_bytes_per_token"] for g in m["groups"])
        for g in m["groups"]:
            assert {"kind", "layers", "kv_bytes_per_token", "state_bytes_per_request"} <= set(g)
            assert ("window" in g) == (g["kind"] in ("sliding", "chunked")), (name, g)
            assert ("compress_ratio" in g) == (g["kind"] == "compressed"), (name, g)
    assert models["qwen3-8b"]["groups"] == GROUPS["qwen3-8b"]
    for name, groups in GROUPS.items():
        assert models[name]["groups"] == groups, name
    assert models["qwen3.5-397b-a17b"]["architecture"] == "Qwen3_5MoeForCausalLM"
    assert models["gemma-3-27b"]["architecture"] == "Gemma3ForConditionalGeneration"
    assert all(isinstance(m["architecture"], str) for m in models.values())
    assert models["gpt-oss-120b"]["kv_bytes_per_token_at_128k"] == 36900
    fp8 = CliRunner().invoke(cli, ["models", "--json", "--kv-dtype", "fp8"])
    m8 = {m["name"]: m for m in json.loads(fp8.stdout)["models"]}
    assert m8["qwen3-8b"]["kv_bytes_per_token"] == 73728 and m8["qwen3-8b"]["kv_dtype"] == "fp8"


# --- the agentic catalog runs on both engines ------------------------------------------------
# issue 54's catalog models (and the hybrids beside them) with what each engine does with them:
# None runs, a string is the start of the one-line reason the run is refused with
AGENTIC = {name: {"sglang": None, "vllm": None} for name in (
    "gpt-oss-120b", "qwen3-next-80b-a3b", "qwen3.5-27b", "qwen3.6-27b", "qwen3.5-397b-a17b",
    "deepseek-v3.2", "kimi-k2.5", "glm-5.2", "gemma-4-31b", "gemma-4-26b-a4b",
    "deepseek-v4-flash")}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("name", sorted(AGENTIC))
def test_agentic_catalog_runs_or_is_refused_by_reason(name: str, engine: str) -> None:
    """Each model runs its engine's preset and penelope under cache pressure (requests
    simulated, some cache hits), or is refused with one line saying why. vLLM's hybrid pool
    shares its blocks between the model's KV cache groups (sim/engines/vllm.py
    ``vllm_kv_groups``): it gets 20k tokens per group, the pressure one group has at 20k."""
    from sim.engines.vllm import vllm_kv_groups

    groups = vllm_kv_groups(get_spec(name)) if engine == "vllm" else None
    cache = f"{20 * len(groups or [None])}k"
    res = CliRunner().invoke(cli, ["run", *TINY, "--gpu-cache", cache, "--model", name,
                                   "--engine", engine, "--preset", f"{engine},penelope",
                                   "--json"])
    reason = AGENTIC[name][engine]
    if reason is not None:
        assert res.exit_code == 2, res.output
        line = res.stderr.strip().splitlines()[-1]
        assert reason in line, line
        return
    assert res.exit_code == 0, res.output
    for run in json.loads(res.stdout)["runs"]:
        assert run["summary"]["requests"] > 0, (name, engine, run["policy"])


@pytest.mark.parametrize("shape", [["--replicas", "2", "--router", "dynamo-kv"],
                                   ["--prefill-replicas", "1", "--decode-replicas", "1"]])
def test_deepseek_v4_runs_in_fleets_and_disaggregated_on_vllm(shape: list[str]) -> None:
    """DeepSeek-V4 on vLLM (one full-attention pool: docs/hybrid.md, DeepSeek-V4 on both
    engines) in a routed fleet and with PD: every request served, both presets. (SGLang's
    hybrid tree runs it in both shapes in tests/test_sglang_hybrid_engine.py.)"""
    res = CliRunner().invoke(cli, ["run", *TINY, "--gpu-cache", "40k", "--model",
                                   "deepseek-v4-flash", "--engine", "vllm", "--preset",
                                   "vllm,penelope", *shape, "--json"])
    assert res.exit_code == 0, res.output
    for run in json.loads(res.stdout)["runs"]:
        s = run["summary"]
        assert s["requests"] > 0 and s["dropped_requests"] == 0, run["policy"]
        assert 0 < s["hit_rate"] <= 1


def test_shared_indexer_layers_must_follow_an_indexer() -> None:
    for shared in [(0,), (2, 1), (1, 1)]:
        with pytest.raises(ValueError, match="shared_indexer_layers must be sorted DSA"):
            replace(_spec("dsa"), shared_indexer_layers=shared)
    with pytest.raises(ValueError, match="shared_indexer_layers"):
        replace(_spec("mla"), shared_indexer_layers=(1,))


@pytest.mark.parametrize("name,total_b,active_b", [
    ("qwen3.5-27b", 26.9, 24.4), ("qwen3.6-27b", 26.9, 24.4),
    ("qwen3.5-397b-a17b", 396.2, 15.2), ("kimi-k2.5", 1026.2, 30.3),
    ("glm-5.2", 743.3, 39.2), ("gemma-4-31b", 30.8, 29.4), ("gemma-4-26b-a4b", 25.2, 3.1),
])
def test_catalog_shapes_weigh_what_the_models_are_published_at(name: str, total_b: float,
                                                               active_b: float) -> None:
    """Parameters from the catalog shapes (linear layers, every expert, embeddings; no vision
    tower or MTP layer): within a few percent of each model's published size (27B, 397B-A17B,
    Kimi K2's 1T-A32B, GLM-5's 744B-A40B, Gemma 4 31B and 26B-A4B), so no shape is off by a
    factor; active excludes the embeddings."""
    spec = get_spec(name)
    assert round(spec.total_params / 1e9, 1) == total_b
    assert round(spec.active_params / 1e9, 1) == active_b


V4_FLASH = CATALOG["deepseek-v4-flash"]["config"]


def test_deepseek_v4_reads_its_compress_ratios_or_compress_rates(tmp_path: Path) -> None:
    """DeepSeek-V4-Flash's config.json as a file reads as the catalog entry; its MTP layer's
    ratio (the 44th) is not read; transformers' form (``layer_types`` with ``compress_rates``,
    MTP layers dropped) reads the same, as vLLM's ``get_compress_ratios`` reads either."""
    spec = load_spec(_write_config(tmp_path, V4_FLASH))
    mine = get_spec("deepseek-v4-flash")
    assert spec.groups == mine.groups and spec.W == mine.W
    assert spec.compress_ratios == tuple(V4_FLASH["compress_ratios"][:43])
    names = {0: "sliding_attention", 4: "compressed_sparse_attention",
             128: "heavily_compressed_attention"}
    rates = {k: v for k, v in V4_FLASH.items() if k != "compress_ratios"}
    rates.update(layer_types=[names[r] for r in spec.compress_ratios],
                 compress_rates={"compressed_sparse_attention": 4,
                                 "heavily_compressed_attention": 128})
    assert spec_fields(rates, "x") == spec_fields(V4_FLASH, "x")
    assert spec.kinds.count(AttentionKind.SLIDING) == 2
    assert mine.indexer_kv_dtype == "fp4" and mine.window_caps == ((43, 127),)
    assert mine.extra_terms == ((21, AttentionKind.COMPRESSED, 512, 4),
                                (21, AttentionKind.DSA, 64 * 128 // 2, 4),
                                (20, AttentionKind.COMPRESSED, 0, 128))


@pytest.mark.parametrize("change,field", [
    ({"compress_ratios": [0, 4] * 20}, "compress_ratios"),
    ({"compress_ratios": [1] * 44}, "compress_ratios"),
    ({"compress_ratios": [0, 0] + [3, 128] * 20 + [4, 0]}, "compress_ratios"),
    ({"compress_ratios": None, "compress_rates": [4, 128]}, "compress_rates"),
    ({"compress_ratios": None, "compress_rates": {"a": 4}, "layer_types": ["a"]},
     "layer_types"),
    ({"sliding_window": None}, "sliding_window"),
    ({"head_dim": None}, "head_dim"),
    ({"index_topk": None}, "index_topk"),
    ({"o_groups": 7}, "o_groups"),
    ({"kv_lora_rank": 512}, "kv_lora_rank"),
    ({"index_topk_freq": 4}, "index_topk_freq"),
    ({"kv_source_layer_ids": [2, 8]}, "kv_source_layer_ids"),
    ({"index_source_layer_ids": [2, 8]}, "index_source_layer_ids"),
    ({"engram_layer_ids": [2]}, "engram_layer_ids"),
    ({"vision_n_layers": 24}, "vision_n_layers"),
])
def test_compressed_configs_kvsim_cannot_read_are_one_line(change: dict, field: str,
                                                           tmp_path: Path) -> None:
    """A compressed model's bad or unmodelled fields (DeepSeek-V4.1's KV and indexer shared
    across layers, its Engram and vision layers) are refused with one line naming the field."""
    raw = {k: v for k, v in {**V4_FLASH, **change}.items() if v is not None}
    path = _write_config(tmp_path, raw)
    with pytest.raises(ModelConfigError) as e:
        load_spec(path)
    assert str(e.value).startswith(f"{path}: field {field!r}: "), str(e.value)
    assert "\n" not in str(e.value)


@settings(max_examples=100, deadline=None)
@given(ratios=st.lists(st.sampled_from([0, 2, 4, 8, 16]), min_size=1, max_size=8),
       window=st.integers(1, 40), tokens=st.integers(0, 300),
       dtype=st.sampled_from(list(KV_DTYPE_BITS)))
def test_compressed_bytes_equal_brute_force(ratios: list[int], window: int, tokens: int,
                                            dtype: str) -> None:
    """A request's bytes in a compressed model, counted entry by entry: every layer's window
    of its last ``window`` tokens, a compressed layer's entry each time ``r`` tokens
    complete, a ratio-4 layer's fp4 indexer key beside each of its entries."""
    spec = ModelSpec("t", layers=len(ratios), hidden=64, q_heads=4, kv_heads=1, head_dim=32,
                     layer_kinds=tuple("compressed" if r else "sliding" for r in ratios),
                     layer_windows=(window,) * len(ratios), compress_ratios=tuple(ratios),
                     index_topk=3, index_n_heads=2, index_head_dim=8, indexer_kv_dtype="fp4",
                     kv_dtype=dtype)
    entry = 32 * KV_DTYPE_BITS[dtype] // 8
    brute = 0
    for r in ratios:
        for p in range(tokens):
            brute += entry if p >= tokens - window else 0
            if r and (p + 1) % r == 0:
                brute += entry + (8 * 4 // 8 if r == 4 else 0)
    assert spec.kv_bytes(tokens) == brute
    assert sum(g.layers for g in spec.groups if g.kind is AttentionKind.SLIDING) == len(ratios)
    assert [g.compress_ratio for g in spec.groups if g.kind is AttentionKind.COMPRESSED] \
        == list(dict.fromkeys(r for r in ratios if r))


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8"])
def test_compressed_bytes_are_vllms_pages(kv_dtype: str) -> None:
    """The pinned vLLM's own cache specs of DeepSeek-V4 (vllm/models/deepseek_v4/
    attention.py): a compressed layer's ``MLAAttentionSpec`` with ``tokens_per_state`` r
    keeps a block's tokens in ``block / r`` entries, the window's ``SlidingWindowMLASpec``
    one entry a token, the ratio-4 indexer's MXFP4 keys (``head_dim / 2`` bytes plus a scale
    byte per 32) one per 4 tokens; per token, one layer: what kvsim's groups store (plain
    rows: vLLM's fp8_ds_mla layout adds its scales, 584 bytes an entry, not modelled)."""
    import torch

    from benchmarks.vllm_ref import load_vllm_core
    from costmodel.gpus import group_bytes

    iface = load_vllm_core()["interface"]
    spec = get_spec("deepseek-v4-flash", kv_dtype)
    dtype = torch.bfloat16 if kv_dtype == "bf16" else torch.float8_e4m3fn
    block = 256
    window, c4, c128 = group_bytes(spec, 1, "vllm")
    swa = iface.SlidingWindowMLASpec(block_size=block, num_kv_heads=1, head_size=512,
                                     dtype=dtype, sliding_window=128)
    assert window.layer_token == swa.page_size_bytes // block
    for g, ratio in ((c4, 4), (c128, 128)):
        page = iface.MLAAttentionSpec(block_size=block, num_kv_heads=1, head_size=512,
                                      dtype=dtype, tokens_per_state=ratio)
        assert g.layer_token == page.page_size_bytes // block
    key = iface.MLAAttentionSpec(block_size=block, num_kv_heads=1, head_size=128 // 2 + 128 // 32,
                                 dtype=torch.uint8, tokens_per_state=4)
    assert c4.indexer_token == 21 * key.page_size_bytes // block and c128.indexer_token == 0


# --- a Gated DeltaNet hybrid disaggregated: the state crosses the link once, not per token ---
# Qwen3-Next's 36 Gated DeltaNet layers: one request's state per layer on one GPU, as each
# engine stores it (the convolution window in bf16 beside the recurrent state: bf16 on vLLM,
# the page tests/test_vllm_hybrid_diff.py checks against vLLM's MambaSpec; fp32 on SGLang)
NEXT_STATE_PER_LAYER = {"vllm": 1_097_728, "sglang": 2_146_304}


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_pd_ships_a_linear_models_state_once_beside_its_tokens(engine: str, tp: int) -> None:
    """``kvsim run --model qwen3-next-80b-a3b --prefill-replicas 1 --decode-replicas 1`` on
    both engines: every prefilled remote request moves its prompt's full-attention KV per
    token plus the 36 layers' state once (all TP ranks together); each rank ships its share
    (the state's heads split over the ranks), so the link is busy for that rank's bytes."""
    from costmodel.links import get_link
    from sim.config import RunConfig
    from sim.run import run

    model = "qwen3-next-80b-a3b"
    cfg = RunConfig.from_flat(trace="synthetic:claude-code?sessions=4", max_context=32768,
                              gaps="tool", sessions=2, gpu_cache=65536, model=model,
                              engine=engine, tp=tp, prefill_replicas=1,
                              decode_replicas=1).with_preset(engine)
    res = run(cfg)
    t = res.requests
    sent = t[t["prefill_s"].notna() & ~t["prefilled_locally"]]
    assert len(sent) > 0 and res.summary["dropped_requests"] == 0
    kvb = get_spec(model).kv_bytes_per_token  # the 12 full layers; the linear ones hold none
    state = 36 * NEXT_STATE_PER_LAYER[engine]
    assert (sent["transfer_bytes"] == sent["prompt_tokens"] * kvb + state).all()
    link = get_link(cfg.pd.pd_link)
    share = 1 / tp  # Qwen3-Next's 2 KV heads, one per rank at TP 2
    for prompt, seconds in zip(sent["prompt_tokens"], sent["transfer_s"], strict=True):
        busy = link.busy_seconds(prompt * kvb * share + state / tp)
        assert seconds == pytest.approx(busy + link.latency_s, rel=1e-12)
