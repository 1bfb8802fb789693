"""A run folder's plots (sim/report/plots.py): titles that say what ran, change bars with the
repeats' intervals, a disaggregated run's TTFT by part (issue 51, new-user task 15)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.report import plots

TRACE = ["--trace", "synthetic:claude-code?sessions=6", "--max-context", "32k", "--gaps",
         "tool", "--sessions", "3"]


def test_a_run_title_names_the_fleet_the_pd_pools_and_the_load() -> None:
    base = {"trace": "t", "model": "m", "gpu_cache_tokens": 1024, "n_sessions": 4}
    fleet = plots._run_title({**base, "replicas": 3, "router": "dynamo-kv", "repeats": 3},
                             {"replay": "open", "time_scale": 0.5, "max_concurrency": 16})
    assert "3 replicas, router dynamo-kv" in fleet and "open loop, send times x0.5" in fleet
    assert "at most 16 in flight" in fleet and "3 repeats" in fleet
    assert "N = 4" not in fleet  # an open loop has no sessions at once
    pd_title = plots._run_title({**base, "replicas": 3, "router": "round-robin",
                                 "pd_prefill_replicas": 1, "pd_decode_replicas": 2,
                                 "pd_rule": "disagg"}, {"replay": "closed"})
    assert "PD 1P:2D, rule disagg" in pd_title and "N = 4" in pd_title
    assert "replicas" not in pd_title
    assert plots._run_title(base).endswith("\nN = 4")  # one server: as before


@pytest.fixture
def figures(monkeypatch) -> dict[str, object]:
    """Every figure a plot function saves, by file name, kept open for inspection."""
    saved: dict[str, object] = {}

    def keep(fig, path: Path) -> Path:
        saved[path.name] = fig
        return path

    monkeypatch.setattr(plots, "_save", keep)
    return saved


def _run_cli(out: Path, *args: str) -> None:
    res = CliRunner().invoke(cli, ["run", *TRACE, "--out", str(out), *args])
    assert res.exit_code == 0, res.stderr


def test_change_bars_draw_the_repeats_intervals_and_mark_noise(tmp_path, figures) -> None:
    _run_cli(tmp_path, "--replicas", "2", "--router", "random", "--gpu-cache", "48k", "--preset",
         "sglang,penelope", "--repeats", "3")
    plots.plot_dir(tmp_path)
    ax = figures["change_vs_first.png"].axes[0]
    errorbars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert len(errorbars) == 2  # mean TTFT and mean JCT, each with its interval
    runs = pd.read_json(tmp_path / "runs.json")["runs"]
    a, b = runs[0]["summary"], runs[1]["summary"]
    bars = [c for c in ax.containers if type(c).__name__ == "BarContainer"]
    for bar_set, key in zip(bars, ("ttft_mean_s", "jct_mean_s"), strict=True):
        within = abs(b[key] - a[key]) <= a[f"{key}_ci95"] + b[f"{key}_ci95"]
        assert (bar_set.patches[0].get_alpha() == 0.4) is within
    assert "3 repeats" in ax.get_title()


def test_without_repeats_change_bars_have_no_intervals(tmp_path, figures) -> None:
    _run_cli(tmp_path, "--preset", "sglang,penelope", "--gpu-cache", "48k")
    plots.plot_dir(tmp_path)
    ax = figures["change_vs_first.png"].axes[0]
    assert not [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    assert "pd_ttft_parts.png" not in figures


def test_a_pd_run_gets_its_ttft_by_part(tmp_path, figures) -> None:
    _run_cli(tmp_path, "--preset", "sglang", "--prefill-replicas", "1", "--decode-replicas", "2")
    plots.plot_dir(tmp_path)
    ax = figures["pd_ttft_parts.png"].axes[0]
    assert "PD 1P:2D" in ax.get_title()
    req = pd.read_parquet(tmp_path / "sglang" / "requests.parquet")
    remote = req[~req["dropped"] & ~req["prefilled_locally"]]
    stacked = sum(c.patches[0].get_height() for c in ax.containers)
    # the parts add up to the TTFT of the remotely prefilled requests
    assert stacked == pytest.approx(remote["ttft_s"].mean(), rel=1e-9)
