"""Closed-form unit sums (Section 2.2). Never loop over tokens.

Computing tokens at positions ``[a, b)`` with everything before ``a`` cached costs, summed over
layers::

    linear    = layers * (b - a) * W
    attention = sum over layers of sum_{p=a}^{b-1} min(p, cap_layer)

where ``cap_layer`` is unbounded for full attention (and MLA), ``window - 1`` for a sliding
window and ``index_topk - 1`` for DSA's top-k keys; per group, weighted by its layers
(``ModelSpec.window_caps``). Hybrid groups add (``ModelSpec.extra_terms``, docs/hybrid.md)::

    chunked (chunk c)   sum_{p=a}^{b-1} (p mod c)
    compressed (r)      sum_{p=a}^{b-1} floor(p / r), or min(floor(p / r), k) with an indexer
    linear              (b - a) * state_update_macs / macs_per_unit
    DSA indexer         sum_{p=a}^{b-1} p * indexer_macs_per_key / macs_per_unit
    compressed indexer  sum_{p=a}^{b-1} floor(p / r) * indexer_macs_per_key / macs_per_unit

the last three summed in MACs over the groups and floored to whole units once per range (a
compressed layer's window is a sliding term). A profile with a rate per kind
(``Profile.pricing_spec``) weights each group's layers by its kind's rate over the profile's
one rate, and the range's units are floored once.
A batch of ranges (a phantom request's hole plus the real request's new tokens) is priced as
the sum of its ranges: positions are kept, so the hole costs what it originally cost.

With context edits a token costs ``W + (keys it attends to)``: dropped keys are not attended
(``attended_units``), and keys an edit moved are re-rotated in one bandwidth-bound pass
(``rerotation_seconds``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .specs import AttentionKind, ModelSpec

if TYPE_CHECKING:
    from .profile import Profile


class Units(NamedTuple):
    """Work of a set of token ranges, over all layers: ``linear`` (W per token per layer) and
    ``attention`` (one per query-key pair per layer). Immutable; ``+`` adds field by field.
    (A named tuple: every priced range makes one, and a tuple is the cheapest to build.)"""

    linear: float = 0.0
    attention: int = 0
    tokens: int = 0

    @property
    def total(self) -> float:
        return self.linear + self.attention

    def __add__(self, other: Units) -> Units:  # type: ignore[override]
        linear, attention, tokens = self
        linear2, attention2, tokens2 = other
        return _new(Units, (linear + linear2, attention + attention2, tokens + tokens2))


_new = tuple.__new__  # builds a Units from its three fields without the Python-level __new__


def position_sum(a: int, b: int, cap: int | None = None) -> int:
    """``sum(min(p, cap) for p in range(a, b))`` in closed form; ``cap=None`` means no cap."""
    if b <= a:
        return 0
    if cap is None or b <= cap:
        return (a + b - 1) * (b - a) // 2
    if a >= cap:
        return (b - a) * cap
    return (a + cap - 1) * (cap - a) // 2 + (b - cap) * cap


def chunk_position_sum(a: int, b: int, chunk: int) -> int:
    """``sum(p % chunk for p in range(a, b))`` in closed form."""
    if b <= a:
        return 0

    def upto(n: int) -> int:  # sum over [0, n)
        q, r = divmod(n, chunk)
        return q * (chunk * (chunk - 1) // 2) + r * (r - 1) // 2

    return upto(b) - upto(a)


def compressed_position_sum(a: int, b: int, ratio: int, cap: int = 0) -> int:
    """``sum(min(p // ratio, cap) for p in range(a, b))`` in closed form (``cap=0``: no cap):
    the compressed entries (one per ``ratio`` earlier tokens) the tokens at ``[a, b)`` read."""
    if b <= a:
        return 0

    def upto(n: int) -> int:  # sum over [0, n)
        if cap and n > cap * ratio:
            return upto(cap * ratio) + (n - cap * ratio) * cap
        q, r = divmod(n, ratio)
        return ratio * (q * (q - 1) // 2) + r * q

    return upto(b) - upto(a)


def extra_units(spec: ModelSpec, a: int, b: int) -> int:
    """Attention units of ``[a, b)`` in the chunked, compressed, linear and indexer terms
    (``ModelSpec.extra_terms``); 0 for full and sliding models."""
    chunked = macs = 0
    for count, kind, param, ratio in spec.extra_terms:
        if kind is AttentionKind.CHUNKED:
            chunked += count * chunk_position_sum(a, b, param)
        elif kind is AttentionKind.COMPRESSED:
            chunked += count * compressed_position_sum(a, b, ratio, param)
        elif kind is AttentionKind.LINEAR:
            macs += count * (b - a) * param
        elif ratio == 1:  # DSA: the indexer scores every earlier token
            macs += count * position_sum(a, b) * param
        else:  # a compressed group's indexer scores every earlier entry
            macs += count * compressed_position_sum(a, b, ratio) * param
    return chunked + macs // spec.macs_per_unit


def attention_units(spec: ModelSpec, a: int, b: int) -> int:
    """Attention units of computing positions ``[a, b)`` in every layer of ``spec``."""
    total = 0
    for count, cap in spec.window_caps:
        total += count * position_sum(a, b, cap)
    if spec.extra_terms:
        total += extra_units(spec, a, b)
    return int(total) if spec.attention_weights else total


def range_units(spec: ModelSpec, a: int, b: int) -> Units:
    """Units of computing positions ``[a, b)`` over a cached prefix of ``a`` tokens."""
    if a < 0 or b < a:
        raise ValueError(f"bad token range [{a}, {b})")
    n = b - a
    # attention_units(spec, a, b) with position_sum's closed form, inlined: every prefill
    # chunk prices ranges (tests/test_costmodel_units.py holds it to brute-force sums)
    attention = 0
    if n:
        for count, cap in spec.window_caps:
            if cap is None or b <= cap:
                attention += count * ((a + b - 1) * n // 2)
            elif a >= cap:
                attention += count * (n * cap)
            else:
                attention += count * ((a + cap - 1) * (cap - a) // 2 + (b - cap) * cap)
        if spec.extra_terms:
            attention += extra_units(spec, a, b)
        if spec.attention_weights:  # weighted kinds (Profile.pricing_spec): whole units
            attention = int(attention)
    return _new(Units, (spec.layers * n * spec.W, attention, n))


def ranges_units(spec: ModelSpec, ranges: Iterable[tuple[int, int]]) -> Units:
    """Units of one batch computing several disjoint ranges (e.g. phantom + real request)."""
    total = Units()
    for a, b in ranges:
        total = total + range_units(spec, a, b)
    return total


# --- attended keys (cache engineering: dropped KV is not attended) ------------------------
#
# A token costs W + (keys it attends to) per layer, not W + position: keys a context edit
# dropped (AKV ``drop``, MemDecay / SparseEngine pruning) are not read. Hidden keys are given as
# half-open token intervals [s, e) lying before the computed range; a sliding-window layer
# (window w, cap c = w - 1) sees keys [p - c, p) of which the hidden ones are subtracted.

def _hidden_prefix(x: np.ndarray, s: np.ndarray, length: np.ndarray) -> np.ndarray:
    """``sum(clip(q - s, 0, L) for q < x)`` per interval, in closed form: the hidden keys
    of [s, s + L) seen by all tokens before position ``x`` under full attention."""
    n = np.clip(x - s - 1, 0, length)
    return n * (n + 1) // 2 + np.maximum(0, x - s - 1 - length) * length


def hidden_key_sum(a: int, b: int, starts: np.ndarray, ends: np.ndarray,
                   cap: int | None = None) -> int:
    """``sum over p in [a, b) of |[max(0, p - cap), p) ∩ hidden|`` (``cap=None``: [0, p)),
    where hidden is the union of the disjoint intervals ``[starts[i], ends[i])``: the keys a
    token would attend to but may not. Closed form per interval, vectorized."""
    if b <= a or len(starts) == 0:
        return 0
    s = np.asarray(starts, dtype=np.int64)
    length = np.asarray(ends, dtype=np.int64) - s
    total = _hidden_prefix(np.int64(b), s, length) - _hidden_prefix(np.int64(a), s, length)
    if cap is not None:
        total = total - (_hidden_prefix(np.int64(b - cap), s, length)
                         - _hidden_prefix(np.int64(a - cap), s, length))
    return int(total.sum())


def attended_units(spec: ModelSpec, a: int, b: int, starts: np.ndarray, ends: np.ndarray
                   ) -> int:
    """Attention units of computing positions ``[a, b)`` when the keys in the disjoint
    intervals ``[starts, ends)`` are not attended: per layer, each token counts the keys it
    attends to (``min(p, w - 1)`` minus the hidden ones in its window)."""
    total = 0
    for count, cap in spec.window_caps:
        total += count * (position_sum(a, b, cap) - hidden_key_sum(a, b, starts, ends, cap))
    if spec.extra_terms:  # hybrid terms as without hidden keys (docs/hybrid.md)
        total += extra_units(spec, a, b)
    return int(total) if spec.attention_weights else total


def range_units_hidden(spec: ModelSpec, a: int, b: int, starts: np.ndarray,
                       ends: np.ndarray) -> Units:
    """``range_units`` with the keys in ``[starts, ends)`` not attended."""
    if a < 0 or b < a:
        raise ValueError(f"bad token range [{a}, {b})")
    n = b - a
    return Units(spec.layers * n * spec.W, attended_units(spec, a, b, starts, ends), n)


# --- re-rotation (AKV ``repos``, Leyline splice) ----------------------------------------------
def rerotation_bytes(spec: ModelSpec, tokens: int) -> int:
    """HBM bytes of re-rotating ``tokens`` retained keys after an edit moved them: the K half
    of their KV (every layer) is read and written once (V does not depend on position)."""
    return 2 * tokens * (spec.kv_bytes_per_token // 2)


def rerotation_seconds(spec: ModelSpec, profile: Profile, tokens: int) -> float:
    """A bandwidth-bound pass over the moved keys: ``rerotation_bytes`` over the profile's
    memory bandwidth, taken from its decode KV-read coefficient (the bytes a decode step reads
    per context token, ``costmodel/gpus.py`` ``decode_read_bytes``, over
    ``decode.per_context_token_s``: the bandwidth decode steps already read KV at)."""
    from .gpus import decode_read_bytes

    per_token = profile.decode.per_context_token_s
    read = decode_read_bytes(spec, profile.gpus, profile.gpus)[0]
    if tokens <= 0 or per_token <= 0 or read <= 0:
        return 0.0
    bandwidth = read / per_token
    return rerotation_bytes(spec, tokens) / bandwidth
