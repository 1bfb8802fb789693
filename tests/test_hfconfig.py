"""Model specs from Hugging Face config.json files (costmodel/hfconfig.py) and the catalog
read through the same reader (costmodel/data/models.yaml); issue 53 item 2.

The fixtures under tests/fixtures/hf/ are the models' public config.json files
(huggingface.co/<repo>/blob/main/config.json): Qwen/Qwen3-8B, Qwen/Qwen3-32B,
Qwen/Qwen3-235B-A22B, meta-llama/Llama-3.1-8B, meta-llama/Llama-3.2-1B, Qwen/Qwen1.5-MoE-A2.7B.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodel.errors import ModelConfigError
from costmodel.hfconfig import MAX_BYTES, catalog_entries, load_spec, spec_fields
from costmodel.profile import load_profile
from costmodel.specs import SPECS, ModelSpec, get_spec
from sim.cli.main import cli

HF = Path(__file__).parent / "fixtures" / "hf"
TINY = ["--trace", "synthetic:claude-code?sessions=4", "--max-context", "32k", "--gaps", "tool",
        "--sessions", "2"]


def fixture(name: str) -> dict:
    return json.loads((HF / f"{name}.json").read_text())


def write(tmp_path: Path, raw: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return str(path)


# --- the reader reproduces the catalog's documented numbers --------------------------------
@pytest.mark.parametrize("model,w", [("qwen3-8b", 23_552), ("qwen3-32b", 29_760),
                                     ("qwen3-235b-a22b", 13_568), ("llama-3.1-8b", 26_624)])
def test_reader_reproduces_the_hand_written_specs(model: str, w: int) -> None:
    """Every shape, W, KV bytes and parameter count of the specs written in specs.py; only
    the context differs for Qwen3 (config.json 40,960; the catalog keeps its 131,072/262,144,
    the YaRN-extended lengths its goldens were made with)."""
    spec = load_spec(str(HF / f"{model}.json"))
    mine = get_spec(model)
    assert spec.W == mine.W == w
    assert spec.kv_bytes_per_token == mine.kv_bytes_per_token
    assert spec.total_params == mine.total_params
    assert spec.active_params == mine.active_params
    assert replace(spec, name=model, source=mine.source, max_context=mine.max_context,
                   config_sha256="") == mine


def test_moe_with_shared_experts() -> None:
    """Qwen1.5-MoE-A2.7B: 60 experts of 1408, top 4, and a shared expert of 5632 every token
    runs (the spec's ``ffn``); 14.3B parameters, 2.7B active with embeddings."""
    spec = load_spec(str(HF / "qwen1.5-moe-a2.7b.json"))
    assert (spec.experts, spec.active_experts, spec.expert_ffn, spec.ffn) == (60, 4, 1408, 5632)
    attn = 2048 * 16 * 128 * 2 + 2 * 2048 * 16 * 128
    assert spec.W == (attn + 3 * 2048 * (5632 + 4 * 1408)) / (2 * 16 * 128) == 20_992
    assert 14.2e9 < spec.total_params < 14.4e9
    assert 2.0e9 < spec.active_params + 2 * 151936 * 2048 < 2.8e9


def test_tied_embeddings_count_once() -> None:
    """Llama-3.2-1B ties its LM head to its embeddings: 1.24B parameters, not 1.50B."""
    spec = load_spec(str(HF / "llama-3.2-1b.json"))
    assert spec.tied_embeddings and spec.head_dim == 64
    untied = replace(spec, tied_embeddings=False)
    assert untied.total_params - spec.total_params == 128256 * 2048
    assert 1.23e9 < spec.total_params < 1.24e9


def test_gqa_defaults_and_head_dim() -> None:
    raw = fixture("llama-3.1-8b")
    del raw["num_key_value_heads"]  # absent: multi-head attention
    fields = spec_fields(raw, "x")
    assert fields["kv_heads"] == fields["q_heads"] == 32 and fields["head_dim"] == 4096 // 32
    assert spec_fields({**raw, "head_dim": None}, "x")["head_dim"] == 128


def test_dense_layers_mixed_into_an_moe(tmp_path: Path) -> None:
    """DeepSeek/GLM's first_k_dense_replace and Qwen-MoE's decoder_sparse_step /
    mlp_only_layers: those layers run the dense FFN; W is the mean over layers."""
    glm = {"architectures": ["Glm4MoeForCausalLM"], "hidden_size": 1024,
           "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
           "head_dim": 128, "intermediate_size": 4096, "moe_intermediate_size": 256,
           "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4,
           "first_k_dense_replace": 3, "vocab_size": 1000, "max_position_embeddings": 4096}
    spec = load_spec(write(tmp_path, glm))
    assert (spec.dense_layers, spec.dense_ffn, spec.ffn) == (3, 4096, 256)
    attn = 1024 * 8 * 128 * 2 + 2 * 1024 * 2 * 128
    moe = attn + 3 * 1024 * (256 + 4 * 256)
    dense = attn + 3 * 1024 * 4096
    assert spec.active_params == 5 * moe + 3 * dense
    assert spec.W == (5 * moe + 3 * dense) / 8 / (2 * 8 * 128)
    full_moe = attn + 3 * 1024 * (256 + 16 * 256)
    assert spec.total_params == 5 * full_moe + 3 * dense + 2 * 1000 * 1024
    qwen = {**fixture("qwen1.5-moe-a2.7b"), "decoder_sparse_step": 2, "mlp_only_layers": [1]}
    # sparse iff (i + 1) % 2 == 0 and i not in [1]: layers 3, 5, ..., 23 (11 of 24)
    assert spec_fields(qwen, "x")["dense_layers"] == 13


# --- what is not modelled is refused by name ----------------------------------------------
@pytest.mark.parametrize("field,value", [
    # (the hybrid kinds kvsim models are parsed: tests/test_hybrid_models.py, issue 54)
    ("linear_attn_config", {"kda_layers": [1]}), ("attn_type_list", [0, 1]),
    ("layers_block_type", ["attention", "mamba"]), ("hybrid_override_pattern", "M-M*"),
    ("attn_layer_period", 8), ("attention_chunk_size", 8192), ("mamba_d_state", 128),
    ("ssm_state_size", 128), ("quantization_config", {"quant_method": "awq"}),
    ("quantization_config", "fp8"),
    ("text_config", {"hidden_size": 8}), ("kv_source_layer_ids", [2, 8]),
])
def test_hybrid_markers_refused_by_name(field: str, value: object, tmp_path: Path) -> None:
    path = write(tmp_path, {**fixture("llama-3.1-8b"), field: value})
    with pytest.raises(ModelConfigError) as e:
        load_spec(path)
    assert str(e.value).startswith(f"{path}: field {field!r}: ")
    assert "not modelled" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("quant,fields", [
    ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
     {"weight_dtype": "fp8"}),
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]},
     {"expert_weight_dtype": "mxfp4"}),
])
def test_quantized_weights_are_read(quant: dict, fields: dict) -> None:
    """fp8 (DeepSeek's blocks) stores every linear layer in a byte; MXFP4 (gpt-oss) the
    routed experts in 17/32 of one: the weights the GPUs hold shrink, nothing else moves."""
    raw = fixture("qwen1.5-moe-a2.7b")
    plain = ModelSpec("m", **spec_fields(raw, "x"))
    got = spec_fields({**raw, "quantization_config": quant}, "x")
    assert {k: got[k] for k in fields} == fields
    spec = ModelSpec("m", **got)
    assert spec.groups == plain.groups and spec.total_params == plain.total_params
    assert spec.weight_bytes < plain.weight_bytes == plain.total_params * 2


def test_markers_that_ask_for_nothing_are_read() -> None:
    raw = fixture("llama-3.1-8b")
    base = spec_fields(raw, "x")
    for extra in ({"sliding_window": None}, {"sliding_window": 4096, "use_sliding_window": False},
                  {"sliding_window": 131072},  # covers the whole context
                  {"layer_types": ["full_attention"] * 32}, {"kv_lora_rank": None}):
        assert spec_fields({**raw, **extra}, "x") == base, extra


def test_unmodelled_architecture_refused() -> None:
    raw = {**fixture("llama-3.1-8b"), "architectures": ["GPT2LMHeadModel"]}
    with pytest.raises(ModelConfigError, match=r"field 'architectures': 'GPT2LMHeadModel': not "
                                               r"modelled.*LlamaForCausalLM"):
        spec_fields(raw, "x")


# --- bad input: one line naming the file and the field -------------------------------------
@pytest.mark.parametrize("change,field", [
    ({"hidden_size": "4096"}, "hidden_size"), ({"num_hidden_layers": True}, "num_hidden_layers"),
    ({"num_attention_heads": 0}, "num_attention_heads"), ({"vocab_size": None}, "vocab_size"),
    ({"num_key_value_heads": 5}, "num_key_value_heads"), ({"torch_dtype": "int8"}, "torch_dtype"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings"), ({"architectures": "x"},
                                                              "architectures"),
    ({"layer_types": "full_attention"}, "layer_types"),
    ({"head_dim": None, "hidden_size": 4097}, "head_dim"),
])
def test_bad_fields(change: dict, field: str, tmp_path: Path) -> None:
    path = write(tmp_path, {**fixture("llama-3.1-8b"), **change})
    with pytest.raises(ModelConfigError, match=f"^{path}: field {field!r}: "):
        load_spec(path)


@pytest.mark.parametrize("change,field", [
    ({"num_experts_per_tok": 61}, "num_experts_per_tok"),
    ({"mlp_only_layers": [24]}, "mlp_only_layers"),
    ({"decoder_sparse_step": 25}, "decoder_sparse_step"),
    ({"moe_intermediate_size": -1}, "moe_intermediate_size"),
])
def test_bad_moe_fields(change: dict, field: str) -> None:
    with pytest.raises(ModelConfigError, match=f"^m.json: field {field!r}: "):
        spec_fields({**fixture("qwen1.5-moe-a2.7b"), **change}, "m.json")


def test_bad_files(tmp_path: Path) -> None:
    cases = {"yaml.json": (b"hidden_size: 1\n", "<json>"), "nan.json": (b'{"a": NaN}', "<json>"),
             "bin.json": (b"\xff\xfe", "<json>"), "list.json": (b"[1]", "<root>"),
             "big.json": (b" " * (MAX_BYTES + 1), "<file>"),
             "deep.json": (b"[" * 100_000, "<json>")}
    for name, (data, field) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ModelConfigError, match=f"field {field!r}"):
            load_spec(str(tmp_path / name))
    with pytest.raises(ModelConfigError, match="field '<file>': cannot read"):
        get_spec(str(tmp_path / "missing.json"))
    e = ModelConfigError("a.json", "b", "c")  # a sweep worker sends it back whole
    assert str(pickle.loads(pickle.dumps(e))) == "a.json: field 'b': c"


def test_unknown_name_mentions_config_paths() -> None:
    with pytest.raises(KeyError, match=r"unknown model 'gpt-17'.*config\.json path"):
        get_spec("gpt-17")


# --- the catalog -----------------------------------------------------------------------------
def test_catalog_round_trip() -> None:
    """Every catalog entry is its config.json facts read by the reader, names its HF repo,
    and is registered as read."""
    entries = catalog_entries()
    assert {"qwen3-30b-a3b", "llama-3.2-1b", "llama-2-70b", "mixtral-8x22b", "qwen2.5-72b",
            "mistral-small-24b", "yi-1.5-34b"} <= {n for n, _, _ in entries}
    for name, fields, source in entries:
        spec = SPECS.get(name)
        assert spec.source == source and "/" in source
        assert {k: getattr(spec, k) for k in fields} == fields


@pytest.mark.parametrize("model,w,kv_bytes,params_b", [
    ("qwen3-30b-a3b", 6_912, 98_304, 30.5), ("mixtral-8x7b", 48_128, 131_072, 46.7),
    ("llama-2-7b", 24_704, 524_288, 6.7), ("llama-3.2-1b", 14_848, 32_768, 1.2),
    ("qwen2.5-7b", 32_512, 57_344, 7.6), ("yi-1.5-34b", 38_912, 245_760, 34.4),
])
def test_catalog_numbers(model: str, w: int, kv_bytes: int, params_b: float) -> None:
    spec = get_spec(model)
    assert (spec.W, spec.kv_bytes_per_token) == (w, kv_bytes)
    assert round(spec.total_params / 1e9, 1) == params_b


def test_a_model_without_a_profile_is_priced_by_its_derived_profile() -> None:
    prof = load_profile(None, "mixtral-8x7b")
    assert prof.name == "derived-h100-mixtral-8x7b" and prof.provenance.startswith("derived")
    assert load_profile("derived-h100-mixtral-8x7b", "mixtral-8x7b") == prof
    assert load_profile(None, "qwen3-8b").name == "kernels-h100_sxm-qwen3-8b"  # as before


# --- the commands --------------------------------------------------------------------------
def test_run_with_a_config_json_end_to_end() -> None:
    path = "tests/fixtures/hf/llama-3.2-1b.json"
    res = CliRunner().invoke(cli, ["run", *TINY, "--model", path, "--preset", "sglang",
                                   "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)["runs"][0]["summary"]
    assert summary["model"] == path
    assert summary["model_config_sha256"] == hashlib.sha256(Path(path).read_bytes()).hexdigest()
    assert summary["profile"] == f"derived-h100-{path}"
    assert summary["requests"] > 0


def test_run_with_gpu_sizes_a_config_json() -> None:
    res = CliRunner().invoke(cli, ["run", *TINY, "--model", str(HF / "qwen1.5-moe-a2.7b.json"),
                                   "--gpu", "H100", "--preset", "sglang", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["runs"][0]["summary"]["gpus"] == 1


def test_refused_config_exits_2_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, {**fixture("llama-3.1-8b"), "linear_attn_config": {"kda_layers": [1]}})
    for args in (["run", *TINY, "--model", path],
                 ["microbench", "figure1", "--model", path],
                 ["plan", TINY[1], "--slo", "ttft=2s", "--model", path,
                  "--out", str(tmp_path / "o")]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 2, (args, res.output)
        line = res.stderr.strip().splitlines()[-1]
        assert path in line and "'linear_attn_config'" in line, line


def test_models_lists_the_catalog() -> None:
    res = CliRunner().invoke(cli, ["models", "--json"])
    assert res.exit_code == 0, res.output
    by = {m["name"]: m for m in json.loads(res.stdout)["models"]}
    # kernel tables price the ground-truth MoE; a catalog model without them is derived
    assert by["qwen3-30b-a3b"]["default_profile"] == "kernels-h100_sxm-qwen3-30b-a3b"
    assert by["mixtral-8x7b"]["default_profile"] == "derived-h100-mixtral-8x7b"
    assert by["qwen1.5-moe-a2.7b"]["ffn"] == 5632
    assert by["llama-3.2-1b"]["tied_embeddings"] is True
    assert by["qwen3-8b"]["default_profile"] == "kernels-h100_sxm-qwen3-8b"
