"""Closed-form unit sums (Section 2.2). Never loop over tokens.

Computing tokens at positions ``[a, b)`` with everything before ``a`` cached costs, summed over
layers::

    linear    = layers * (b - a) * W
    attention = sum over layers of sum_{p=a}^{b-1} min(p, cap_layer)

where ``cap_layer`` is unbounded for full attention and ``window - 1`` for a sliding window.
A batch of ranges (a phantom request's hole plus the real request's new tokens) is priced as
the sum of its ranges: positions are kept, so the hole costs what it originally cost.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .specs import ModelSpec


@dataclass(frozen=True)
class Units:
    """Work of a set of token ranges, over all layers: ``linear`` (W per token per layer) and
    ``attention`` (one per query-key pair per layer)."""

    linear: float = 0.0
    attention: int = 0
    tokens: int = 0

    @property
    def total(self) -> float:
        return self.linear + self.attention

    def __add__(self, other: Units) -> Units:
        return Units(self.linear + other.linear, self.attention + other.attention,
                     self.tokens + other.tokens)


def position_sum(a: int, b: int, cap: int | None = None) -> int:
    """``sum(min(p, cap) for p in range(a, b))`` in closed form; ``cap=None`` means no cap."""
    if b <= a:
        return 0
    if cap is None or b <= cap:
        return (a + b - 1) * (b - a) // 2
    if a >= cap:
        return (b - a) * cap
    return (a + cap - 1) * (cap - a) // 2 + (b - cap) * cap


def attention_units(spec: ModelSpec, a: int, b: int) -> int:
    """Attention units of computing positions ``[a, b)`` in every layer of ``spec``."""
    total = 0
    for window, count in spec.window_groups().items():
        total += count * position_sum(a, b, None if window is None else window - 1)
    return total


def range_units(spec: ModelSpec, a: int, b: int) -> Units:
    """Units of computing positions ``[a, b)`` over a cached prefix of ``a`` tokens."""
    if a < 0 or b < a:
        raise ValueError(f"bad token range [{a}, {b})")
    n = b - a
    return Units(spec.layers * n * spec.W, attention_units(spec, a, b), n)


def ranges_units(spec: ModelSpec, ranges: Iterable[tuple[int, int]]) -> Units:
    """Units of one batch computing several disjoint ranges (e.g. phantom + real request)."""
    total = Units()
    for a, b in ranges:
        total = total + range_units(spec, a, b)
    return total
