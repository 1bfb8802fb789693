"""Fit and grids of the calibration (numpy/scipy only): NNLS recovers known coefficients,
reports honest held-out errors, stays non-negative; grids contain what the issue asks for;
``import calibration`` works without torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration import fit
from calibration.grid import GRIDS
from calibration.tiny import rescale_factors, tiny_spec
from costmodel.figure1 import APPEND, DELETE_FRACTION, FRONT_START
from costmodel.specs import get_spec, model_names

SPEC = get_spec("qwen3-8b")
TRUE = np.array([4e-3, 2.7e-11, 2.8e-11, 1e-12])


def _grid_design(name="cuda"):
    g = GRIDS[name]()
    return g, fit.prefill_design(SPEC, [p.ranges for p in g.prefill])


def test_exact_data_recovers_coefficients():
    g, a = _grid_design()
    res = fit.fit(fit.PREFILL_TERMS, a, a @ TRUE, [p.holdout for p in g.prefill])
    np.testing.assert_allclose(res.coeffs, TRUE, rtol=1e-6)
    assert res.metrics["median_abs_rel_error"] < 1e-8
    assert res.metrics["holdout_median_abs_rel_error"] < 1e-8
    assert res.r2 == pytest.approx(1.0)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), noise=st.floats(0.0, 0.05))
def test_noisy_data_fit_error_is_bounded_by_noise(seed, noise):
    g, a = _grid_design()
    rng = np.random.default_rng(seed)
    t = (a @ TRUE) * (1 + rng.uniform(-noise, noise, len(a)))
    res = fit.fit(fit.PREFILL_TERMS, a, t, [p.holdout for p in g.prefill])
    assert np.all(res.coeffs >= 0)
    # The fitted model is at least as good as the truth on the training rows (least squares)
    # and the truth is within `noise` of every point.
    train = ~res.holdout
    truth_rel = (a @ TRUE)[train] / t[train] - 1
    assert np.sum(res.rel_errors[train] ** 2) <= np.sum(truth_rel**2) * (1 + 1e-9) + 1e-18
    assert res.metrics["holdout_median_abs_rel_error"] < 3 * noise + 1e-9


def test_coefficients_stay_non_negative():
    # Time that falls with linear work would need a negative coefficient: clipped to 0.
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    res = fit.fit(("c", "slope"), a, [3.0, 2.0, 1.0])
    assert res.coeff("slope") == 0.0 and res.coeff("c") > 0


def test_metrics_definitions():
    a = fit.copy_design([1, 2, 3, 4])
    t = np.array([2.0, 3.0, 4.0, 5.0])
    res = fit.fit(fit.COPY_TERMS, a, t, [False, False, True, False])
    np.testing.assert_allclose(res.predicted, t)
    assert res.metrics["points"] == 3 and res.metrics["holdout_points"] == 1
    assert fit.r_squared(t, t) == 1.0
    assert fit.r_squared(t, np.full(4, t.mean())) == 0.0


def test_bad_times_refused():
    with pytest.raises(ValueError):
        fit.nnls_relative(np.ones((2, 1)), np.array([1.0, 0.0]))
    with pytest.raises(ValueError):
        fit.nnls_relative(np.ones((0, 1)), np.array([]))


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_grids_have_what_the_issue_asks(name):
    g = GRIDS[name]()
    kinds = {p.kind for p in g.prefill}
    assert {"p-sweep", "n-sweep", "figure1-front", "figure1-tail"} <= kinds
    assert len({p.ranges for p in g.prefill}) == len(g.prefill)
    for p in g.prefill:  # ranges sorted, disjoint, non-empty
        ends = [x for r in p.ranges for x in r]
        assert ends == sorted(ends) and all(a < b for a, b in p.ranges)
    # p varies at fixed n, n at fixed p
    sweep = [p.ranges[0] for p in g.prefill if p.kind == "p-sweep"]
    assert len({b - a for a, b in sweep}) == 1 and len({a for a, _ in sweep}) >= 5
    # held-out points exist, are never a sweep's ends, and the fit keeps most points
    held = [p for p in g.prefill if p.holdout]
    assert 3 <= len(held) <= len(g.prefill) // 3
    assert sweep[0] not in [h.ranges[0] for h in held]
    assert any(d.holdout for d in g.decode)
    # Figure 1: front and tail recompute the same number of tokens
    pairs = list(zip(g.prefill, g.prefill[1:], strict=False))
    figs = [(f, t) for f, t in pairs if f.kind == "figure1-front" and t.kind == "figure1-tail"]
    assert len(figs) == len(g.figure1_contexts)
    for f, t in figs:
        assert f.tokens == t.tokens
    # hole restore: batched and both parts measured
    measured = {p.ranges for p in g.prefill}
    assert g.hole_checks
    for hole, new in g.hole_checks:
        assert {(hole, new), (hole,), (new,)} <= measured


def test_cuda_grid_has_the_papers_figure1_cases():
    g = GRIDS["cuda"]()
    measured = {p.ranges for p in g.prefill}
    for k in (8, 16, 32, 64, 128):
        c = k * 1024
        d = round(DELETE_FRACTION * c)
        assert ((FRONT_START, FRONT_START + d), (c, c + APPEND)) in measured
        assert ((c - d, c + APPEND),) in measured
    assert g.capacity == 128 * 1024 + APPEND


def test_rescale_identity_and_direction():
    for name in model_names():
        spec = get_spec(name)
        assert set(rescale_factors(spec, spec).values()) == {1.0}
        assert all(v >= 1 for v in rescale_factors(tiny_spec(spec), spec).values())


def test_import_calibration_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import calibration, calibration.grid, calibration.fit, calibration.tiny\n"
        "import calibration.run as r\n"
        "from calibration.errors import CalibrationError\n"
        "try:\n"
        "    r.calibrate(r.Settings('qwen3-8b', 'cpu', quick=True))\n"
        "except CalibrationError as e:\n"
        "    print(e.exit_code, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("2 ") and "pip install 'kvsim[calibration]'" in out
