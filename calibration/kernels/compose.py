"""Whole-model prefill and decode times composed from measured per-kernel latencies.

One decoder layer on one GPU of a tensor-parallel group of ``gpus`` (heads, FFN columns and
experts split ``gpus`` ways; KV heads replicated when there are fewer than GPUs), as SGLang,
vLLM and TensorRT-LLM run it::

    prefill layer(ranges) = GEMM qkv + attention(ranges) + GEMM o + FFN + element-wise
                            + 2 all-reduces (eager; only when gpus > 1)
    FFN (dense)           = GEMM gate_up (merged) + GEMM down + SiLU*mul
    FFN (MoE)             = GEMM router + fused MoE (the measured kernel: routing, grouped
                            expert GEMMs and activation, balanced token distribution)
    decode step(b, c)     = the same at m = b tokens, with generation attention over c cached
                            tokens per sequence and CUDA-graph all-reduces

With ``ep > 1`` (vLLM ``--data-parallel-size ep --enable-expert-parallel`` at TP 1), one
replica is one GPU of an attention-data-parallel group whose experts are split ``ep`` ways:
its attention and dense GEMMs run its own ``m`` tokens, the fused MoE runs the group's
``ep x m`` tokens on its ``experts / ep`` experts (the table's ``moe_ep_size`` rows, whose
token count is the group's), between an NCCL all-gather and a reduce-scatter of the
group's tokens (``comm/nccl`` tables: the naive dispatch over the GPUs' own link). The other
ranks are assumed as loaded as this one (vLLM steps its DP ranks together).

GEMMs, attention, MoE and all-reduce are the measured tables (:mod:`.tables`,
:mod:`.attention`). Element-wise ops (residual add + RMSNorm twice, SiLU*mul) are not in the
tables: they are priced from the system description as aiconfigurator-core does, bytes read
and written over ``mem_bw * mem_bw_empirical_scaling_factor`` plus its constant latency.
Embeddings, the LM head (one token per request in prefill) and sampling are left out, as in
the Section 2.2 units; CPU-side scheduling is in no table and so in no composed time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from costmodel.specs import ModelSpec

from .attention import ContextAttention, GenerationAttention, Shape
from .tables import (
    AllReduceTable,
    GemmTable,
    KernelTableError,
    MoeTable,
    NcclTable,
    NoRows,
    SystemDesc,
    versions,
)

FRAMEWORKS = ("sglang", "vllm", "trtllm")
MOE_DTYPES = ("bfloat16", "w4a16_mxfp4")  # bf16 first; gpt-oss's MXFP4 experts where bf16 is
#                                            not measured (recorded in the provenance)
ELEMENT_BYTES = 2  # bf16 activations


def _newest(root: Path, system: str, op: str, framework: str, table: str, build):
    """``build(path, version)`` on the newest version that has rows for the shape; the
    newest version's :class:`NoRows` if none has. Malformed tables are never skipped."""
    found = versions(root, system, op, framework, table)
    if not found:
        raise KernelTableError(root / "data" / system / op / framework / "*" /
                               f"{table}.parquet", "<file>",
                               f"missing: no {framework} {op} table for {system}")
    first: NoRows | None = None
    for v in found:
        try:
            return build(root / "data" / system / op / framework / v / f"{table}.parquet", v)
        except NoRows as e:
            first = first or e
    assert first is not None
    raise first


@dataclass
class Gemm:
    name: str
    n: int
    k: int


@dataclass
class KernelModel:
    """Composed times of ``spec`` on ``gpus`` GPUs of ``system`` under ``framework``."""

    spec: ModelSpec
    root: Path
    system: str
    framework: str
    gpus: int
    sources: dict[str, Any] = field(default_factory=dict)
    ep: int = 1  # attention data parallel x expert parallel group (module docstring)

    def __post_init__(self) -> None:
        spec, tp = self.spec, self.gpus
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}")
        if self.ep > 1 and (tp != 1 or not spec.experts or spec.experts % self.ep):
            raise ValueError(f"DP x EP {self.ep} needs an MoE model at TP 1 whose experts "
                             f"split {self.ep} ways")
        if spec.q_heads % tp or (spec.kv_heads >= tp and spec.kv_heads % tp) \
                or spec.ffn % tp or spec.expert_ffn % tp:
            raise ValueError(f"{spec.name} does not split over {tp} GPUs")
        self.desc = SystemDesc.load(self.root, self.system)
        heads, kv = spec.q_heads // tp, max(1, spec.kv_heads // tp)
        hd, h = spec.head_dim, spec.hidden
        self.gemms = [Gemm("qkv", (heads + 2 * kv) * hd, h), Gemm("o", h, heads * hd)]
        if spec.ffn:
            self.gemms += [Gemm("gate_up", 2 * spec.ffn // tp, h), Gemm("down", h, spec.ffn // tp)]
        if spec.experts:
            self.gemms.append(Gemm("router", spec.experts, h))
        args = (self.root, self.system)
        fw = self.framework
        self.gemm = _newest(*args, "gemm", fw, "gemm_perf", GemmTable)
        self.moe = self._moe() if spec.experts else None
        self.context: dict[int | None, ContextAttention] = {}
        self.generation: dict[int | None, GenerationAttention] = {}
        for window in spec.window_groups():
            shape = Shape(heads, kv, hd, window)
            self.context[window] = _newest(*args, "attention", fw, "context_attention_perf",
                                           lambda p, v, s=shape: ContextAttention(p, v, s))
            self.generation[window] = _newest(
                *args, "attention", fw, "generation_attention_perf",
                lambda p, v, s=shape: GenerationAttention(p, v, s))
        self.allreduce: dict[str, AllReduceTable] = {}
        self.dispatch: dict[str, NcclTable] = {}
        if self.ep > 1:
            for op in ("all_gather", "reduce_scatter"):
                self.dispatch[op] = _newest(*args, "comm", "nccl", "nccl_perf",
                                            lambda p, v, o=op: NcclTable(p, v, self.ep, o))
        if tp > 1:
            for mode in ("eager", "graph"):
                backend = None if fw == "trtllm" else f"{fw}_{mode}"
                self.allreduce[mode] = _newest(
                    *args, "comm", fw, "custom_allreduce_perf",
                    lambda p, v, b=backend: AllReduceTable(p, v, tp, b))
        self.sources = self._provenance(heads, kv)

    def _moe(self) -> MoeTable:
        spec, tp = self.spec, self.gpus
        last: NoRows | None = None
        for dtype in MOE_DTYPES:
            for mtp, mep in (((1, self.ep),) if self.ep > 1 else ((tp, 1), (1, tp))):
                try:
                    return _newest(
                        self.root, self.system, "moe", self.framework, "moe_perf",
                        lambda p, v, d=dtype, a=mtp, b=mep: MoeTable(
                            p, v, hidden=spec.hidden, inter=spec.expert_ffn,
                            topk=spec.active_experts, experts=spec.experts, tp=a, ep=b,
                            dtype=d))
                except NoRows as e:
                    last = last or e
        assert last is not None
        raise last

    # --- one layer's non-attention part, at m tokens -----------------------------------
    def _elementwise(self, m: int) -> float:
        """Residual add + RMSNorm twice (2h in, 2h out each), SiLU*mul for a dense FFN."""
        spec, d = self.spec, self.desc
        moved = 2 * (4 * spec.hidden)
        ops = 2
        if spec.ffn:
            moved += 3 * spec.ffn // self.gpus
            ops += 1
        bw = d.mem_bw * (d.mem_bw_scaling or 1.0)
        return m * moved * ELEMENT_BYTES / bw + ops * d.mem_latency_s

    def _dense(self, m: int, mode: str) -> float:
        t = sum(float(self.gemm(m, g.n, g.k)) for g in self.gemms)
        if self.moe is not None:
            t += float(self.moe(m * self.ep))  # the group's tokens (module docstring)
        for table in self.dispatch.values():
            t += float(table(m * self.ep * self.spec.hidden))
        t += self._elementwise(m)
        if self.allreduce:
            t += 2 * float(self.allreduce[mode](m * self.spec.hidden))
        return t

    # --- whole model -------------------------------------------------------------------
    def prefill_seconds(self, ranges) -> float:
        """Seconds of one prefill batch computing ``ranges`` (each over its cached prefix)."""
        tokens = sum(b - a for a, b in ranges)
        t = self.spec.layers * self._dense(tokens, "eager")
        for window, count in self.spec.window_groups().items():
            t += count * self.context[window].seconds(ranges)
        return t

    def prefill_extrapolated(self, ranges) -> bool:
        """Whether any attention lookup ran past the measured sequence lengths."""
        return any(c.extrapolated(ranges) for c in self.context.values())

    def decode_seconds(self, batch: int, context: int) -> float:
        """Seconds of one decode step: ``batch`` sequences each attending ``context`` tokens."""
        t = self.spec.layers * self._dense(batch, "graph")
        for window, count in self.spec.window_groups().items():
            t += count * self.generation[window].seconds(batch, context)
        return t

    def decode_extrapolated(self, batch: int, context: int) -> bool:
        return any(g.extrapolated(batch, context) for g in self.generation.values())

    def _provenance(self, heads: int, kv: int) -> dict[str, Any]:
        def src(obj) -> dict[str, Any]:
            s = obj.source
            return {"table": str(Path(s.path).relative_to(self.root)), "version": s.version,
                    "kernel_source": s.kernel_source}

        out: dict[str, Any] = {
            "per_gpu_shapes": {"q_heads": heads, "kv_heads": kv, "head_dim": self.spec.head_dim,
                               "gemms": {g.name: [g.n, g.k] for g in self.gemms}},
            "gemm": src(self.gemm)}
        if self.moe is not None:
            out["moe"] = {**src(self.moe), **self.moe.layout}
        for name, tables in (("context_attention", self.context),
                             ("generation_attention", self.generation)):
            out[name] = {("full" if w is None else f"window-{w}"): {**src(t), **t.info}
                         for w, t in tables.items()}
        for mode, t in self.allreduce.items():
            out[f"allreduce_{mode}"] = src(t)
        for op, t in self.dispatch.items():
            out[f"ep_dispatch_{op}"] = src(t)
        if self.ep > 1:
            out["data_expert_parallel"] = {
                "dp": self.ep, "ep": self.ep, "moe_tokens": f"{self.ep} x the replica's",
                "assumed": "every DP rank as loaded as this one (vLLM steps them together)"}
        out["elementwise"] = ("residual add + RMSNorm x2 (+ SiLU*mul): bytes / (mem_bw x "
                              "mem_bw_empirical_scaling_factor) + constant latency, from "
                              f"{Path(self.desc.path).name} (not measured)")
        return out


def allreduce_line(root: Path, system: str, framework: str, gpus: int, hidden: int,
                   max_tokens: int = 2048) -> tuple[float, float]:
    """(seconds per all-reduce, seconds per element) of the measured CUDA-graph all-reduce of
    ``gpus`` GPUs on ``system`` (the table a composed decode step reads), least squares over
    its message sizes from one token to ``max_tokens`` tokens of ``hidden`` elements: what
    the kernel-table profiles already hold of a TP step's all-reduces, so that pricing them
    over another link replaces them (costmodel/profile.py ``server_terms``)."""
    backend = None if framework == "trtllm" else f"{framework}_graph"
    table = _newest(root, system, "comm", framework, "custom_allreduce_perf",
                    lambda p, v: AllReduceTable(p, v, gpus, backend))
    x = table.series.x
    sizes = x[(x >= hidden) & (x <= max_tokens * hidden)]
    if len(sizes) < 2:  # too few measured sizes in range: the piecewise-linear series there
        sizes = np.geomspace(hidden, max_tokens * hidden, 24)
    slope, icpt = np.polyfit(sizes, np.asarray(table(sizes), np.float64), 1)
    return max(0.0, float(icpt)), max(0.0, float(slope))


def dispatch_line(root: Path, system: str, ep: int, hidden: int,
                  max_tokens: int = 2048) -> tuple[float, float]:
    """(seconds per layer, seconds per element) of the measured NCCL all-gather and
    reduce-scatter one layer of a DP x EP ``ep`` rank runs (``KernelModel._dense``: the
    group's tokens x ``hidden`` elements each), summed, least squares over the group's
    message sizes from one token to ``max_tokens`` tokens: what a ``-dp<ep>ep<ep>`` profile
    already holds of its dispatch, so that pricing it over another link replaces it
    (costmodel/profile.py ``server_terms``)."""
    out = np.zeros(2)
    for op in ("all_gather", "reduce_scatter"):
        table = _newest(root, system, "comm", "nccl", "nccl_perf",
                        lambda p, v, o=op: NcclTable(p, v, ep, o))
        sizes = np.geomspace(ep * hidden, ep * max_tokens * hidden, 24)
        out += np.polyfit(sizes, np.asarray(table(sizes), np.float64), 1)[::-1]
    return max(0.0, float(out[0])), max(0.0, float(out[1]))
