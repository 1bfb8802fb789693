"""Calibration: time real prefill/decode with a pure-torch decoder stack and fit a profile.

``kvsim calibrate`` builds a decoder stack with a model spec's exact shapes and random weights
(:mod:`calibration.stack`, attention in :mod:`calibration.attention`; ``--quick`` uses the tiny
stand-in of :mod:`calibration.tiny`), times prefill of token ranges over a cached prefix, decode
steps and host<->device copies (:mod:`calibration.measure`) on the points of a grid
(:mod:`calibration.grid`), fits the profile coefficients with non-negative least squares
(:mod:`calibration.fit`, numpy/scipy only) and writes a ``costmodel`` profile
(:mod:`calibration.run`).

torch is optional for kvsim: this package imports it lazily, inside functions, so
``import calibration`` (and the grid and fit modules) work without it; running a measurement
without torch raises :class:`calibration.errors.CalibrationError` (exit status 2).
"""

from .errors import CalibrationError

__all__ = ["CalibrationError"]
