"""KV sizing from the KV cache groups (costmodel/gpus.py ``kv_capacity``, sim/deploy.py), by
hand (issue 54 follow-ups; docs/hybrid.md, Capacity in bytes)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from costmodel.gpus import GIB, get_gpu, kv_cache_tokens, kv_capacity
from costmodel.specs import get_spec
from sim.cli.main import cli
from sim.deploy import resolve_gpu_fields

BUDGET = 40 * GIB  # 42,949,672,960 bytes
TINY = ["--trace", "synthetic:claude-code?sessions=4", "--max-context", "32k", "--gaps", "tool",
        "--sessions", "2"]


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3-32b", "qwen3-235b-a22b", "llama-3.1-70b"])
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_full_attention_sizing_is_the_old_cell_rule(model: str, engine: str) -> None:
    """Full-attention models: bit-identical to 2 x kv_heads_per_rank x head_dim x layers x 2."""
    spec = get_spec(model)
    for tp in (1, 2, 4, 8):
        if spec.q_heads % tp:
            continue
        cell = 2 * max(1, spec.kv_heads // tp) * spec.head_dim * spec.layers * 2
        for budget in (BUDGET, 12_345_678_901, 7 * GIB + 3):
            for bs in (16, 64):
                got = kv_capacity(spec, budget, tp, engine, bs)
                assert got.tokens == budget // cell // bs * bs, (tp, budget, bs)
    # the pinned GPU numbers (tests/test_gpus.py, tests/test_deploy.py) under either engine
    for engine_name in ("sglang", "vllm"):
        assert kv_cache_tokens(get_spec("qwen3-32b"), get_gpu("H100"), 2, 0.9,
                               engine=engine_name).tokens == 337_216


def test_gpt_oss_120b_groups_by_hand() -> None:
    spec = get_spec("gpt-oss-120b")
    # one layer's token: K and V, 8 KV heads x 64 dims, bf16 = 2,048 B; 18 sliding(128) and
    # 18 full layers: 36,864 B per token in each group
    # vLLM: group_size 18 (both buckets), a block is 64 tokens x 2,048 B x 18 layers
    v = kv_capacity(spec, BUDGET, 1, "vllm", 64)
    assert (v.group_size, v.vllm_groups, v.block_bytes) == (18, (1, 1), 2_359_296)
    assert v.num_blocks == BUDGET // 2_359_296 == 18_204
    assert v.tokens == 18_204 * 64 == 1_165_056  # the shared pool's token slots
    # SGLang: full pool + SWA pool of 0.8 x its tokens: cell 36,864 + 0.8 x 36,864
    s = kv_capacity(spec, BUDGET, 1, "sglang", 64)
    full = int(BUDGET // (36_864 + 0.8 * 36_864)) // 64 * 64
    assert (s.full_tokens, s.tokens) == (full, full) == (647_232, 647_232)
    assert s.swa_tokens == int(full * 0.8) // 64 * 64 == 517_760
    # the old rule counted both groups as full: 40 GiB // 73,728 B
    assert BUDGET // 73_728 // 64 * 64 == 582_528 < s.tokens < v.tokens


def test_sglang_one_pool_models_by_hand() -> None:
    """``kv_capacity(..., "sglang")`` called alone sizes the pools SGLang 0.5.23 allocates:
    Gemma 2/3 in one pool of every layer (their model override sets
    disable_hybrid_swa_memory and ``is_hybrid_swa_model`` does not list them), each layer
    keeping every token; gpt-oss in one pool only under ``hybrid_swa_memory`` off; Gemma 4
    (listed) in a full pool beside an SWA pool. vLLM keeps every model's window groups."""
    from costmodel.specs import AttentionKind

    gemma3 = get_spec("gemma-3-27b")
    cell = 62 * 2 * 16 * 128 * 2  # 62 layers, K and V, 16 KV heads x 128 dims, bf16
    s = kv_capacity(gemma3, BUDGET, 1, "sglang", 64)
    assert (s.tokens, s.full_tokens, s.swa_tokens) == (BUDGET // cell // 64 * 64,
                                                       BUDGET // cell // 64 * 64, 0)
    for hsm in (True, False):  # whatever the flag says
        assert kv_capacity(gemma3, BUDGET, 1, "sglang", 64, hybrid_swa_memory=hsm) == s
    assert kv_capacity(gemma3, BUDGET, 1, "vllm", 64).tokens > s.tokens  # its window groups
    gpt = get_spec("gpt-oss-120b")
    one = kv_capacity(gpt, BUDGET, 1, "sglang", 64, hybrid_swa_memory=False)
    assert (one.tokens, one.swa_tokens) == (BUDGET // 73_728 // 64 * 64, 0) == (582_528, 0)
    assert kv_capacity(gpt, BUDGET, 1, "sglang", 64).swa_tokens == 517_760
    gemma4 = get_spec("gemma-4-31b")
    hybrid = kv_capacity(gemma4, BUDGET, 1, "sglang", 64)
    assert 0 < hybrid.swa_tokens < hybrid.full_tokens
    # one pool (--hybrid-swa-memory off): each layer every token at its own shape, counted
    # layer by layer (50 sliding layers of 16 KV heads x 256, 10 global of 4 x 512)
    shape = {AttentionKind.SLIDING: (16, 256), AttentionKind.FULL: (4, 512)}
    cell4 = sum(2 * shape[k][0] * shape[k][1] * 2 for k in gemma4.kinds)
    assert cell4 == 901_120
    one4 = kv_capacity(gemma4, BUDGET, 1, "sglang", 64, hybrid_swa_memory=False)
    assert (one4.tokens, one4.swa_tokens) == (BUDGET // cell4 // 64 * 64, 0)
    from sim.deploy import resolve_gpu_fields

    point = {"model": "gemma-4-31b", "engine": "sglang", "hybrid_swa_memory": False}
    assert resolve_gpu_fields({**point, "gpu_cache": "40GiB"}, "t")["gpu_cache"] == one4.tokens


def test_deepseek_v3_latent_by_hand() -> None:
    """MLA: (kv_lora_rank 512 + qk_rope 64) x 2 B x 61 layers = 70,272 B per token, the whole
    latent on every rank (not split by TP, not 2 x 128 KV heads x 128 dims)."""
    spec = get_spec("deepseek-v3")
    for tp in (1, 8):
        for engine in ("sglang", "vllm"):
            got = kv_capacity(spec, BUDGET, tp, engine, 64)
            assert got.groups[0].token_bytes == 70_272
            assert got.tokens == BUDGET // 70_272 // 64 * 64 == 611_136
    fp8 = kv_capacity(get_spec("deepseek-v3", "fp8"), BUDGET, 8, "vllm", 64)
    assert fp8.tokens == BUDGET // 35_136 // 64 * 64
    # DSA: the latent and the indexer key in fp8 with an fp32 scale per 128: 576 x 2 + 132
    dsa = kv_capacity(get_spec("deepseek-v3.2"), BUDGET, 8, "sglang", 64)
    assert dsa.groups[0].token_bytes == 61 * (576 * 2 + 128 + 4) == 78_324


def test_qwen3_next_states_by_hand() -> None:
    spec = get_spec("qwen3-next-80b-a3b")  # 12 full (2 KV heads x 256), 36 Gated DeltaNet
    # TP 4: a full layer holds 1 KV head x 256 x 2 (K, V) x 2 B = 1,024 B per token; a GDN
    # layer's state: conv 3 x (2 x 16 x 128 + 32 x 128) / 4 in bf16 = 12,288 B, recurrent
    # 32 / 4 heads x 128 x 128 in fp32 (SGLang) 524,288 B or bf16 (vLLM) 262,144 B
    s = kv_capacity(spec, BUDGET, 4, "sglang", 64)
    assert s.state_bytes == 36 * (12_288 + 524_288)
    slots = int((BUDGET * 0.9 / 1.9 - s.state_bytes) // s.state_bytes)
    assert s.mamba_slots == slots == 1_052
    assert s.tokens == (BUDGET - (slots + 1) * s.state_bytes) // 12_288 // 64 * 64
    v = kv_capacity(spec, BUDGET, 4, "vllm", 64)
    # a block must hold a 274,432 B state page: 64 x cdiv(274,432, 64 x 1,024) = 320 tokens
    assert (v.block_size, v.group_size, v.vllm_groups) == (320, 12, (3, 1))
    assert v.block_bytes == 12 * 320 * 1_024 and v.num_blocks == BUDGET // v.block_bytes
    assert v.state_blocks_per_request == 3 and v.tokens == v.num_blocks * 320


def test_kv_dtype_sizes_gpu_and_byte_caches() -> None:
    """--kv-dtype with --gpu and --gpu-cache in bytes (refused before): fp8 halves a token."""
    fp8 = resolve_gpu_fields({"gpu_cache": "40GiB", "model": "qwen3-8b", "kv_dtype": "fp8"},
                             "t")
    assert fp8["gpu_cache"] == BUDGET // 73_728 // 64 * 64 == 582_528
    bf16 = resolve_gpu_fields({"gpu_cache": "40GiB", "model": "qwen3-8b"}, "t")
    assert bf16["gpu_cache"] == BUDGET // 147_456 // 64 * 64
    gpu = {"gpu": "H100", "model": "qwen3-8b", "engine": "sglang"}
    a = resolve_gpu_fields(gpu, "t")["gpu_cache"]
    b = resolve_gpu_fields({**gpu, "kv_dtype": "fp4"}, "t")["gpu_cache"]
    assert a // 64 * 4 <= b <= (a + 64) * 4
    res = CliRunner().invoke(cli, ["run", *TINY, "--kv-dtype", "fp8", "--gpu", "H100",
                                   "--preset", "sglang", "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["runs"][0]["summary"]
    assert s["gpu_cache_tokens"] == kv_cache_tokens(
        get_spec("qwen3-8b", "fp8"), get_gpu("H100"), 1, s["mem_fraction"]).tokens


# --- attention rates per kind (Profile.attention_rates; calibration/kernels/hybrid.py) -------
def test_kind_rates_are_the_fits_of_the_installed_tables() -> None:
    from importlib import resources
    from pathlib import Path

    from calibration.kernels.hybrid import fit_kinds
    from costmodel.derive import KIND_FLOPS_H100

    fits = fit_kinds(Path(str(resources.files("aiconfigurator_core") / "systems")))
    for kind, flops in KIND_FLOPS_H100.items():
        assert fits[kind].flops == pytest.approx(flops, rel=1e-4), kind
    assert fits["mla"].median_abs_rel_error < 0.1 and fits["linear"].median_abs_rel_error < 0.05
    assert fits["dsa"].median_abs_rel_error < 0.1
    # slower than the derived one rate per unit (1.38e-10 s for a 40,960-MAC unit): MLA 3.6x
    assert fits["mla"].seconds_per_unit == pytest.approx(4.944e-10, rel=1e-3)


def test_a_run_resolves_its_model_as_its_profile_prices_it() -> None:
    """sim/run/driver.py loads the profile first and asks ``get_spec`` once for the priced
    spec: the same spec as weighting the resolved one afterwards (``Profile.pricing_spec``)."""
    from costmodel.derive import derive

    nxt = derive("qwen3-next-80b-a3b")
    assert nxt.attention_weights == {"linear": pytest.approx(
        dict(nxt.attention_rates)["linear"] / nxt.prefill.per_attention_unit_s)}
    for dtype in (None, "fp8"):
        priced = get_spec(nxt.model, dtype, nxt.attention_weights)
        assert priced == nxt.pricing_spec(get_spec(nxt.model, dtype)) != get_spec(nxt.model, dtype)
    plain = derive("qwen3-8b")
    assert plain.attention_weights == {}
    assert get_spec("qwen3-8b", "bf16", plain.attention_weights) is get_spec("qwen3-8b", "bf16")


def test_derived_profiles_price_each_kind_at_its_rate() -> None:
    from costmodel.derive import KIND_FLOPS_H100, derive, roofline
    from costmodel.units import range_units

    for model in ("qwen3-8b", "gpt-oss-120b", "gemma-3-27b", "glm-4.5"):
        p = derive(model)  # full and sliding kinds: one rate, as before
        assert p.attention_rates == () and p.pricing_spec(p.spec) is p.spec
        assert "attention_rates" not in p.to_dict()
    p = derive("deepseek-v3")
    assert p.attention_rates == (("mla", 2 * 40_960 / KIND_FLOPS_H100["mla"]),)
    nxt = derive("qwen3-next-80b-a3b")  # full layers at the one rate, Gated DeltaNet its own
    rate = dict(nxt.attention_rates)["linear"]
    assert rate == pytest.approx(2 * 8_192 / KIND_FLOPS_H100["linear"])
    spec = nxt.spec
    priced = nxt.pricing_spec(spec)
    a, b = 100_000, 101_000
    full = 12 * (a + b - 1) * (b - a) // 2  # 12 full layers
    linear = 36 * (b - a) * spec.state_update_macs // spec.macs_per_unit  # 192 units a token
    assert range_units(spec, a, b).attention == full + linear
    base = nxt.prefill.per_attention_unit_s
    got = range_units(priced, a, b)
    assert isinstance(got.attention, int)
    assert got.attention * base == pytest.approx(full * base + linear * rate, rel=1e-9)
    assert nxt.prefill_seconds(got) - nxt.prefill_seconds(range_units(spec, a, b)) \
        == pytest.approx(linear * (rate - base), rel=1e-6)
    # a GPU without tables: the H100's rates at its peak, said in the details
    r = roofline("RTX4090", "deepseek-v3", 1)
    assert "derived, not measured" in r.details["attention_rates"]
    assert dict(r.attention_rates)["mla"] > dict(p.attention_rates)["mla"]


def test_attention_rates_read_back_and_bad_ones_are_named(tmp_path) -> None:
    from costmodel.derive import derive
    from costmodel.errors import ProfileError
    from costmodel.profile import load_profile

    p = derive("deepseek-v3.2")
    path = tmp_path / "p.yaml"
    p.dump(path)
    assert load_profile(str(path), "deepseek-v3.2").attention_rates == p.attention_rates
    import yaml

    raw = yaml.safe_load(path.read_text())
    raw["attention_rates"] = {"lsh": 1e-9}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError, match=r"attention_rates\.lsh"):
        load_profile(str(path), "deepseek-v3.2")


# --- kvsim capacity at equal memory in bytes (sim/cli/capacity.py) ---------------------------
CAP = ["capacity", "synthetic:claude-code?sessions=4", "--cache-dir", "off"]


def test_capacity_curves_by_model_at_equal_bytes() -> None:
    res = CliRunner().invoke(cli, [*CAP, "--cache", "2GiB,8GiB", "--model", "qwen3-8b",
                                   "--model", "gpt-oss-120b", "--engine", "sglang", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    got = {(r["model"], r["cache_bytes"]): r for r in rows}
    assert len(rows) == 4 and set(got) == {(m, b * GIB) for m in ("qwen3-8b", "gpt-oss-120b")
                                            for b in (2, 8)}
    for (m, b), r in got.items():  # each model's tokens from its groups, SGLang's pools
        assert r["cache_tokens"] == kv_capacity(get_spec(m), b, 1, "sglang", 64).tokens
    # the same tokens given as tokens give the same hit rate (the study is unchanged)
    t = got[("gpt-oss-120b", 8 * GIB)]["cache_tokens"]
    plain = CliRunner().invoke(cli, [*CAP, "--cache", str(t), "--json"])
    assert json.loads(plain.stdout)[0]["hit_rate"] == got[("gpt-oss-120b", 8 * GIB)]["hit_rate"]
    # at equal memory the sliding-window model holds more of the trace
    assert got[("gpt-oss-120b", 8 * GIB)]["hit_rate"] > got[("qwen3-8b", 8 * GIB)]["hit_rate"]


@pytest.mark.parametrize(("args", "words"), [
    (["--cache", "2GiB,64k"], "--cache"),
    (["--cache", "64k", "--model", "qwen3-8b"], "--model"),
    (["--cache", "64k", "--kv-dtype", "fp8"], "--kv-dtype"),
    (["--cache", "1MiB", "--model", "qwen3-8b"], "fewer than one"),
    (["--cache", "2GiB", "--model", "no-such-model"], "--model"),
])
def test_capacity_bytes_refusals_name_the_option(args: list[str], words: str) -> None:
    res = CliRunner().invoke(cli, [*CAP, *args])
    assert res.exit_code == 2, res.output
    assert words in res.output and "Traceback" not in res.output


def test_sglangs_swa_pool_list_is_its_own() -> None:
    """``SGLANG_SWA_POOL_ARCHS`` is SGLang 0.5.23's ``is_hybrid_swa_model`` allow-list: the
    real function (compiled from the installed source) says yes to each name and, for every
    architecture kvsim reads, what membership says."""
    from importlib import metadata
    from pathlib import Path

    from benchmarks.stubbing import real_definitions
    from costmodel.gpus import SGLANG_SWA_POOL_ARCHS
    from costmodel.hfconfig import ARCHITECTURES

    # the installed wheel's file (other tests may register a bare ``sglang`` package)
    source = Path(str(metadata.distribution("sglang").locate_file(
        "sglang/srt/configs/model_config.py")))
    assert source.is_file(), source
    real = real_definitions(source, ("is_hybrid_swa_model", "SWA_SINK_ARCHS",
                                     "MIMO_V2_MODEL_ARCHS"))
    is_hybrid_swa = real["is_hybrid_swa_model"]
    is_hybrid_swa.__globals__.update(real)
    assert all(is_hybrid_swa([arch]) for arch in SGLANG_SWA_POOL_ARCHS)
    for arch in ARCHITECTURES:
        assert is_hybrid_swa([arch]) == (arch in SGLANG_SWA_POOL_ARCHS), arch


def test_an_unlisted_architecture_with_sliding_layers_keeps_one_sglang_pool(tmp_path) -> None:
    """A Qwen3 config.json whose ``layer_types`` mix sliding and full layers: SGLang does not
    list Qwen3 for an SWA pool, so every layer keeps every token in one pool; vLLM keeps the
    window group apart."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 4,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 12288, "vocab_size": 151936, "max_position_embeddings": 40960,
        "torch_dtype": "bfloat16", "sliding_window": 4096,
        "layer_types": ["sliding_attention", "full_attention"] * 2}))
    from costmodel.hfconfig import load_spec

    spec = load_spec(str(path))
    cell = 4 * 2 * 8 * 128 * 2  # every layer's K and V, bf16
    s = kv_capacity(spec, BUDGET, 1, "sglang", 64)
    assert (s.tokens, s.full_tokens, s.swa_tokens) == (BUDGET // cell // 64 * 64,) * 2 + (0,)
    assert kv_capacity(spec, BUDGET, 1, "vllm", 64).tokens > s.tokens
