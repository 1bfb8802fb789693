"""Closed-form unit sums equal brute-force sums (hypothesis), incl. sliding-window layers."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.specs import ModelSpec, get_spec
from costmodel.units import position_sum, range_units, ranges_units


def brute_units(spec: ModelSpec, a: int, b: int) -> tuple[float, int]:
    linear, attention = 0.0, 0
    for window in spec.windows():
        for p in range(a, b):
            linear += spec.W
            attention += p if window is None else min(p, window - 1)
    return linear, attention


@given(a=st.integers(0, 400), n=st.integers(0, 300), cap=st.none() | st.integers(0, 500))
def test_position_sum_matches_loop(a: int, n: int, cap: int | None) -> None:
    b = a + n
    expected = sum(p if cap is None else min(p, cap) for p in range(a, b))
    assert position_sum(a, b, cap) == expected


layer_window = st.none() | st.integers(1, 64)


@settings(max_examples=200)
@given(windows=st.lists(layer_window, min_size=1, max_size=6), a=st.integers(0, 200),
       n=st.integers(0, 150))
def test_range_units_match_brute_force_on_layer_mixes(windows: list, a: int, n: int) -> None:
    spec = ModelSpec("mix", layers=len(windows), hidden=64, q_heads=4, kv_heads=2, head_dim=16,
                     ffn=96, layer_windows=tuple(windows))
    u = range_units(spec, a, a + n)
    linear, attention = brute_units(spec, a, a + n)
    assert u.attention == attention
    assert abs(u.linear - linear) <= 1e-9 * max(1.0, linear)
    assert u.tokens == n


@given(cuts=st.lists(st.integers(0, 500), min_size=2, max_size=6, unique=True))
def test_ranges_are_additive(cuts: list[int]) -> None:
    spec = get_spec("gemma-3-27b")
    cuts = sorted(cuts)
    pieces = list(itertools.pairwise(cuts))
    whole = range_units(spec, cuts[0], cuts[-1])
    split = ranges_units(spec, pieces)
    assert split.attention == whole.attention
    assert abs(split.linear - whole.linear) < 1e-6 * whole.linear + 1e-9


def test_token_at_position_p_costs_W_plus_p_per_layer() -> None:
    spec = get_spec("qwen3-8b")
    u = range_units(spec, 1000, 1001)
    assert u.total == spec.layers * (23_552 + 1000)
