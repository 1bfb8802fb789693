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

Hybrid attention (docs/hybrid.md): each layer's kind is read from ``layer_types``
(``full_attention``, ``sliding_attention``, ``chunked_attention``, ``linear_attention``), or
from ``full_attention_interval`` (Qwen3-Next: every n-th layer full, the others Gated
DeltaNet), ``sliding_window_pattern`` (Gemma 3: every n-th layer global, the others sliding) or
a bare ``sliding_window`` (every layer); windows from ``sliding_window`` and
``attention_chunk_size``; the Gated DeltaNet shapes from ``linear_*``; ``kv_lora_rank`` makes
the attention layers MLA (``q_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
``v_head_dim``) and ``index_topk`` makes them DSA (``index_n_heads``, ``index_head_dim``;
layers sharing an earlier indexer's top-k from ``index_topk_freq``, ``index_skip_topk_offset``,
``index_topk_pattern`` and ``indexer_types``). ``compress_ratios`` (DeepSeek-V4; or
``compress_rates`` by ``layer_types``, as transformers writes it) makes each layer a sliding
window of ``sliding_window`` tokens (ratio 0) or compressed with that ratio beside its window
(one entry of ``head_dim`` per KV head serving as K and V; ratio-4 layers with an indexer:
``index_topk``, ``index_n_heads``, ``index_head_dim``; ``q_lora_rank``, ``o_lora_rank``,
``o_groups``); entries past ``num_hidden_layers`` are the MTP layers' and are not read.

Gemma 4's full-attention layers have their own KV heads and head dim
(``num_global_key_value_heads``, ``global_head_dim``); its MoE block (``enable_moe_block``,
``num_experts``, ``top_k_experts``, ``moe_intermediate_size``) runs beside the dense MLP
(``intermediate_size``), which is priced as a shared expert.

What kvsim does not model is refused by the field that asks for it (:data:`REFUSED`,
:data:`REFUSED_VALUES`): state-space (Mamba) layers, other linear attentions (Kimi's KDA,
MiniMax's lightning), DeepSeek-V4.1's KV and indexer shared across layers and its Engram
and vision layers, sliding layers with an attention
shape of their own (MiMo-V2.5's ``swa_*``), KV-shared layers and per-layer embeddings (Gemma 4
E models), quantized weights, multimodal wrappers. ``rope_scaling``
changes no shape and is not read (``max_position_embeddings`` already states the context).

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
    "GptOssForCausalLM", "Gemma3ForCausalLM", "Qwen3NextForCausalLM", "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM",
    "GlmMoeDsaForCausalLM", "Gemma4ForCausalLM", "DeepseekV4ForCausalLM",
)

# Fields whose presence (not null) asks for something kvsim does not model, and why.
REFUSED = {
    "linear_attn_config": "Kimi Delta Attention (KDA) layers",
    "attn_type_list": "MiniMax lightning (linear) attention layers",
    "kv_source_layer_ids": "compressed KV shared across layers (DeepSeek-V4.1)",
    "index_source_layer_ids": "indexer keys shared across layers (DeepSeek-V4.1)",
    "candidate_source_layer_id": "candidate blocks shared across layers (DeepSeek-V4.1)",
    "engram_layer_ids": "Engram memory layers (DeepSeek-V4.1)",
    "layers_block_type": "hybrid attention/state-space layers",
    "hybrid_override_pattern": "hybrid attention/state-space layers",
    "attn_layer_period": "hybrid attention/state-space layers",
    "text_config": "a multimodal model (give its language model's config.json)",
}
REFUSED_PREFIXES = ("mamba", "ssm_")  # state-space layers (Mamba, Jamba, Nemotron-H, ...)
# Fields refused when set to other than their plain value (0, false), and why
REFUSED_VALUES = {
    "vision_n_layers": "vision layers (give the language model's config.json)",
    "num_kv_shared_layers": "layers reading an earlier layer's KV (Gemma 4 KV sharing)",
    "hidden_size_per_layer_input": "per-layer input embeddings (Gemma 4 E models)",
}
# sliding layers with their own attention shape (MiMo-V2.5: swa_num_key_value_heads,
# swa_head_dim, swa_v_head_dim)
REFUSED_SWA_PREFIX = "swa_"
DTYPES = ("bfloat16", "float16", "float32")  # served in 16 bits (vLLM's dtype=auto)
# quantization_config.quant_method -> the weights it stores quantized (ModelSpec fields):
# fp8 every linear layer, experts too, in 128 x 128 blocks (DeepSeek-V3/V3.2, Kimi-K2); mxfp4
# the routed experts, attention, router, embeddings and head left in bf16 (gpt-oss)
QUANT_METHODS = {"fp8": {"weight_dtype": "fp8"}, "mxfp4": {"expert_weight_dtype": "mxfp4"}}
HINT = "not modelled (docs/models.md, Models from config.json)"


def _refuse(raw: dict[str, Any], where: str) -> None:
    """One line naming the first field that asks for what kvsim does not model."""
    for key, what in REFUSED.items():
        if raw.get(key) is not None:
            raise ModelConfigError(where, key, f"{what}: {HINT}")
    for key, what in REFUSED_VALUES.items():
        if raw.get(key) not in (None, 0, False):
            raise ModelConfigError(where, key, f"{what}: {HINT}")
    for key in sorted(raw):
        if key.startswith(REFUSED_PREFIXES) and raw[key] is not None:
            raise ModelConfigError(where, key, f"state-space (Mamba) layers: {HINT}")
        if key.startswith(REFUSED_SWA_PREFIX) and raw[key] is not None:
            raise ModelConfigError(where, key, f"sliding layers with their own attention "
                                   f"shape: {HINT}")
    if raw.get("use_sliding_window") is True and raw.get("max_window_layers") is not None:
        raise ModelConfigError(where, "max_window_layers",
                               f"sliding windows on some layers by max_window_layers: {HINT}")


def _weight_fields(raw: dict[str, Any], where: str) -> dict[str, str]:
    """The stored weights' dtypes from ``quantization_config`` (``QUANT_METHODS``); other
    methods refused by name."""
    quant = raw.get("quantization_config")
    if quant is None:
        return {}
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method not in QUANT_METHODS:
        raise ModelConfigError(where, "quantization_config", f"quant_method {method!r}: "
                               f"weights quantized other than {', '.join(QUANT_METHODS)}: "
                               f"{HINT}")
    return dict(QUANT_METHODS[method])


# config.json layer_types values -> the kind of that layer ("full_attention" is the model's
# attention: full, MLA or DSA)
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding",
               "chunked_attention": "chunked", "linear_attention": "linear"}
_LINEAR = {"linear_num_key_heads": "linear_key_heads", "linear_key_head_dim": "linear_key_dim",
           "linear_num_value_heads": "linear_value_heads",
           "linear_value_head_dim": "linear_value_dim",
           "linear_conv_kernel_dim": "linear_conv_kernel"}


def _every(raw: dict[str, Any], key: str, layers: int, other: str, where: str) -> list[str]:
    """Layer types of a model whose every ``raw[key]``-th layer attends in full and whose
    other layers are ``other`` (Qwen3-Next's full_attention_interval, Gemma 3's
    sliding_window_pattern: layer ``i`` is full iff ``(i + 1) % n == 0``)."""
    n = _int(raw, key, where)
    return ["full_attention" if (i + 1) % n == 0 else other for i in range(layers)]


def _layer_types(raw: dict[str, Any], layers: int, where: str) -> list[str] | None:
    """Each layer's config.json type, or None when every layer attends in full."""
    types = raw.get("layer_types")
    if types is not None:
        if not isinstance(types, list):
            raise ModelConfigError(where, "layer_types", "must be a list of layer kinds")
        if len(types) != layers:
            raise ModelConfigError(where, "layer_types", f"has {len(types)} entries, "
                                   f"num_hidden_layers is {layers}")
        unknown = sorted({repr(t) for t in types if t not in LAYER_TYPES})
        if unknown:
            raise ModelConfigError(where, "layer_types", f"unknown layer kind "
                                   f"{', '.join(unknown)}; read: {', '.join(LAYER_TYPES)}")
    for key, other in (("full_attention_interval", "linear_attention"),
                       ("sliding_window_pattern", "sliding_attention")):
        if raw.get(key) is not None:
            pattern = _every(raw, key, layers, other, where)
            if types is not None and types != pattern:
                raise ModelConfigError(where, key, "disagrees with layer_types")
            types = pattern
    window = raw.get("sliding_window")
    ctx = raw.get("max_position_embeddings")
    windowed = (window is not None and raw.get("use_sliding_window") is not False
                and not (isinstance(ctx, int) and isinstance(window, int) and window >= ctx))
    if types is not None and windowed and "sliding_attention" not in types:
        raise ModelConfigError(where, "sliding_window", f"{window!r} tokens, but no layer is "
                               "sliding_attention (layer_types)")
    if types is None:
        if windowed:
            types = ["sliding_attention"] * layers  # one window on every layer
        if raw.get("attention_chunk_size") is not None:
            raise ModelConfigError(where, "attention_chunk_size", "chunked attention without "
                                   "layer_types naming the chunked layers: " + HINT)
    if types is not None and all(t == "full_attention" for t in types):
        return None
    return types


SHARED_INDEXER = ("index_topk_freq", "index_skip_topk_offset", "index_topk_pattern",
                  "indexer_types")


def _shared_indexer_layers(raw: dict[str, Any], layers: int, where: str) -> tuple[int, ...]:
    """The DSA layers that reuse an earlier layer's top-k and build no indexer (IndexCache),
    by the rule vLLM (``deepseek_v2.py``) and SGLang (``configs/model_config.py``) apply:
    ``index_topk_pattern`` (``S``: shared) if given, else layer ``i`` is shared iff
    ``max(i - index_skip_topk_offset + 1, 0) % index_topk_freq != 0`` (offset 2 when absent);
    ``indexer_types`` (``full``/``shared``), where given, must say the same."""
    pattern = raw.get("index_topk_pattern")
    if pattern is not None:
        if not (isinstance(pattern, str) and set(pattern) <= {"S", "F"}):
            raise ModelConfigError(where, "index_topk_pattern", "must be a string of S "
                                   "(shared) and F (full) per layer")
        shared = [i < len(pattern) and pattern[i] == "S" for i in range(layers)]
    else:
        freq = _int(raw, "index_topk_freq", where, 1)
        offset = _int(raw, "index_skip_topk_offset", where, 2)
        shared = [max(i - offset + 1, 0) % freq != 0 for i in range(layers)]
    if shared and shared[0]:
        raise ModelConfigError(where, "index_topk_pattern" if pattern is not None
                               else "index_skip_topk_offset", "layer 0 would reuse a top-k "
                               "no earlier layer computed")
    types = raw.get("indexer_types")
    if types is not None:
        if not (isinstance(types, list) and len(types) == layers
                and all(t in ("full", "shared") for t in types)):
            raise ModelConfigError(where, "indexer_types", f"must list full or shared for "
                                   f"each of the {layers} layers")
        if [t == "shared" for t in types] != shared:
            raise ModelConfigError(where, "indexer_types", "disagrees with index_topk_freq "
                                   "and index_skip_topk_offset (or index_topk_pattern)")
    return tuple(i for i, s in enumerate(shared) if s)


# DeepSeek-V4's indexer keys are kept in MXFP4 (its reference inference code and the public
# kvcache-simulator catalog; vLLM's --attention-config indexer_kv_dtype=mxfp4, fp8 its default)
COMPRESSED_INDEXER_KV_DTYPE = "fp4"
# fields of other layer layouts that cannot stand beside compress_ratios
NOT_WITH_COMPRESSED = ("kv_lora_rank", "full_attention_interval", "sliding_window_pattern",
                       "attention_chunk_size", "num_global_key_value_heads", *SHARED_INDEXER)


def _compress_ratios(raw: dict[str, Any], layers: int, where: str) -> list[int]:
    """Each layer's compress ratio: ``compress_ratios`` (the MTP layers' entries after the
    ``num_hidden_layers`` dropped), or ``compress_rates`` looked up by ``layer_types`` (0
    where a type has none), as vLLM's ``get_compress_ratios`` reads either."""
    mtp = _int(raw, "num_nextn_predict_layers", where, 0, minimum=0)
    ratios = raw.get("compress_ratios")
    if ratios is None:
        rates, types = raw.get("compress_rates"), raw.get("layer_types")
        if not (isinstance(rates, dict) and all(isinstance(k, str) for k in rates)):
            raise ModelConfigError(where, "compress_rates", "must map layer types to ratios")
        if not (isinstance(types, list) and len(types) == layers
                and all(isinstance(t, str) for t in types)):
            raise ModelConfigError(where, "layer_types", f"must name each of the {layers} "
                                   "layers' type (compress_rates reads it)")
        ratios, key = [rates.get(t, 0) for t in types], "compress_rates"
    else:
        key = "compress_ratios"
        if not (isinstance(ratios, list) and len(ratios) in (layers, layers + mtp)):
            raise ModelConfigError(where, key, f"must list a ratio for each of the {layers} "
                                   f"layers (and the {mtp} num_nextn_predict_layers)")
        ratios = ratios[:layers]
    for r in ratios:
        if isinstance(r, bool) or not isinstance(r, int) or r < 0 or r == 1:
            raise ModelConfigError(where, key, f"ratios must be 0 (sliding window only) or "
                                   f"integers >= 2, got {r!r}")
    return ratios


def _compressed_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """``ModelSpec`` fields of a compressed-attention model (module docstring)."""
    stray = next((k for k in NOT_WITH_COMPRESSED if raw.get(k) is not None), None)
    if stray is not None:
        raise ModelConfigError(where, stray, f"beside compressed attention (compress_ratios): "
                               f"{HINT}")
    ratios = _compress_ratios(raw, layers, where)
    if raw.get("head_dim") is None:
        raise ModelConfigError(where, "head_dim", "missing (the compressed KV entry's width)")
    window = _int(raw, "sliding_window", where)
    out: dict[str, Any] = dict(
        layer_kinds=tuple("compressed" if r else "sliding" for r in ratios),
        layer_windows=(window,) * layers, compress_ratios=tuple(ratios),
        q_lora_rank=_int(raw, "q_lora_rank", where, 0, minimum=0),
        o_lora_rank=_int(raw, "o_lora_rank", where, 0, minimum=0),
        o_groups=_int(raw, "o_groups", where, 1))
    heads = raw.get("num_attention_heads")
    if isinstance(heads, int) and heads % out["o_groups"]:
        raise ModelConfigError(where, "o_groups", f"{out['o_groups']} does not divide "
                               f"num_attention_heads {heads}")
    if 4 in ratios:  # SPARSE_COMPRESS_RATIO: those layers have an indexer
        out.update(index_topk=_int(raw, "index_topk", where),
                   index_n_heads=_int(raw, "index_n_heads", where),
                   index_head_dim=_int(raw, "index_head_dim", where),
                   indexer_kv_dtype=COMPRESSED_INDEXER_KV_DTYPE)
    head_dim, kv_heads = raw["head_dim"], raw.get("num_key_value_heads", heads)
    key_bytes = out.get("index_head_dim", 2) // 2
    if isinstance(head_dim, int) and isinstance(kv_heads, int):
        bad = next((r for r in ratios if r and (kv_heads * head_dim // 2 % r
                                                 or (r == 4 and key_bytes % r))), None)
        if bad is not None:
            raise ModelConfigError(where, "compress_ratios", f"ratio {bad} does not divide a KV "
                                   "entry's (or an indexer key's) fp4 bytes: " + HINT)
    return out


def _attention_fields(raw: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """``ModelSpec`` fields of the layer kinds (module docstring): ``layer_kinds``,
    ``layer_windows`` and the shapes of the MLA, DSA, compressed and linear-attention
    layers."""
    if raw.get("compress_ratios") is not None or raw.get("compress_rates") is not None:
        return _compressed_fields(raw, layers, where)
    out: dict[str, Any] = {}
    full = "full"
    if raw.get("kv_lora_rank") is not None:
        full = "mla"
        out.update(kv_lora_rank=_int(raw, "kv_lora_rank", where),
                   q_lora_rank=_int(raw, "q_lora_rank", where, 0, minimum=0),
                   qk_nope_head_dim=_int(raw, "qk_nope_head_dim", where),
                   qk_rope_head_dim=_int(raw, "qk_rope_head_dim", where),
                   v_head_dim=_int(raw, "v_head_dim", where))
        if raw.get("index_topk") is not None:
            full = "dsa"
            out.update(index_topk=_int(raw, "index_topk", where),
                       index_n_heads=_int(raw, "index_n_heads", where),
                       index_head_dim=_int(raw, "index_head_dim", where))
            shared = _shared_indexer_layers(raw, layers, where)
            if shared:
                out["shared_indexer_layers"] = shared
    elif raw.get("index_topk") is not None:
        raise ModelConfigError(where, "index_topk", "a DSA indexer needs MLA layers "
                               "(kv_lora_rank)")
    if full != "dsa":
        stray = next((k for k in SHARED_INDEXER if raw.get(k) is not None), None)
        if stray is not None:
            raise ModelConfigError(where, stray, "a shared indexer needs DSA layers "
                                   "(index_topk)")
    types = _layer_types(raw, layers, where)
    if types is None or "linear_attention" not in types:
        stray = next((k for k in _LINEAR if raw.get(k) is not None), None)
        if stray is not None:
            raise ModelConfigError(where, stray, "linear-attention shapes, but no layer is "
                                   "linear_attention (layer_types, full_attention_interval)")
    if types is None:
        if full != "full":
            out["layer_kinds"] = (full,) * layers
        _full_shape(raw, [], where)  # refuses a full-attention shape with no sliding beside
        return out
    kinds = [full if t == "full_attention" else LAYER_TYPES[t] for t in types]
    if full != "full" and ("sliding" in kinds or "chunked" in kinds):
        raise ModelConfigError(where, "kv_lora_rank", f"windowed MLA layers: {HINT}")
    windows: list[int | None] = [None] * layers
    for kind, key in (("sliding", "sliding_window"), ("chunked", "attention_chunk_size")):
        if kind in kinds:
            if raw.get("use_sliding_window") is False and kind == "sliding":
                raise ModelConfigError(where, "use_sliding_window",
                                       "is false, but layer_types has sliding_attention layers")
            w = _int(raw, key, where)
            windows = [w if k == kind else v for k, v in zip(kinds, windows, strict=True)]
    if "linear" in kinds:
        out.update({f: _int(raw, key, where) for key, f in _LINEAR.items()})
        arch = raw.get("architectures") or [""]
        gate = raw.get("attn_output_gate", arch[0] == "Qwen3NextForCausalLM")
        if not isinstance(gate, bool):
            raise ModelConfigError(where, "attn_output_gate", f"must be true or false, got "
                                   f"{gate!r}")
        out["attn_output_gate"] = gate
    if not set(kinds) <= {"full", "sliding"}:  # full and sliding layers: the windows say it
        out["layer_kinds"] = tuple(kinds)
    out.update(_full_shape(raw, kinds, where))
    if any(w is not None for w in windows):
        out["layer_windows"] = tuple(windows)
    return out


def _full_shape(raw: dict[str, Any], kinds: list[str], where: str) -> dict[str, int]:
    """Full-attention layers' own KV heads and head dim beside sliding layers (Gemma 4:
    ``num_global_key_value_heads``, ``global_head_dim``); their cache keeps K and V even where
    ``attention_k_eq_v`` makes V a copy of K (vLLM ``gemma4.py`` loads K into both)."""
    keys = {"num_global_key_value_heads": "full_kv_heads", "global_head_dim": "full_head_dim"}
    given = [k for k in keys if raw.get(k) is not None]
    if not given:
        return {}
    if not ("full" in kinds and "sliding" in kinds):
        raise ModelConfigError(where, given[0], "a full-attention shape of its own, but the "
                               "layers are not full beside sliding (layer_types)")
    out = {f: _int(raw, k, where) for k, f in keys.items() if raw.get(k) is not None}
    heads = raw.get("num_attention_heads")
    if isinstance(heads, int) and out.get("full_kv_heads") and heads % out["full_kv_heads"]:
        raise ModelConfigError(where, "num_global_key_value_heads", f"{out['full_kv_heads']} "
                               f"does not divide num_attention_heads {heads}")
    return out


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
        max_context=_int(raw, "max_position_embeddings", where), tied_embeddings=tied,
        architecture=arch[0], **_attention_fields(raw, layers, where),
        **_weight_fields(raw, where))
    count_key = next((k for k in ("num_local_experts", "num_experts", "n_routed_experts")
                      if raw.get(k) is not None), None)
    experts = 0 if count_key is None else _int(raw, count_key, where, minimum=0)
    block = raw.get("enable_moe_block")  # Gemma 4: experts beside the dense MLP
    if block is not None and block is not bool(experts):
        raise ModelConfigError(where, "enable_moe_block", f"is {block!r}, but the config has "
                               f"{experts} experts")
    if experts == 0:
        return {**fields, "ffn": _int(raw, "intermediate_size", where)}
    active_key = "top_k_experts" if block else "num_experts_per_tok"
    active = _int(raw, active_key, where)
    if active > experts:
        raise ModelConfigError(where, active_key, f"{active} is more than {count_key} {experts}")
    width_key = ("moe_intermediate_size" if raw.get("moe_intermediate_size") is not None
                 else "intermediate_size")
    expert_ffn = _int(raw, width_key, where)
    if block:  # every token runs the dense MLP too, as a shared expert (vLLM gemma4.py)
        shared = _int(raw, "intermediate_size", where)
    elif raw.get("shared_expert_intermediate_size") is not None:
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
