"""Integration with the real traces in ../shared/data (skipped when absent)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from traces import REGION_NAMES, load_trace, read_trace_files
from traces.regions import REGION_SYSTEM, REGION_TOOLS

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
CC = DATA / "cc-traces"
pytestmark = [pytest.mark.shared_data,
              pytest.mark.skipif(not CC.is_dir(), reason="../shared/data is absent")]


@pytest.fixture(scope="module")
def cc_stats():
    r = CliRunner().invoke(cli, ["trace", "stats", str(CC), "--json"])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_cc_traces_acceptance(cc_stats):
    s = cc_stats
    assert (s["sessions"], s["requests"]) == (360, 23669)
    assert (s["subagent_sessions"], s["subagent_requests"]) == (38, 439)
    assert s["prompt_tokens"]["median"] == 107694.0
    assert s["prompt_tokens"]["max"] == 894371
    assert s["infinite_cache_block_hit_rate"] == pytest.approx(0.9651, abs=1e-4)
    assert s["gap_s"]["tool_median"] == 9.0
    assert s["distinct_blocks"] == 1705884


def test_generator_pins_are_the_real_statistics(cc_stats):
    from test_traces_synthetic import REAL_CC, fitted

    real = fitted(cc_stats)
    assert real == pytest.approx(REAL_CC, rel=1e-4)


def test_context_cut_and_selection():
    b = read_trace_files(str(CC))
    t = b.build(max_context=131072)
    main = t.main_mask()
    assert int(main.sum()) == 12530  # all 360 sessions cut at 128K
    assert int(t.prompt_tokens.max()) <= 131072
    top = b.build(max_context=131072, select="top-requests:16", shared_prefix="auto")
    tops = [s for s in top.sessions if s.parent < 0]
    assert len(tops) == 16
    counts = sorted((s.count for s in t.sessions if s.parent < 0), reverse=True)
    assert sorted((s.count for s in tops), reverse=True) == counts[:16]
    # shared prefix: system + tool tokens become global shared ids across sessions
    assert all(s.shared_prefix_blocks > 0 for s in tops)


def test_other_real_formats():
    mc = load_trace(str(DATA / "mooncake" / "synthetic_trace.jsonl.gz")).stats()
    assert mc["requests"] == 3993 and mc["sessions"] == 3993
    # The folder holds the same two sessions twice (sanitized and derived copies under other
    # ids): each round counts once.
    both = load_trace(str(DATA / "tracelab-example"))
    assert both.options["duplicate_sessions"] == 2
    tl = both.stats()
    assert tl["requests"] == 19 and tl["sessions"] == 2
    one = load_trace(str(DATA / "tracelab-example" / "sanitized_round_trace.jsonl")).stats()
    assert one["requests"] == 19 and one["sessions"] == 2
    assert {k: v for k, v in tl.items() if k not in ("name", "source", "options")} == \
        {k: v for k, v in one.items() if k not in ("name", "source", "options")}


@pytest.fixture(scope="module")
def cc_builder():
    return read_trace_files(str(CC))


def test_cc_traces_regions(cc_builder, cc_stats):
    t = cc_builder.build()
    for r in range(len(t)):
        regs = t.block_regions(r)
        assert regs.shape == t.block_ids(r).shape
        pre = (regs == REGION_SYSTEM) | (regs == REGION_TOOLS)
        n = int(pre.sum())
        assert pre[:n].all(), r  # system and tool blocks form a prefix of every prompt
        assert (np.diff(regs[:n].astype(np.int16)) <= 0).all(), r  # tools, then system
    for s in t.sessions:  # the first prompt: system + tool tokens, by the majority rule
        st = s.prefix_hint_tokens
        want = min(t.n_blocks(s.first), st // 64 + (st % 64 >= 32))
        regs = t.block_regions(s.first)
        assert int(((regs == REGION_SYSTEM) | (regs == REGION_TOOLS)).sum()) == want, s.id
    doc = cc_stats["regions"]
    for key in ("prompt_share", "distinct_share"):
        assert list(doc[key]) == list(REGION_NAMES)
        assert sum(doc[key].values()) == pytest.approx(1.0)
    # measured (docs/traces.md): over all prompts and over distinct blocks
    assert [round(doc["prompt_share"][n], 3) for n in REGION_NAMES] == [
        0.022, 0.090, 0.069, 0.144, 0.361, 0.315]
    assert [round(doc["distinct_share"][n], 3) for n in REGION_NAMES] == [
        0.012, 0.042, 0.085, 0.138, 0.360, 0.363]
    shared = cc_builder.build(shared_prefix="auto")
    for s in shared.sessions:
        regs = shared.block_regions(s.first)[:s.shared_prefix_blocks]
        assert ((regs == REGION_SYSTEM) | (regs == REGION_TOOLS)).all(), s.id
