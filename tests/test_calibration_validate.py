"""A calibration never writes a profile that ``load_profile`` would refuse (issue 11): the
profile is validated before the file is written, and a bad one exits 2 naming the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from costmodel.errors import ProfileError
from costmodel.profile import TransferCoeffs, check_profile, load_profile
from sim.cli.main import cli


def _inf_bandwidth_profile():
    """What ``calibrate`` made when the copy fit returned ``s_per_byte`` 0: 1/0 -> inf."""
    good = load_profile("derived-h100-qwen3-8b")
    return dataclasses.replace(
        good, name="measured-cpu-qwen3-8b",
        transfer=TransferCoeffs(float("inf"), 1e10, 1e-5))


def test_check_profile_names_the_bad_field() -> None:
    with pytest.raises(ProfileError, match=r"transfer\.h2d_bytes_per_s"):
        check_profile(_inf_bandwidth_profile(), "out.yaml")
    check_profile(load_profile("derived-h100-qwen3-8b"), "out.yaml")  # a good one passes


def test_dump_refuses_an_invalid_profile(tmp_path: Path) -> None:
    out = tmp_path / "bad.yaml"
    with pytest.raises(ProfileError, match=r"transfer\.h2d_bytes_per_s"):
        _inf_bandwidth_profile().dump(out)
    assert not out.exists() and not list(tmp_path.iterdir())


def test_torch_calibrate_does_not_write_a_profile_load_profile_rejects(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import calibration.run

    bad = _inf_bandwidth_profile()
    monkeypatch.setattr(calibration.run, "calibrate",
                        lambda settings, progress=None: (bad, {"fit": {}, "details": {}}))
    out = tmp_path / "p.yaml"
    r = CliRunner().invoke(cli, ["calibrate", "--device", "cpu", "--out", str(out), "--json"])
    assert r.exit_code == 2, r.output
    assert "transfer.h2d_bytes_per_s" in r.output
    assert not out.exists() and not list(tmp_path.iterdir())
