"""GPU sizing (costmodel/gpus.py): KV-cache tokens from device memory, by hand."""

from __future__ import annotations

import pytest

from costmodel.errors import ProfileError
from costmodel.gpus import get_gpu, kv_cache_tokens, load_gpus, profile_for
from costmodel.specs import get_spec


def test_qwen3_32b_on_two_h100_by_hand() -> None:
    spec, gpu = get_spec("qwen3-32b"), get_gpu("H100")
    # 81,559 MiB per GPU; 90% of it for weights and KV
    budget = int(81559 * 2**20 * 0.9)
    # weights: 64 layers x (q 5120x8192 + k,v 2x5120x1024 + o 8192x5120 + ffn 3x5120x25600)
    # + embedding and head 2 x 151,936 x 5,120, in bf16, split over 2 ranks
    per_layer = 5120 * 8192 + 2 * 5120 * 1024 + 8192 * 5120 + 3 * 5120 * 25600
    weights = (64 * per_layer + 2 * 151936 * 5120) * 2
    assert spec.total_params * 2 == weights
    # each rank holds 8 / 2 = 4 KV heads of 128 dims over 64 layers, K and V, bf16
    cell = 2 * 4 * 128 * 64 * 2
    tokens = (budget - weights // 2) // cell // 64 * 64
    got = kv_cache_tokens(spec, gpu, tp=2, mem_fraction=0.9)
    assert (got.cell_bytes, got.weight_bytes_per_rank, got.tokens) == (cell, weights // 2, tokens)
    assert got.tokens == 337_216


def test_kv_heads_replicate_when_tp_exceeds_them() -> None:
    spec = get_spec("qwen3-235b-a22b")  # 4 KV heads
    a = kv_cache_tokens(spec, get_gpu("H200"), tp=8)
    assert a.cell_bytes == 2 * 1 * 128 * 94 * 2  # one head per rank, not half of one


def test_no_room_for_the_weights_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="leave no room for a KV cache"):
        kv_cache_tokens(get_spec("qwen3-235b-a22b"), get_gpu("H100"), tp=2)
    with pytest.raises(ValueError, match="memory fraction"):
        kv_cache_tokens(get_spec("qwen3-8b"), get_gpu("H100"), mem_fraction=1.5)


def test_more_memory_more_tokens() -> None:
    spec = get_spec("qwen3-8b")
    sizes = [kv_cache_tokens(spec, get_gpu(g)).tokens for g in ("H100", "H200", "B200")]
    assert sizes == sorted(sizes) and sizes[0] > 0
    lo = kv_cache_tokens(spec, get_gpu("H100"), mem_fraction=0.8).tokens
    assert lo < kv_cache_tokens(spec, get_gpu("H100"), mem_fraction=0.9).tokens


def test_profile_choice_says_when_it_is_not_measured() -> None:
    assert profile_for(get_gpu("H200"), "qwen3-32b", 2).exact
    other_tp = profile_for(get_gpu("H200"), "qwen3-32b", 4)
    assert not other_tp.exact and "2 x H200" in other_tp.note
    none = profile_for(get_gpu("A100"), "qwen3-8b", 1)
    assert not none.exact and none.name == "kernels-h100_sxm-qwen3-8b" and "A100" in none.note


def test_catalog_is_checked(tmp_path) -> None:
    assert {"H100", "H200", "B200"} <= set(load_gpus())
    bad = tmp_path / "gpus.yaml"
    bad.write_text("gpus:\n  X1:\n    memory_mib: -5\n    hbm_tb_s: 1\n    bf16_tflops: 1\n"
                   "    nvlink_gb_s: 0\n    price_usd_h: 1\n")
    with pytest.raises(ProfileError, match=r"X1\.memory_mib"):
        load_gpus(bad)
    with pytest.raises(KeyError, match="unknown GPU 'Z9'; known: "):
        get_gpu("Z9")
