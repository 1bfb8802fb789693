"""Cache engineering costs: a token costs W + (keys it attends to), dropped keys are not
attended (full and sliding-window layers), and moved keys are re-rotated in one
bandwidth-bound pass. Hand-computed cases first, then brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.profile import load_profile
from costmodel.specs import ModelSpec, get_spec
from costmodel.units import (
    Units,
    attended_units,
    hidden_key_sum,
    range_units,
    range_units_hidden,
    rerotation_bytes,
    rerotation_seconds,
)
from sim.context.view import RequestView

FULL2 = ModelSpec("t-full", layers=2, hidden=64, q_heads=1, kv_heads=1, head_dim=32, ffn=64)
WIN4 = ModelSpec("t-win", layers=1, hidden=64, q_heads=1, kv_heads=1, head_dim=32, ffn=64,
                 layer_windows=(4,))
MIXED = ModelSpec("t-mixed", layers=2, hidden=64, q_heads=1, kv_heads=1, head_dim=32, ffn=64,
                  layer_windows=(None, 4))


def arr(*x: int) -> np.ndarray:
    return np.array(x, dtype=np.int64)


# --- hand-computed -----------------------------------------------------------------------------
def test_full_attention_skips_dropped_keys() -> None:
    # tokens 10..13 attend p keys each, minus the 3 dropped keys 2, 3, 4:
    # (10 - 3) + (11 - 3) + (12 - 3) + (13 - 3) = 34 per layer, 2 layers
    assert attended_units(FULL2, 10, 14, arr(2), arr(5)) == 68
    assert attended_units(FULL2, 10, 14, arr(), arr()) == 2 * (10 + 11 + 12 + 13)


def test_tokens_inside_a_dropped_interval() -> None:
    # restoring tokens 3..5 while keys [0, 4) are hidden: token 3 sees [0, 3) -> 0, token 4
    # sees [0, 4) -> 0, token 5 sees [0, 5) minus 4 hidden -> 1
    assert attended_units(FULL2, 3, 6, arr(0), arr(4)) == 2 * 1


def test_sliding_window_only_subtracts_dropped_keys_inside_the_window() -> None:
    # window 4: a token at p sees keys [p - 3, p). Hidden [8, 10):
    # p=10 sees 7, 8, 9 -> 1 visible; p=11 sees 8, 9, 10 -> 1; p=12 sees 9, 10, 11 -> 2
    assert attended_units(WIN4, 10, 13, arr(8), arr(10)) == 4
    # far behind the window: nothing to subtract, 3 keys per token
    assert attended_units(WIN4, 100, 103, arr(8), arr(10)) == 9
    # mixed: the full layer subtracts the 2 dropped keys from every token
    full = (10 - 2) + (11 - 2) + (12 - 2)
    assert attended_units(MIXED, 10, 13, arr(8), arr(10)) == full + 4


def test_hidden_key_sum_two_intervals() -> None:
    # p in 20..21, full attention: both intervals [2, 4) and [10, 15) entirely behind
    assert hidden_key_sum(20, 22, arr(2, 10), arr(4, 15)) == 2 * (2 + 5)
    # window cap 9 (keys [p - 9, p)): p=20 sees [11, 20) -> 11..14 hidden = 4;
    # p=21 sees [12, 21) -> 12..14 = 3
    assert hidden_key_sum(20, 22, arr(2, 10), arr(4, 15), cap=9) == 7


def test_range_units_hidden_keeps_linear_work() -> None:
    u = range_units_hidden(FULL2, 10, 14, arr(2), arr(5))
    plain = range_units(FULL2, 10, 14)
    assert (u.linear, u.tokens) == (plain.linear, plain.tokens)
    assert u.attention == plain.attention - 2 * 4 * 3


def test_units_of_cuts_at_the_trigger() -> None:
    # keys [0, 64) dropped from token 128 on: tokens 64..127 still see them, 128..191 not
    view = RequestView("turn", 0, arr(1), 192, 1, arr(1), hid_s=arr(0), hid_e=arr(64),
                       hid_t=arr(128))
    got = view.units(FULL2, 64, 192)
    want = range_units(FULL2, 64, 128) + range_units_hidden(FULL2, 128, 192, arr(0), arr(64))
    assert got == want
    assert got.attention == range_units(FULL2, 64, 192).attention - 2 * 64 * 64


def test_rerotation_price_from_the_profile_bandwidth() -> None:
    spec = get_spec("qwen3-8b")
    # K and V of 36 layers x 8 KV heads x 128 dims x 2 bytes = 147,456 bytes per token;
    # the K half (73,728) is read and written once per token
    assert spec.kv_bytes_per_token == 147_456
    assert rerotation_bytes(spec, 1000) == 2 * 1000 * 73_728
    prof = load_profile("derived-h100-qwen3-8b", "qwen3-8b")
    # derived profile: decode reads KV at 3.35e12 B/s x 0.8 (one H100)
    bw = 3.35e12 * 0.8
    assert prof.decode.per_context_token_s == pytest.approx(147_456 / bw)
    assert rerotation_seconds(spec, prof, 1000) == pytest.approx(147_456_000 / bw)
    assert rerotation_seconds(spec, prof, 0) == 0.0


# --- brute force ---------------------------------------------------------------------------------
def brute_hidden(a: int, b: int, intervals: list[tuple[int, int]], cap: int | None) -> int:
    total = 0
    for p in range(a, b):
        lo = 0 if cap is None else max(0, p - cap)
        total += sum(1 for q in range(lo, p) if any(s <= q < e for s, e in intervals))
    return total


@st.composite
def disjoint_intervals(draw, limit: int = 60):
    points = sorted(draw(st.sets(st.integers(0, limit), max_size=8)))
    points = points[: len(points) // 2 * 2]
    return list(zip(points[::2], points[1::2], strict=True))


@settings(max_examples=300, deadline=None)
@given(intervals=disjoint_intervals(), a=st.integers(0, 70), n=st.integers(0, 30),
       cap=st.sampled_from([None, 1, 3, 8, 25]))
def test_hidden_key_sum_matches_brute_force(intervals, a, n, cap) -> None:
    s = np.array([x for x, _ in intervals], np.int64)
    e = np.array([y for _, y in intervals], np.int64)
    assert hidden_key_sum(a, a + n, s, e, cap) == brute_hidden(a, a + n, intervals, cap)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_units_of_matches_per_token_brute_force(data) -> None:
    """Each token counts the keys it attends to: all keys before it, minus those dropped by
    an event whose trigger is at or before it, within the layer's window."""
    events = []
    cursor = 0
    for _ in range(data.draw(st.integers(0, 3))):
        trig = cursor + data.draw(st.integers(2, 20))
        s = data.draw(st.integers(cursor, trig - 1))
        e = data.draw(st.integers(s + 1, trig))
        events.append((s, e, trig))
        cursor = trig
    a = data.draw(st.integers(0, cursor + 10))
    b = a + data.draw(st.integers(0, 25))
    view = RequestView("turn", 0, arr(1), b, 1, arr(1),
                       hid_s=np.array([x[0] for x in events], np.int64),
                       hid_e=np.array([x[1] for x in events], np.int64),
                       hid_t=np.array([x[2] for x in events], np.int64))
    for spec in (FULL2, WIN4, MIXED):
        att = 0
        for p in range(a, b):
            hidden = {q for s, e, t in events if t <= p for q in range(s, e)}
            for window, count in spec.window_groups().items():
                lo = 0 if window is None else max(0, p - (window - 1))
                att += count * sum(1 for q in range(lo, p) if q not in hidden)
        got = view.units(spec, a, b)
        assert got.attention == att
        assert got.tokens == b - a and got == Units(spec.layers * (b - a) * spec.W, att, b - a)
