"""Attention of a range of new tokens over a KV cache, and the naive reference it must equal.

Semantics (one sequence, absolute positions): the query at position ``i`` sees the key at
position ``j`` iff ``j <= i`` and, in a sliding-window layer with window ``w``,
``i - j < w`` (at most ``w`` keys including itself, as in ``costmodel.specs``). A range of new
tokens at positions ``[start, start + n)`` reads keys ``[0, start + n)`` from the cache, which
already holds its own freshly written K/V (write before read, as in a serving engine).

:func:`attend` uses ``scaled_dot_product_attention`` so that the fast kernels run: plain causal
when the range is the whole key span, the lower-right-aligned causal bias (FlashAttention on
CUDA) for a range over a cached prefix, an explicit boolean mask only where a sliding window
cuts the span (queries in window-sized chunks). GQA is native (``enable_gqa``): K/V are
never repeated per query head.
"""

from __future__ import annotations

from .errors import require_torch

torch = require_torch()
F = torch.nn.functional


def key_span(start: int, n: int, window: int | None) -> tuple[int, int]:
    """Key positions ``[lo, hi)`` that queries ``[start, start + n)`` may read."""
    hi = start + n
    lo = 0 if window is None else max(0, start - window + 1)
    return lo, hi


def attend(q, cache_k, cache_v, start: int, window: int | None = None):
    """Attention of queries ``q`` (``(B, Hq, n, d)``, positions ``[start, start + n)``) over
    ``cache_k``/``cache_v`` (``(B, Hkv, L, d)``, position = index, ``L >= start + n``)."""
    n = q.shape[-2]
    lo, hi = key_span(start, n, window)
    m = hi - lo
    # Does the window cut keys inside [lo, hi) for some query? Only then is a mask needed.
    window_cuts = window is not None and (start + n - 1) - (window - 1) > lo
    if not window_cuts:
        k, v = cache_k[:, :, lo:hi], cache_v[:, :, lo:hi]
        if n == 1:  # one query at the span's end sees every key in it
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        if m == n:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        from torch.nn.attention.bias import causal_lower_right

        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(n, m),
                                              enable_gqa=True)
    # Sliding window cut: queries in chunks of ``window`` so work and mask stay O(n * window).
    outs = []
    for s in range(start, hi, window):
        e = min(s + window, hi)
        klo = max(0, s - window + 1)
        qpos = torch.arange(s, e, device=q.device)[:, None]
        kpos = torch.arange(klo, e, device=q.device)[None, :]
        mask = (kpos <= qpos) & (qpos - kpos < window)
        outs.append(F.scaled_dot_product_attention(
            q[:, :, s - start:e - start], cache_k[:, :, klo:e], cache_v[:, :, klo:e],
            attn_mask=mask, enable_gqa=True))
    return torch.cat(outs, dim=-2)


def naive_attention(q, k, v, q_positions, k_positions, window: int | None = None):
    """Reference: softmax over every allowed (query, key) pair, GQA by repeating K/V heads,
    in float64. ``q``: ``(Hq, nq, d)``, ``k``/``v``: ``(Hkv, nk, d)``; positions are 1-D."""
    hq, hkv = q.shape[0], k.shape[0]
    q64, k64, v64 = q.double(), k.double(), v.double()
    k64 = k64.repeat_interleave(hq // hkv, dim=0)
    v64 = v64.repeat_interleave(hq // hkv, dim=0)
    scores = q64 @ k64.transpose(-1, -2) / q.shape[-1] ** 0.5
    qp = torch.as_tensor(q_positions)[:, None]
    kp = torch.as_tensor(k_positions)[None, :]
    allowed = kp <= qp
    if window is not None:
        allowed &= qp - kp < window
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v64
