"""GPUs as deployments are sized: KV-cache tokens from device memory, and the time profile.

``kv_cache_tokens`` is the rule SGLang applies at start-up (``ModelRunner.profile_max_num_token``)
and vLLM's ``gpu_memory_utilization`` follows in effect: a fraction ``mem_fraction`` of each
GPU's memory holds the weights and the KV cache (the rest is left for activations, CUDA graphs
and the runtime), the weights are split evenly over the ``tp`` tensor-parallel ranks, and every
rank holds its share of the KV heads of every token, so::

    kv_bytes_per_rank = memory * mem_fraction - weight_bytes / tp - reserve
    cell_bytes        = 2 (K, V) * kv_heads_per_rank * head_dim * layers * dtype_bytes
    kv_heads_per_rank = max(1, kv_heads // tp)        (replicated when tp > kv_heads)
    tokens            = floor(kv_bytes_per_rank / cell_bytes), floored to a whole block

``weight_bytes`` is ``ModelSpec.total_params * dtype_bytes`` (every expert, an untied head): it
overstates models that tie their embeddings (gemma-3) or ship 4-bit experts (gpt-oss), which
``notes`` say. The catalog (``costmodel/data/gpus.yaml``) is data with its sources.
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
from .specs import ModelSpec

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
    profile: str | None  # the shipped kernels-<profile>-MODEL family measured on it
    price_usd_h: float
    source: str

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


def _check(raw: Any, name: str, where: str) -> GPU:
    if not isinstance(raw, dict):
        raise ProfileError(where, name, "must be a mapping of fields")
    unknown = set(raw) - set(_FIELDS) - {"profile", "source"}
    if unknown:
        raise ProfileError(where, f"{name}.{sorted(unknown)[0]}", "unknown field")
    values: dict[str, Any] = {}
    for key, kind in _FIELDS.items():
        v = raw.get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or v < 0 or (key == "memory_mib" and (v <= 0 or v != int(v))):
            raise ProfileError(where, f"{name}.{key}", f"must be a number >= 0, got {v!r}")
        values[key] = kind(v)
    profile = raw.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ProfileError(where, f"{name}.profile", "must be a profile family or null")
    return GPU(name=name, profile=profile, source=str(raw.get("source", "")), **values)


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


def kv_heads_per_rank(spec: ModelSpec, tp: int) -> int:
    return max(1, spec.kv_heads // tp)


def weight_bytes(spec: ModelSpec) -> int:
    return spec.total_params * spec.dtype_bytes


@dataclass(frozen=True)
class KVSizing:
    """How the KV-cache tokens of one replica (``tp`` GPUs) were derived."""

    gpu: str
    tp: int
    mem_fraction: float
    memory_bytes: int  # per GPU
    weight_bytes_per_rank: int
    reserve_bytes: int
    cell_bytes: int  # KV bytes of one token on one rank
    tokens: int

    @property
    def kv_bytes_per_rank(self) -> int:
        return self.tokens * self.cell_bytes


def kv_cache_tokens(spec: ModelSpec, gpu: GPU, tp: int = 1, mem_fraction: float = 0.9,
                    block_size: int = 64, reserve_bytes: int = 0) -> KVSizing:
    """The KV tokens one replica of ``spec`` on ``tp`` x ``gpu`` holds (module docstring).
    Raises ValueError when the weights leave no room for one block."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if not 0 < mem_fraction <= 1:
        raise ValueError(f"the memory fraction must be in (0, 1], got {mem_fraction}")
    per_rank_weights = -(-weight_bytes(spec) // tp)
    budget = int(gpu.memory_bytes * mem_fraction) - per_rank_weights - reserve_bytes
    cell = 2 * kv_heads_per_rank(spec, tp) * spec.head_dim * spec.layers * spec.dtype_bytes
    tokens = max(0, budget) // cell // block_size * block_size
    if tokens < block_size:
        raise ValueError(
            f"{spec.name} on {tp} x {gpu.name} at memory fraction {mem_fraction:g}: the "
            f"weights ({per_rank_weights / GIB:.1f} GiB per GPU) leave no room for a KV "
            f"cache in {gpu.memory_bytes * mem_fraction / GIB:.1f} GiB; use more GPUs (--tp) "
            "or a larger GPU")
    return KVSizing(gpu.name, tp, mem_fraction, gpu.memory_bytes, per_rank_weights,
                    reserve_bytes, cell, tokens)


@dataclass(frozen=True)
class ProfileChoice:
    """The time profile a (GPU, model, TP) deployment is priced with, and whether it was
    measured for exactly that deployment (``note`` says what was used instead)."""

    name: str
    exact: bool
    note: str


def profile_for(gpu: GPU, model: str, tp: int) -> ProfileChoice:
    """The shipped profile measured for ``model`` on ``tp`` x ``gpu`` (kernels-<family>-MODEL
    with that GPU count); otherwise the closest shipped one, said in ``note``: the same GPU at
    another TP, else the H100 one (the kvsim default)."""
    from .profile import load_profile, shipped_profiles

    shipped = set(shipped_profiles())
    family = f"kernels-{gpu.profile}-{model}" if gpu.profile else None
    if family in shipped:
        measured_tp = load_profile(family).gpus
        if measured_tp == tp:
            return ProfileChoice(family, True, "")
        return ProfileChoice(family, False, f"no measured profile for {model} on {tp} x "
                             f"{gpu.name}; priced with {family} ({measured_tp} x {gpu.name})")
    fallback = f"kernels-h100_sxm-{model}"
    if fallback not in shipped:
        fallback = f"derived-h100-{model}"
    return ProfileChoice(fallback, False, f"no measured profile for {gpu.name}; priced with "
                         f"{fallback} (H100), memory sized for {gpu.name}")
