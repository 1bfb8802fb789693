"""`kvsim plot` on a sweep folder scales past two grid fields: small multiples, one visual
encoding per field, every line of a panel distinguishable (its own colour/style and label),
short readable labels. Run on small versions of the README's sweeps: the paper's GPU-only grid
(docs/sweeps/, 54 points), docs/sweeps.md's example, docs/policies.md's file-policy sweep,
and a five-field grid."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import matplotlib.colors
import matplotlib.pyplot as plt
import matplotlib.text
import pytest
import yaml
from click.testing import CliRunner

from sim.cli.main import cli
from sim.report import plots

DOCS = Path(__file__).resolve().parent.parent / "docs"
TINY_BASE = {"trace": "synthetic:chat?sessions=3", "gpu_cache": "16k"}


def _yaml_blocks(md: Path) -> list[dict]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", md.read_text(), re.S)]


def _grids() -> dict[str, dict]:
    paper = yaml.safe_load((DOCS / "sweeps" / "gpu_only_qwen3-8b.yaml").read_text())
    example = next(b for b in _yaml_blocks(DOCS / "sweeps.md") if b and "grid" in b)
    policy = next(b for b in _yaml_blocks(DOCS / "policies.md")
                  if b and "policy" in b.get("grid", {}))
    policy["grid"]["policy"] = [p.replace("examples/", f"{DOCS}/examples/")
                                for p in policy["grid"]["policy"]]
    five = {"grid": {"preset": ["sglang", "penelope"], "gpu_cache": ["16k", "32k"],
                     "sessions": [1, 2], "gaps": ["recorded", "tool"],
                     "checkpoint_chunks": [True, False]}, "baseline": {"preset": "sglang"}}
    return {"paper": paper, "sweeps.md": example, "policies.md": policy, "five-fields": five}


@pytest.fixture(scope="module", params=list(_grids()))
def sweep_dir(request, tmp_path_factory) -> Path:
    doc = _grids()[request.param]
    d = tmp_path_factory.mktemp(request.param.replace(".", "-"))
    cfg = {"base": dict(TINY_BASE), "grid": doc["grid"]}  # the grid as written, a tiny trace
    if "baseline" in doc:
        cfg["baseline"] = doc["baseline"]
    (d / "sweep.yaml").write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(cli, ["sweep", str(d / "sweep.yaml"), "--out", str(d / "out"),
                                   "--json"])
    assert res.exit_code == 0, res.output
    return d / "out"


@pytest.fixture()
def sweep_figures(sweep_dir, monkeypatch) -> Iterator[dict]:
    """The figures ``kvsim plot`` writes, kept open to inspect."""
    kept: dict = {}

    def keep(fig, path: Path) -> Path:
        kept[path.name] = fig
        return path

    monkeypatch.setattr(plots, "_save", keep)
    plots.plot_dir(sweep_dir, sweep_dir)
    assert kept
    yield kept
    for fig in kept.values():
        plt.close(fig)


def _data_lines(ax) -> list:
    return [ln for ln in ax.get_lines() if ln.get_gid() != "reference" and len(ln.get_xdata())]


def test_every_line_of_a_panel_is_distinguishable(sweep_figures) -> None:
    for name, fig in sweep_figures.items():
        for ax in fig.axes:
            lines = _data_lines(ax)
            looks = [(ln.get_color(), ln.get_linestyle(), ln.get_marker()) for ln in lines]
            labels = [ln.get_label() for ln in lines]
            assert len(set(looks)) == len(looks), (name, ax.get_title(), looks)
            assert len(set(labels)) == len(labels), (name, ax.get_title(), labels)
            assert not any(lab.startswith("_") for lab in labels), (name, labels)


def test_labels_are_short_and_readable(sweep_figures) -> None:
    for name, fig in sweep_figures.items():
        for t in fig.findobj(matplotlib.text.Text):
            text = t.get_text()
            if not text:
                continue
            assert t.get_fontsize() >= 8, (name, text)
            assert ".py:" not in text, (name, text)  # a file policy by its label
        for ax in fig.axes:
            for tick in ax.get_xticklabels():
                assert len(tick.get_text()) <= 24, (name, tick.get_text())


def test_small_multiples_draw_every_point_once(sweep_figures, sweep_dir) -> None:
    import pandas as pd

    df = pd.read_csv(sweep_dir / "results.csv", dtype=str, keep_default_na=False)
    varied = [k for k in _grid_fields(sweep_dir) if df[k].nunique() > 1]
    fig = sweep_figures["sweep_ttft.png"]
    assert sum(len(ln.get_xdata()) for ax in fig.axes for ln in _data_lines(ax)) == len(df)
    if len(varied) >= 2:  # x and panels: each panel names the values it holds
        for ax in fig.axes:
            assert " = " in ax.get_title(), ax.get_title()


def _grid_fields(sweep_dir: Path) -> set[str]:
    import json

    points = json.loads((sweep_dir / "sweep.json").read_text())["points"]
    return set(points[0]["values"]) - {"preset", "policy"}


@pytest.mark.parametrize("n", [1, 3, 10, 11, 20, 33])
def test_policy_colours_stay_distinct_past_the_default_cycle(n: int) -> None:
    colours = [matplotlib.colors.to_hex(c) for c in plots.policy_colors(n)]
    assert len(set(colours)) == n


def test_the_baseline_points_are_not_drawn_whatever_field_the_baseline_names(tmp_path,
                                                                            monkeypatch) -> None:
    cfg = {"base": {"trace": "synthetic:claude-code?sessions=6", "max_context": "64k",
                    "preset": "sglang"},
           "grid": {"gpu_cache": ["64k", "96k", "128k"], "sessions": [2, 4]},
           "baseline": {"gpu_cache": "64k"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "s.yaml"), "--out",
                                   str(tmp_path / "o"), "--json"])
    assert res.exit_code == 0, res.output
    figs = plots.sweep_figures(tmp_path / "o")
    try:
        for name in ("sweep_change.png", "sweep_jct_change.png"):
            xs = sorted({float(x) for ax in figs[name].axes for ln in _data_lines(ax)
                         for x in ln.get_xdata()})
            assert xs == [98304.0, 131072.0], (name, xs)  # 64k: the baseline, 0 by definition
            assert "not drawn" in figs[name]._suptitle.get_text()
        ttft = {float(x) for ax in figs["sweep_ttft.png"].axes for ln in _data_lines(ax)
                for x in ln.get_xdata()}
        assert 65536.0 in ttft  # the values themselves are drawn
    finally:
        for fig in figs.values():
            plt.close(fig)


def test_a_sweep_of_routers_draws_them_as_colours_in_one_panel(tmp_path) -> None:
    cfg = {"base": {"trace": "synthetic:claude-code?sessions=6", "max_context": "64k",
                    "gaps": "tool", "preset": "sglang", "replicas": 2},
           "grid": {"router": ["round-robin", "least-load", "session-affinity"],
                    "sessions": [2, 4]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "s.yaml"), "--out",
                                   str(tmp_path / "o"), "--json"])
    assert res.exit_code == 0, res.output
    figs = plots.sweep_figures(tmp_path / "o")
    try:
        fig = figs["sweep_ttft.png"]
        assert len(fig.axes) == 1  # x = sessions, one panel
        lines = _data_lines(fig.axes[0])
        assert sorted(ln.get_label() for ln in lines) == sorted(cfg["grid"]["router"])
        assert len({ln.get_color() for ln in lines}) == 3
        assert fig.legends[0].get_title().get_text() == "router"
    finally:
        for f in figs.values():
            plt.close(f)


def test_replica_load_heatmap_is_the_time_weighted_load_over_the_busy_period() -> None:
    import numpy as np
    import pandas as pd

    from sim.report.fleet_load import load_heatmap

    # replica 0: 2 requests over [1, 3), then 0; replica 1: 1 request over [2, 5), then 0
    df = pd.DataFrame({"time_s": [0.0, 1.0, 3.0, 0.0, 2.0, 5.0],
                       "replica": [0, 0, 0, 1, 1, 1], "waiting": [0, 1, 0, 0, 0, 0],
                       "running": [0, 1, 0, 0, 1, 0]})
    grid, edges, replicas = load_heatmap(df, bins=4)
    assert replicas == [0, 1]
    assert (edges[0], edges[-1]) == (1.0, 5.0)  # clipped to the busy period
    assert np.allclose(grid[0], [2, 2, 0, 0]) and np.allclose(grid[1], [0, 1, 1, 1])
