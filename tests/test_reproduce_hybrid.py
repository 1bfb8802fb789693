"""Hybrid models end to end (issue 54 item 5 and its acceptance): the recompute priced per KV
cache group (sim/run/summary.py ``recompute_by_group``), ``kvsim reproduce hybrid`` (sim/
studies/hybrid.py), and every hybrid on both engines alone, in a fleet and with PD."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from costmodel.specs import get_spec
from sim.cli.main import cli
from sim.config import ConfigError, RunConfig
from sim.engines.recorder import RunRecorder
from sim.run import run
from sim.run.summary import recompute_by_group
from sim.studies import hybrid, reproduce
from sim.studies.study import QUICK_CONTEXT

TINY = "synthetic:claude-code?sessions=2"
HYBRIDS = ("gpt-oss-120b", "qwen3-next-80b-a3b", "deepseek-v3.2")
RANGES = [(0, 1), (5, 300), (100, 129), (4000, 9000), (70000, 71234)]


def _brute(spec, kind: str, ranges) -> int:
    """The group's attention units token by token (docs/hybrid.md, the cost formula)."""
    g = next(g for g in spec.groups if str(g.kind) == kind)
    total = 0
    for a, b in ranges:
        p = np.arange(a, b, dtype=object)  # Python ints: no overflow
        if kind in ("full", "mla"):
            total += g.layers * int(p.sum())
        elif kind == "sliding":
            total += g.layers * int(np.minimum(p, g.window - 1).sum())
        elif kind == "linear":
            total += g.layers * (b - a) * spec.state_update_macs // spec.macs_per_unit
        elif kind == "dsa":
            total += (g.layers * int(np.minimum(p, spec.index_topk - 1).sum())
                      + g.layers * int(p.sum()) * spec.indexer_macs_per_key
                      // spec.macs_per_unit)
    return total


@pytest.mark.parametrize("model", ("qwen3-32b", *HYBRIDS))
def test_recompute_by_group_prices_each_group_by_its_formula(model: str) -> None:
    spec = get_spec(model)
    rec, other = RunRecorder(["s"], [0], [False], [0]), RunRecorder(["s"], [0], [False], [0])
    for a, b in RANGES[:2]:
        rec._recomputed += (a, b)
    for a, b in RANGES[2:]:
        other._recomputed += (a, b)
    rec.absorb(other)  # a fleet's merged recorder prices every replica's ranges
    assert rec.recomputed_ranges == RANGES
    got = recompute_by_group(spec, rec.recomputed_ranges)
    assert [g["kind"] for g in got] == list(dict.fromkeys(str(g.kind) for g in spec.groups))
    for g in got:
        assert g["tokens"] == sum(b - a for a, b in RANGES)
        assert g["attention_units"] == _brute(spec, g["kind"], RANGES), g


def test_a_run_reports_its_recompute_by_group() -> None:
    cfg = RunConfig.from_flat(trace="synthetic:claude-code?sessions=6", max_context=32768,
                              gaps="tool", sessions=3, gpu_cache=24576,
                              model="gpt-oss-120b").with_preset("sglang")
    s = run(cfg).summary
    groups = {g["kind"]: g for g in s["recompute_by_group"]}
    assert set(groups) == {"sliding", "full"}
    assert s["recomputed_tokens"] > 0
    assert all(g["tokens"] == s["recomputed_tokens"] for g in groups.values())
    # deep positions: the full layers' position term dwarfs the window's (127 at most)
    assert groups["full"]["attention_units"] > groups["sliding"]["attention_units"] > 0


# --- kvsim reproduce hybrid ---------------------------------------------------------------
@pytest.fixture(scope="module")
def doc() -> dict:
    return reproduce("hybrid", trace=TINY, quick=True)


def test_reproduce_hybrid_rows(doc) -> None:
    rows = doc["rows"]
    assert {r["model"] for r in rows} == set(hybrid.MODELS)
    for r in rows:
        for key in ("model", "preset", "engine", "ttft_mean_s", "hit_rate",
                    "recompute_by_group", "note", "cache_bytes", "cache_tokens"):
            assert key in r, key
        multi = len(get_spec(r["model"]).groups) > 1
        if r["cache"] == "-":  # refused: said so, no numbers
            assert r["note"].startswith("refused:") and math.isnan(r["ttft_mean_s"])
            continue
        assert r["ttft_mean_s"] > 0 and 0 <= r["hit_rate"] <= 1
        # a cache of one full-attention group for a model of several groups is said
        full = r["cache"] in hybrid.FULL_ATTENTION_CACHES
        assert ("not modelled" in r["note"]) == (multi and full), r
    # equal cache pressure: each model's bytes hold the anchor's sessions at the cut
    anchor = next(r for r in rows if r["model"] == hybrid.ANCHOR)
    cut = QUICK_CONTEXT
    for r in rows:
        want = anchor["cache_tokens"] / cut * get_spec(r["model"]).kv_bytes(cut)
        assert r["cache_bytes"] == pytest.approx(want, rel=1e-6)
    assert {r["model"] for r in doc["figure1"]} == set(hybrid.MODELS)
    caps = [r for r in doc["capacity"] if r["model"] == "gpt-oss-120b"]
    assert [r["cache_bytes"] for r in caps] == sorted(r["cache_bytes"] for r in caps)
    assert all(0 <= r["hit_rate"] <= r["ideal_hit_rate"] + 1e-12 for r in doc["capacity"])


def test_kvsim_reproduce_hybrid_json() -> None:
    res = CliRunner().invoke(cli, ["reproduce", "hybrid", "--quick", "--json", "--trace", TINY])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert len(rows) == len(hybrid.MODELS) * 5


# --- the acceptance line: every hybrid on both engines, alone, in a fleet, with PD ---------
SHAPES = {"single": {}, "fleet": {"replicas": 2, "router": "dynamo-kv"},
          "pd": {"prefill_replicas": 1, "decode_replicas": 1}}
PRESETS = {"sglang": ("sglang", "vllm", "penelope"), "vllm": ("vllm", "penelope")}
# refused in one line naming the field (vLLM's hybrid KV cache: sim/engines/vllm.py
# _hybrid_unsupported): (model, engine, shape, preset) -> field
# every combination runs now (vLLM's hybrid pool: Penelope's release order, connector loads
# into Mamba groups); a refusal would be listed here as (model, engine, shape, preset) -> field
REFUSED: dict[tuple[str, str, str, str], str] = {}
CASES = [(m, e, s, p) for m in HYBRIDS for e in PRESETS for s in SHAPES for p in PRESETS[e]]


@pytest.mark.slow
@pytest.mark.parametrize("model,engine,shape,preset", CASES, ids=["/".join(c) for c in CASES])
def test_every_hybrid_runs_on_both_engines_alone_in_fleets_and_with_pd(
        model: str, engine: str, shape: str, preset: str) -> None:
    cfg = RunConfig.from_flat(trace="synthetic:claude-code?sessions=4", max_context=32768,
                              gaps="tool", sessions=2, gpu_cache=65536, model=model,
                              engine=engine, scheduler="lpm" if engine == "sglang" else "fcfs",
                              **SHAPES[shape]).with_preset(preset)
    key = (model, engine, shape, preset)
    if key in REFUSED:
        with pytest.raises(ConfigError, match=f"field '{REFUSED[key]}'.*KV cache groups"):
            run(cfg)
        return
    s = run(cfg).summary
    assert s["requests"] > 0 and s["dropped_requests"] == 0
    assert 0 < s["ttft_mean_s"] < 60 and 0 < s["hit_rate"] <= 1
    assert [g["tokens"] for g in s["recompute_by_group"]] == (
        [s["recomputed_tokens"]] * len(s["recompute_by_group"]))
