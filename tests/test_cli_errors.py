"""User mistakes never show a traceback: every case exits with status 2 and ONE stderr line
naming the file or option, before any simulation starts (issue 15, item 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.sweep import load_sweep, relative_change, tidy
from tests.enginekit import write_cc_traces

BINARY = bytes(range(256)) * 4  # not UTF-8
SWEEP = """
base:
  trace: {trace}
  gaps: tool
  sessions: 2
  gpu_cache: 16k
grid:
  preset: [sglang, vllm]
{extra}"""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("errors")
    write_cc_traces(root / "cc", sessions=2, turns=4)
    f = {"root": root, "trace": root / "cc"}
    ro = root / "readonly"
    ro.mkdir()
    f["readonly"] = ro
    f["file"] = root / "a-file.txt"
    f["file"].write_text("not a folder\n")
    f["binary_profile"] = root / "profile.yaml"
    f["binary_profile"].write_bytes(BINARY)
    f["bad_profile"] = root / "bad-profile.yaml"
    f["bad_profile"].write_text("name: x\nprefill: {fixed_s: 1\n")
    f["binary_sweep"] = root / "binary.yaml"
    f["binary_sweep"].write_bytes(BINARY)
    f["bad_sweep"] = root / "bad.yaml"
    f["bad_sweep"].write_text("base:\n  trace: [unclosed\n")
    f["sweep"] = root / "sweep.yaml"
    f["sweep"].write_text(SWEEP.format(trace=f["trace"], extra=""))
    f["sweep_profile"] = root / "sweep-profile.yaml"
    f["sweep_profile"].write_text(SWEEP.format(trace=f["trace"], extra="") +
                                  f"  profile: [{f['binary_profile']}]\n")
    f["no_match"] = root / "no-match.yaml"
    f["no_match"].write_text(SWEEP.format(trace=f["trace"],
                                          extra="baseline: {preset: penelope}\n"))
    f["not_grid"] = root / "not-grid.yaml"
    f["not_grid"].write_text(SWEEP.format(trace=f["trace"],
                                          extra="baseline: {gaps: tool}\n"))
    f["run_dir"] = root / "run"
    res = CliRunner().invoke(cli, ["run", "--trace", str(f["trace"]), "--gpu-cache", "16k",
                                   "--sessions", "2", "--preset", "sglang,penelope",
                                   "--out", str(f["run_dir"])])
    assert res.exit_code == 0, res.stderr
    ro.chmod(0o555)  # read-only; root could still write, kvsim refuses all the same
    yield f
    ro.chmod(0o755)


def _cases(f: dict[str, Path]) -> list[tuple[list[str], str]]:
    """(arguments, text the one stderr line must contain)."""
    run = ["run", "--trace", str(f["trace"]), "--gpu-cache", "16k", "--sessions", "2"]
    sweep = ["sweep", str(f["sweep"])]
    plot = ["plot", str(f["run_dir"])]
    outs = [(str(f["readonly"] / "out"), "read-only folder"),
            (str(f["readonly"]), "read-only folder"),
            (str(f["file"]), "exists and is not a folder"),
            ("/proc/kvsim-test-out", "under /proc")]
    cases = [([*cmd, "--out", out], why) for cmd in (run, sweep, plot) for out, why in outs]
    cases.extend([
        (["plot", str(f["readonly"])], "read-only folder"),
        ([*run, "--profile", str(f["binary_profile"])], "profile.yaml: not a text profile"),
        ([*run, "--profile", str(f["bad_profile"])], "bad-profile.yaml: line 3, column 1: "
                                                     "not valid YAML"),
        (["microbench", "figure1", "--profile", str(f["binary_profile"])],
         "profile.yaml: not a text profile"),
        (["sweep", str(f["binary_sweep"]), "--out", str(f["root"] / "o1")],
         "binary.yaml: not a text sweep config"),
        (["sweep", str(f["bad_sweep"]), "--out", str(f["root"] / "o2")],
         "bad.yaml: line 3, column 1: not valid YAML"),
        (["sweep", str(f["sweep_profile"]), "--out", str(f["root"] / "o3")],
         "profile.yaml: not a text profile"),
        (["sweep", str(f["no_match"]), "--out", str(f["root"] / "o4")],
         "field 'baseline.preset': 'penelope' matches no point"),
        (["sweep", str(f["not_grid"]), "--out", str(f["root"] / "o5")],
         "field 'baseline.gaps': not a grid field"),
        ([*run[:3], "--gpu-cache", "lots"], "Invalid value for '--gpu-cache'"),
    ])
    return cases


def test_every_user_mistake_is_one_line_and_exit_2(files) -> None:
    for args, needle in _cases(files):
        res = CliRunner().invoke(cli, args)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        shown = f"kvsim {' '.join(args)}\n--- stderr:\n{res.stderr}"
        assert res.exit_code == 2, shown
        assert isinstance(res.exception, SystemExit), shown  # not an uncaught exception
        assert "Traceback" not in res.stdout + res.stderr, shown
        assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), shown
        assert needle in lines[0], shown
    # nothing ran: checked before any work (the sweeps made no point folders)
    for o in ("o1", "o2", "o3", "o4", "o5"):
        assert not (files["root"] / o / "points").exists()
    assert not any(files["readonly"].iterdir())


def test_baseline_that_matches_no_point_fails_at_load(files) -> None:
    """Before the fix the sweep ran every point, then crashed in the table (IndexError)."""
    from sim.config import ConfigError

    with pytest.raises(ConfigError, match=r"baseline\.preset.*matches no point"):
        load_sweep(files["no_match"])


def test_change_against_zero_or_missing_reference_is_nan_not_inf(files, tmp_path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(SWEEP.format(trace=files["trace"], extra="baseline: {preset: sglang}\n"))
    sweep = load_sweep(cfg)
    assert sweep.refs == [0, 0]
    for p, ttft in zip(sweep.points, (0.0, 1.5), strict=True):
        d = tmp_path / "points" / p.id
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(
            {"ttft_mean_s": ttft, "jct_mean_s": None, "hit_rate": 0.5}))
    df = tidy(sweep, tmp_path)
    for m in ("ttft_mean_s_change", "jct_mean_s_change"):
        assert df[m].isna().all(), df[m]  # zero / missing reference: NaN, never inf
    assert df["hit_rate_change"].tolist() == [0.0, 0.0]
    assert relative_change(2.0, 0.0) != relative_change(2.0, 0.0)  # NaN
    assert relative_change(3.0, 2.0) == 0.5


def test_out_folder_checks_do_not_refuse_good_folders(files, tmp_path) -> None:
    from sim.io import check_out_dir

    assert check_out_dir(tmp_path / "new" / "deeper").is_dir()
    assert check_out_dir(tmp_path).is_dir()
    assert not list(tmp_path.rglob(".kvsim-probe*"))  # the probe file is removed
