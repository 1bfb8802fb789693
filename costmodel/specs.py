"""Model specs: exact public shapes, and what the Section 2.2 cost model derives from them.

One *unit* is one query-key pair in one layer: the QK dot product and the PV accumulation over
all query heads, i.e. ``2 * q_heads * head_dim`` multiply-accumulates (MACs). A token at
position ``p`` (``p`` tokens before it) costs ``W + p`` units in a full-attention layer, where

    W = (MACs of the Q, K, V, O projections + MACs of the FFN, active experts only)
        / (2 * q_heads * head_dim)

Embeddings, norms, the MoE router and the LM head are left out, as in the paper.

A sliding-window layer with window ``w`` lets a token see at most ``w`` tokens including
itself, so its position term is ``min(p, w - 1)``. All shapes are from the models' public
``config.json`` files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from .hfconfig import catalog_entries, is_config_path, load_spec
from .registry import Registry


class AttentionKind(StrEnum):
    FULL = "full"
    SLIDING = "sliding"


@dataclass(frozen=True)
class ModelSpec:
    """Shapes of one decoder-only transformer.

    ``layer_windows[i]`` is ``None`` for a full-attention layer and the window size for a
    sliding-window layer; an empty tuple means every layer is full attention.
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
    dtype_bytes: int = 2  # bf16 KV and weights
    layer_windows: tuple[int | None, ...] = ()
    # Mixed dense/MoE models (config.json first_k_dense_replace, decoder_sparse_step,
    # mlp_only_layers): ``dense_layers`` of the ``layers`` run a dense FFN of width
    # ``dense_ffn`` instead of the experts and ``ffn`` (which, in an MoE, is its shared experts).
    dense_layers: int = 0
    dense_ffn: int = 0
    tied_embeddings: bool = False  # one embedding matrix serves as the LM head too
    source: str = ""
    notes: str = field(default="", compare=False)
    config_sha256: str = ""  # a spec read from a config.json file: the sha256 of its bytes

    def __post_init__(self) -> None:
        if self.layer_windows and len(self.layer_windows) != self.layers:
            raise ValueError(f"{self.name}: layer_windows has {len(self.layer_windows)} entries")
        for w in self.layer_windows:
            if w is not None and w < 1:
                raise ValueError(f"{self.name}: window must be >= 1, got {w}")
        if not 0 <= self.dense_layers <= self.layers:
            raise ValueError(f"{self.name}: dense_layers must be in 0..{self.layers}")

    # --- Section 2.2 -------------------------------------------------------------------
    @property
    def macs_per_unit(self) -> int:
        """MACs of one query-key pair over all query heads (QK and PV)."""
        return 2 * self.q_heads * self.head_dim

    @property
    def attention_macs_per_token(self) -> int:
        """Per-token, per-layer MACs of the Q, K, V and O projections."""
        q = self.hidden * self.q_heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.q_heads * self.head_dim * self.hidden
        return q + kv + o

    @property
    def _ffn_macs(self) -> int:
        """Per-token MACs of one layer's (active) FFN: the dense or shared FFN ``ffn`` and the
        active experts; gate, up, down each (SwiGLU / GeGLU)."""
        return 3 * self.hidden * (self.ffn + self.expert_ffn * self.active_experts)

    @property
    def linear_macs_all_layers(self) -> int:
        """Per-token MACs of the projections and active FFNs summed over every layer."""
        per_layer = self.attention_macs_per_token + self._ffn_macs
        return (per_layer * self.layers
                + self.dense_layers * (3 * self.hidden * self.dense_ffn - self._ffn_macs))

    @property
    def linear_macs_per_token(self) -> int | float:
        """Per-token, per-layer MACs of the Q, K, V, O projections and the (active) FFN; with
        ``dense_layers``, the mean over layers (the cost model prices every layer alike)."""
        if self.dense_layers:
            return self.linear_macs_all_layers / self.layers
        return self.attention_macs_per_token + self._ffn_macs

    @cached_property
    def W(self) -> float:
        """Per-token linear+FFN work in units (exact for the shipped models); every priced
        range reads it, so it is computed once per spec."""
        return self.linear_macs_per_token / self.macs_per_unit

    def windows(self) -> tuple[int | None, ...]:
        return self.layer_windows or (None,) * self.layers

    def attention_kinds(self) -> list[AttentionKind]:
        return [AttentionKind.FULL if w is None else AttentionKind.SLIDING for w in self.windows()]

    def window_groups(self) -> dict[int | None, int]:
        """Layer count per window (``None`` = full attention); prices ranges per group."""
        groups: dict[int | None, int] = {}
        for w in self.windows():
            groups[w] = groups.get(w, 0) + 1
        return groups

    @cached_property
    def window_caps(self) -> tuple[tuple[int, int | None], ...]:
        """``window_groups`` as pricing reads it, once per spec: (layer count, position cap)
        per group, the cap ``window - 1`` (None: full attention), in ``window_groups`` order.
        Every priced range reads it, so it is not rebuilt per call."""
        return tuple((count, None if w is None else w - 1)
                     for w, count in self.window_groups().items())

    # --- memory -----------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token (bf16). Capacity is counted in tokens."""
        return 2 * self.kv_heads * self.head_dim * self.layers * self.dtype_bytes

    @property
    def active_params(self) -> int:
        """Parameters read per decode step (linear layers, active experts; no embeddings)."""
        return self.linear_macs_all_layers

    @property
    def total_params(self) -> int:
        """Linear-layer parameters incl. every expert, plus the embeddings and the LM head
        (counted once when tied)."""
        attn = self.attention_macs_per_token
        moe_layer = attn + 3 * self.hidden * (self.ffn + self.expert_ffn * self.experts)
        dense_layer = attn + 3 * self.hidden * self.dense_ffn
        embeddings = (1 if self.tied_embeddings else 2) * self.vocab * self.hidden
        return (moe_layer * (self.layers - self.dense_layers) + dense_layer * self.dense_layers
                + embeddings)

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
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "full_attention_layers": kinds.count(AttentionKind.FULL),
            "sliding_attention_layers": kinds.count(AttentionKind.SLIDING),
            "windows": sorted({w for w in self.windows() if w is not None}),
            "max_context": self.max_context,
            "total_params": self.total_params,
            "source": self.source,
        }


def _alternating(layers: int, window: int, full_every: int, first_full: int) -> tuple:
    """Windows for a model whose layer ``i`` is global iff ``i % full_every == first_full``."""
    return tuple(None if i % full_every == first_full else window for i in range(layers))


SPECS: Registry[ModelSpec] = Registry("model", unique=True)


def register(spec: ModelSpec) -> ModelSpec:
    return SPECS.register(spec.name, spec)


register(ModelSpec("qwen3-8b", layers=36, hidden=4096, q_heads=32, kv_heads=8, head_dim=128,
                   ffn=12288, vocab=151936, max_context=131072, source="Qwen/Qwen3-8B"))
register(ModelSpec("qwen3-32b", layers=64, hidden=5120, q_heads=64, kv_heads=8, head_dim=128,
                   ffn=25600, vocab=151936, max_context=131072, source="Qwen/Qwen3-32B"))
register(ModelSpec("qwen3-235b-a22b", layers=94, hidden=4096, q_heads=64, kv_heads=4,
                   head_dim=128, experts=128, active_experts=8, expert_ffn=1536, vocab=151936,
                   max_context=262144, source="Qwen/Qwen3-235B-A22B(-Instruct-2507)"))
register(ModelSpec("llama-3.1-8b", layers=32, hidden=4096, q_heads=32, kv_heads=8,
                   head_dim=128, ffn=14336, vocab=128256, max_context=131072,
                   source="meta-llama/Llama-3.1-8B"))
register(ModelSpec("llama-3.1-70b", layers=80, hidden=8192, q_heads=64, kv_heads=8,
                   head_dim=128, ffn=28672, vocab=128256, max_context=131072,
                   source="meta-llama/Llama-3.1-70B"))
# gpt-oss-120b: layers alternate sliding (window 128) and full attention, sliding first.
register(ModelSpec("gpt-oss-120b", layers=36, hidden=2880, q_heads=64, kv_heads=8,
                   head_dim=64, experts=128, active_experts=4, expert_ffn=2880, vocab=201088,
                   max_context=131072, layer_windows=_alternating(36, 128, 2, 1),
                   source="openai/gpt-oss-120b",
                   notes="attention sinks and biases ignored; weights MXFP4 in practice"))
# gemma-3-27b: five local layers (window 1024) then one global layer.
register(ModelSpec("gemma-3-27b", layers=62, hidden=5376, q_heads=32, kv_heads=16,
                   head_dim=128, ffn=21504, vocab=262208, max_context=131072,
                   layer_windows=_alternating(62, 1024, 6, 5), source="google/gemma-3-27b-it"))


# The models above have shipped time profiles (kernels-*, derived-h100-*); the catalog of
# config.json facts (costmodel/data/models.yaml, through the config.json reader) adds models
# priced by profiles derived when asked (costmodel/profile.py ``derivable``).
PROFILED: tuple[str, ...] = SPECS.names()
for _name, _fields, _source in catalog_entries():
    register(ModelSpec(_name, **_fields, source=_source))

_FILE_SPECS: dict[str, ModelSpec] = {}


def get_spec(name: str) -> ModelSpec:
    """The one resolution of a ``--model``/``model`` value: a catalog name, or a Hugging Face
    config.json path read by ``costmodel/hfconfig.py`` (once per process; an unreadable file or
    one asking for what kvsim does not model is one ``ModelConfigError`` line, a ``KeyError``
    as an unknown name is)."""
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
