"""Model specs from Hugging Face ``config.json`` files (``--model path/config.json``) and the
shipped catalog ``costmodel/data/models.yaml``, which holds the same facts and is read through
the same reader.

What is read (docs/models.md, Models from config.json): ``architectures``, ``hidden_size``,
``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads`` (absent: MHA),
``head_dim`` (absent or null: hidden / heads), ``intermediate_size``, ``vocab_size``,
``max_position_embeddings``, ``tie_word_embeddings``, ``torch_dtype`` (or ``dtype``); for an
MoE the expert count (``num_local_experts``, ``num_experts`` or ``n_routed_experts``),
``num_experts_per_tok``, ``moe_intermediate_size`` (absent: ``intermediate_size``, as
Mixtral), the shared experts (``shared_expert_intermediate_size``, or ``n_shared_experts`` x
``moe_intermediate_size``) and which layers stay dense (``decoder_sparse_step`` and
``mlp_only_layers`` as Qwen2/3-MoE read them; ``first_k_dense_replace`` and ``moe_layer_freq``
as DeepSeek/GLM read them). A shared expert is an FFN every token runs, so it becomes the
spec's ``ffn`` in MoE layers (``costmodel/specs.py``).

What kvsim does not model is refused by the field that asks for it (:data:`REFUSED`): sliding
windows, linear attention and state-space layers, MLA, sparse (DSA) attention, chunked
attention, quantized weights, multimodal wrappers. ``rope_scaling`` changes no shape and is not
read (``max_position_embeddings`` already states the context).

A config.json is untrusted input: JSON only, at most :data:`MAX_BYTES`, every field checked;
each error is one :class:`~costmodel.errors.ModelConfigError` line naming the file and field.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .errors import ModelConfigError
from .safeyaml import safe_load

if TYPE_CHECKING:
    from .specs import ModelSpec

MAX_BYTES = 1 << 20  # real config.json files are a few KiB

# The decoder-only architectures whose every layer this reader prices (standard GQA/MHA
# attention, a gated FFN or routed experts); anything else is refused by name.
ARCHITECTURES = (
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM",
    "Qwen3ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM",
)

# Fields whose presence (not null) asks for something kvsim does not model, and why.
REFUSED = {
    "kv_lora_rank": "multi-head latent attention (MLA)",
    "index_topk": "sparse attention (DSA indexer)",
    "sliding_window_pattern": "interleaved sliding-window layers",
    "full_attention_interval": "hybrid linear/full attention layers",
    "linear_num_value_heads": "linear attention layers",
    "linear_attn_config": "linear attention layers",
    "attn_type_list": "hybrid linear/full attention layers",
    "layers_block_type": "hybrid attention/state-space layers",
    "hybrid_override_pattern": "hybrid attention/state-space layers",
    "attn_layer_period": "hybrid attention/state-space layers",
    "attention_chunk_size": "chunked attention layers",
    "quantization_config": "quantized weights",
    "text_config": "a multimodal model (give its language model's config.json)",
}
REFUSED_PREFIXES = ("mamba", "ssm_")  # state-space layers (Mamba, Jamba, Nemotron-H, ...)
DTYPES = ("bfloat16", "float16", "float32")  # served in 16 bits (vLLM's dtype=auto)
HINT = "not modelled (docs/models.md, Models from config.json)"


def _refuse(raw: dict[str, Any], where: str) -> None:
    """One line naming the first field that asks for what kvsim does not model."""
    for key, what in REFUSED.items():
        if raw.get(key) is not None:
            raise ModelConfigError(where, key, f"{what}: {HINT}")
    for key in sorted(raw):
        if key.startswith(REFUSED_PREFIXES) and raw[key] is not None:
            raise ModelConfigError(where, key, f"state-space (Mamba) layers: {HINT}")
    kinds = raw.get("layer_types")
    if kinds is not None:
        if not isinstance(kinds, list):
            raise ModelConfigError(where, "layer_types", "must be a list of layer kinds")
        other = sorted({str(k) for k in kinds if k != "full_attention"})
        if other:
            raise ModelConfigError(where, "layer_types",
                                   f"{', '.join(repr(k) for k in other)} layers: {HINT}")
    window = raw.get("sliding_window")
    if window is not None and raw.get("use_sliding_window") is not False:
        ctx = raw.get("max_position_embeddings")
        if not (isinstance(ctx, int) and isinstance(window, int) and window >= ctx):
            raise ModelConfigError(where, "sliding_window",
                                   f"sliding-window attention ({window!r} tokens): {HINT}")


def _int(raw: dict[str, Any], key: str, where: str, default: int | None = None,
         minimum: int = 1) -> int:
    value = raw.get(key)
    if value is None:
        if default is None:
            raise ModelConfigError(where, key, "missing")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ModelConfigError(where, key, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _dense_layer_count(raw: dict[str, Any], layers: int, where: str) -> int:
    """Layers whose FFN stays dense in an MoE, by the model family's own rule."""
    if "first_k_dense_replace" in raw or "moe_layer_freq" in raw:  # DeepSeek, GLM-4.5
        first = _int(raw, "first_k_dense_replace", where, 0, minimum=0)
        freq = _int(raw, "moe_layer_freq", where, 1)
        return sum(1 for i in range(layers) if not (i >= first and i % freq == 0))
    step = _int(raw, "decoder_sparse_step", where, 1)  # Qwen2-MoE, Qwen3-MoE
    only = raw.get("mlp_only_layers") or []
    if not (isinstance(only, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                           and 0 <= i < layers for i in only)):
        raise ModelConfigError(where, "mlp_only_layers",
                               f"must be a list of layer indices in 0..{layers - 1}")
    return sum(1 for i in range(layers) if i in set(only) or (i + 1) % step)


def spec_fields(raw: Any, where: str) -> dict[str, Any]:
    """``ModelSpec`` keyword arguments (all but ``name`` and ``source``) from a config.json
    mapping; ``where`` names it in errors."""
    if not isinstance(raw, dict):
        raise ModelConfigError(where, "<root>", "a config.json must be a JSON object")
    _refuse(raw, where)
    arch = raw.get("architectures")
    if not (isinstance(arch, list) and len(arch) == 1 and isinstance(arch[0], str)):
        raise ModelConfigError(where, "architectures", "must be a list of one architecture "
                               f"name; read: {', '.join(ARCHITECTURES)}")
    if arch[0] not in ARCHITECTURES:
        raise ModelConfigError(where, "architectures", f"{arch[0]!r}: {HINT}; read: "
                               f"{', '.join(ARCHITECTURES)}")
    hidden = _int(raw, "hidden_size", where)
    layers = _int(raw, "num_hidden_layers", where)
    heads = _int(raw, "num_attention_heads", where)
    kv_heads = _int(raw, "num_key_value_heads", where, heads)
    if heads % kv_heads:
        raise ModelConfigError(where, "num_key_value_heads",
                               f"{kv_heads} does not divide num_attention_heads {heads}")
    if raw.get("head_dim") is None and hidden % heads:
        raise ModelConfigError(where, "head_dim", f"missing, and hidden_size {hidden} is not "
                               f"a multiple of num_attention_heads {heads}")
    head_dim = _int(raw, "head_dim", where, hidden // heads)
    dtype = raw.get("torch_dtype", raw.get("dtype", "bfloat16"))
    if dtype not in DTYPES:
        raise ModelConfigError(where, "torch_dtype", f"{dtype!r}: one of {', '.join(DTYPES)}")
    tied = raw.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ModelConfigError(where, "tie_word_embeddings", f"must be true or false, got "
                                                             f"{tied!r}")
    fields: dict[str, Any] = dict(
        layers=layers, hidden=hidden, q_heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        vocab=_int(raw, "vocab_size", where),
        max_context=_int(raw, "max_position_embeddings", where), tied_embeddings=tied)
    count_key = next((k for k in ("num_local_experts", "num_experts", "n_routed_experts")
                      if raw.get(k) is not None), None)
    experts = 0 if count_key is None else _int(raw, count_key, where, minimum=0)
    if experts == 0:
        return {**fields, "ffn": _int(raw, "intermediate_size", where)}
    active = _int(raw, "num_experts_per_tok", where)
    if active > experts:
        raise ModelConfigError(where, "num_experts_per_tok",
                               f"{active} is more than {count_key} {experts}")
    width_key = ("moe_intermediate_size" if raw.get("moe_intermediate_size") is not None
                 else "intermediate_size")
    expert_ffn = _int(raw, width_key, where)
    if raw.get("shared_expert_intermediate_size") is not None:
        shared = _int(raw, "shared_expert_intermediate_size", where, minimum=0)
    else:
        shared = _int(raw, "n_shared_experts", where, 0, minimum=0) * expert_ffn
    dense = _dense_layer_count(raw, layers, where)
    if dense == layers:
        raise ModelConfigError(where, "decoder_sparse_step", "no layer is an MoE layer")
    return {**fields, "ffn": shared, "experts": experts, "active_experts": active,
            "expert_ffn": expert_ffn, "dense_layers": dense,
            "dense_ffn": _int(raw, "intermediate_size", where) if dense else 0}


def read_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """The JSON object of a config.json and the sha256 of its bytes."""
    where = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise ModelConfigError(where, "<file>", f"cannot read: {e.strerror or e}") from None
    if len(data) > MAX_BYTES:
        raise ModelConfigError(where, "<file>", f"larger than {MAX_BYTES} bytes: not a "
                                                "model config.json")

    def no_constant(name: str) -> None:
        raise ValueError(f"{name} is not a JSON number")

    try:
        raw = json.loads(data.decode("utf-8"), parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ModelConfigError(where, "<json>", f"not valid JSON: {e}") from None
    return raw, hashlib.sha256(data).hexdigest()


def load_spec(path: str) -> ModelSpec:
    """The spec of the config.json at ``path``, named ``path`` (the run's ``model``), with the
    sha256 of its bytes (``config_sha256``: a run's summary records which file it priced)."""
    from .specs import ModelSpec

    raw, digest = read_config(path)
    fields = spec_fields(raw, path)
    return ModelSpec(path, **fields, source=path, config_sha256=digest)


def is_config_path(name: str) -> bool:
    """``--model`` names a config.json file rather than a catalog entry."""
    return name.endswith(".json")


def catalog_entries() -> list[tuple[str, dict[str, Any], str]]:
    """(name, ``ModelSpec`` fields, source) of each entry of the shipped
    ``costmodel/data/models.yaml``: the config.json facts of a public model, read by
    :func:`spec_fields`."""
    where = "costmodel/data/models.yaml"
    try:
        doc = safe_load((resources.files("costmodel") / "data" / "models.yaml").read_text())
    except yaml.YAMLError as e:  # pragma: no cover - shipped data
        raise ModelConfigError(where, "<yaml>", f"not valid YAML: {e}") from None
    out = []
    for name, entry in doc["models"].items():
        out.append((name, spec_fields(entry["config"], f"{where}: {name}"), entry["source"]))
    return out
