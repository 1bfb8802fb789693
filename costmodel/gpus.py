"""GPUs as deployments are sized: KV-cache tokens from device memory, and the time profile.

``kv_cache_tokens`` is the rule SGLang applies at start-up (``ModelRunner.profile_max_num_token``)
and vLLM's ``gpu_memory_utilization`` follows in effect: a fraction ``mem_fraction`` of each
GPU's memory holds the weights and the KV cache (the rest is left for activations, CUDA graphs
and the runtime), the weights are split evenly over the ``tp`` tensor-parallel ranks, and every
rank holds its share of the KV heads of every token, so::

    kv_bytes_per_rank = memory * mem_fraction - weight_bytes / tp - reserve
    cell_bytes        = 2 (K, V) * kv_heads_per_rank * head_dim * layers * kv_dtype bytes
    kv_heads_per_rank = max(1, kv_heads // tp)        (replicated when tp > kv_heads)
    tokens            = floor(kv_bytes_per_rank / cell_bytes), floored to a whole block

for a full-attention model. A hybrid's KV cache groups are sized as each engine allocates
them (``kv_capacity``: vLLM's one pool of uniform blocks, SGLang's full, SWA and mamba pools;
MLA's latent on every rank; docs/hybrid.md, Capacity in bytes).

``tp`` must be one the engines accept (``tp_refusal``). Each engine's own fraction and reserve
(SGLang's derived ``--mem-fraction-static``, ``sglang_mem_fraction``; vLLM's utilization less
the estimated activation peak and CUDA graphs) are chosen in ``sim/deploy.py``
``memory_rule``; ``kv_cache_tokens``' 0.9 default is a plain number, neither engine's.

The weights are ``ModelSpec.weight_bytes``: every parameter (every expert, an untied
head) as the checkpoint stores it (fp8 linear layers, MXFP4 experts: its quantization_config).
The catalog (``costmodel/data/gpus.yaml``) is data with its sources.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .errors import ProfileError
from .safeyaml import safe_load
from .specs import (
    BOUNDED,
    CONV_STATE_BYTES,
    KV_DTYPE_BITS,
    RECURRENT_STATE_BYTES,
    AttentionKind,
    ModelSpec,
)

MIB = 1 << 20
GIB = 1 << 30
CATALOG = "gpus.yaml"
_FIELDS = {"memory_mib": int, "hbm_tb_s": float, "bf16_tflops": float, "nvlink_gb_s": float,
           "price_usd_h": float}


@dataclass(frozen=True)
class GPU:
    name: str
    memory_mib: int  # as the driver reports it
    hbm_tb_s: float
    bf16_tflops: float
    nvlink_gb_s: float
    profile: str | None  # the aiconfigurator-core system whose kernel tables price it
    price_usd_h: float
    source: str
    pcie_gb_s: float = 64.0  # one direction, per GPU (PCIe Gen5 x16 unless the catalog says)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


def _check(raw: Any, name: str, where: str) -> GPU:
    if not isinstance(raw, dict):
        raise ProfileError(where, name, "must be a mapping of fields")
    unknown = set(raw) - set(_FIELDS) - {"profile", "source", "pcie_gb_s"}
    if unknown:
        raise ProfileError(where, f"{name}.{sorted(unknown)[0]}", "unknown field")
    values: dict[str, Any] = {}
    for key, kind in _FIELDS.items():
        v = raw.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or v < 0 or (key == "memory_mib" and (v <= 0 or v != int(v))):
            raise ProfileError(where, f"{name}.{key}", f"must be a number >= 0, got {v!r}")
        values[key] = kind(v)
    pcie = raw.get("pcie_gb_s", 64.0)
    if isinstance(pcie, bool) or not isinstance(pcie, int | float) or not math.isfinite(pcie) \
            or pcie <= 0:
        raise ProfileError(where, f"{name}.pcie_gb_s", f"must be a number > 0, got {pcie!r}")
    profile = raw.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ProfileError(where, f"{name}.profile", "must be a profile family or null")
    return GPU(name=name, profile=profile, source=str(raw.get("source", "")),
               pcie_gb_s=float(pcie), **values)


def load_gpus(path: str | Path | None = None) -> dict[str, GPU]:
    """The GPU catalog: the shipped one, or a user's file of the same shape."""
    if path is None:
        where = f"costmodel/data/{CATALOG}"
        text = (resources.files("costmodel") / "data" / CATALOG).read_text()
    else:
        where = str(path)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ProfileError(where, "<file>", f"cannot read: {e.strerror}") from None
    try:
        raw = safe_load(text)
    except yaml.YAMLError as e:
        raise ProfileError(where, "<yaml>", f"not valid YAML: {e}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), dict) or not raw["gpus"]:
        raise ProfileError(where, "gpus", "must map GPU names to their fields")
    return {str(k).upper(): _check(v, str(k).upper(), where) for k, v in raw["gpus"].items()}


def get_gpu(name: str, catalog: dict[str, GPU] | None = None) -> GPU:
    gpus = load_gpus() if catalog is None else catalog
    try:
        return gpus[name.upper()]
    except KeyError:
        raise KeyError(f"unknown GPU {name!r}; known: {', '.join(gpus)}") from None


def tp_refusal(spec: ModelSpec, tp: int) -> str | None:
    """Why vLLM and SGLang refuse ``tp`` ranks for ``spec`` (None when they accept it): the
    attention heads must split evenly (vLLM ``config/model.py`` ``verify_with_parallel_config``)
    and so must the KV heads, or each rank holds one replicated KV head when ``tp`` is a
    multiple of them (SGLang ``models/qwen3.py`` ``Qwen3Attention.__init__``)."""
    if spec.q_heads % tp == 0 and (spec.kv_heads % tp == 0 or tp % spec.kv_heads == 0):
        return None
    fits = [t for t in range(1, 2 * max(spec.q_heads, spec.kv_heads) + 1)
            if spec.q_heads % t == 0 and (spec.kv_heads % t == 0 or t % spec.kv_heads == 0)]
    return (f"TP {tp} does not fit {spec.name}: vLLM and SGLang need attention heads % tp == 0 "
            f"and (kv_heads % tp == 0 or tp % kv_heads == 0), and it has {spec.q_heads} "
            f"attention and {spec.kv_heads} KV heads; TP sizes that fit: "
            f"{', '.join(map(str, fits))}")


def kv_heads_per_rank(spec: ModelSpec, tp: int, kind: AttentionKind | None = None) -> int:
    """KV heads each of ``tp`` ranks stores in a layer of ``kind`` (its own heads,
    ``ModelSpec.kv_shape``: Gemma 4's global layers have fewer; None: the model's
    ``kv_heads``): an even share, or one replicated head when ``tp`` exceeds them (a TP that
    ``tp_refusal`` refuses raises ValueError: no share is right)."""
    why = tp_refusal(spec, tp)
    if why is not None:
        raise ValueError(why)
    heads = spec.kv_heads if kind is None else spec.kv_shape(kind)[0]
    return max(1, heads // tp)


def _rank_share(spec: ModelSpec, tp: int, kind: AttentionKind, nbytes: int) -> int:
    """One of ``tp`` ranks' share of ``nbytes`` of a ``kind`` group's KV: an MLA or DSA
    latent whole (every rank holds it), a GQA group's ``kv_heads_per_rank`` of its own heads
    (replicated heads count on every rank)."""
    if kind in (AttentionKind.MLA, AttentionKind.DSA) or not nbytes:
        return nbytes
    heads = spec.kv_shape(kind)[0]
    return nbytes * kv_heads_per_rank(spec, tp, kind) // heads


def shipped_kv_bytes(spec: ModelSpec, tp: int, tokens: int) -> tuple[int, int]:
    """The KV a request of ``tokens`` context holds, over all ``tp`` ranks and on one rank:
    each group what it keeps (``KVGroup.kv_bytes``: every token, a window's last tokens, a
    compressed group's entries; the linear state, which goes apart, left out), a rank its
    ``_rank_share`` (a disaggregated decode rank pulls an MLA or DSA latent whole from one
    prefill rank: SGLang's ``disaggregation/common/conn.py``). A PD link moves one rank's
    bytes (sim/fleet/pd.py)."""
    total = rank = 0
    if tokens <= 0:
        return 0, 0
    for g in spec.groups:
        held = g.kv_bytes(tokens) - g.state_bytes_per_request
        total += held
        rank += _rank_share(spec, tp, g.kind, held)
    return total, rank


def _through(tp: int, channels: int, rank_bytes: int) -> int:
    """Bytes that price a move of ``rank_bytes`` on each of ``tp`` ranks, the ranks side by
    side, through ``channels`` like channels whose summed bandwidth prices it: a move takes
    ``ceil(tp / channels)`` ranks' bytes through one channel, that many times ``channels``
    ranks' bytes through the sum."""
    return -(-tp // channels) * channels * rank_bytes


def kv_bytes_through(spec: ModelSpec, tp: int, channels: int) -> int:
    """Bytes a token's KV costs to copy through ``channels`` (``_through``) on a replica of
    ``tp`` ranks: to host memory or a pool (a profile's PCIe bandwidth is its GPUs'; a pool's
    link is the replica's one). Each rank copies its ``_rank_share`` of every group's bytes
    per token (``KVGroup.kv_bytes_per_token``: a compressed group's entry spread over the
    tokens it stands for)."""
    return _through(tp, channels, sum(_rank_share(spec, tp, g.kind, g.kv_bytes_per_token)
                                      for g in spec.groups))


def decode_read_bytes(spec: ModelSpec, tp: int, channels: int) -> tuple[int, int]:
    """Bytes one decode step reads for one sequence, per token of its context and per
    sequence, through ``channels`` (``_through``: HBM, each rank its ``_rank_share``). Each
    group reads what its attention reads at the new token (docs/hybrid.md, Decode):
    full and MLA layers every token; a sliding layer its window; a chunked layer its current
    chunk, half a chunk on average; a DSA layer the ``index_topk`` latent entries its indexer
    picks and every token's indexer key; a compressed layer its entries, the ``index_topk``
    picked ones where it has an indexer (and every indexer key); a linear layer its state,
    read and written. Capped reads are priced at the cap: a context shorter than the window
    or the top-k is over-priced by at most the cap's bytes a step (at 100K-token agent
    contexts every sequence is past it)."""
    per_token = per_seq = 0
    for g in spec.groups:
        nbytes, indexer = g.kv_bytes_per_token, g.indexer_bytes_per_token
        if g.kind is AttentionKind.LINEAR:
            per_seq += 2 * -(-g.state_bytes_per_request // tp)
        elif g.kind is AttentionKind.SLIDING:
            per_seq += _rank_share(spec, tp, g.kind, (g.window or 1) * nbytes)
        elif g.kind is AttentionKind.CHUNKED:
            per_seq += _rank_share(spec, tp, g.kind, ((g.window or 1) + 1) // 2 * nbytes)
        elif g.kind is AttentionKind.DSA:
            per_token += indexer
            per_seq += spec.index_topk * (nbytes - indexer)
        elif g.kind is AttentionKind.COMPRESSED and g.indexer_layers:
            per_token += _rank_share(spec, tp, g.kind, indexer)
            per_seq += _rank_share(spec, tp, g.kind,
                                   spec.index_topk * (nbytes - indexer) * g.compress_ratio)
        else:  # full, MLA, compressed without an indexer: every token (entry)
            per_token += _rank_share(spec, tp, g.kind, nbytes)
    return _through(tp, channels, per_token), _through(tp, channels, per_seq)


# --- KV capacity per KV cache group, in each engine's own terms (docs/hybrid.md, Capacity in
# bytes). SGLang 0.5.23's fallbacks (sglang/srt/arg_groups/fields/schedule.py):
SWA_FULL_TOKENS_RATIO = 0.8  # --swa-full-tokens-ratio: SWA pool tokens / full pool tokens
MAMBA_FULL_MEMORY_RATIO = 0.9  # --mamba-full-memory-ratio: mamba state memory / KV memory
# vLLM 0.33 aligns a hybrid Mamba model's attention block to this kernel block (FlashAttention
# and FlashInfer: multiples of 16; platforms/interface.py ``_align_hybrid_block_size``)
VLLM_KERNEL_BLOCK = 16
TOKEN_KINDS = (AttentionKind.FULL, AttentionKind.MLA, AttentionKind.DSA,  # hold every token
               AttentionKind.COMPRESSED)  # (one entry per ratio tokens)


@dataclass(frozen=True)
class GroupBytes:
    """One KV cache group (``ModelSpec.groups``) on one of ``tp`` ranks as the engine stores
    it: ``layer_token`` bytes per token in one layer (GQA: its share of the KV heads; MLA and
    DSA: the whole latent, which every rank holds), ``indexer_token`` bytes per token of the
    DSA indexer keys over the group's layers that have an indexer (``KVGroup.indexer_layers``;
    fp8 with an fp32 scale per 128 elements, as both engines store it), ``layer_state`` bytes of one
    request's state in one layer (linear: the convolution window in bf16 and the recurrent
    state in fp32 (SGLang) or the model's bf16 (vLLM's ``--mamba-ssm-cache-dtype auto``),
    heads split over the ranks)."""

    kind: AttentionKind
    layers: int
    window: int | None
    layer_token: int
    layer_state: int = 0
    indexer_token: int = 0

    @property
    def token_bytes(self) -> int:
        return self.layers * self.layer_token + self.indexer_token

    @property
    def state_bytes(self) -> int:
        return self.layers * self.layer_state


def group_bytes(spec: ModelSpec, tp: int, engine: str | None = None) -> tuple[GroupBytes, ...]:
    """``spec``'s KV cache groups on one of ``tp`` ranks under ``engine`` (``GroupBytes``)."""
    bits = KV_DTYPE_BITS[spec.kv_dtype]
    out = []
    for g in spec.groups:
        token = state = indexer = 0
        if spec.compress_ratios:  # DeepSeek-V4: one entry serves as K and V, on every rank
            ratio = g.compress_ratio or 1
            token = spec.kv_heads * spec.head_dim * bits // 8 // ratio
            if g.indexer_layers:  # MXFP4 keys with a scale byte per 32 (SGLang
                # deepseek_v4_memory_pool.py get_dsv4_indexer_bytes_per_token, force_fp4)
                indexer = g.indexer_layers * (spec.index_head_dim // 2
                                              + spec.index_head_dim // 32) // ratio
        elif g.kind in (AttentionKind.MLA, AttentionKind.DSA):
            token = (spec.kv_lora_rank + spec.qk_rope_head_dim) * bits // 8
            if g.kind is AttentionKind.DSA:
                indexer = g.indexer_layers * (spec.index_head_dim
                                              + spec.index_head_dim // 128 * 4)
        elif g.kind is AttentionKind.LINEAR:
            conv = ((spec.linear_conv_kernel - 1)
                    * (2 * spec.linear_key_heads * spec.linear_key_dim
                       + spec.linear_value_heads * spec.linear_value_dim) // tp)
            rec = max(1, spec.linear_value_heads // tp) * spec.linear_key_dim \
                * spec.linear_value_dim
            state = conv * CONV_STATE_BYTES + rec * (
                2 if engine_lane(engine) == "vllm" else RECURRENT_STATE_BYTES)
        else:
            dim = spec.kv_shape(g.kind)[1]
            token = 2 * kv_heads_per_rank(spec, tp, g.kind) * dim * bits // 8
        out.append(GroupBytes(g.kind, g.layers, g.window, token, state, indexer))
    return tuple(out)


@dataclass(frozen=True)
class KVCapacity:
    """One rank's KV memory (``budget`` bytes) in the engine's own terms.

    ``tokens`` is the run's ``gpu_cache``: the tokens a request's full-attention (or MLA/DSA)
    history may take, floored to the run's block. vLLM (one pool of ``num_blocks`` uniform
    blocks of ``block_bytes``, every vLLM KV cache group of ``group_size`` layers allocating
    its ``block_size``-token blocks from it; ``vllm_groups[i]`` groups for ``groups[i]``; a
    running request holds ``state_blocks_per_request`` blocks of Mamba state):
    ``num_blocks x block_size``. SGLang (separate pools): ``full_tokens``, the full pool beside
    an SWA pool of ``swa_tokens`` and a mamba pool of ``mamba_slots`` request states."""

    engine: str
    budget: int
    block_size: int
    tokens: int
    groups: tuple[GroupBytes, ...]
    group_size: int = 0
    vllm_groups: tuple[int, ...] = ()
    num_blocks: int = 0
    block_bytes: int = 0
    full_tokens: int = 0
    swa_tokens: int = 0
    mamba_slots: int = 0

    @property
    def state_blocks_per_request(self) -> int:
        return sum(n for g, n in zip(self.groups, self.vllm_groups, strict=True)
                   if g.kind is AttentionKind.LINEAR)

    @property
    def state_bytes(self) -> int:
        """Bytes of one request's state over every linear layer (one SGLang mamba slot)."""
        return sum(g.state_bytes for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"engine": self.engine, "budget_bytes": self.budget,
                             "block_size": self.block_size, "tokens": self.tokens,
                             "groups": [{"kind": str(g.kind), "layers": g.layers,
                                         "window": g.window, "token_bytes": g.token_bytes,
                                         "state_bytes": g.state_bytes} for g in self.groups]}
        if self.engine == "vllm":
            d.update(group_size=self.group_size, vllm_groups=list(self.vllm_groups),
                     num_blocks=self.num_blocks, block_bytes=self.block_bytes,
                     state_blocks_per_request=self.state_blocks_per_request)
        else:
            d.update(full_tokens=self.full_tokens, swa_tokens=self.swa_tokens,
                     mamba_slots=self.mamba_slots, state_bytes=self.state_bytes)
        return d


def _vllm_capacity(groups: tuple[GroupBytes, ...], budget: int, bs: int) -> KVCapacity:
    """vLLM 0.33's ``kv_cache_planning.py``: layers of one spec form a bucket, buckets split
    into groups of ``group_size`` layers (the smallest bucket, or the largest when under 1.5x
    the smallest; padded), one block of every group has the same bytes, and ``num_blocks =
    budget // (group_size x page)``. A Mamba bucket's page (its state, padded) must fit an
    attention page: the block grows to ``16 x cdiv(state, 16 x attention bytes per token)``
    (``_align_hybrid_block_size``)."""
    sizes = [g.layers for g in groups]
    group_size = min(sizes)
    if max(sizes) < 1.5 * group_size:
        group_size = max(sizes)
    layer_token = max(g.layer_token for g in groups)
    layer_state = max(g.layer_state for g in groups)
    block = bs
    if layer_state and layer_token:
        align = max(VLLM_KERNEL_BLOCK, bs)
        block = max(bs, align * -(-layer_state // (align * layer_token)))
    page = block * layer_token if layer_token else layer_state
    # DSA's indexer caches share the MLA layers' block table (one group of uniform type,
    # UniformTypeKVCacheSpecs): their bytes join each block
    block_bytes = group_size * page + block * sum(g.indexer_token for g in groups)
    num_blocks = max(0, budget) // block_bytes
    return KVCapacity("vllm", budget, block, num_blocks * block // bs * bs, groups,
                      group_size, tuple(-(-n // group_size) for n in sizes), num_blocks,
                      block_bytes)


def _sglang_capacity(groups: tuple[GroupBytes, ...], budget: int, bs: int,
                     one_pool: bool = False) -> KVCapacity:
    """SGLang 0.5.23: a mamba pool first (``kv_cache_configurator.py``
    ``_handle_max_mamba_cache``: ``ratio / (1 + ratio)`` of the memory, less one padding
    slot), then the full pool beside an SWA pool of ``swa_full_tokens_ratio`` as many tokens
    (``pool_configurator.py`` ``HybridSWAPoolConfigurator``), else one pool of every layer
    (``one_pool``: window layers too, each keeping every token at its own shape)."""
    rest = max(0, budget)
    state = sum(g.state_bytes for g in groups)
    slots = 0
    if state:
        share = rest * MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO)
        slots = max(0, int((share - state) // state))
        rest = max(0, rest - (slots + 1) * state)
    full = sum(g.token_bytes for g in groups if g.kind in TOKEN_KINDS)
    swa = sum(g.token_bytes for g in groups if g.kind in BOUNDED)
    if one_pool:
        full, swa = full + swa, 0
    if full and swa:
        full_tokens = int(rest // (full + SWA_FULL_TOKENS_RATIO * swa)) // bs * bs
        swa_tokens = int(full_tokens * SWA_FULL_TOKENS_RATIO) // bs * bs
    else:  # one kind of token group (or none)
        full_tokens = rest // (full or swa) // bs * bs if full or swa else 0
        swa_tokens = 0 if full else full_tokens
    return KVCapacity("sglang", budget, bs, full_tokens, groups, full_tokens=full_tokens,
                      swa_tokens=swa_tokens, mamba_slots=slots)


# The architectures SGLang 0.5.23 gives an SWA pool beside the full one
# (sglang/srt/configs/model_config.py ``is_hybrid_swa_model``: its allow-list with
# ``SWA_SINK_ARCHS`` and ``MIMO_V2_MODEL_ARCHS``); any other model with sliding layers keeps
# every layer in one pool (Gemma 2/3, whose model overrides also set
# disable_hybrid_swa_memory, or a Qwen3 config.json with sliding ``layer_types``).
SGLANG_SWA_POOL_ARCHS = frozenset({
    "BeamForCausalLM", "Llama4ForConditionalGeneration", "DeepseekV4ForCausalLM",
    "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark", "GptOssForCausalLM",
    "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM", "IQuestQ1ForCausalLM", "IQuestQ1MTP",
    "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM", "MiMoV2MTP", "Step3p5ForCausalLM",
    "Step3p5MTP", "Step3p7ForConditionalGeneration", "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration", "EmbeddingGemma2Model",
    "Gemma4UnifiedForConditionalGeneration", "DiffusionGemmaForBlockDiffusion",
    "LagunaForCausalLM", "MellumForCausalLM", "MuseGlimmerForCausalLM",
    "MuseGlimmerForConditionalGeneration", "InklingForConditionalGeneration",
    "InklingForConditionalGenerationMTP", "UnlimitedOCRForCausalLM"})


def sglang_one_pool(spec: ModelSpec, hybrid_swa_memory: bool = True) -> bool:
    """Whether SGLang keeps an SWA hybrid (full layers beside sliding layers of one window)
    in one pool of every layer: any architecture SGLang does not list for an SWA pool
    (``SGLANG_SWA_POOL_ARCHS``), or any under ``--hybrid-swa-memory off`` (SGLang's
    ``--disable-hybrid-swa-memory``). A spec without an architecture goes by its layer
    kinds (the SWA pool)."""
    kinds = {g.kind for g in spec.groups}
    windows = {g.window for g in spec.groups if g.kind is AttentionKind.SLIDING}
    return (kinds == {AttentionKind.FULL, AttentionKind.SLIDING} and len(windows) == 1
            and (not hybrid_swa_memory or (spec.architecture != ""
                                           and spec.architecture not in SGLANG_SWA_POOL_ARCHS)))


def kv_capacity(spec: ModelSpec, budget: int, tp: int = 1, engine: str | None = None,
                block_size: int = 64, hybrid_swa_memory: bool = True) -> KVCapacity:
    """What ``budget`` bytes of KV memory on each of ``tp`` ranks hold of ``spec`` (at its
    ``kv_dtype``) under ``engine`` (vLLM, else SGLang), per KV cache group in the engine's
    own terms (``KVCapacity``; docs/hybrid.md, Capacity in bytes). A model of one group
    (full attention, MLA, DSA, every layer sliding) gets ``budget // (bytes per token) //
    block_size x block_size`` tokens under both engines, and so does an SWA hybrid that
    SGLang keeps in one pool of every layer (``sglang_one_pool``: Gemma 2/3, or
    ``hybrid_swa_memory`` off: SGLang's ``--disable-hybrid-swa-memory``) at every layer's
    bytes of a token, window layers at their own KV shape (Gemma 4's differ from its global
    layers'); the groups stay the model's."""
    groups = group_bytes(spec, tp, engine)
    if engine_lane(engine) == "vllm":
        return _vllm_capacity(groups, budget, block_size)
    return _sglang_capacity(groups, budget, block_size,
                            sglang_one_pool(spec, hybrid_swa_memory))


@dataclass(frozen=True)
class KVSizing:
    """How the KV-cache tokens of one replica (``tp`` GPUs) were derived."""

    gpu: str
    tp: int
    mem_fraction: float
    memory_bytes: int  # per GPU
    weight_bytes_per_rank: int
    reserve_bytes: int
    cell_bytes: int  # KV bytes one token writes on one rank, over every group
    tokens: int
    capacity: KVCapacity | None = None  # per group, in the engine's terms

    @property
    def kv_bytes_per_rank(self) -> int:
        return self.tokens * self.cell_bytes


def kv_cache_tokens(spec: ModelSpec, gpu: GPU, tp: int = 1, mem_fraction: float = 0.9,
                    block_size: int = 64, reserve_bytes: int = 0,
                    engine: str | None = None, hybrid_swa_memory: bool = True) -> KVSizing:
    """The KV tokens one replica of ``spec`` on ``tp`` x ``gpu`` holds (module docstring),
    under ``engine``'s allocation of its KV cache groups (``kv_capacity``). Raises
    ValueError when the weights leave no room for one block."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if not 0 < mem_fraction <= 1:
        raise ValueError(f"the memory fraction must be in (0, 1], got {mem_fraction}")
    per_rank_weights = -(-spec.weight_bytes // tp)
    budget = int(gpu.memory_bytes * mem_fraction) - per_rank_weights - reserve_bytes
    cap = kv_capacity(spec, budget, tp, engine, block_size, hybrid_swa_memory)
    cell = sum(g.token_bytes for g in cap.groups)
    tokens = cap.tokens
    if tokens < block_size:
        raise ValueError(
            f"{spec.name} on {tp} x {gpu.name} at memory fraction {mem_fraction:g}: the "
            f"weights ({per_rank_weights / GIB:.1f} GiB per GPU) leave no room for a KV "
            f"cache in {gpu.memory_bytes * mem_fraction / GIB:.1f} GiB; use more GPUs (--tp) "
            "or a larger GPU")
    return KVSizing(gpu.name, tp, mem_fraction, gpu.memory_bytes, per_rank_weights,
                    reserve_bytes, cell, tokens, cap)


def _sglang_prefill_graph_sizes(max_bs: int) -> list[int]:
    """SGLang 0.5.23's prefill CUDA-graph sizes (``sglang/srt/arg_groups/cuda_graph_hook.py``
    ``generate_prefill_cuda_graph_batch_sizes``)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_bs + 1, 512)]
    return [s for s in sizes if s <= max_bs]


def sglang_mem_fraction(memory_mib: int, tp: int, chunk: int,
                        max_running: int | None = None) -> float:
    """SGLang 0.5.23's ``--mem-fraction-static`` default, as ``handle_gpu_memory_settings``
    derives it (``sglang/srt/arg_groups/memory_hook.py``, aggregated serving on CUDA: decode
    graphs FULL, prefill graphs BREAKABLE, no post-capture sizing, which is off by default),
    in MiB: reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024 + graphs, at least
    10 GiB on a GPU above 60 GiB; graphs = 2 * decode max_bs (256 below TP 4 else 512 on a
    35-160 GiB GPU, ... ; capped by ``--max-running-requests``) + 8 per prefill graph size up
    to ``chunk`` (``reserve_for_graph_mb``); fraction = round((mem - reserved) / mem, 3)."""
    if memory_mib < 20 * 1024:
        max_bs = 8
    elif memory_mib < 35 * 1024:
        max_bs = 48 if tp < 4 else 160
    elif memory_mib < 60 * 1024:
        max_bs = 32 if tp < 4 else 160
    elif memory_mib < 160 * 1024:
        max_bs = 256 if tp < 4 else 512
    else:
        max_bs = 512
    if max_running is not None and max_bs > max_running:
        max_bs = max_running
    graphs = max_bs * 2 + len(_sglang_prefill_graph_sizes(chunk)) * 8
    reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024 + graphs
    if memory_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((memory_mib - reserved) / memory_mib, 3)


def vllm_activation_peak_bytes(spec: ModelSpec, tp: int, batched_tokens: int,
                               max_seqs: int) -> int:
    """An estimate of the activation peak vLLM measures in its start-up profile run
    (``v1/worker/gpu_worker.py`` ``determine_available_memory``: a dummy forward of
    ``max_num_batched_tokens`` tokens, then a dummy sampler over ``max_num_seqs`` rows). kvsim
    cannot run it, so it takes the larger of the two live sets: the forward's MLP
    (gate/up output plus the activated half: 3 x FFN width per rank) and residual (2 x hidden)
    per token in the model dtype, and the sampler's logits and probabilities (2 x vocab in
    fp32) per row. An assumption, not a measurement (docs/engine.md, GPUs)."""
    ffn = spec.ffn or spec.active_experts * spec.expert_ffn
    forward = batched_tokens * (3 * -(-ffn // tp) + 2 * spec.hidden) * spec.dtype_bytes
    sampler = max_seqs * spec.vocab * 4 * 2
    return max(forward, sampler)


def vllm_graph_bytes(max_seqs: int, gpu: GPU) -> int:
    """An estimate of the CUDA-graph memory vLLM measures (``profile_cudagraph_memory``):
    graphs are captured up to ``min(2 * max_num_seqs, 512)`` tokens (1024 on Blackwell;
    ``config/vllm.py``), priced at SGLang's 2 MiB per token of the largest decode graph
    (``reserve_for_graph_mb``). An assumption, not a measurement."""
    ceiling = 1024 if gpu.name.startswith("B") else 512
    return min(2 * max_seqs, ceiling) * 2 * MIB


LANES = ("sglang", "vllm")  # engines whose kernel tables price them (their own lane first)


def engine_lane(engine: str | None) -> str:
    """The kernel-table lane of an engine: ``vllm`` (and its variants) or ``sglang``."""
    return "vllm" if (engine or "").startswith("vllm") else "sglang"


def kernel_profile_name(system: str, lane: str, model: str, tp: int | None = None,
                        ep: int = 1) -> str:
    """The one naming rule of kernel-table profiles (``calibration/kernels/ship.py`` writes
    them): ``kernels-<system>-[<lane>-]<model>[-tp<tp>][-dp<ep>ep<ep>]``; SGLang's lane and
    the model's default GPU count (``costmodel/derive.py`` ``GPUS``) are left out of the
    name, so the profiles shipped before lanes and TP keep their names. ``-dp2ep2``: one GPU
    of a vLLM DP 2 x EP 2 group (``calibration/kernels/compose.py``)."""
    from .derive import GPUS

    lane_part = "" if lane == "sglang" else f"{lane}-"
    tp_part = "" if tp is None or tp == GPUS.get(model, 1) else f"-tp{tp}"
    ep_part = f"-dp{ep}ep{ep}" if ep > 1 else ""
    return f"kernels-{system}-{lane_part}{model}{tp_part}{ep_part}"


def roofline_profile_name(gpu: str, model: str, tp: int) -> str:
    """``roofline-<gpu>-<model>[-tp<tp>]``: a GPU's datasheet roofline, derived on demand
    (``costmodel/derive.py`` ``roofline``); the H100's is ``derived-h100-MODEL``."""
    from .derive import GPUS

    tp_part = "" if tp == GPUS.get(model, 1) else f"-tp{tp}"
    return f"roofline-{gpu.lower()}-{model}{tp_part}"


def _shipped_tps(shipped: set[str], system: str, lane: str, model: str) -> dict[int, str]:
    """The TP sizes shipped for (system, lane, model), by name."""
    from .derive import GPUS

    base = kernel_profile_name(system, lane, model)
    out = {GPUS.get(model, 1): base} if base in shipped else {}
    for name in shipped:
        tail = name.removeprefix(base + "-tp")
        if name != tail and tail.isdigit():
            out[int(tail)] = name
    return out


@dataclass(frozen=True)
class ProfileChoice:
    """The time profile a (GPU, model, TP) deployment is priced with, and whether it was
    measured for exactly that deployment (``note`` says what was used instead)."""

    name: str
    exact: bool
    note: str


def profile_for(gpu: GPU, model: str, tp: int, engine: str | None = None,
                ep: int = 1) -> ProfileChoice:
    """The profile of ``model`` on ``tp`` x ``gpu`` under ``engine`` (default SGLang), and
    what differs when it is not exact (``note``). In order: the kernel-table profile of the
    GPU's system at that TP in the engine's lane (exact); the other lane at that TP; the
    nearest shipped TP (engine's lane first); for a GPU or model without kernel tables, the
    GPU's datasheet roofline at that TP (``roofline-<gpu>-MODEL``; the H100's is
    ``derived-h100-MODEL``), labelled so. No GPU is ever priced at another GPU's speed.
    ``ep > 1`` (a vLLM DP ``ep`` x EP ``ep`` group at TP 1, each DP rank a replica): the
    ``-dp<ep>ep<ep>`` profile of the engine's lane, then the other's; without one, the TP
    profile above with a note that the expert split and its dispatch are not priced."""
    from .derive import GPUS
    from .profile import shipped_profiles

    lane = engine_lane(engine)
    lanes = (lane, *(x for x in LANES if x != lane))
    if ep > 1:
        if gpu.profile:
            shipped = set(shipped_profiles())
            for ln in lanes:
                name = kernel_profile_name(gpu.profile, ln, model, tp, ep)
                if name in shipped:
                    return ProfileChoice(name, ln == lane, "" if ln == lane else
                                         f"no {lane} kernel tables for {model} DP{ep} x EP{ep} "
                                         f"on {gpu.profile}; priced with {name} ({ln} kernels)")
        base = profile_for(gpu, model, tp, engine)
        return ProfileChoice(base.name, False, "; ".join(filter(None, (
            f"no DP{ep} x EP{ep} profile for {model} on {gpu.name}: priced as TP {tp} "
            f"replicas with {base.name}, the expert split and its dispatch not priced",
            base.note))))
    if gpu.profile:
        shipped = set(shipped_profiles())
        found = {ln: _shipped_tps(shipped, gpu.profile, ln, model) for ln in lanes}
        for ln in lanes:
            if tp in found[ln]:
                name = found[ln][tp]
                if ln == lane:
                    return ProfileChoice(name, True, "")
                return ProfileChoice(name, False, f"no {lane} kernel tables for {model} on "
                                     f"{gpu.profile}; priced with {name} ({ln} kernels, "
                                     f"{tp} x {gpu.name})")
        for ln in lanes:
            if found[ln]:
                near = min(found[ln], key=lambda t: (abs(t - tp), t))
                name = found[ln][near]
                what = "" if ln == lane else f", {ln} kernels"
                return ProfileChoice(name, False, f"no kernel-table profile for {model} on "
                                     f"{tp} x {gpu.name}; priced with {name} ({near} x "
                                     f"{gpu.name}{what})")
    if gpu.name == "H100":  # the H100's datasheet profile, shipped or derived on demand
        name = f"derived-h100-{model}"
        measured = GPUS.get(model, 1)
        at = "" if measured == tp else f" ({measured} x H100, the run is TP {tp})"
        return ProfileChoice(name, False, f"no kernel-table profile for {model} on H100; "
                             f"priced with its datasheet roofline {name}{at}")
    name = roofline_profile_name(gpu.name, model, tp)
    why = (f"no kernel tables for {gpu.name}" if not gpu.profile else
           f"no kernel-table profile for {model} on {gpu.name}")
    return ProfileChoice(name, False, f"{why}; priced with its datasheet roofline {name} "
                         "(peaks x stated efficiencies, not measured)")
