"""The field's routers inside a fleet run: every request served once with totals that add
up, a pure function of the seed, beliefs as their views promise (approximate ones drift
once engines evict, an unlagged event index is the truth), and ``kvsim reproduce fleet``'s
grid and JSON rows."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import RunConfig
from sim.run import run
from sim.studies import StudySetup
from sim.studies import fleet as exp_fleet

FIELD = ("sglang-cache-aware", "dynamo-kv", "llm-d", "mooncake", "preble")
BASE = RunConfig.from_flat(trace="synthetic:claude-code?sessions=8", max_context=65536, gaps="tool",
                           gpu_cache=65536, sessions=6, replicas=3).with_preset("penelope")
GROUPS = RunConfig.from_flat(trace="synthetic:prefix-groups?groups=6&users=4&turns=2&qps=8..24",
                             replay="open", gpu_cache=16384, replicas=3).with_preset("sglang")


@pytest.mark.parametrize("router", FIELD)
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_every_request_served_once_and_totals_add_up(router, engine):
    res = run(BASE.with_fields(router=router, engine=engine))
    t, s = res.requests, res.summary
    assert sorted(t["request"]) == list(range(s["trace_requests"]))
    per = s["replica_summaries"]
    for k in ("requests", "prompt_tokens", "recomputed_tokens", "decoded_tokens", "evictions"):
        assert s[k] == sum(p[k] for p in per), k
    assert 0 <= s["reuse_captured"] <= s["reuse_available"] <= 1
    again = run(BASE.with_fields(router=router, engine=engine))
    assert again.requests.equals(t)  # a pure function of (trace, config, seed)


def test_open_loop_prefix_groups_with_every_field_router():
    for router in FIELD:
        res = run(GROUPS.with_fields(router=router))
        assert len(res.requests) == 48 and res.summary["dropped_requests"] == 0, router


@pytest.mark.parametrize("router", ["sglang-cache-aware", "preble",
                                    "dynamo-kv?use_kv_events=false"])
def test_approximate_views_overpredict_once_engines_evict(router):
    s = run(BASE.with_fields(router=router, gpu_cache=32768)).summary
    assert s["evicted_tokens"] > 0
    assert s["belief_bias_mean_tokens"] > 0 and s["belief_wrong_share"] > 0


def test_llmd_index_sized_by_the_engines_believes_evicted_blocks():
    # autoTune: each pod's LRU holds as many 64-token hashes as the engine has 16-token
    # blocks (4x its tokens), and never hears of evictions: once engines evict, it believes
    # prefixes they no longer hold; the precise (KV-event) scorer sees the truth
    cfg = GROUPS.with_fields(gpu_cache=8192, router="llm-d")
    s = run(cfg).summary
    assert s["evicted_tokens"] > 0 and s["belief_bias_mean_tokens"] > 0
    exact = run(cfg.with_fields(router_params={"precise": True})).summary
    assert exact["evicted_tokens"] > 0 and exact["belief_error_mean_tokens"] == 0.0


def test_llmd_believes_at_most_its_hashed_prefix():
    # without autoTune llm-d hashes only the first 256 x 16 = 4,096 tokens: on long agent
    # prompts its belief falls short of the truth, and it is wrong on most decisions
    res = run(BASE.with_fields(router="llm-d", gpu_cache=32768,
                               router_params={"auto_tune": False}))
    s = res.summary
    assert s["evicted_tokens"] > 0
    assert s["belief_bias_mean_tokens"] < 0 and s["belief_wrong_share"] > 0.5


@pytest.mark.parametrize("router", ["dynamo-kv?version=classic", "mooncake"])
def test_kv_event_routers_see_the_truth_without_lag(router):
    s = run(BASE.with_fields(router=router, gpu_cache=32768)).summary
    assert s["evicted_tokens"] > 0 and s["belief_error_mean_tokens"] == 0.0
    lagged = run(BASE.with_fields(router=router, gpu_cache=32768,
                                  router_params={"event_lag_s": 20.0})).summary
    assert lagged["belief_wrong_share"] > 0


def test_dynamo_16_index_loses_what_follows_a_freed_head():
    # Penelope frees a history from its head: Dynamo 1.6's index forgets every block after
    # a removed one (they are unreachable), while the engine keeps them, so it believes less
    # than is cached; with SGLang's tail-first eviction nothing is orphaned
    s = run(BASE.with_fields(router="dynamo-kv", gpu_cache=32768)).summary
    assert s["evicted_tokens"] > 0 and s["belief_bias_mean_tokens"] < 0
    tail = run(BASE.with_preset("sglang").with_fields(router="dynamo-kv",
                                                      gpu_cache=32768)).summary
    assert tail["evicted_tokens"] > 0 and tail["belief_error_mean_tokens"] == 0.0


def test_sglang_cache_aware_113_spreads_a_shared_prefix_fleet_the_19_rule_piles():
    # Every session starts with the same system + tool prefix: once worker 0 holds it, the
    # tree matches > 30% of most new prompts there. The 1.9 rule sends every such hit to a
    # holder whatever its load (only a first prompt more than twice as long as the prefix
    # misses), and 6 sessions never make the 64 in-flight requests of imbalance, so one worker
    # stays idle. 1.13 sends a hit to the least-loaded holder and spills a holder past the
    # natural swing of the mean: every worker serves.
    cfg = BASE.with_fields(shared_prefix="auto", router="sglang-cache-aware")
    old = run(cfg.with_fields(router_params={"version": "1.9"})).summary
    assert min(p["requests"] for p in old["replica_summaries"]) == 0
    new = run(cfg).summary
    assert min(p["requests"] for p in new["replica_summaries"]) > 0
    assert new["load_cv_requests"] < old["load_cv_requests"]
    low = run(cfg.with_fields(router_params={"version": "1.9", "balance_abs_threshold": 1,
                              "balance_rel_threshold": 1.0})).summary
    assert min(p["requests"] for p in low["replica_summaries"]) > 0


def test_reproduce_fleet_grid_and_rows():
    ctx = StudySetup(trace="synthetic:claude-code")
    keys, cfgs = exp_fleet.configs(ctx)
    n_workloads = 3 if exp_fleet.MOONCAKE.is_file() else 2
    assert len(cfgs) == len(exp_fleet.ROUTERS) * 2 * 3 * n_workloads
    assert {k[1] for k in keys} == set(exp_fleet.ROUTERS) and {k[3] for k in keys} == {2, 4, 8}
    for (workload, router, policy, n), c in zip(keys, cfgs, strict=True):
        assert (c.fleet.router, c.fleet.replicas, c.policy_spec) == (router, n, policy)
        if workload == "cc-traces":
            assert c.traffic.sessions == exp_fleet.SESSIONS_PER_REPLICA * n
        else:
            assert c.traffic.replay == "open"


def test_reproduce_fleet_json_prints_one_document(monkeypatch):
    monkeypatch.setattr(exp_fleet, "ROUTERS", ("round-robin", "sglang-cache-aware"))
    monkeypatch.setattr(exp_fleet, "QUICK_REPLICAS", (2,))
    monkeypatch.setattr(exp_fleet, "MOONCAKE", exp_fleet.MOONCAKE.with_name("absent.jsonl"))
    res = CliRunner().invoke(cli, ["reproduce", "fleet", "--quick", "--json",
                                   "--trace", "synthetic:claude-code"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["rows"]) == 2 * 2 * 2  # 2 routers x 2 policies x 2 workloads
    assert all(set(exp_fleet.COLUMNS) <= set(r) for r in doc["rows"])
    assert {r["workload"] for r in doc["rows"]} == {"cc-traces", "prefix-groups"}
    assert any("mooncake workload left out" in n for n in doc["notes"])
    # local caches vs a pool, and the pooled fleets' capacity curves (sim/studies/pool.py)
    pool_keys = {"pool", "pool_hit_rate", "fetched_tokens", "fetch_s"}
    assert all(pool_keys <= set(r) and r["pool"] == 0 for r in doc["rows"])
    assert {r["pool"] > 0 for r in doc["pool_rows"]} == {True, False}
    assert any(r["fetched_tokens"] > 0 for r in doc["pool_rows"])
    assert {r["pool_tokens"] > 0 for r in doc["capacity"]} == {True, False}


def test_reproduce_fleet_prints_a_table_per_workload(monkeypatch):
    monkeypatch.setattr(exp_fleet, "ROUTERS", ("sglang-cache-aware",))
    monkeypatch.setattr(exp_fleet, "POLICIES", ("sglang",))
    monkeypatch.setattr(exp_fleet, "QUICK_REPLICAS", (2,))
    monkeypatch.setattr(exp_fleet, "MOONCAKE", exp_fleet.MOONCAKE.with_name("absent.jsonl"))
    res = CliRunner().invoke(cli, ["reproduce", "fleet", "--quick",
                                   "--trace", "synthetic:claude-code"])
    assert res.exit_code == 0, res.output
    for workload in ("cc-traces", "prefix-groups"):
        assert f"kvsim reproduce fleet -- {workload}" in res.stdout
    assert "sglang-cache-aware" in res.stdout and "mooncake workload left out" in res.stdout
    assert "kvsim reproduce pool -- with and without a shared pool" in res.stdout
