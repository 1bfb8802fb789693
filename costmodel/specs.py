"""Model specs: exact public shapes, and what the Section 2.2 cost model derives from them.

One *unit* is one query-key pair in one layer: the QK dot product and the PV accumulation over
all query heads, i.e. ``q_heads * (qk_dim + v_dim)`` multiply-accumulates (MACs), which is
``2 * q_heads * head_dim`` for GQA/MHA (MLA: ``qk_dim = qk_nope + qk_rope``, ``v_dim =
v_head_dim``, as its prefill kernels compute it, decompressed). A token at position ``p`` (``p``
tokens before it) costs ``W + p`` units in a full-attention layer, where

    W = (MACs of the attention projections + MACs of the FFN, active experts only)
        / MACs of one unit          (the mean over layers when layers differ)

Embeddings, norms, the MoE router and the LM head are left out, as in the paper.

A model is a list of layer kinds (:class:`AttentionKind`); the layers of one kind (and window)
form a *KV cache group* (:class:`KVGroup`) with its own bytes per token or per request and its
own position term (``costmodel/units.py``; docs/hybrid.md): full ``p``; sliding window ``w``
(a token sees at most ``w`` tokens including itself) ``min(p, w - 1)``; chunked local (chunk
``c``) ``p mod c``; linear / Gated DeltaNet a constant state update; MLA ``p``; DSA
``min(p, k - 1)`` over the top-k keys plus the indexer scoring all ``p``; compressed (ratio
``r``, DeepSeek-V4) ``floor(p / r)`` compressed entries, or ``min(floor(p / r), k)`` where an
indexer picks the top-k of them (and scores all ``floor(p / r)``), beside its sliding window.
All shapes are from the models' public ``config.json`` files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property

from .hfconfig import catalog_entries, is_config_path, load_spec
from .registry import Registry


class AttentionKind(StrEnum):
    """The attention of one layer; the layers of one kind (and window) are one KV cache
    group (docs/hybrid.md)."""

    FULL = "full"  # every earlier token, K and V per KV head
    SLIDING = "sliding"  # the last ``window`` tokens (including itself)
    CHUNKED = "chunked"  # the tokens of its own ``window``-token chunk (Llama 4 local layers)
    LINEAR = "linear"  # linear attention / Gated DeltaNet: a fixed state per request
    MLA = "mla"  # multi-head latent attention: one latent (kv_lora_rank + rope) per token
    DSA = "dsa"  # MLA whose queries read the top-k keys an indexer picks (indexer cache)
    # DeepSeek-V4: one entry per ``r`` tokens (``compress_ratios``) beside the layer's sliding
    # window; ratio-4 layers' queries read the top-k entries an indexer picks
    COMPRESSED = "compressed"


# bits per KV element (``--kv-dtype``); fp4's block scales are not counted (as the public
# kvcache-simulator catalog counts it: 0.5 bytes per element)
KV_DTYPE_BITS = {"bf16": 16, "fp8": 8, "fp4": 4}
# Stored weight bytes per parameter (numerator, denominator) of a quantized checkpoint
# (config.json quantization_config): fp8 (DeepSeek's 128 x 128 blocks, one fp32 scale per
# 16,384 weights, not counted), MXFP4 (gpt-oss's experts: 4 bits and one 8-bit scale per 32)
WEIGHT_DTYPE_BYTES = {"bf16": (2, 1), "fp8": (1, 1), "mxfp4": (17, 32)}
# Gated DeltaNet state as SGLang 0.5.23 keeps it (and the public catalog counts it): the
# convolution window in bf16, the recurrent state in fp32 (SGLANG_MAMBA_SSM_DTYPE)
CONV_STATE_BYTES = 2
RECURRENT_STATE_BYTES = 4
# bounded kinds: a request holds at most ``window`` tokens of them
BOUNDED = (AttentionKind.SLIDING, AttentionKind.CHUNKED)
# kinds whose layers have a ``window``: the bounded ones, and compressed layers (their window
# of recent tokens beside the compressed entries)
WINDOWED = (*BOUNDED, AttentionKind.COMPRESSED)
# DeepSeek-V4: only the layers compressed 4x have an indexer and read its top-k (vLLM
# vllm/models/deepseek_v4/attention.py: "Only C4A uses sparse attention and hence has
# indexer"; SGLang sglang/srt/models/deepseek_v4.py); the others attend to every entry
SPARSE_COMPRESS_RATIO = 4


@dataclass(frozen=True)
class KVGroup:
    """One KV cache group: ``layers`` layers of one ``kind`` (and ``window``: the window of a
    sliding group, the chunk of a chunked one). ``kv_bytes_per_token``: what one token's KV
    takes in all its layers (0 for linear attention); ``state_bytes_per_request``: the fixed
    state one request holds (linear attention); ``indexer_bytes_per_token``: of
    ``kv_bytes_per_token``, the DSA indexer's keys, which ``indexer_layers`` of the layers
    compute and cache (the others reuse an earlier layer's top-k: ``shared_indexer_layers``).
    A compressed group keeps one entry per ``compress_ratio`` tokens: ``kv_bytes_per_token``
    is an entry's bytes (and its indexer key's) over its layers divided by the ratio, and a
    request of ``p`` tokens holds ``floor(p / r)`` entries; its layers' windows are the
    model's sliding group, which every layer of a compressed model has."""

    kind: AttentionKind
    layers: int
    window: int | None
    kv_bytes_per_token: int
    state_bytes_per_request: int = 0
    indexer_bytes_per_token: int = 0
    indexer_layers: int = 0
    compress_ratio: int = 0

    def kv_bytes(self, tokens: int) -> int:
        """Bytes one request of ``tokens`` context holds in this group: every token (full,
        MLA, DSA), the last ``window`` (sliding), the current chunk (chunked); plus the
        state (linear)."""
        if tokens <= 0:
            return 0
        held = tokens
        if self.kind is AttentionKind.SLIDING:
            held = min(tokens, self.window or tokens)
        elif self.kind is AttentionKind.CHUNKED:
            held = (tokens - 1) % (self.window or tokens) + 1
        elif self.kind is AttentionKind.COMPRESSED:  # whole entries only
            held = tokens // self.compress_ratio * self.compress_ratio
        return held * self.kv_bytes_per_token + self.state_bytes_per_request

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"kind": str(self.kind), "layers": self.layers}
        if self.window is not None:
            d["window"] = self.window
        if self.kind is AttentionKind.COMPRESSED:
            d["compress_ratio"] = self.compress_ratio
        d["kv_bytes_per_token"] = self.kv_bytes_per_token
        d["state_bytes_per_request"] = self.state_bytes_per_request
        if self.indexer_layers or self.kind is AttentionKind.DSA:
            d["indexer_bytes_per_token"] = self.indexer_bytes_per_token
            d["indexer_layers"] = self.indexer_layers
        return d


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of one decoder-only transformer.

    ``layer_kinds[i]`` is layer ``i``'s :class:`AttentionKind` (empty: full attention, or
    sliding where ``layer_windows`` gives a window). ``layer_windows[i]`` is the window of a
    sliding layer and the chunk of a chunked one, ``None`` otherwise; an empty tuple means no
    layer has one. ``kv_dtype`` (``KV_DTYPE_BITS``) sizes the KV; ``dtype_bytes`` the weights.
    """

    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int = 0  # dense FFN intermediate size (0 for a pure MoE)
    experts: int = 0
    active_experts: int = 0
    expert_ffn: int = 0
    max_context: int = 131072
    vocab: int = 0
    dtype_bytes: int = 2  # bf16 weights (the KV: kv_dtype; gpus.py's KV cells still read this)
    # a quantized checkpoint's weights (``WEIGHT_DTYPE_BYTES``; "": ``dtype_bytes``): the
    # linear layers' (projections, dense and shared FFNs) and the routed experts' ("": the
    # linear layers'); embeddings and the LM head stay at ``dtype_bytes``
    weight_dtype: str = ""
    expert_weight_dtype: str = ""
    layer_windows: tuple[int | None, ...] = ()
    # Mixed dense/MoE models (config.json first_k_dense_replace, decoder_sparse_step,
    # mlp_only_layers): ``dense_layers`` of the ``layers`` run a dense FFN of width
    # ``dense_ffn`` instead of the experts and ``ffn`` (which, in an MoE, is its shared experts).
    dense_layers: int = 0
    dense_ffn: int = 0
    tied_embeddings: bool = False  # one embedding matrix serves as the LM head too
    layer_kinds: tuple[str, ...] = ()
    kv_dtype: str = "bf16"
    # MLA / DSA layers (config.json kv_lora_rank, q_lora_rank (0: none), qk_nope_head_dim,
    # qk_rope_head_dim, v_head_dim; DSA's indexer: index_topk, index_n_heads, index_head_dim)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    index_topk: int = 0
    index_n_heads: int = 0
    index_head_dim: int = 0
    # DSA layers that reuse the top-k of the indexer before them and have no indexer (GLM-5.2's
    # IndexCache: config.json index_topk_freq, index_skip_topk_offset, index_topk_pattern)
    shared_indexer_layers: tuple[int, ...] = ()
    # linear-attention (Gated DeltaNet) layers: config.json linear_num_key_heads,
    # linear_key_head_dim, linear_num_value_heads, linear_value_head_dim, linear_conv_kernel_dim
    linear_key_heads: int = 0
    linear_key_dim: int = 0
    linear_value_heads: int = 0
    linear_value_dim: int = 0
    linear_conv_kernel: int = 0
    attn_output_gate: bool = False  # Qwen3-Next: q_proj also gives a per-head output gate
    # GQA full-attention layers with their own KV heads and head dim beside sliding ones
    # (Gemma 4: config.json num_global_key_value_heads, global_head_dim); 0: kv_heads, head_dim
    full_kv_heads: int = 0
    full_head_dim: int = 0
    # compressed attention (DeepSeek-V4, config.json compress_ratios): each layer's ratio (0:
    # its sliding window only, layer kind sliding; else kind compressed); every layer's KV is
    # one entry of ``head_dim`` per KV head that serves as K and V; queries through
    # ``q_lora_rank``, the output through ``o_groups`` groups of ``o_lora_rank`` (config.json
    # o_groups, o_lora_rank); the indexer's keys kept in ``indexer_kv_dtype`` ("": kv_dtype)
    compress_ratios: tuple[int, ...] = ()
    o_lora_rank: int = 0
    o_groups: int = 0
    indexer_kv_dtype: str = ""
    source: str = ""
    # config.json ``architectures[0]`` of ``source``: engines that treat an architecture apart
    # read it (SGLang keeps Gemma 2/3 in one pool, sim/engines/sglang.py); "": not stated, the
    # engines go by the layer kinds alone
    architecture: str = ""
    notes: str = field(default="", compare=False)
    config_sha256: str = ""  # a spec read from a config.json file: the sha256 of its bytes
    # (kind, weight): a kind's attention units counted at its kernel's time per unit over the
    # profile's one rate (``Profile.pricing_spec``; empty: every kind at that rate)
    attention_weights: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.layer_windows and len(self.layer_windows) != self.layers:
            raise ValueError(f"{self.name}: layer_windows has {len(self.layer_windows)} entries")
        for w in self.layer_windows:
            if w is not None and w < 1:
                raise ValueError(f"{self.name}: window must be >= 1, got {w}")
        if not 0 <= self.dense_layers <= self.layers:
            raise ValueError(f"{self.name}: dense_layers must be in 0..{self.layers}")
        if self.kv_dtype not in KV_DTYPE_BITS:
            raise ValueError(f"{self.name}: kv_dtype {self.kv_dtype!r}: one of "
                             f"{', '.join(KV_DTYPE_BITS)}")
        for f in ("weight_dtype", "expert_weight_dtype"):
            if getattr(self, f) not in ("", *WEIGHT_DTYPE_BYTES):
                raise ValueError(f"{self.name}: {f} {getattr(self, f)!r}: one of "
                                 f"{', '.join(WEIGHT_DTYPE_BYTES)}")
        if self.layer_kinds and len(self.layer_kinds) != self.layers:
            raise ValueError(f"{self.name}: layer_kinds has {len(self.layer_kinds)} entries")
        known = set(AttentionKind)
        need = {AttentionKind.MLA: ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                    "v_head_dim"),
                AttentionKind.DSA: ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                    "v_head_dim", "index_topk", "index_n_heads",
                                    "index_head_dim"),
                AttentionKind.LINEAR: ("linear_key_heads", "linear_key_dim",
                                       "linear_value_heads", "linear_value_dim",
                                       "linear_conv_kernel")}
        for i, k in enumerate(self.layer_kinds):
            if k not in known:
                raise ValueError(f"{self.name}: layer {i}: unknown attention kind {k!r}")
            w = self.layer_windows[i] if self.layer_windows else None
            if (k in WINDOWED) != (w is not None):
                raise ValueError(f"{self.name}: layer {i} ({k}): a window is given exactly "
                                 "for sliding, chunked and compressed layers")
            for f in need.get(AttentionKind(k), ()):
                if getattr(self, f) < 1:
                    raise ValueError(f"{self.name}: {k} layers need {f} >= 1")
        for f in ("full_kv_heads", "full_head_dim"):
            if getattr(self, f) < 0:
                raise ValueError(f"{self.name}: {f} must be >= 0")
        if self.full_kv_heads and self.q_heads % self.full_kv_heads:
            raise ValueError(f"{self.name}: full_kv_heads {self.full_kv_heads} does not divide "
                             f"q_heads {self.q_heads}")
        self._check_compressed()
        shared = self.shared_indexer_layers
        if shared:
            dsa = [i for i, k in enumerate(self.layer_kinds) if k == AttentionKind.DSA]
            if list(shared) != sorted(set(shared)) or not set(shared) <= set(dsa[1:]):
                raise ValueError(f"{self.name}: shared_indexer_layers must be sorted DSA layers "
                                 "after the first (an earlier indexer's top-k is reused)")

    def _check_compressed(self) -> None:
        """Compressed layers exactly where ``compress_ratios`` is positive, and every entry
        (and indexer key) a whole number of bytes per token at any KV dtype."""
        if self.indexer_kv_dtype not in ("", *KV_DTYPE_BITS):
            raise ValueError(f"{self.name}: indexer_kv_dtype {self.indexer_kv_dtype!r}: one of "
                             f"{', '.join(KV_DTYPE_BITS)}")
        ratios = self.compress_ratios
        if not ratios:
            if AttentionKind.COMPRESSED in self.layer_kinds:
                raise ValueError(f"{self.name}: compressed layers need compress_ratios")
            return
        if len(ratios) != self.layers or len(self.layer_kinds) != self.layers:
            raise ValueError(f"{self.name}: compress_ratios and layer_kinds need one entry "
                             "per layer")
        fp4_entry = self.kv_heads * self.head_dim * KV_DTYPE_BITS["fp4"] // 8
        fp4_key = self.index_head_dim * KV_DTYPE_BITS["fp4"] // 8
        for i, (k, r) in enumerate(zip(self.layer_kinds, ratios, strict=True)):
            if (k == AttentionKind.COMPRESSED) != (r > 0) or (r == 0 and k != "sliding"):
                raise ValueError(f"{self.name}: layer {i} ({k}): compressed exactly where its "
                                 f"compress ratio is positive, sliding elsewhere, got {r}")
            if r and (r < 2 or fp4_entry % r
                      or (r == SPARSE_COMPRESS_RATIO and (self.index_topk < 1 or fp4_key % r))):
                raise ValueError(f"{self.name}: layer {i}: compress ratio {r} must be >= 2 and "
                                 "divide a KV entry's (and an indexer key's) bytes")

    # --- Section 2.2 -------------------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def macs_per_unit(self) -> int:
        """MACs of one query-key pair over all query heads (QK and PV); MLA as its prefill
        kernels compute it (decompressed: QK over qk_nope + qk_rope, PV over v_head_dim)."""
        if self.is_mla:
            return self.q_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim
                                   + self.v_head_dim)
        return 2 * self.q_heads * self.head_dim

    @property
    def attention_macs_per_token(self) -> int:
        """Per-token, per-layer MACs of the Q, K, V and O projections of a GQA/MHA layer
        (full, sliding or chunked); with an output gate, q_proj is twice as wide."""
        return self._gqa_macs(self.kv_heads, self.head_dim)

    def _gqa_macs(self, kv_heads: int, head_dim: int) -> int:
        q = self.hidden * self.q_heads * head_dim * (2 if self.attn_output_gate else 1)
        kv = 2 * self.hidden * kv_heads * head_dim
        o = self.q_heads * head_dim * self.hidden
        return q + kv + o

    def kv_shape(self, kind: AttentionKind) -> tuple[int, int]:
        """KV heads and head dim of a GQA layer of ``kind``: full layers' own where the model
        gives them (``full_kv_heads``, ``full_head_dim``), else the model's."""
        if kind is AttentionKind.FULL:
            return self.full_kv_heads or self.kv_heads, self.full_head_dim or self.head_dim
        return self.kv_heads, self.head_dim

    def unit_ratio(self, kind: AttentionKind) -> int | float:
        """One query-key pair of a ``kind`` layer in the model's units: full layers with a
        wider head (``full_head_dim``) do that many times the MACs (QK and PV over it)."""
        if kind is not AttentionKind.FULL or not self.full_head_dim or self.is_mla:
            return 1
        ratio = self.full_head_dim / self.head_dim
        return int(ratio) if ratio.is_integer() else ratio

    def projection_macs(self, kind: AttentionKind) -> int:
        """Per-token MACs of one ``kind`` layer's projections (modelling code of vLLM/SGLang:
        ``deepseek_v2.py`` MLA and its DSA ``Indexer``, ``qwen3_next.py`` Gated DeltaNet); in
        a compressed model, those of the first ``kind`` layer's ratio (layers of one kind
        differ by ratio there: ``compressed_layer_macs`` gives each, and W sums them)."""
        if self.compress_ratios:
            ratio = next(r for k, r in zip(self.kinds, self.compress_ratios, strict=True)
                         if k is kind)
            return self.compressed_layer_macs(ratio)
        if kind in (AttentionKind.MLA, AttentionKind.DSA):
            h, qk = self.q_heads, self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (self.hidden * self.q_lora_rank + self.q_lora_rank * h * qk if self.q_lora_rank
                 else self.hidden * h * qk)
            kv_a = self.hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * h * (self.qk_nope_head_dim + self.v_head_dim)
            o = h * self.v_head_dim * self.hidden
            macs = q + kv_a + kv_b + o
            if kind is AttentionKind.DSA:
                macs += self.indexer_projection_macs
            return macs
        if kind is AttentionKind.LINEAR:  # in_proj_qkvz, in_proj_ba, conv1d, out_proj
            qk = 2 * self.linear_key_heads * self.linear_key_dim
            v = self.linear_value_heads * self.linear_value_dim
            return (self.hidden * (qk + 2 * v) + self.hidden * 2 * self.linear_value_heads
                    + self.linear_conv_kernel * (qk + v) + v * self.hidden)
        return self._gqa_macs(*self.kv_shape(kind))

    def compressed_layer_macs(self, ratio: int) -> int:
        """Per-token MACs of one layer of a compressed model (vLLM
        vllm/models/deepseek_v4/attention.py, compressor.py): wq_a and wq_b through
        ``q_lora_rank``, the one KV entry, wo_a per output group and wo_b; a compressed layer's
        compressor (KV and gate projections of ``coff`` entries, two where ratio 4 overlaps
        its windows); a ratio-4 layer's indexer (wq_b, weights_proj, and its own compressor
        of ``index_head_dim`` keys)."""
        h, d = self.q_heads, self.head_dim
        q = (self.hidden * self.q_lora_rank + self.q_lora_rank * h * d if self.q_lora_rank
             else self.hidden * h * d)
        o = (h * d * self.o_lora_rank + self.o_groups * self.o_lora_rank * self.hidden
             if self.o_lora_rank else h * d * self.hidden)
        macs = q + self.hidden * self.kv_heads * d + o
        if ratio:
            coff = 2 if ratio == SPARSE_COMPRESS_RATIO else 1
            macs += 2 * self.hidden * coff * d
        if ratio == SPARSE_COMPRESS_RATIO:
            q_in = self.q_lora_rank or self.hidden
            macs += (q_in * self.index_n_heads * self.index_head_dim
                     + self.hidden * self.index_n_heads
                     + 2 * self.hidden * 2 * self.index_head_dim)
        return macs

    @property
    def indexer_projection_macs(self) -> int:
        """Per-token MACs of one DSA indexer's projections (wq_b, wk, weights_proj); a layer
        in ``shared_indexer_layers`` has none."""
        q_in = self.q_lora_rank or self.hidden
        return (q_in * self.index_n_heads * self.index_head_dim
                + self.hidden * self.index_head_dim + self.hidden * self.index_n_heads)

    @property
    def state_update_macs(self) -> int:
        """Per-token MACs of one linear-attention layer's recurrent step: the delta rule reads
        the state with the key, writes a rank-one update and reads it with the query, three
        ``key_dim x value_dim`` passes per value head (derived; docs/hybrid.md)."""
        return 3 * self.linear_value_heads * self.linear_key_dim * self.linear_value_dim

    @property
    def indexer_macs_per_key(self) -> int:
        """bf16-equivalent MACs of the DSA indexer scoring one earlier token: every indexer
        head's dot product (``index_n_heads x index_head_dim``), halved because the kernel
        runs in fp8 (DeepGEMM ``fp8_mqa_logits``; fp8 tensor cores do twice the bf16 MACs)."""
        return self.index_n_heads * self.index_head_dim // 2

    @property
    def _ffn_macs(self) -> int:
        """Per-token MACs of one layer's (active) FFN: the dense or shared FFN ``ffn`` and the
        active experts; gate, up, down each (SwiGLU / GeGLU)."""
        return 3 * self.hidden * (self.ffn + self.expert_ffn * self.active_experts)

    @property
    def _projection_macs_all_layers(self) -> int:
        if self.compress_ratios:
            return sum(self.compressed_layer_macs(r) for r in self.compress_ratios)
        return (sum(n * self.projection_macs(k) for k, n in self.kind_counts().items())
                - len(self.shared_indexer_layers) * self.indexer_projection_macs)

    @property
    def _uniform(self) -> bool:
        """Every layer has the same projections and FFN."""
        return (not self.dense_layers and not self.shared_indexer_layers
                and len(set(self.compress_ratios)) < 2
                and len({self.projection_macs(k) for k in self.kind_counts()}) == 1)

    @property
    def linear_macs_all_layers(self) -> int:
        """Per-token MACs of the projections and active FFNs summed over every layer."""
        return (self._projection_macs_all_layers + self._ffn_macs * self.layers
                + self.dense_layers * (3 * self.hidden * self.dense_ffn - self._ffn_macs))

    @property
    def linear_macs_per_token(self) -> int | float:
        """Per-token, per-layer MACs of the projections and the (active) FFN; with
        ``dense_layers`` or layers of different kinds, the mean over layers (the cost model
        prices every layer's linear work alike)."""
        if not self._uniform:
            return self.linear_macs_all_layers / self.layers
        return self.projection_macs(self.kinds[0]) + self._ffn_macs

    @cached_property
    def W(self) -> float:
        """Per-token linear+FFN work in units (exact for the shipped models); every priced
        range reads it, so it is computed once per spec."""
        return self.linear_macs_per_token / self.macs_per_unit

    def windows(self) -> tuple[int | None, ...]:
        return self.layer_windows or (None,) * self.layers

    @cached_property
    def kinds(self) -> tuple[AttentionKind, ...]:
        """Each layer's attention kind."""
        if self.layer_kinds:
            return tuple(AttentionKind(k) for k in self.layer_kinds)
        return tuple(AttentionKind.FULL if w is None else AttentionKind.SLIDING
                     for w in self.windows())

    def attention_kinds(self) -> list[AttentionKind]:
        return list(self.kinds)

    def _weighted(self, g: KVGroup, layers: int | None = None) -> int | float:
        """The layers of ``g`` (or ``layers`` of them) as pricing counts them: at its kind's
        weight, if it has one."""
        n = (g.layers if layers is None else layers) * self.unit_ratio(g.kind)
        for kind, w in self.attention_weights:
            if kind == g.kind:
                return n * w
        return n

    def with_attention_weights(self, weights: dict[str, float]) -> ModelSpec:
        """This spec with its kinds' attention units weighted (``attention_weights``)."""
        w = tuple(sorted((str(k), float(v)) for k, v in weights.items() if v != 1.0))
        return self if w == self.attention_weights else replace(self, attention_weights=w)

    def kind_counts(self) -> dict[AttentionKind, int]:
        counts: dict[AttentionKind, int] = {}
        for k in self.kinds:
            counts[k] = counts.get(k, 0) + 1
        return counts

    @cached_property
    def groups(self) -> tuple[KVGroup, ...]:
        """The KV cache groups: the layers of one kind and window, in order of their first
        layer, with their bytes at ``kv_dtype`` (docs/hybrid.md, Bytes). A compressed model's
        sliding group holds every layer's window (compressed layers keep one too), and its
        compressed groups are keyed by their ratio."""
        counts: dict[tuple[AttentionKind, int | None], int] = {}
        ratios = self.compress_ratios or (0,) * self.layers
        for k, w, r in zip(self.kinds, self.windows(), ratios, strict=True):
            if k is AttentionKind.COMPRESSED:
                counts[(AttentionKind.SLIDING, w)] = counts.get((AttentionKind.SLIDING, w), 0) + 1
                w = r
            counts[(k, w)] = counts.get((k, w), 0) + 1
        bits = KV_DTYPE_BITS[self.kv_dtype]
        out = []
        for (k, w), n in counts.items():
            state = indexer = indexer_layers = 0
            if self.compress_ratios:  # one entry per KV head serves as K and V
                entry = n * self.kv_heads * self.head_dim * bits // 8
                if k is AttentionKind.SLIDING:
                    out.append(KVGroup(k, n, w, entry))
                    continue
                ratio = w or 1
                if ratio == SPARSE_COMPRESS_RATIO:
                    indexer_layers = n
                    ibits = KV_DTYPE_BITS[self.indexer_kv_dtype or self.kv_dtype]
                    indexer = n * self.index_head_dim * ibits // 8 // ratio
                out.append(KVGroup(k, n, None, entry // ratio + indexer, 0, indexer,
                                   indexer_layers, ratio))
                continue
            if k in (AttentionKind.MLA, AttentionKind.DSA):
                kv = n * (self.kv_lora_rank + self.qk_rope_head_dim) * bits // 8
                if k is AttentionKind.DSA:
                    indexer_layers = n - len(self.shared_indexer_layers)
                    indexer = indexer_layers * self.index_head_dim * bits // 8
                    kv += indexer
            elif k is AttentionKind.LINEAR:
                kv = 0
                conv = ((self.linear_conv_kernel - 1)
                        * (2 * self.linear_key_heads * self.linear_key_dim
                           + self.linear_value_heads * self.linear_value_dim))
                rec = self.linear_value_heads * self.linear_key_dim * self.linear_value_dim
                state = n * (conv * CONV_STATE_BYTES + rec * RECURRENT_STATE_BYTES)
            else:
                heads, dim = self.kv_shape(k)
                kv = n * 2 * heads * dim * bits // 8
            out.append(KVGroup(k, n, w, kv, state, indexer, indexer_layers))
        return tuple(out)

    def kv_bytes(self, tokens: int, state: bool = True) -> int:
        """Bytes one request of ``tokens`` context holds over every group (each keeps what its
        kind needs: ``KVGroup.kv_bytes``); ``state=False`` leaves the linear state out."""
        return sum(g.kv_bytes(tokens) - (0 if state or tokens <= 0
                                         else g.state_bytes_per_request)
                   for g in self.groups)

    def kv_bytes_per_token_at(self, tokens: int) -> float:
        """KV bytes per token of one request of ``tokens`` context, state left out (what the
        public kvcache-simulator catalog calls bytes per token at that context)."""
        return self.kv_bytes(tokens, state=False) / tokens

    @property
    def state_bytes_per_request(self) -> int:
        return sum(g.state_bytes_per_request for g in self.groups)

    @cached_property
    def extra_terms(self) -> tuple[tuple[int | float, AttentionKind, int, int], ...]:
        """The position terms beyond ``window_caps``' ``min(p, cap)``, per group (layer count,
        kind, parameter, tokens per key): chunked (chunk), linear (state-update MACs per
        token), the DSA indexer (MACs per scored key, every token a key; a compressed group's
        indexer: one key per ``r`` tokens), compressed (its cap: ``index_topk`` where an
        indexer picks the entries, 0 for none; one entry per ``r`` tokens). Empty for full and
        sliding models, so their pricing pays nothing for it (``costmodel/units.py``)."""
        terms = []
        for g in self.groups:
            if g.kind is AttentionKind.CHUNKED:
                terms.append((self._weighted(g), g.kind, g.window or 1, 1))
            elif g.kind is AttentionKind.LINEAR:
                terms.append((self._weighted(g), g.kind, self.state_update_macs, 1))
            elif g.kind is AttentionKind.DSA:  # only the layers with an indexer score keys
                terms.append((self._weighted(g, g.indexer_layers), g.kind,
                              self.indexer_macs_per_key, 1))
            elif g.kind is AttentionKind.COMPRESSED:
                cap = self.index_topk if g.indexer_layers else 0
                terms.append((self._weighted(g), g.kind, cap, g.compress_ratio))
                if g.indexer_layers:
                    terms.append((self._weighted(g, g.indexer_layers), AttentionKind.DSA,
                                  self.indexer_macs_per_key, g.compress_ratio))
        return tuple(terms)

    def window_groups(self) -> dict[int | None, int]:
        """Layer count per window (``None`` = full attention); prices ranges per group."""
        groups: dict[int | None, int] = {}
        for w in self.windows():
            groups[w] = groups.get(w, 0) + 1
        return groups

    @cached_property
    def window_caps(self) -> tuple[tuple[int | float, int | None], ...]:
        """The ``min(p, cap)`` position terms as pricing reads them, once per spec: (layer
        count, cap) per group that has one: full and MLA (None: no cap), sliding
        (``window - 1``), DSA's top-k (``index_topk - 1``); chunked and linear groups are
        ``extra_terms``. Every priced range reads it, so it is not rebuilt per call."""
        caps: list[tuple[int | float, int | None]] = []
        for g in self.groups:
            if g.kind in (AttentionKind.FULL, AttentionKind.MLA):
                caps.append((self._weighted(g), None))
            elif g.kind is AttentionKind.SLIDING:
                caps.append((self._weighted(g), (g.window or 1) - 1))
            elif g.kind is AttentionKind.DSA:
                caps.append((self._weighted(g), self.index_topk - 1))
        return tuple(caps)

    # --- memory -----------------------------------------------------------------------
    @cached_property
    def kv_bytes_per_token(self) -> int:
        """KV bytes one token writes over every group (K and V per KV head, or MLA's latent
        and DSA's indexer key) at ``kv_dtype``: what a token's KV moves when copied.
        Windowed groups hold only their window (``kv_bytes``)."""
        return sum(g.kv_bytes_per_token for g in self.groups)

    def with_kv_dtype(self, kv_dtype: str) -> ModelSpec:
        """This spec with its KV in ``kv_dtype`` (``--kv-dtype``)."""
        return self if kv_dtype == self.kv_dtype else replace(self, kv_dtype=kv_dtype)

    @property
    def active_params(self) -> int:
        """Parameters read per decode step (linear layers, active experts; no embeddings)."""
        return self.linear_macs_all_layers

    @property
    def _routed_expert_params(self) -> int:
        """Parameters of one routed expert over every MoE layer (gate, up, down)."""
        return 3 * self.hidden * self.expert_ffn * (self.layers - self.dense_layers)

    def _stored_bytes(self, params: int, dtype: str) -> int:
        if not dtype:
            return params * self.dtype_bytes
        num, den = WEIGHT_DTYPE_BYTES[dtype]
        return -(-params * num // den)

    def _weights(self, routed: int, linear: int) -> int:
        return (self._stored_bytes(routed, self.expert_weight_dtype or self.weight_dtype)
                + self._stored_bytes(linear, self.weight_dtype))

    @property
    def weight_bytes(self) -> int:
        """Bytes of every weight as the checkpoint stores them (``total_params``: routed
        experts at ``expert_weight_dtype``, the other linear layers at ``weight_dtype``, the
        embeddings and the head at ``dtype_bytes``): what the GPUs hold."""
        routed = self._routed_expert_params * self.experts
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab * self.hidden
        return (self._weights(routed, self.total_params - embeddings - routed)
                + embeddings * self.dtype_bytes)

    def weight_read_bytes(self, routed: bool = True) -> int:
        """Bytes of ``active_params`` as stored: what a decode step reads of the weights
        (``routed=False``: the routed experts left out, for a profile that prices them
        apart)."""
        active_routed = self._routed_expert_params * self.active_experts
        return self._weights(active_routed if routed else 0, self.active_params - active_routed)

    @property
    def total_params(self) -> int:
        """Linear-layer parameters incl. every expert, plus the embeddings and the LM head
        (counted once when tied)."""
        moe_ffn = 3 * self.hidden * (self.ffn + self.expert_ffn * self.experts)
        dense_ffn = 3 * self.hidden * self.dense_ffn
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab * self.hidden
        return (self._projection_macs_all_layers + moe_ffn * (self.layers - self.dense_layers)
                + dense_ffn * self.dense_layers + embeddings)

    def summary(self) -> dict[str, object]:
        kinds = self.attention_kinds()
        return {
            "name": self.name,
            "layers": self.layers,
            "hidden": self.hidden,
            "q_heads": self.q_heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "ffn": self.ffn,
            "experts": self.experts,
            "active_experts": self.active_experts,
            "expert_ffn": self.expert_ffn,
            "dense_layers": self.dense_layers,
            "dense_ffn": self.dense_ffn,
            "tied_embeddings": self.tied_embeddings,
            "W": self.W,
            "kv_dtype": self.kv_dtype,
            "groups": [g.to_dict() for g in self.groups],
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_at_128k": self.kv_bytes_per_token_at(131072),
            "state_bytes_per_request": self.state_bytes_per_request,
            "full_attention_layers": kinds.count(AttentionKind.FULL),
            "sliding_attention_layers": kinds.count(AttentionKind.SLIDING),
            "windows": sorted({w for w in self.windows() if w is not None}),
            "max_context": self.max_context,
            "total_params": self.total_params,
            "weight_dtype": self.weight_dtype or f"{8 * self.dtype_bytes}-bit",
            "expert_weight_dtype": (self.expert_weight_dtype or self.weight_dtype
                                    or f"{8 * self.dtype_bytes}-bit") if self.experts else None,
            "weight_bytes": self.weight_bytes,
            "source": self.source,
        }


def _alternating(layers: int, window: int, full_every: int, first_full: int) -> tuple:
    """Windows for a model whose layer ``i`` is global iff ``i % full_every == first_full``."""
    return tuple(None if i % full_every == first_full else window for i in range(layers))


SPECS: Registry[ModelSpec] = Registry("model", unique=True)


def register(spec: ModelSpec) -> ModelSpec:
    return SPECS.register(spec.name, spec)


register(ModelSpec("qwen3-8b", layers=36, hidden=4096, q_heads=32, kv_heads=8, head_dim=128,
                   ffn=12288, vocab=151936, max_context=131072, source="Qwen/Qwen3-8B",
                   architecture="Qwen3ForCausalLM"))
register(ModelSpec("qwen3-32b", layers=64, hidden=5120, q_heads=64, kv_heads=8, head_dim=128,
                   ffn=25600, vocab=151936, max_context=131072, source="Qwen/Qwen3-32B",
                   architecture="Qwen3ForCausalLM"))
register(ModelSpec("qwen3-235b-a22b", layers=94, hidden=4096, q_heads=64, kv_heads=4,
                   head_dim=128, experts=128, active_experts=8, expert_ffn=1536, vocab=151936,
                   max_context=262144, source="Qwen/Qwen3-235B-A22B(-Instruct-2507)",
                   architecture="Qwen3MoeForCausalLM"))
register(ModelSpec("llama-3.1-8b", layers=32, hidden=4096, q_heads=32, kv_heads=8,
                   head_dim=128, ffn=14336, vocab=128256, max_context=131072,
                   architecture="LlamaForCausalLM", source="meta-llama/Llama-3.1-8B"))
register(ModelSpec("llama-3.1-70b", layers=80, hidden=8192, q_heads=64, kv_heads=8,
                   head_dim=128, ffn=28672, vocab=128256, max_context=131072,
                   architecture="LlamaForCausalLM", source="meta-llama/Llama-3.1-70B"))
# gpt-oss-120b: layers alternate sliding (window 128) and full attention, sliding first.
register(ModelSpec("gpt-oss-120b", layers=36, hidden=2880, q_heads=64, kv_heads=8,
                   head_dim=64, experts=128, active_experts=4, expert_ffn=2880, vocab=201088,
                   max_context=131072, layer_windows=_alternating(36, 128, 2, 1),
                   source="openai/gpt-oss-120b", architecture="GptOssForCausalLM",
                   expert_weight_dtype="mxfp4",  # config.json quantization_config
                   notes="attention sinks and biases ignored"))
# gemma-3-27b: five local layers (window 1024) then one global layer.
register(ModelSpec("gemma-3-27b", layers=62, hidden=5376, q_heads=32, kv_heads=16,
                   head_dim=128, ffn=21504, vocab=262208, max_context=131072,
                   layer_windows=_alternating(62, 1024, 6, 5), source="google/gemma-3-27b-it",
                   architecture="Gemma3ForConditionalGeneration"))


# The models above have shipped time profiles (kernels-*, derived-h100-*); the catalog of
# config.json facts (costmodel/data/models.yaml, through the config.json reader) adds models
# priced by profiles derived when asked (costmodel/profile.py ``derivable``).
PROFILED: tuple[str, ...] = SPECS.names()
for _name, _fields, _source in catalog_entries():
    register(ModelSpec(_name, **_fields, source=_source))

_FILE_SPECS: dict[str, ModelSpec] = {}
_DTYPE_SPECS: dict[str, ModelSpec] = {}  # (name, kv_dtype): built once, its caches kept


def get_spec(name: str, kv_dtype: str | None = None,
             weights: dict[str, float] | None = None) -> ModelSpec:
    """The one resolution of a ``--model``/``model`` value: a catalog name, or a Hugging Face
    config.json path read by ``costmodel/hfconfig.py`` (once per process; an unreadable file or
    one asking for what kvsim does not model is one ``ModelConfigError`` line, a ``KeyError``
    as an unknown name is); with its KV in ``kv_dtype`` when given (a ValueError names an
    unknown one); priced by a profile's ``weights`` (``Profile.attention_weights``) if any."""
    if weights:
        return get_spec(name, kv_dtype).with_attention_weights(weights)
    if kv_dtype is not None:
        key = f"{name}\0{kv_dtype}"
        spec = _DTYPE_SPECS.get(key)
        if spec is None:
            spec = _DTYPE_SPECS[key] = get_spec(name).with_kv_dtype(kv_dtype)
        return spec
    if name in SPECS:
        return SPECS.get(name)
    if isinstance(name, str) and is_config_path(name):
        spec = _FILE_SPECS.get(name)
        if spec is None:
            spec = _FILE_SPECS[name] = load_spec(name)
        return spec
    raise SPECS.unknown(name, hint="or a Hugging Face config.json path")


def model_names() -> list[str]:
    """The models kvsim ships time profiles for (calibration and the shipped-profile checks
    iterate these); :func:`all_model_names` adds the catalog."""
    return list(PROFILED)


def all_model_names() -> list[str]:
    """Every catalog model (``kvsim models``)."""
    return list(SPECS.names())
