"""The calibration harness computes the right thing: its attention equals a naive reference
(offset prefix, sliding windows, GQA, decode batches), its layers have the spec's exact shapes,
and a prefill over a cache, a hole restored in one batch with new tokens and a decode step all
reproduce a from-scratch prefill of the whole sequence."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from calibration.attention import attend, key_span, naive_attention  # noqa: E402
from calibration.stack import DecoderStack, layer_shapes  # noqa: E402
from calibration.tiny import tiny_spec  # noqa: E402
from costmodel.specs import ModelSpec, get_spec, model_names  # noqa: E402

TOL = 1e-10  # float64 everywhere in these tests


def _cache(hkv, length, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, hkv, length, d, generator=g, dtype=torch.float64),
            torch.randn(1, hkv, length, d, generator=g, dtype=torch.float64))


def _check_attend(start, n, window, hq=8, hkv=2, d=16, seed=0):
    ck, cv = _cache(hkv, start + n + 7, d, seed)  # cache longer than needed: must not be read
    q = torch.randn(1, hq, n, d, generator=torch.Generator().manual_seed(seed + 1),
                    dtype=torch.float64)
    out = attend(q, ck, cv, start, window)[0]
    ref = naive_attention(q[0], ck[0, :, :start + n], cv[0, :, :start + n],
                          torch.arange(start, start + n), torch.arange(start + n), window)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() < TOL


@pytest.mark.parametrize("start,n,window", [
    (0, 64, None),      # plain causal
    (100, 37, None),    # offset prefix: lower-right causal
    (100, 1, None),     # one query (decode)
    (100, 50, 20),      # window cuts inside the span
    (5, 50, 20),        # window starts cutting mid-range
    (10, 5, 20),        # window wider than the span: no cut
    (250, 50, 7),
    (0, 40, 1),         # window 1: each token sees only itself
    (0, 200, 16),       # several window chunks
])
def test_attend_equals_naive(start, n, window):
    _check_attend(start, n, window)


@settings(max_examples=25, deadline=None)
@given(start=st.integers(0, 300), n=st.integers(1, 120),
       window=st.one_of(st.none(), st.integers(1, 200)), group=st.sampled_from([1, 2, 4]))
def test_attend_equals_naive_property(start, n, window, group):
    _check_attend(start, n, window, hq=2 * group, hkv=2, d=8, seed=start * 1000 + n)


def test_key_span():
    assert key_span(100, 10, None) == (0, 110)
    assert key_span(100, 10, 20) == (81, 110)
    assert key_span(5, 10, 20) == (0, 15)


def test_decode_batch_attention_equals_naive():
    hq, hkv, d, c, bsz = 8, 2, 16, 90, 3
    g = torch.Generator().manual_seed(5)
    ck = torch.randn(bsz, hkv, c, d, generator=g, dtype=torch.float64)
    cv = torch.randn(bsz, hkv, c, d, generator=g, dtype=torch.float64)
    q = torch.randn(bsz, hq, 1, d, generator=g, dtype=torch.float64)
    for window in (None, 10):
        out = attend(q, ck, cv, c - 1, window)
        for b in range(bsz):
            ref = naive_attention(q[b], ck[b], cv[b], torch.tensor([c - 1]), torch.arange(c),
                                  window)
            assert (out[b] - ref).abs().max().item() < TOL


@pytest.mark.parametrize("name", model_names())
def test_layer_shapes_match_spec_macs(name):
    spec = get_spec(name)
    shapes = layer_shapes(spec)
    macs = math.prod(shapes["wqkv"]) + math.prod(shapes["wo"])
    macs += sum(math.prod(a) + math.prod(b) for a, b in shapes["ffn"])
    assert macs == spec.linear_macs_per_token


SMALL = ModelSpec("test-small", layers=3, hidden=64, q_heads=4, kv_heads=2, head_dim=16,
                  ffn=96)
SMALL_MOE = ModelSpec("test-moe", layers=2, hidden=64, q_heads=4, kv_heads=1, head_dim=16,
                      experts=8, active_experts=3, expert_ffn=32)
MIXED = [None, 12, None]  # full, sliding window 12, full


def _stack(spec, windows, capacity=200):
    return DecoderStack(spec, windows, capacity, "cpu", torch.float64, seed=7)


def _x(length, hidden, seed=3):
    return torch.randn(length, hidden, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


@pytest.mark.parametrize("spec,windows", [(SMALL, MIXED), (SMALL_MOE, [None, 5])])
def test_prefill_over_cached_prefix_equals_full_prefill(spec, windows):
    p, n = 70, 45
    x = _x(p + n, spec.hidden)
    with torch.inference_mode():
        full = _stack(spec, windows).prefill(x, [(0, p + n)])
        s = _stack(spec, windows)
        s.prefill(x[:p], [(0, p)])
        part = s.prefill(x[p:], [(p, p + n)])
    assert (part - full[p:]).abs().max().item() < TOL


def test_hole_restored_in_one_batch_equals_full_prefill():
    """Phantom range [a, b) batched with the real request's new tokens [c, c + n): the real
    request reads the hole's K/V written in the same layer (write before read)."""
    a, b, c, n = 20, 60, 110, 30
    x = _x(c + n, SMALL.hidden)
    with torch.inference_mode():
        full = _stack(SMALL, MIXED).prefill(x, [(0, c + n)])
        s = _stack(SMALL, MIXED)
        s.prefill(x[:c], [(0, c)])
        for ck, cv in s.cache:  # free the hole: its K/V become garbage
            ck[:, :, a:b] = 1e3
            cv[:, :, a:b] = -1e3
        out = s.prefill(torch.cat([x[a:b], x[c:]]), [(a, b), (c, c + n)])
    assert (out[: b - a] - full[a:b]).abs().max().item() < TOL
    assert (out[b - a:] - full[c:]).abs().max().item() < TOL


def test_decode_step_equals_prefill_of_last_token():
    c, bsz = 50, 2
    xs = [_x(c, SMALL.hidden, seed=10 + i) for i in range(bsz)]
    with torch.inference_mode():
        refs, caches = [], []
        for x in xs:
            refs.append(_stack(SMALL, MIXED).prefill(x, [(0, c)])[-1])
            s = _stack(SMALL, MIXED, capacity=c)
            s.prefill(x[:c - 1], [(0, c - 1)])
            caches.append(s.cache)
        batched = [(torch.cat([cs[i][0] for cs in caches]), torch.cat([cs[i][1] for cs in caches]))
                   for i in range(len(MIXED))]
        out = _stack(SMALL, MIXED, capacity=1).decode_step(
            torch.stack([x[-1] for x in xs]), c, batched)
    for i in range(bsz):
        assert (out[i] - refs[i]).abs().max().item() < TOL


def test_tiny_spec_keeps_depth_ratios_and_windows():
    for name in model_names():
        spec, tiny = get_spec(name), tiny_spec(get_spec(name))
        assert tiny.layers == spec.layers
        assert tiny.q_heads % tiny.kv_heads == 0
        assert tiny.active_experts == spec.active_experts
        assert [w is None for w in tiny.windows()] == [w is None for w in spec.windows()]


def test_prefill_rejects_ranges_outside_cache():
    s = _stack(SMALL, [None], capacity=10)
    with pytest.raises(ValueError, match="outside"):
        s.prefill(_x(5, SMALL.hidden), [(8, 13)])


def test_bf16_stack_runs_and_stays_close_to_float64():
    """The CUDA path runs bf16: the same code in bf16 on a CPU (dtype handling of RoPE, masks,
    caches) stays close to the float64 result."""
    p, n = 40, 24
    x = _x(p + n, SMALL.hidden)
    with torch.inference_mode():
        ref = _stack(SMALL, MIXED).prefill(x, [(0, p + n)])
        s = DecoderStack(SMALL, MIXED, 200, "cpu", torch.bfloat16, seed=7)
        s.prefill(x[:p].to(torch.bfloat16), [(0, p)])
        out = s.prefill(x[p:].to(torch.bfloat16), [(p, p + n)])
        caches = [(ck[:, :, : p + n + 1], cv[:, :, : p + n + 1]) for ck, cv in s.cache]
        step = s.decode_step(x[-1:].to(torch.bfloat16), p + n + 1, caches)
    assert out.dtype == torch.bfloat16 and step.shape == (1, SMALL.hidden)
    err = (out.double() - ref[p:]).abs().max().item() / ref[p:].abs().max().item()
    assert err < 0.05
