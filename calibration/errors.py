"""Errors of the calibration harness. Each carries ``exit_code = 2`` so the CLI prints one
``kvsim: error: ...`` line instead of a traceback."""

from __future__ import annotations


class CalibrationError(RuntimeError):
    """Calibration cannot run as asked (no torch, no CUDA, a bad option, too much memory)."""

    exit_code = 2


TORCH_HINT = "torch is needed for calibration: pip install 'kvsim[calibration]'"


def require_torch():  # -> the torch module
    """Import torch lazily: ``import calibration`` must work without it."""
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is installed in the test venv
        raise CalibrationError(f"{TORCH_HINT} ({e})") from None
    return torch
