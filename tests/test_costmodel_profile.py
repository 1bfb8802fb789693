"""Profiles: shipped files equal their derivation; bad files are refused with the field named."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel import derive
from costmodel.errors import ProfileError
from costmodel.profile import load_profile, shipped_profiles
from costmodel.specs import model_names
from costmodel.units import range_units


def test_every_model_has_a_derived_h100_profile() -> None:
    for m in model_names():
        p = load_profile(f"derived-h100-{m}", m)
        assert p.model == m
        assert p.provenance == "derived, not measured"
        assert p.to_dict() == derive.derive(m).to_dict(), \
            "run python -m costmodel.derive --update-shipped"
    assert len(shipped_profiles()) >= 4 * len(model_names())


def test_the_default_is_the_measured_kernel_h100_profile() -> None:
    for m in model_names():
        p = load_profile(None, m)
        assert p.name == f"kernels-h100_sxm-{m}"
        assert p.provenance.startswith("fitted to measured kernel tables")


def test_the_old_derived_names_point_to_the_new_ones() -> None:
    with pytest.raises(ProfileError, match=r"derived-h100-qwen3-8b.*kernels-h100_sxm-qwen3-8b"):
        load_profile("h100-qwen3-8b")


def test_prefill_seconds_is_linear_in_units() -> None:
    p = load_profile("derived-h100-qwen3-8b")
    u = range_units(p.spec, 0, 8192)
    t = p.prefill_seconds(u)
    assert t == pytest.approx(p.prefill.fixed_s + p.prefill.per_linear_unit_s * u.linear
                              + p.prefill.per_attention_unit_s * u.attention)
    # A 100K-token prefill of an 8B model on one H100 takes seconds, not minutes.
    assert 3 < p.prefill_seconds(range_units(p.spec, 0, 100_000)) < 15


def test_decode_and_transfer() -> None:
    p = load_profile("derived-h100-qwen3-8b")
    one = p.decode_step_seconds(1, 1000)
    assert 0.005 < one < 0.05
    assert p.decode_step_seconds(8, 800_000) > one
    assert p.transfer_seconds(0, "h2d") == 0
    assert p.transfer_seconds(51.2e9, "h2d") == pytest.approx(1 + p.transfer.latency_s)


def _steps_by_bisection(p, batch: int, ctx: int, elapsed: float, cap: int) -> int:
    lo, hi = 1, cap
    while lo < hi:
        mid = (lo + hi) // 2
        if p.decode_run_seconds(batch, ctx, mid) >= elapsed:
            hi = mid
        else:
            lo = mid + 1
    return lo


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 512), st.integers(0, 1 << 24), st.floats(0.0, 120.0),
       st.integers(1, 1 << 14), st.sampled_from(["derived-h100-qwen3-8b",
                                                  "kernels-h100_sxm-qwen3-8b"]),
       st.sampled_from([None, 0.0, 1e-12]))
def test_the_step_in_flight_is_the_bisections(batch, ctx, elapsed, cap, name, per_token) -> None:
    """``decode_steps_within`` proposes the step in flight in closed form; it must be the
    smallest k the run's own price puts at or past ``elapsed``, as a bisection finds it (also
    with no per-token cost: a flat series)."""
    p = load_profile(name)
    if per_token is not None:
        p = dataclasses.replace(p, decode=dataclasses.replace(p.decode,
                                                              per_context_token_s=per_token))
    assert p.decode_steps_within(batch, ctx, elapsed, cap) \
        == _steps_by_bisection(p, batch, ctx, elapsed, cap)
    total = p.decode_run_seconds(batch, ctx, cap)
    k = p.decode_steps_within(batch, ctx, total * 0.999, cap)
    assert k == _steps_by_bisection(p, batch, ctx, total * 0.999, cap)


def test_profile_round_trip(tmp_path: Path) -> None:
    p = load_profile("derived-h100-qwen3-32b")
    out = tmp_path / "p.yaml"
    p.dump(out)
    assert load_profile(str(out)).to_dict() == p.to_dict()


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["prefill"].pop("per_attention_unit_s"), "prefill.per_attention_unit_s"),
        (lambda d: d["decode"].update(fixed_s="fast"), "decode.fixed_s"),
        (lambda d: d["prefill"].update(fixed_s=float("nan")), "prefill.fixed_s"),
        (lambda d: d["transfer"].update(latency_s=-1), "transfer.latency_s"),
        (lambda d: d.update(model="gpt-17"), "model"),
        (lambda d: d.update(kvsim_profile=99), "kvsim_profile"),
        (lambda d: d["prefill"].update(bogus=1), "prefill.bogus"),
    ],
)
def test_bad_profiles_name_the_field(tmp_path: Path, mutate, field: str) -> None:
    d = load_profile("derived-h100-qwen3-8b").to_dict()
    mutate(d)
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(d))
    with pytest.raises(ProfileError) as e:
        load_profile(str(f))
    assert e.value.field == field
    assert str(f) in str(e.value)


def test_profile_for_another_model_is_refused() -> None:
    with pytest.raises(ProfileError, match="not 'qwen3-8b'"):
        load_profile("derived-h100-qwen3-32b", "qwen3-8b")


def test_yaml_is_safe_loaded(tmp_path: Path) -> None:
    f = tmp_path / "evil.yaml"
    f.write_text("!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(str(f))


def test_the_fast_loader_reads_every_shipped_yaml_as_safe_load_does() -> None:
    """libyaml's parser (``SAFE_LOADER``) must give the values ``yaml.safe_load`` gives, on every
    shipped profile and catalog."""
    from importlib import resources

    from costmodel.safeyaml import SAFE_LOADER
    files = [f for d in ("profiles", "data") for f in (resources.files("costmodel") / d).iterdir()
             if f.name.endswith(".yaml")]
    assert files
    for f in files:
        text = f.read_text()
        assert yaml.load(text, Loader=SAFE_LOADER) == yaml.safe_load(text), f.name


def test_an_moe_decode_step_reads_the_experts_its_tokens_route_to(tmp_path: Path) -> None:
    """An MoE decode step reads the share of a GPU's experts its tokens route to (each token
    picks k of E), which saturates long before the batch is large; the kernel-table MoE
    profiles hold that curve (``decode.experts_s``; calibration/kernels/run.py), so they
    follow their own tables where a line in the batch missed them by up to 44% in median."""
    from costmodel.profile import expert_share
    from costmodel.specs import get_spec

    moe = get_spec("qwen3-30b-a3b")  # 128 experts, 8 a token
    assert expert_share(moe, 1) == pytest.approx(8 / 128)
    assert expert_share(moe, 32) == pytest.approx(1 - (120 / 128) ** 32)
    assert expert_share(moe, 16, group=2) == expert_share(moe, 32)
    assert expert_share(get_spec("qwen3-32b"), 64) == 0.0

    p = load_profile("kernels-rtx_pro_6000_server-vllm-qwen3-30b-a3b-dp2ep2")
    d = p.decode
    assert d.experts_s > 0 and p.expert_share(16) == expert_share(moe, 16, group=2)
    for b in (1, 8, 64):
        assert p.decode_kernel_seconds(b, 1000 * b) == pytest.approx(
            d.weights_s + d.per_seq_s * b + d.per_context_token_s * 1000 * b
            + d.experts_s * p.expert_share(b))
    # a mixed step's prefill chunk already reads every expert its decode rows read: the rows
    # add their own reads (per row, KV), never less than those at any batch
    from costmodel.profile import ServerCoeffs

    q = p.with_server(ServerCoeffs(mixed_decode_rows=1.0), "test")
    for b in (1, 2, 64):
        own = d.per_seq_s * b + d.per_context_token_s * 1000 * b
        assert own > 0
        assert q.mixed_seconds(0.2, q.decode_kernel_seconds(b, 1000 * b), b) == \
            pytest.approx(0.2 + own)
    out = tmp_path / "moe.yaml"
    p.dump(out)
    assert load_profile(str(out)).decode == d
    assert "experts_s" not in load_profile("kernels-h100_sxm-qwen3-8b").to_dict()["decode"]

    moe_kernels = [n for n in shipped_profiles() if n.startswith("kernels-")
                   and get_spec(load_profile(n).model).experts]
    assert len(moe_kernels) > 50
    for name in moe_kernels:
        prof = load_profile(name)
        fit = prof.details["fit"]["decode"]
        assert prof.decode.experts_s > 0, name
        assert fit["median_abs_rel_error"] < 0.25, name
