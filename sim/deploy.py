"""A run in GPUs: ``gpu``, ``tp`` and ``mem_fraction`` into KV-cache tokens and a time profile.

``resolve_gpu_fields`` turns the fields a user wrote (command line or sweep point) into the
ones a ``RunConfig`` holds: ``gpu_cache`` in tokens, whether it was given as tokens, as bytes
of KV per GPU (``40GiB``: through the model's KV bytes per token on one of ``tp`` ranks) or
derived from the GPU (``costmodel/gpus.py`` ``kv_cache_tokens``), and the profile measured
for that GPU and TP (``profile_for``; where none is, the run says what it used).
Contradictions are refused: a token count beside ``gpu`` that is not the one the GPU gives,
a ``mem_fraction`` beside a byte budget, more KV bytes than the GPU holds beside the weights.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from costmodel.gpus import GPU, get_gpu, kv_cache_tokens, kv_heads_per_rank, profile_for
from costmodel.gpus import weight_bytes as model_weight_bytes
from costmodel.specs import ModelSpec, get_spec
from sim.config import ConfigError

DEFAULT_MEM_FRACTION = 0.9  # SGLang's --mem-fraction-static and vLLM's default utilization
# spelt exactly (``3mb`` is a typo of a size in tokens, refused as one)
_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(KiB|MiB|GiB|TiB|KB|MB|GB|TB)\s*$")
_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def parse_kv_bytes(text: Any) -> int | None:
    """Bytes of ``40GiB``, ``512MiB``, ``80GB`` (a unit ending in a capital B, spelt as
    here); None for anything else (a size in tokens)."""
    if not isinstance(text, str):
        return None
    m = _BYTES.match(text)
    if m is None:
        return None
    return int(Decimal(m.group(1)) * _UNITS[m.group(2)])


def cell_bytes(spec: ModelSpec, tp: int) -> int:
    """KV bytes of one token on one of ``tp`` ranks."""
    return 2 * kv_heads_per_rank(spec, tp) * spec.head_dim * spec.layers * spec.dtype_bytes


def tokens_from_bytes(spec: ModelSpec, nbytes: int, tp: int, block_size: int) -> int:
    return nbytes // cell_bytes(spec, tp) // block_size * block_size


def resolve_gpu_fields(point: dict[str, Any], where: str,
                       spell=lambda f: f) -> dict[str, Any]:
    """``point`` (RunConfig fields as written; ``gpu_cache`` may be text) with ``gpu_cache``
    in tokens and, for a ``gpu``, its profile (module docstring). ``spell`` names a field as
    the caller's user wrote it (``--gpu-cache`` on the command line)."""
    out = dict(point)
    gpu_name, tp, fraction = out.get("gpu"), out.get("tp"), out.get("mem_fraction")
    nbytes = parse_kv_bytes(out.get("gpu_cache"))
    if gpu_name is None and nbytes is None:
        return out  # tokens as before (``tp`` and ``mem_fraction`` alone: IDLE_RULES refuse)
    model = out.get("model", "qwen3-8b")
    try:
        spec = get_spec(model)
    except KeyError as e:
        raise ConfigError(where, "model", str(e.args[0])) from None
    if tp is not None and (isinstance(tp, bool) or not isinstance(tp, int) or tp < 1):
        raise ConfigError(where, "tp", f"must be a positive integer, got {tp!r}")
    tp = tp or 1
    bs = out.get("block_size", 64)
    if nbytes is not None:
        out["gpu_cache_bytes"] = nbytes
        out["gpu_cache"] = tokens_from_bytes(spec, nbytes, tp, bs)
        if out["gpu_cache"] < 4 * bs:
            raise ConfigError(where, "gpu_cache", f"{point['gpu_cache']} holds "
                              f"{out['gpu_cache']} tokens of {model} per replica: fewer "
                              "than 4 blocks")
    if gpu_name is None:
        return out
    try:
        gpu = get_gpu(str(gpu_name))
    except KeyError as e:
        raise ConfigError(where, "gpu", str(e.args[0])) from None
    out["gpu"] = gpu.name
    if nbytes is not None:
        _check_budget(spec, gpu, tp, nbytes, where, spell)
    else:
        try:
            sized = kv_cache_tokens(spec, gpu, tp, DEFAULT_MEM_FRACTION if fraction is None
                                    else fraction, bs)
        except ValueError as e:
            raise ConfigError(where, "gpu", str(e)) from None
        given = out.get("gpu_cache")
        if given is not None and given != sized.tokens:
            raise ConfigError(where, "gpu_cache", f"{given:,} tokens contradicts "
                              f"{spell('gpu')} {gpu.name} (x{tp}), which holds "
                              f"{sized.tokens:,} tokens of {model}: drop one, or give "
                              f"{spell('gpu_cache')} in bytes of KV per GPU (e.g. 40GiB)")
        out["gpu_cache"] = sized.tokens
    if out.get("profile") is None:
        out["profile"] = profile_for(gpu, model, tp).name
    return out


def _check_budget(spec: ModelSpec, gpu: GPU, tp: int, nbytes: int, where: str, spell) -> None:
    room = gpu.memory_bytes - -(-model_weight_bytes(spec) // tp)
    if nbytes > room:
        raise ConfigError(where, "gpu_cache", f"{nbytes / 2**30:.1f} GiB of KV per GPU does "
                          f"not fit {spell('gpu')} {gpu.name} x{tp}: {room / 2**30:.1f} GiB "
                          f"are left beside {spec.name}'s weights")


def gpus_per_replica(cfg, profile) -> int:
    """The GPUs one replica runs on: its TP on a ``gpu``, else the profile's measured count."""
    if cfg.cache.gpu is not None:
        return cfg.cache.tp or 1
    return int(profile.gpus)


def profile_note(cfg, profile) -> str:
    """Empty when the profile was measured for the run's GPU and TP (or no GPU was named);
    else what the run was priced with instead."""
    if cfg.cache.gpu is None:
        return ""
    tp = cfg.cache.tp or 1
    choice = profile_for(get_gpu(cfg.cache.gpu), cfg.cache.model, tp)
    if profile.name == choice.name:
        return choice.note
    return (f"priced with the profile {profile.name} ({profile.gpus} x {profile.device}), "
            f"chosen with --profile, for {tp} x {cfg.cache.gpu}")


def deployment_fields(cfg, profile) -> dict[str, Any]:
    """GPUs used and KV tokens per GPU for every run summary."""
    per_replica = gpus_per_replica(cfg, profile)
    # a disaggregated fleet's replicas are its two pools (sim/fleet/pd.py)
    replicas = cfg.pd.prefill_replicas + cfg.pd.decode_replicas if cfg.is_pd else cfg.fleet.replicas
    fields: dict[str, Any] = {
        "gpus": replicas * per_replica, "gpus_per_replica": per_replica,
        "kv_tokens_per_gpu": cfg.cache.gpu_cache // per_replica,
    }
    if cfg.cache.gpu is not None:
        fields.update(gpu=cfg.cache.gpu, tp=cfg.cache.tp or 1, mem_fraction=(
            None if cfg.cache.gpu_cache_bytes is not None else cfg.cache.mem_fraction
            if cfg.cache.mem_fraction is not None else DEFAULT_MEM_FRACTION),
            profile_note=profile_note(cfg, profile))
    if cfg.cache.gpu_cache_bytes is not None:
        fields["kv_bytes_per_gpu"] = cfg.cache.gpu_cache_bytes
    return fields
