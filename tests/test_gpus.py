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
    """Issue 53 item 3: every GPU, TP and engine lane priced as itself, or the note says what
    differs; never another GPU's profile."""
    assert profile_for(get_gpu("H200"), "qwen3-32b", 2).exact
    tp4 = profile_for(get_gpu("H200"), "qwen3-32b", 4)
    assert tp4.exact and tp4.name == "kernels-h200_sxm-qwen3-32b-tp4"
    # the engine's own lane: vLLM tables for --engine vllm
    a100 = profile_for(get_gpu("A100"), "qwen3-8b", 1, "vllm")
    assert a100.exact and a100.name == "kernels-a100_sxm-vllm-qwen3-8b"
    assert profile_for(get_gpu("A100"), "qwen3-8b", 1).name == "kernels-a100_sxm-qwen3-8b"
    # qwen3-32b's 64 GB of weights do not fit one L40S: the nearest TP, said
    l40s = profile_for(get_gpu("L40S"), "qwen3-32b", 1)
    assert not l40s.exact and l40s.name == "kernels-l40s-qwen3-32b" and "1 x L40S" in l40s.note
    assert "(2 x L40S)" in l40s.note
    # B60 has vLLM tables only: SGLang is priced with them, and the note says so
    b60 = profile_for(get_gpu("B60"), "qwen3-8b", 1)
    assert not b60.exact and b60.name == "kernels-b60-vllm-qwen3-8b"
    assert "no sglang kernel tables" in b60.note and "vllm kernels" in b60.note
    # no tables at all: the GPU's own datasheet roofline, labelled so
    rtx = profile_for(get_gpu("RTX4090"), "llama-3.1-8b", 1, "vllm")
    assert not rtx.exact and rtx.name == "roofline-rtx4090-llama-3.1-8b"
    assert "datasheet roofline" in rtx.note and "no kernel tables for RTX4090" in rtx.note
    # a model without kernel profiles on H100: its datasheet profile, said
    h100 = profile_for(get_gpu("H100"), "mistral-7b-v0.3", 1)
    assert h100.name == "derived-h100-mistral-7b-v0.3" and "datasheet roofline" in h100.note
    for g in load_gpus().values():  # no GPU is priced with another GPU's tables
        name = profile_for(g, "qwen3-8b", 1).name
        assert (g.profile is not None and f"kernels-{g.profile}-" in name) or \
            name in (f"roofline-{g.name.lower()}-qwen3-8b", "derived-h100-qwen3-8b"), g.name


def test_catalog_is_checked(tmp_path) -> None:
    assert {"H100", "H200", "B200"} <= set(load_gpus())
    bad = tmp_path / "gpus.yaml"
    bad.write_text("gpus:\n  X1:\n    memory_mib: -5\n    hbm_tb_s: 1\n    bf16_tflops: 1\n"
                   "    nvlink_gb_s: 0\n    price_usd_h: 1\n")
    with pytest.raises(ProfileError, match=r"X1\.memory_mib"):
        load_gpus(bad)
    with pytest.raises(KeyError, match="unknown GPU 'Z9'; known: "):
        get_gpu("Z9")


def test_a_tp_the_engines_refuse_sizes_nothing() -> None:
    # issue 51 D5: vLLM (config/model.py) and SGLang (models/qwen3.py) need attention heads
    # % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0); 8 // 3 = 2 heads per rank
    # stored 6 of qwen3-32b's 8 KV heads
    from costmodel.gpus import tp_refusal

    spec = get_spec("qwen3-32b")  # 64 attention, 8 KV heads
    assert [t for t in range(1, 17) if tp_refusal(spec, t) is None] == [1, 2, 4, 8, 16]
    with pytest.raises(ValueError, match=r"TP 3 does not fit qwen3-32b.*64 attention and 8 KV"):
        kv_cache_tokens(spec, get_gpu("H100"), tp=3)
    # TP 16 > 8 KV heads: each rank holds one replicated head
    assert kv_cache_tokens(spec, get_gpu("H100"), tp=16).cell_bytes == 2 * 1 * 128 * 64 * 2


def test_sglang_mem_fraction_as_sglang_0_5_23_derives_it() -> None:
    # issue 51 D7: sglang/srt/arg_groups/memory_hook.py handle_gpu_memory_settings, in MiB:
    # reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024 + graphs, graphs = decode max_bs
    # (256 on an 80 GB GPU below TP 4) * 2 + 8 per prefill graph size up to the chunk (58 up to
    # 8192: cuda_graph_hook.py); at least 10 GiB on a GPU above 60 GiB
    from costmodel.gpus import sglang_mem_fraction

    h100 = get_gpu("H100").memory_mib  # 81,559
    reserved = 512 + 8192 * 1.5 + 1 / 8 * 1024 + (256 * 2 + 58 * 8)
    assert sglang_mem_fraction(h100, 1, 8192) == round((h100 - reserved) / h100, 3) == 0.83
    assert sglang_mem_fraction(h100, 4, 8192) == round(
        (h100 - (512 + 12288 + 512 + 512 * 2 + 58 * 8)) / h100, 3)  # TP 4: max_bs 512
    # a 2,048-token chunk reserves 4,560 MiB: the 10 GiB floor binds
    assert sglang_mem_fraction(h100, 1, 2048) == round((h100 - 10240) / h100, 3) == 0.874
    # no floor below 60 GiB (L40S, 46,068 MiB: decode max_bs 32, 50 prefill sizes to 4,096)
    assert sglang_mem_fraction(46068, 1, 4096) == round(
        (46068 - (512 + 6144 + 128 + 64 + 50 * 8)) / 46068, 3)
    # --max-running-requests caps the decode graphs
    assert sglang_mem_fraction(h100, 1, 8192, max_running=16) == round(
        (h100 - (512 + 12288 + 128 + 32 + 58 * 8)) / h100, 3)
    # qwen3-8b on one H100: 0.9 held 410,880 tokens; SGLang's 0.83 holds 370,240
    spec = get_spec("qwen3-8b")
    assert kv_cache_tokens(spec, get_gpu("H100"), 1, 0.9).tokens == 410_880
    assert kv_cache_tokens(spec, get_gpu("H100"), 1, 0.83).tokens == 370_240 == (
        int(h100 * 2**20 * 0.83) - spec.total_params * 2) // (2 * 8 * 128 * 36 * 2) // 64 * 64


def test_vllm_reserve_estimates() -> None:
    # the activation peak: the larger of the forward's MLP and residual live set
    # (8192 x (3 x 12288 + 2 x 4096) x 2 B) and the sampler's logits and probabilities
    # (1024 x 151,936 x 2 x 4 B); graphs: min(2 x 1024, 512) tokens x 2 MiB
    from costmodel.gpus import vllm_activation_peak_bytes, vllm_graph_bytes

    spec = get_spec("qwen3-8b")
    assert vllm_activation_peak_bytes(spec, 1, 8192, 1024) == max(
        8192 * (3 * 12288 + 2 * 4096) * 2, 1024 * 151936 * 8) == 1024 * 151936 * 8
    assert vllm_activation_peak_bytes(spec, 1, 65536, 1) == 65536 * (3 * 12288 + 2 * 4096) * 2
    assert vllm_graph_bytes(1024, get_gpu("H100")) == 512 * 2 * 2**20
    assert vllm_graph_bytes(8, get_gpu("H100")) == 16 * 2 * 2**20
    assert vllm_graph_bytes(1024, get_gpu("B200")) == 1024 * 2 * 2**20


def test_copied_kv_bytes_count_every_ranks_share_by_hand() -> None:
    """A copy to host memory or a pool moves each rank's share: a GQA model's KV heads split
    over the ranks (replicated ones counted on every rank), an MLA latent whole on each."""
    from costmodel.gpus import kv_bytes_through

    qwen8, llama70 = get_spec("qwen3-8b"), get_spec("llama-3.1-70b")
    qwen235, deepseek = get_spec("qwen3-235b-a22b"), get_spec("deepseek-v3")
    assert kv_bytes_through(qwen8, 1, 1) == qwen8.kv_bytes_per_token == 147_456
    # 8 KV heads over 8 ranks, one link each: the whole token, as on one GPU
    assert kv_bytes_through(llama70, 8, 8) == llama70.kv_bytes_per_token == 327_680
    # 4 KV heads over 8 ranks: each rank keeps one (every head twice)
    assert kv_bytes_through(qwen235, 8, 8) == 2 * qwen235.kv_bytes_per_token
    # MLA: 61 layers x (512 + 64) x 2 bytes on every rank
    assert deepseek.kv_bytes_per_token == 61 * 576 * 2 == 70_272
    assert kv_bytes_through(deepseek, 8, 8) == 8 * 70_272
    # ranks beyond the links take turns: 8 ranks on one pool link copy 8 latents one by one
    assert kv_bytes_through(deepseek, 8, 1) == 8 * 70_272
    assert kv_bytes_through(llama70, 2, 1) == llama70.kv_bytes_per_token


def test_copied_kv_bytes_keep_every_groups_bytes() -> None:
    """A copied token carries every group's bytes: DeepSeek-V4's compressed entries (one per
    4 or 128 tokens, spread over the tokens) beside its sliding layers' K/V."""
    from costmodel.gpus import kv_bytes_through

    v4 = get_spec("deepseek-v4-flash")
    compressed = sum(g.kv_bytes_per_token for g in v4.groups if g.kind == "compressed")
    assert compressed > 0
    assert kv_bytes_through(v4, 1, 1) == v4.kv_bytes_per_token


def _brute_decode_read(spec, context: int) -> int:
    """What one decode step of a sequence of ``context`` tokens reads on one GPU, group by
    group from what its attention sees: every held token of a full, MLA or sliding group
    (a window group holds exactly what it reads), the top-k latent entries and every indexer
    key of a DSA group, the picked entries and every indexer key of a compressed group with an
    indexer, a linear group's state read and written."""
    total = 0
    for g in spec.groups:
        if g.kind == "linear":
            total += 2 * g.state_bytes_per_request
        elif g.kind == "dsa":
            latent = g.kv_bytes_per_token - g.indexer_bytes_per_token
            total += min(context, spec.index_topk) * latent + context * g.indexer_bytes_per_token
        elif g.kind == "compressed" and g.indexer_layers:
            r = g.compress_ratio
            entry = (g.kv_bytes_per_token - g.indexer_bytes_per_token) * r
            total += min(context // r, spec.index_topk) * entry \
                + context // r * g.indexer_bytes_per_token * r
        else:
            total += g.kv_bytes(context) - g.state_bytes_per_request
    return total


@pytest.mark.parametrize("model", ["qwen3-32b", "gpt-oss-120b", "gemma-4-31b", "deepseek-v3",
                                   "deepseek-v3.2", "glm-5.2", "deepseek-v4-flash",
                                   "qwen3-next-80b-a3b", "qwen3.5-27b"])
def test_decode_reads_what_each_groups_attention_reads(model: str) -> None:
    """Past every cap (window, top-k), a decode step's priced read equals the group-by-group
    count at any context; a compressed group's entries are counted whole, so the closed form
    (entries spread over their tokens) is within one entry per compressed group."""
    from costmodel.gpus import decode_read_bytes

    spec = get_spec(model)
    per_token, per_seq = decode_read_bytes(spec, 1, 1)
    slack = sum(g.kv_bytes_per_token * g.compress_ratio for g in spec.groups
                if g.kind == "compressed")
    cap = max([g.window or 0 for g in spec.groups] + [spec.index_topk * 128])
    for context in (cap, cap + 1, 3 * cap + 77, 100_000 + cap, 1_000_003):
        assert abs(per_token * context + per_seq - _brute_decode_read(spec, context)) <= slack, \
            context


def test_decode_reads_under_tp_by_hand() -> None:
    """Each rank reads its share at its own bandwidth: qwen3-235b's 4 KV heads on 8 ranks are
    read twice over; an MLA latent whole on every rank; DSA reads top-k latents per sequence."""
    from costmodel.derive import H100_HBM_BYTES_PER_S, derive
    from costmodel.gpus import decode_read_bytes

    qwen235, dsv32 = get_spec("qwen3-235b-a22b"), get_spec("deepseek-v3.2")
    assert decode_read_bytes(qwen235, 8, 8) == (2 * qwen235.kv_bytes_per_token, 0)
    assert decode_read_bytes(get_spec("deepseek-v3"), 8, 8) == (8 * 70_272, 0)
    # 61 layers: latent (512 + 64) x 2 bytes, top-2048 of them; indexer keys every token
    assert decode_read_bytes(dsv32, 1, 1) == (dsv32.groups[0].indexer_bytes_per_token,
                                              2048 * 61 * 576 * 2)
    # the derived H100 profile reads at one GPU's bandwidth (x efficiencies) per rank
    prof = derive("qwen3-235b-a22b")
    hbm = 8 * H100_HBM_BYTES_PER_S * 0.80 * 0.85
    assert prof.decode.per_context_token_s == pytest.approx(2 * qwen235.kv_bytes_per_token / hbm)


def test_a_tiered_mla_run_copies_the_latent_of_every_rank() -> None:
    """deepseek-v3 on 8 x B200 with a CPU tier: every rank loads its own copy of a block's
    latent, so the bytes moved (and priced over the profile's 8 PCIe links) are 8 latents a
    token, not one."""
    import json

    from click.testing import CliRunner

    from sim.cli.main import cli

    res = CliRunner().invoke(cli, [
        "run", "--trace", "synthetic:claude-code?sessions=6", "--gaps", "tool",
        "--sessions", "6", "--model", "deepseek-v3", "--gpu", "B200", "--tp", "8",
        "--gpu-cache", "2GiB", "--cpu-cache", "200k", "--preset", "sglang", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)["runs"][0]["summary"]
    assert summary["loaded_cpu_tokens"] > 0
    assert summary["bytes_h2d"] == summary["loaded_cpu_tokens"] * 8 * 70_272


def test_a_roofline_decode_reads_each_ranks_share() -> None:
    """The datasheet roofline's decode KV read: a GQA model's heads split over the ranks
    (the whole token over the GPUs' summed bandwidth), an MLA latent read whole by each of
    the 8 ranks (8 x its bytes over the sum: one latent at one GPU's bandwidth)."""
    from costmodel.derive import EFF_HBM, roofline

    hbm1 = get_gpu("H200").hbm_tb_s * 1e12 * EFF_HBM
    llama = roofline("H200", "llama-3.1-70b", 8)
    assert llama.decode.per_context_token_s == pytest.approx(327_680 / (8 * hbm1), rel=1e-12)
    deepseek = roofline("H200", "deepseek-v3", 8)
    assert deepseek.decode.per_context_token_s == pytest.approx(70_272 / hbm1, rel=1e-12)
    one = roofline("H200", "deepseek-v3", 1)
    assert one.decode.per_context_token_s == pytest.approx(70_272 / hbm1, rel=1e-12)


def test_quantized_weights_by_hand() -> None:
    """Weights as the checkpoint stores them: gpt-oss-120b's routed experts in MXFP4 (4 bits
    and an 8-bit scale per 32: 17/32 byte a weight), the rest in bf16; DeepSeek-V3's linear
    layers in fp8, its embeddings and head in bf16. On one H100 gpt-oss-120b leaves room for a
    KV cache, as it is served; on 8 x H200 DeepSeek-V3 too."""
    oss, ds = get_spec("gpt-oss-120b"), get_spec("deepseek-v3")
    experts = 36 * 128 * 3 * 2880 * 2880
    embeddings = 2 * 201088 * 2880
    assert oss.weight_bytes == -(-experts * 17 // 32) + (oss.total_params - experts) * 2
    assert 64e9 < oss.weight_bytes < 66e9  # the published checkpoint: about 65 GB
    active = 36 * 4 * 3 * 2880 * 2880
    assert oss.weight_read_bytes() == -(-active * 17 // 32) + (oss.active_params - active) * 2
    assert oss.weight_read_bytes(routed=False) == (oss.active_params - active) * 2
    ds_embeddings = 2 * 129280 * 7168
    assert ds.weight_bytes == ds.total_params - ds_embeddings + 2 * ds_embeddings
    assert ds.weight_read_bytes() == ds.active_params
    assert embeddings and kv_cache_tokens(oss, get_gpu("H100"), tp=1, mem_fraction=0.9).tokens > 0
    assert kv_cache_tokens(ds, get_gpu("H200"), tp=8, mem_fraction=0.9).tokens > 0
    qwen = get_spec("qwen3-32b")  # unquantized: dtype_bytes, as ever
    assert qwen.weight_bytes == qwen.total_params * 2
    assert qwen.weight_read_bytes() == qwen.active_params * 2
