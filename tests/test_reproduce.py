"""`kvsim reproduce` as users run it: the JSON contract and the paper's numbers beside ours."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sim.cli.main import cli


def reproduce(*args: str) -> dict:
    res = CliRunner().invoke(cli, ["reproduce", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_figure1() -> None:
    doc = reproduce("figure1")
    rows = {r["context_tokens"] // 1024: r for r in doc["rows"]}
    assert rows[128]["paper_speedup"] == 2.93
    assert abs(rows[128]["difference"]) < 0.04


def test_ablation_quick_on_synthetic_trace() -> None:
    doc = reproduce("ablation", "--quick", "--trace", "synthetic:claude-code")
    assert doc["experiment"] == "ablation" and doc["trace"].startswith("synthetic:")
    assert doc["gaps"] == "tool"
    rows = doc["rows"]
    assert len(rows) == 12  # 3 starts x 2 granularities x 2 tree shapes
    for r in rows:
        for k in ("evict", "granularity", "ttft_change", "hit_rate", "paper_ttft_change"):
            assert k in r
    paper = {(r["evict"], r["granularity"]): r["paper_ttft_change"] for r in rows}
    assert paper[("private-head", "block")] == -0.63
    assert paper[("tail", "node")] is None
    # node + leaf-head frees the same whole leaf as node + tail: identical runs.
    for shape in ("chunked", "whole"):
        by = {(r["evict"], r["granularity"]): r for r in rows if r["prompt_nodes"] == shape}
        assert by[("leaf-head", "node")]["ttft_mean_s"] == by[("tail", "node")]["ttft_mean_s"]
        assert by[("tail", "node")]["ttft_change"] == pytest.approx(0.0)


def test_bad_experiment_exit_2() -> None:
    res = CliRunner().invoke(cli, ["reproduce", "table9"])
    assert res.exit_code == 2


def test_policies_quick_rows_and_oracle() -> None:
    doc = reproduce("policies", "--quick", "--trace", "synthetic:claude-code")
    assert doc["experiment"] == "policies" and doc["prompt_nodes"] == "both"
    rows = doc["rows"]
    keys = {"policy", "model", "sessions", "gaps", "tree", "ttft_change", "jct_change",
            "hit_rate", "gap_closed"}
    assert all(keys <= set(r) for r in rows)
    policies = {r["policy"] for r in rows}
    assert {"sglang", "vllm", "penelope", "continuum", "ttl", "tlru", "greedydual",
            "memdecay", "random", "clairvoyant-oracle", "ttl@private-head+block",
            "ttl(tau_s=0.0)", "ttl(tau_s=60.0)"} <= policies
    assert {r["tree"] for r in rows} == {"chunked", "whole"}
    for tree in ("chunked", "whole"):
        by = {r["policy"]: r for r in rows if r["tree"] == tree}
        assert len(by) == len(rows) // 2  # one row per policy and configuration
        oracle = by["clairvoyant-oracle"]
        assert oracle["oracle"] and oracle["oracle_rule"] in ("belady", "cost-aware")
        assert oracle["ttft_mean_s"] == min(oracle["oracle_belady_ttft_mean_s"],
                                            oracle["oracle_cost_aware_ttft_mean_s"])
        assert oracle["gap_closed"] == pytest.approx(1.0)
        assert by["sglang"]["gap_closed"] == 0.0 and by["sglang"]["ttft_change"] == 0.0
        assert by["continuum"]["scheduler"] == "program-fcfs"
        assert sum(r["oracle"] for r in by.values()) == 1
        for r in by.values():  # gap closed is the TTFT change over the oracle's
            assert r["gap_closed"] == pytest.approx(r["ttft_change"] / oracle["ttft_change"])


def test_policies_table_marks_the_oracle() -> None:
    res = CliRunner().invoke(cli, ["reproduce", "policies", "--quick", "--trace",
                                   "synthetic:claude-code?sessions=4"])
    assert res.exit_code == 0, res.output
    assert "clairvoyant-oracle" in res.stdout and "reads the" in res.stdout
    assert "best policy per configuration" in res.stdout


@pytest.mark.parametrize("family", ["derived", "kernels"])
def test_fcfs_prices_every_model_with_its_own_profile(family: str, monkeypatch) -> None:
    """The window cases swap the model on the 8B's setup: the profile must follow the model
    (a leftover 8B profile is refused at load time, mid-experiment)."""
    from costmodel.profile import load_profile
    from sim.studies import paper, reproduce

    seen: list = []

    def configs_only(ctx, configs):
        seen.extend(configs)
        return [{"ttft_mean_s": 1.0, "jct_mean_s": 1.0, "hit_rate": 0.5}] * len(configs)

    monkeypatch.setattr(paper, "run_all", configs_only)
    reproduce("fcfs", trace="synthetic:claude-code", profiles=family)
    assert {c.cache.model for c in seen} >= {"gemma-3-27b", "llama-3.1-8b", "qwen3-235b-a22b"}
    prefix = {"derived": "derived-h100", "kernels": "kernels-h100_sxm"}[family]
    for c in seen:
        assert c.cache.profile == f"{prefix}-{c.cache.model}"
        assert load_profile(c.cache.profile, c.cache.model).model == c.cache.model
