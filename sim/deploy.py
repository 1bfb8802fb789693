"""A run in GPUs: ``gpu``, ``tp`` and ``mem_fraction`` into KV-cache tokens and a time profile.

``resolve_gpu_fields`` turns the fields a user wrote (command line or sweep point) into the
ones a ``RunConfig`` holds: ``gpu_cache`` in tokens, whether it was given as tokens, as bytes
of KV per GPU (``40GiB``: through the model's KV cache groups on one of ``tp`` ranks at its
``kv_dtype``, as the engine allocates them: ``costmodel/gpus.py`` ``kv_capacity``, SGLang's
its one pool of every layer for Gemma 2/3 or ``hybrid_swa_memory`` off) or derived from the
GPU (``costmodel/gpus.py`` ``kv_cache_tokens``, at the engine's own memory rule:
``memory_rule``), and the profile measured for that GPU and TP (``profile_for``; where
none is, the run says what it used). A replica's TP is ``tp`` when given, else the GPU count of
the profile it is priced with (``default_tp``); the KV bytes, the GPU count and the per-GPU
rates all use that one number (``replica_tp``). Refused: a TP the engines refuse for the
model (``check_tp``), a token count beside ``gpu`` that is not the one the GPU gives, a
``mem_fraction`` beside a byte budget, more KV bytes than the GPU holds beside the weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from costmodel.gpus import (
    GIB,
    GPU,
    get_gpu,
    group_bytes,
    kv_cache_tokens,
    kv_capacity,
    profile_for,
    sglang_mem_fraction,
    tp_refusal,
    vllm_activation_peak_bytes,
    vllm_graph_bytes,
)
from costmodel.specs import ModelSpec, get_spec
from sim.config import KNOBS, ConfigError, SGLangKnobs

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


def cell_bytes(spec: ModelSpec, tp: int, engine: str | None = None) -> int:
    """KV bytes one token writes on one of ``tp`` ranks, over every KV cache group at the
    spec's ``kv_dtype`` (``costmodel.gpus.group_bytes``; a linear group's state is per
    request, not per token)."""
    return sum(g.token_bytes for g in group_bytes(spec, tp, engine))


def tokens_from_bytes(spec: ModelSpec, nbytes: int, tp: int, block_size: int,
                      engine: str | None = None, hybrid_swa_memory: bool = True) -> int:
    """The run's tokens (``gpu_cache``) of ``nbytes`` of KV per GPU under ``engine``'s
    allocation of the KV cache groups (``costmodel.gpus.kv_capacity``)."""
    return kv_capacity(spec, nbytes, tp, engine, block_size, hybrid_swa_memory).tokens


def check_tp(model: str, tp: Any, where: str, spell=lambda f: f) -> None:
    """Refuse a TP size the engines refuse for ``model`` (``costmodel.gpus.tp_refusal``), or
    one that is not a positive integer: one ConfigError naming ``tp`` as ``spell`` writes it.
    ``kvsim run`` and ``kvsim plan`` call it before anything runs."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ConfigError(where, "tp", f"{spell('tp')} must be a positive integer, got {tp!r}")
    try:
        spec = get_spec(model)
    except KeyError as e:
        raise ConfigError(where, "model", str(e.args[0])) from None
    why = tp_refusal(spec, tp)
    if why is not None:
        raise ConfigError(where, "tp", f"{spell('tp')} {why.removeprefix('TP ')}")


def default_tp(profile: str | None, gpu: GPU | None, model: str,
               engine: str | None = None) -> int:
    """A replica's TP when none is given: the GPU count of the profile it is priced with
    (``profile``, else ``profile_for`` on ``gpu`` at the model's default GPU count,
    ``costmodel/derive.py`` ``GPUS``, in ``engine``'s lane, else the model's default H100
    profile). One rule for sizing and for counting GPUs (docs/engine.md, GPUs)."""
    from costmodel.derive import GPUS
    from costmodel.profile import load_profile

    if profile is None and gpu is not None:
        profile = profile_for(gpu, model, GPUS.get(model, 1), engine).name
    return int(load_profile(profile, model).gpus)


@dataclass(frozen=True)
class MemoryRule:
    """How much of each GPU a replica's weights and KV may take: ``fraction`` of its memory
    less ``reserve_bytes`` (``costmodel.gpus.kv_cache_tokens``), and where that came from."""

    fraction: float
    reserve_bytes: int
    source: str


def memory_rule(spec: ModelSpec, gpu: GPU, tp: int, fraction: float | None, engine: str,
                chunk: int, max_running: int | None, vllm_version: str,
                pd: bool) -> MemoryRule:
    """The engine's own start-up rule when ``fraction`` (``--mem-fraction``) is None:
    SGLang 0.5.23 derives ``--mem-fraction-static`` (``costmodel.gpus.sglang_mem_fraction``);
    vLLM's ``gpu_memory_utilization`` (0.92 in 0.33 and under NIXL P/D; 1.0 in 0.34 with the
    extensible cache) is what weights, activations and CUDA graphs share, so the activation
    peak and the graph estimate are reserved, and 0.34 keeps ``max(1 GiB, 0.75 x peak)`` of
    headroom (vLLM 0.34's extensible KV cache; docs/engine.md, GPUs). A given fraction
    keeps each engine's meaning of it (vLLM still reserves)."""
    if engine != "vllm":
        if fraction is not None:
            return MemoryRule(fraction, 0, "--mem-fraction")
        return MemoryRule(sglang_mem_fraction(gpu.memory_mib, tp, chunk, max_running), 0,
                          f"SGLang 0.5.23's --mem-fraction-static default for {gpu.name} "
                          f"x TP {tp}, chunk {chunk}")
    from sim.engines.vllm import VLLM_MAX_NUM_SEQS

    seqs = max_running or VLLM_MAX_NUM_SEQS
    peak = vllm_activation_peak_bytes(spec, tp, chunk, seqs)
    reserve = peak + vllm_graph_bytes(seqs, gpu)
    extensible = vllm_version != "0.33" and not pd
    used = fraction if fraction is not None else 1.0 if extensible else 0.92
    if extensible:  # min(requested - non-KV, headroom - margin): the margin where it binds
        margin = max(GIB, int(0.75 * peak))
        reserve += max(0, margin - int(gpu.memory_bytes * (1 - used)))
    source = ("--mem-fraction" if fraction is not None else
              f"vLLM {vllm_version}'s gpu_memory_utilization default"
              + (" under P/D" if pd and vllm_version != "0.33" else ""))
    return MemoryRule(used, reserve, f"{source}, less {reserve / GIB:.1f} GiB of activations "
                      f"and CUDA graphs (estimated)")


def rule_for_point(point: dict[str, Any], spec: ModelSpec, gpu: GPU, tp: int) -> MemoryRule:
    """``memory_rule`` for flat RunConfig fields (a point, the command line), each engine
    knob at its default where the point leaves it out."""
    knobs = KNOBS.get(point.get("engine") or "sglang", SGLangKnobs)()
    pd = bool(point.get("prefill_replicas") or point.get("decode_replicas"))
    return memory_rule(spec, gpu, tp, point.get("mem_fraction"), knobs.name,
                       point.get("chunk_size") or knobs.chunk_size, point.get("max_running"),
                       point.get("vllm_version") or getattr(knobs, "vllm_version", ""), pd)


def rule_for_config(cfg) -> MemoryRule:
    """``memory_rule`` for a built RunConfig sized from its ``gpu``."""
    return memory_rule(get_spec(cfg.cache.model), get_gpu(cfg.cache.gpu), replica_tp(cfg),
                       cfg.cache.mem_fraction, cfg.engine.name, cfg.engine.chunk_size,
                       cfg.engine.max_running,
                       cfg.engine.vllm_version if cfg.engine.name == "vllm" else "", cfg.is_pd)


def resolve_gpu_fields(point: dict[str, Any], where: str,
                       spell=lambda f: f) -> dict[str, Any]:
    """``point`` (RunConfig fields as written; ``gpu_cache`` may be text) with ``gpu_cache``
    in tokens and, for a ``gpu``, its profile (module docstring). ``spell`` names a field as
    the caller's user wrote it (``--gpu-cache`` on the command line)."""
    out = dict(point)
    gpu_name, tp = out.get("gpu"), out.get("tp")
    nbytes = parse_kv_bytes(out.get("gpu_cache"))
    if gpu_name is None and nbytes is None:
        return out  # tokens as before (``tp`` and ``mem_fraction`` alone: IDLE_RULES refuse)
    model = out.get("model", "qwen3-8b")
    try:
        spec = get_spec(model, out.get("kv_dtype"))
    except KeyError as e:
        raise ConfigError(where, "model", str(e.args[0])) from None
    except ValueError as e:  # an unknown kv_dtype
        raise ConfigError(where, "kv_dtype", str(e)) from None
    # SGLang's SWA pool, or its one pool of every layer (--hybrid-swa-memory off)
    swa_memory = out.get("hybrid_swa_memory", True) not in (False, "off")
    gpu: GPU | None = None
    if gpu_name is not None:
        try:
            gpu = get_gpu(str(gpu_name))
        except KeyError as e:
            raise ConfigError(where, "gpu", str(e.args[0])) from None
    if tp is None:  # bytes are per GPU, on as many GPUs as the run counts (default_tp)
        tp = default_tp(out.get("profile"), gpu, model, out.get("engine"))
    check_tp(model, tp, where, spell)
    bs = out.get("block_size", 64)
    if nbytes is not None:
        out["gpu_cache_bytes"] = nbytes
        out["gpu_cache"] = tokens_from_bytes(spec, nbytes, tp, bs, out.get("engine"),
                                             swa_memory)
        if out["gpu_cache"] < 4 * bs:
            raise ConfigError(where, "gpu_cache", f"{point['gpu_cache']} holds "
                              f"{out['gpu_cache']} tokens of {model} per replica: fewer "
                              "than 4 blocks")
    if gpu is None:
        return out
    out["gpu"] = gpu.name
    if nbytes is not None:
        _check_budget(spec, gpu, tp, nbytes, where, spell)
    else:
        rule = rule_for_point(out, spec, gpu, tp)
        try:
            sized = kv_cache_tokens(spec, gpu, tp, rule.fraction, bs, rule.reserve_bytes,
                                    out.get("engine"), swa_memory)
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
        out["profile"] = profile_for(gpu, model, tp, out.get("engine")).name
    return out


def _check_budget(spec: ModelSpec, gpu: GPU, tp: int, nbytes: int, where: str, spell) -> None:
    room = gpu.memory_bytes - -(-spec.weight_bytes // tp)
    if nbytes > room:
        raise ConfigError(where, "gpu_cache", f"{nbytes / 2**30:.1f} GiB of KV per GPU does "
                          f"not fit {spell('gpu')} {gpu.name} x{tp}: {room / 2**30:.1f} GiB "
                          f"are left beside {spec.name}'s weights")


def replica_tp(cfg, profile=None) -> int:
    """The GPUs (TP ranks) one replica runs on: ``tp`` when given, else ``default_tp`` (the
    GPU count of the profile the run is priced with: ``profile`` when the caller holds it)."""
    if profile is not None:
        return cfg.cache.replica_tp(profile.gpus)
    if cfg.cache.tp is not None:
        return int(cfg.cache.tp)
    gpu = get_gpu(cfg.cache.gpu) if cfg.cache.gpu is not None else None
    return default_tp(cfg.cache.profile, gpu, cfg.cache.model, cfg.engine.name)


def gpus_per_replica(cfg, profile) -> int:
    """The GPUs one replica runs on (``replica_tp``: the only definition)."""
    return replica_tp(cfg, profile)


def sizing_note(cfg) -> str:
    """How the run's KV was sized, for the run header: bytes per GPU, or the memory fraction
    and where it came from."""
    if cfg.cache.gpu_cache_bytes is not None:
        return f"{cfg.cache.gpu_cache_bytes / GIB:g} GiB of KV per GPU"
    rule = rule_for_config(cfg)
    return f"memory fraction {rule.fraction:g} ({rule.source})"


def profile_note(cfg, profile) -> str:
    """Empty when the profile was measured for the run's GPU and TP (or the run names no GPU
    and is not sized in bytes); else what the run was priced with instead."""
    tp = replica_tp(cfg, profile)
    if cfg.cache.gpu is None:
        if cfg.cache.gpu_cache_bytes is None or tp == profile.gpus:
            return ""
        return (f"priced with the profile {profile.name}, measured on {profile.gpus} x "
                f"{profile.device}, for TP {tp}")
    choice = profile_for(get_gpu(cfg.cache.gpu), cfg.cache.model, tp, cfg.engine.name)
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
    if cfg.cache.gpu is not None or cfg.cache.gpu_cache_bytes is not None:
        fields["tp"] = per_replica
    if cfg.cache.gpu is not None:
        rule = None if cfg.cache.gpu_cache_bytes is not None else rule_for_config(cfg)
        fields.update(gpu=cfg.cache.gpu, mem_fraction=rule and rule.fraction,
                      mem_fraction_source=rule and rule.source,
                      profile_note=profile_note(cfg, profile))
    if cfg.cache.gpu_cache_bytes is not None:
        fields["kv_bytes_per_gpu"] = cfg.cache.gpu_cache_bytes
        fields.setdefault("profile_note", profile_note(cfg, profile))
    return fields
