"""A run that its options leave without a request is refused before it runs (exit 2, one line
naming the option), for generated traces and trace files alike, in runs and sweep points."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from sim.cli.main import cli
from tests.enginekit import write_cc_traces
from traces import load_trace
from traces.errors import OptionError


@pytest.mark.parametrize("trace", ["synthetic:claude-code?sessions=4", "cc"])
def test_max_context_below_every_first_prompt_is_refused(tmp_path, trace) -> None:
    if trace == "cc":
        write_cc_traces(tmp_path / "cc", sessions=2, turns=3)
        trace = str(tmp_path / "cc")
    res = CliRunner().invoke(cli, ["run", "--trace", trace, "--max-context", "64",
                                   "--preset", "sglang", "--out", str(tmp_path / "out")])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr
    assert lines[-1].startswith("kvsim: error: --max-context 64: no request is left (every "
                                "session's first prompt is longer; the shortest has "), lines
    assert not (tmp_path / "out" / "sglang").exists()  # nothing ran, nothing written


def test_the_loader_names_the_shortest_first_prompt() -> None:
    full = load_trace("synthetic:claude-code?sessions=4")
    shortest = min(int(full.prompt_tokens[s.first]) for s in full.sessions if s.parent < 0)
    with pytest.raises(OptionError, match=f"the shortest has {shortest:,} tokens"):
        load_trace("synthetic:claude-code?sessions=4", max_context=shortest - 1)
    assert len(load_trace("synthetic:claude-code?sessions=4", max_context=shortest)) > 0


def test_a_sweep_point_left_empty_fails_that_point(tmp_path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump({"base": {"trace": "synthetic:chat?sessions=3",
                                            "gpu_cache": "16k", "preset": "sglang"},
                                   "grid": {"max_context": [64, "64k"]}}))
    res = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.stderr
    assert "1 of 2 points failed" in res.stderr and "--max-context 64: no request" in res.stderr
