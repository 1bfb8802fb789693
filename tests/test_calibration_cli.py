"""``kvsim calibrate`` end to end on this CPU (the issue's acceptance test), the profile it
writes used by ``kvsim microbench figure1 --profile``, and its input errors (exit status 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from costmodel.profile import load_profile

KVSIM = [sys.executable, "-c", "from sim.cli.main import main; main()"]


def kvsim(*args: str, block_torch: bool = False) -> subprocess.CompletedProcess:
    cmd = list(KVSIM)
    if block_torch:
        cmd[2] = "import sys; sys.modules['torch'] = None; " + cmd[2]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("calib") / "sub" / "quick.yaml"
    r = kvsim("calibrate", "--device", "cpu", "--quick", "--json", "--out", str(out),
              "--date", "2026-01-02")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), out


@pytest.mark.slow
def test_quick_calibration_fits_this_cpu(quick):
    doc, out = quick
    f = doc["fit"]
    for key in ("r2", "median_abs_rel_error", "max_abs_rel_error",
                "holdout_median_abs_rel_error"):
        assert isinstance(f[key], float), key
    assert f["holdout_median_abs_rel_error"] < 0.15  # the acceptance criterion
    assert f["r2"] > 0.9
    assert f["holdout_points"] >= 3
    assert doc["out"] == str(out)
    assert doc["profile"]["model"] == "qwen3-8b"


@pytest.mark.slow
def test_quick_profile_file_has_provenance_and_loads(quick):
    doc, out = quick
    prof = load_profile(str(out), "qwen3-8b")
    assert prof.to_dict() == doc["profile"]
    d = prof.details
    assert d["date"] == "2026-01-02" and d["quick"] is True
    assert d["torch_version"] and d["device"] and d["device_type"] == "cpu"
    assert d["layers_timed"] == {"full": {"model_layers": 36, "layers_timed": 1}}
    assert d["timed_spec"]["hidden"] == 512  # the tiny shapes are recorded
    assert d["grid"]["name"] == "quick" and d["prefill_points"] and d["decode_points"]
    assert d["attention_self_check_max_abs_error"] < 1e-4
    assert "host memcpy" in d["copy_measurement"]
    assert prof.prefill.per_linear_unit_s > 0 and prof.prefill.per_attention_unit_s > 0
    assert prof.transfer.h2d_bytes_per_s > 0
    assert len(d["figure1_measured"]) == 3 and len(d["hole_restore"]) == 2
    for row in d["hole_restore"]:
        assert row["batched_s"] > 0 and row["apart_s"] > 0


@pytest.mark.slow
def test_figure1_accepts_the_written_profile(quick):
    _, out = quick
    r = kvsim("microbench", "figure1", "--profile", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["profile"] == "measured-quick-cpu-qwen3-8b"
    assert len(doc["rows"]) == 5
    assert all(row["speedup_seconds"] > 1 for row in doc["rows"])


def test_cuda_without_a_gpu_is_an_input_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = kvsim("calibrate", "--device", "cuda", "--quick")
    assert r.returncode == 2
    assert r.stderr.startswith("kvsim: error: --device cuda") and "Traceback" not in r.stderr


def test_unknown_model_is_an_input_error():
    r = kvsim("calibrate", "--quick", "--model", "no-such-model")
    assert r.returncode == 2 and "unknown model" in r.stderr


def test_missing_torch_says_how_to_install():
    r = kvsim("calibrate", "--quick", block_torch=True)
    assert r.returncode == 2
    assert "pip install 'kvsim[calibration]'" in r.stderr and "Traceback" not in r.stderr
