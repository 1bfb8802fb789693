"""A pure-torch decoder stack with a model spec's exact shapes and random weights.

Per layer (Llama/Qwen3 family): RMSNorm -> fused QKV projection (GQA: ``q_heads`` query and
``kv_heads`` key/value heads of ``head_dim``) -> RoPE at the tokens' absolute positions ->
write K/V into the layer's cache -> attention over the cache (:func:`calibration.attention.attend`,
full or sliding window) -> output projection -> residual -> RMSNorm -> SwiGLU FFN (``ffn``) and/or
the ``active_experts`` SwiGLU experts of width ``expert_ffn`` -> residual. These are exactly the
MACs the spec's ``W`` counts. Left out, like in ``W``: embeddings, LM head, MoE router, Qwen3's
per-head q/k norms (O(tokens * hidden), negligible). Every token of an MoE layer runs through
all ``active_experts`` experts: the active compute of real routing, as dense GEMMs.

A *prefill* computes a batch of token ranges ``[(a, b), ...]`` (a phantom request's hole plus
the real request's new tokens): one GEMM over all their tokens per projection, the K/V of every
range written first, then each range attends over keys ``[0, b)`` -- so the real request reads
the hole restored in the same layer, as in the paper. A *decode step* computes one token for
each of ``batch`` sequences whose contexts hold ``context`` tokens (the new one included).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from costmodel.specs import ModelSpec

from .attention import attend
from .errors import require_torch

torch = require_torch()
F = torch.nn.functional

ROPE_THETA = 1_000_000.0  # Qwen3; the value does not change the work
EPS = 1e-6


def rms_norm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def rope(x, positions, inv_freq):
    """Rotate-half RoPE of ``x`` (``(T, H, d)``) at absolute ``positions`` (``(T,)``)."""
    angles = positions[:, None].to(inv_freq.dtype) * inv_freq[None, :]  # (T, d/2)
    cos = angles.cos().to(x.dtype)[:, None, :]
    sin = angles.sin().to(x.dtype)[:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@dataclass
class LayerWeights:
    ln1: object
    wqkv: object  # (hidden, (q_heads + 2 kv_heads) * head_dim)
    wo: object  # (q_heads * head_dim, hidden)
    ln2: object
    ffn: list  # [(w_gate_up (hidden, 2 f), w_down (f, hidden)), ...]: dense FFN and experts


def _init(shape, fan_in, gen, device, dtype):
    w = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    return (w / fan_in**0.5).to(dtype)


def layer_shapes(spec: ModelSpec) -> dict[str, object]:
    """Shapes of one layer's matrices (``(in, out)``); their sizes sum to the spec's linear
    MACs per token (tested for every registered model)."""
    h, d = spec.hidden, spec.head_dim
    widths = ([spec.ffn] if spec.ffn else []) + [spec.expert_ffn] * spec.active_experts
    return {"wqkv": (h, (spec.q_heads + 2 * spec.kv_heads) * d), "wo": (spec.q_heads * d, h),
            "ffn": [((h, 2 * f), (f, h)) for f in widths]}


def make_layer(spec: ModelSpec, gen, device, dtype) -> LayerWeights:
    shapes = layer_shapes(spec)

    def init(shape):
        return _init(shape, shape[0], gen, device, dtype)

    return LayerWeights(
        ln1=torch.ones(spec.hidden, device=device, dtype=dtype),
        wqkv=init(shapes["wqkv"]),
        wo=init(shapes["wo"]),
        ln2=torch.ones(spec.hidden, device=device, dtype=dtype),
        ffn=[(init(gu), init(down)) for gu, down in shapes["ffn"]],
    )


def weight_bytes(spec: ModelSpec, dtype_bytes: int) -> int:
    """Bytes of one layer's weights (what :func:`make_layer` allocates)."""
    return spec.linear_macs_per_token * dtype_bytes


class DecoderStack:
    """``len(windows)`` decoder layers of ``spec``'s shapes (``windows[i]``: None = full
    attention, else the sliding window), each with its own KV cache of ``capacity`` positions.
    Cache contents start as random numbers: timing does not depend on values, and tests fill
    them by prefilling."""

    def __init__(self, spec: ModelSpec, windows: Sequence[int | None], capacity: int,
                 device: str = "cpu", dtype=None, seed: int = 0) -> None:
        self.spec = spec
        self.windows = list(windows)
        self.capacity = capacity
        self.device = torch.device(device)
        self.dtype = dtype or torch.float32
        gen = torch.Generator(device=self.device).manual_seed(seed)  # generated in place
        self.layers = [make_layer(spec, gen, self.device, self.dtype) for _ in self.windows]
        d = spec.head_dim
        self.inv_freq = (ROPE_THETA ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)).to(
            device=self.device, dtype=torch.float32)
        shape = (1, spec.kv_heads, capacity, d)
        self.cache = [tuple(torch.randn(shape, generator=gen, device=self.device,
                                        dtype=self.dtype) for _ in "kv")
                      for _ in self.windows]

    # --- prefill ------------------------------------------------------------------------
    def positions(self, ranges: Sequence[tuple[int, int]]):
        for a, b in ranges:
            if not 0 <= a < b <= self.capacity:
                raise ValueError(f"range [{a}, {b}) outside the cache of {self.capacity}")
        return torch.cat([torch.arange(a, b) for a, b in ranges]).to(self.device)

    def prefill(self, x, ranges: Sequence[tuple[int, int]]):
        """Run every layer on hidden states ``x`` (``(T, hidden)``, the tokens of ``ranges`` in
        order) and return the output hidden states. Ranges must be disjoint."""
        pos = self.positions(ranges)
        for lw, window, (ck, cv) in zip(self.layers, self.windows, self.cache, strict=True):
            x = self._prefill_layer(x, pos, ranges, lw, window, ck, cv)
        return x

    def _prefill_layer(self, x, pos, ranges, lw: LayerWeights, window, ck, cv):
        spec, d = self.spec, self.spec.head_dim
        t = x.shape[0]
        qkv = rms_norm(x, lw.ln1) @ lw.wqkv
        q, k, v = qkv.split([spec.q_heads * d, spec.kv_heads * d, spec.kv_heads * d], dim=-1)
        q = rope(q.view(t, spec.q_heads, d), pos, self.inv_freq)
        k = rope(k.view(t, spec.kv_heads, d), pos, self.inv_freq)
        v = v.view(t, spec.kv_heads, d)
        off = 0
        for a, b in ranges:  # write the whole batch's K/V before any range reads
            ck[0, :, a:b] = k[off:off + b - a].transpose(0, 1)
            cv[0, :, a:b] = v[off:off + b - a].transpose(0, 1)
            off += b - a
        outs, off = [], 0
        for a, b in ranges:
            qr = q[off:off + b - a].transpose(0, 1)[None]
            outs.append(attend(qr, ck, cv, a, window)[0].transpose(0, 1).reshape(b - a, -1))
            off += b - a
        x = x + torch.cat(outs) @ lw.wo
        return x + self._mlp(rms_norm(x, lw.ln2), lw)

    @staticmethod
    def _mlp(h, lw: LayerWeights):
        out = None
        for w_gu, w_down in lw.ffn:
            gate, up = (h @ w_gu).chunk(2, dim=-1)
            y = (F.silu(gate) * up) @ w_down
            out = y if out is None else out + y
        return out

    # --- decode -------------------------------------------------------------------------
    def decode_step(self, x, context: int, caches):
        """One decode step: ``x`` is ``(batch, hidden)``, each sequence's new token sits at
        position ``context - 1``; ``caches[i]`` is layer i's ``(K, V)``, each
        ``(batch, kv_heads, >= context, head_dim)``."""
        spec, d = self.spec, self.spec.head_dim
        bsz = x.shape[0]
        pos = torch.full((bsz,), context - 1, device=self.device)
        for lw, window, (ck, cv) in zip(self.layers, self.windows, caches, strict=True):
            qkv = rms_norm(x, lw.ln1) @ lw.wqkv
            q, k, v = qkv.split([spec.q_heads * d, spec.kv_heads * d, spec.kv_heads * d], -1)
            q = rope(q.view(bsz, spec.q_heads, d), pos, self.inv_freq)
            ck[:, :, context - 1] = rope(k.view(bsz, spec.kv_heads, d), pos, self.inv_freq)
            cv[:, :, context - 1] = v.view(bsz, spec.kv_heads, d)
            o = attend(q[:, :, None], ck, cv, context - 1, window)  # (batch, Hq, 1, d)
            x = x + o.reshape(bsz, -1) @ lw.wo
            x = x + self._mlp(rms_norm(x, lw.ln2), lw)
        return x
