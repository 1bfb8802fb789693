"""Fleets (sim/fleet, policies/routing.py, policies/routers/): --replicas 1 equals one server,
every request is served once and the fleet's totals are the replicas' sums, beliefs diverge
from the truth once engines evict (and an exact event index does not), and the simple
routers decide as their rules say."""

from __future__ import annotations

import json
import math
from typing import ClassVar

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import PolicyError
from policies.routing import (
    ROUTERS,
    ApproxTree,
    ApproxTTL,
    KVEvents,
    PodLRU,
    PredictedLoad,
    ReplicaView,
    Router,
    RouteRequest,
    RouterView,
    ScrapedMetrics,
    get_router,
    register_router,
)
from sim.cli.main import cli
from sim.config import ConfigError, RunConfig
from sim.fleet.fleet import build_belief
from sim.run import check, run
from tests.chained import ids

EXAMPLE = REPO / "docs" / "examples" / "prefix_or_least_load.py"
SIMPLE = ("round-robin", "random", "least-load", "power-of-two", "session-affinity")
BASE = RunConfig.from_flat(trace="synthetic:claude-code?sessions=8", max_context=65536, gaps="tool",
                           gpu_cache=65536, sessions=4)
# Totals that add up over replicas (counts, tokens, seconds of work).
ADDITIVE = ("requests", "dropped_requests", "prompt_tokens", "recomputed_tokens",
            "new_tokens", "hole_tokens", "decoded_tokens", "evictions", "evicted_tokens",
            "prefill_batches", "decode_steps", "retractions", "loaded_cpu_tokens")


def _cfg(engine: str, **kw) -> RunConfig:
    cfg = BASE.with_fields(engine=engine, **kw)
    return cfg.with_preset("vllm" if engine == "vllm" else "penelope")


class ScrapedProbe(Router):
    """Least scraped queue; checks the scrape's staleness on every decision."""

    name = "test-scraped-probe"
    load_view = ScrapedMetrics(scrape_s=2.0)

    def route(self, request, view):
        for r in view.replicas:
            assert r.scraped_at_s is not None and r.scraped_at_s % 2.0 == 0
            assert 0 <= view.now - r.scraped_at_s < 2.0
            assert 0 <= r.kv_usage <= 1 and r.queue >= 0 and r.running >= 0
            assert r.active_blocks is None and r.overlap_blocks is None
        return self.argmin([r.queue for r in view.replicas])


class PredictedProbe(Router):
    """Dynamo's shape: fewest predicted active blocks plus prefill blocks."""

    name = "test-predicted-probe"
    cache_view = ApproxTTL()
    load_view = PredictedLoad()

    def route(self, request, view):
        for r in view.replicas:
            assert r.active_blocks >= 0 and r.active_prefill_tokens >= 0
            assert (r.in_flight == 0) == (r.active_blocks == 0)
        return self.argmin([r.active_blocks + r.active_prefill_tokens / request.block_size
                            for r in view.replicas])


register_router(ScrapedProbe)
register_router(PredictedProbe)


# --- the golden: one replica behind any router is today's single server ------------------
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_one_replica_equals_single_server_for_every_router(engine):
    single = run(_cfg(engine))
    assert "replicas" not in single.summary and "replica" not in single.requests
    for router in (*sorted(ROUTERS), f"{EXAMPLE}:PrefixOrLeastLoad"):  # every registered one
        fleet = run(_cfg(engine, router=router))
        for k, v in single.summary.items():
            assert fleet.summary[k] == v or (v != v and fleet.summary[k] != fleet.summary[k]), \
                (router, k)
        # the fleet's ideal (an unlimited cache shared by its replicas) is the server's own
        t = fleet.requests
        assert t["routed_ideal_hit_tokens"].equals(t["ideal_hit_tokens"]), router
        assert t.drop(columns=["replica", "routed_ideal_hit_tokens"]).equals(
            single.requests), router
        assert fleet.summary["replicas"] == 1 and fleet.summary["affinity"] == 1.0
        assert fleet.summary["routed_ideal_hit_rate"] == single.summary["ideal_hit_rate"]
        # the one replica's own summary is the server's too, field for field in its order
        (own,) = fleet.summary["replica_summaries"]
        scalars = [k for k, v in single.summary.items() if k in own]
        assert scalars == [k for k in own if k not in ("routed_ideal_hit_rate", "replica")]
        for k in scalars:
            v = single.summary[k]
            assert own[k] == v or (v != v and own[k] != own[k]), (router, k)



def test_one_result_assembly_for_every_kind(monkeypatch):
    """The kinds differ in how they serve, not in how their results are built (issue 52 item
    4): each serves the trace and says what it served (sim/run/summary.py ``Served``:
    recorder, requests, its fields and tables, whether it drew from the seed), and
    ``summarize`` alone builds every kind's result from that, once per run."""
    import inspect

    import sim.fleet.pd_run
    import sim.fleet.results
    import sim.run.driver as driver
    import sim.run.kinds as kinds
    from sim.run.summary import Served, summarize

    for module in (kinds, sim.fleet.results, sim.fleet.pd_run):
        source = inspect.getsource(module)
        assert "RunResult(" not in source and "summarize(" not in source, module
    built = []

    def once(kind, served):
        assert isinstance(served, Served) and not built
        built.append(summarize(kind, served))
        return built[-1]

    monkeypatch.setattr(driver, "summarize", once)
    small = BASE.with_fields(trace="synthetic:claude-code?sessions=2", sessions=2)
    for cfg, kind in ((small, kinds.Server), (small.with_fields(replicas=2), kinds.FleetRun),
                      (small.with_fields(prefill_replicas=1, decode_replicas=1), kinds.PDRun)):
        assert kinds.kind_of(cfg) is kind
        built.clear()
        assert run(cfg) is built[0], kind
    # ``--replicas 1`` without a router or pool is the plain run's kind itself
    assert kinds.kind_of(small.with_fields(replicas=1)) is kinds.Server


# --- every request once; fleet totals are the sum of the replicas' -----------------------
@pytest.mark.parametrize("router", [*sorted(ROUTERS), f"{EXAMPLE}:PrefixOrLeastLoad"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(replicas=st.integers(2, 4), seed=st.integers(0, 3),
       engine=st.sampled_from(["sglang", "vllm"]))
def test_every_request_served_once_and_totals_add_up(router, replicas, seed, engine):
    res = run(_cfg(engine, router=router, replicas=replicas, seed=seed))
    t, s = res.requests, res.summary
    assert sorted(t["request"]) == list(range(s["trace_requests"]))
    assert set(t["replica"]) <= set(range(replicas))
    per = s["replica_summaries"]
    assert [p["replica"] for p in per] == list(range(replicas))
    for k in ADDITIVE:
        assert s[k] == sum(p[k] for p in per), k
    for k in ("prefill_busy_s", "decode_busy_s"):
        assert s[k] == pytest.approx(sum(p[k] for p in per)), k
    assert s["sessions_completed"] == sum(p["sessions_completed"] for p in per)
    served = t[~t["dropped"].astype(bool)]
    for p in per:
        assert p["requests"] == int((served["replica"] == p["replica"]).sum())
    assert 0 <= s["reuse_captured"] <= s["reuse_available"] <= 1


def test_a_run_is_a_pure_function_of_its_seed():
    a = run(_cfg("sglang", router="random", replicas=3, seed=1))
    b = run(_cfg("sglang", router="random", replicas=3, seed=1))
    c = run(_cfg("sglang", router="random", replicas=3, seed=2))
    assert a.requests.equals(b.requests)
    assert not a.requests["replica"].equals(c.requests["replica"])


# --- belief vs truth ----------------------------------------------------------------------
class TreeLongest(Router):
    """Longest believed prefix (SGLang's approximate tree, never pruned), else least load."""

    name = "tree-longest"
    cache_view = ApproxTree(max_blocks=1 << 30, eviction_interval_s=1e9)

    def route(self, request, view):
        overlaps = [r.overlap_blocks for r in view.replicas]
        if max(overlaps) > 0:
            return self.argmax(overlaps)
        return self.argmin([r.in_flight for r in view.replicas])


class EventsLongest(TreeLongest):
    name = "events-longest"
    cache_view = KVEvents(lag_s=0.0)


register_router(TreeLongest)
register_router(EventsLongest)


def _run_with(router: type[Router], engine: str, gpu_cache: int):
    return run(_cfg(engine, router=router.name, replicas=3, gpu_cache=gpu_cache))


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_approximate_belief_diverges_once_engines_evict(engine):
    roomy = _run_with(TreeLongest, engine, 1 << 24).summary
    assert roomy["evicted_tokens"] == 0
    assert roomy["belief_error_mean_tokens"] >= 0  # defined: the router has a view
    tight = _run_with(TreeLongest, engine, 65536).summary
    assert tight["evicted_tokens"] > 0
    # The tree never hears of evictions: it believes more is cached than is.
    assert tight["belief_bias_mean_tokens"] > 0
    assert tight["belief_wrong_share"] > 0
    assert tight["belief_error_mean_tokens"] > roomy["belief_error_mean_tokens"]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_event_index_without_lag_is_the_truth(engine):
    s = _run_with(EventsLongest, engine, 65536).summary
    assert s["evicted_tokens"] > 0
    assert s["belief_error_mean_tokens"] == 0.0 and s["belief_wrong_share"] == 0.0


@pytest.mark.parametrize("tiering,preset", [("unified", "sglang"), ("unified", "penelope"),
                                            ("hicache", "sglang")])
def test_event_index_follows_demotions_and_loads_of_a_cpu_tier(tiering, preset):
    cfg = BASE.with_fields(router=EventsLongest.name, replicas=3, gpu_cache=49152,
                  cpu_cache=32768, tiering=tiering, scheduler="lpm-cpu").with_preset(preset)
    s = run(cfg).summary
    assert s["demoted_tokens"] > 0 and s["evicted_tokens"] > 0
    assert s["belief_error_mean_tokens"] == 0.0


def test_event_index_follows_the_device_nodes_a_hicache_load_deletes():
    # HiCache write_back: a CPU load makes device room by deleting nodes without a host copy.
    # Their ids are in the load's result now, so they are removed events (before: only a
    # count, and the index over-believed them: 1.9% of decisions wrong, +415 tokens).
    cfg = BASE.with_fields(trace="synthetic:claude-code?sessions=16", router="dynamo-kv",
                           replicas=2, sessions=16, gpu_cache=65536, cpu_cache=65536,
                  tiering="hicache", hicache_write_policy="write_back").with_preset("sglang")
    res = run(cfg)
    s = res.summary
    assert sum(p["cpu_loads"] for p in s["replica_summaries"]) > 0
    assert s["belief_error_mean_tokens"] == 0.0 and s["belief_wrong_share"] == 0.0


def test_lagged_events_are_wrong_sometimes():
    class Lagged(EventsLongest):
        name = "events-longest-lagged"
        cache_view = KVEvents(lag_s=30.0)

    register_router(Lagged)
    s = _run_with(Lagged, "sglang", 65536).summary
    assert s["belief_wrong_share"] > 0


# --- the belief mechanisms, by hand ----------------------------------------------------------
def test_tree_belief_evicts_least_recent_leaves_per_worker_at_intervals():
    b = build_belief(ApproxTree(max_blocks=3, eviction_interval_s=10.0), 2)
    b.routed(ids(1, 2, 3), 0, 0.0)
    b.routed(ids(1, 4), 0, 1.0)  # worker 0 holds 1,2,3,4 (4 > 3 blocks)
    b.routed(ids(1, 2), 1, 2.0)
    assert b.overlaps(ids(1, 2, 3), 9.0) == [3, 2]  # unbounded between evictions
    assert b.sizes() == [4, 2]
    # At t=10 worker 0 loses its oldest leaf (3, stamped at t=0); 4 is newer.
    assert b.overlaps(ids(1, 2, 3), 10.0) == [2, 2]
    assert b.overlaps(ids(1, 4), 10.0) == [2, 1]
    assert b.sizes() == [3, 2]


def test_pod_lru_counts_blocks_until_no_pod_holds_one():
    b = build_belief(PodLRU(capacity_blocks=3, max_prefix_blocks=8), 2)
    b.routed(ids(1, 2, 3), 0, 0.0)
    b.routed(ids(9, 2, 3), 1, 0.0)  # pod 1 holds 2 and 3 without 1
    assert b.overlaps(ids(1, 2, 3, 4), 0.0) == [3, 2]  # llm-d's scan, not a prefix
    b.routed(ids(5), 0, 1.0)  # pod 0's LRU drops 1 (capacity 3)
    assert b.overlaps(ids(1, 2, 3), 1.0) == [0, 0]  # nobody holds block 1: stop


def test_ttl_belief_expires_and_refreshes():
    b = build_belief(ApproxTTL(ttl_s=10.0, max_blocks=100), 2)
    b.routed(ids(1, 2), 0, 0.0)
    b.routed(ids(1), 0, 5.0)  # block 1 refreshed until 15
    assert b.overlaps(ids(1, 2), 9.0) == [2, 0]
    assert b.overlaps(ids(1, 2), 10.0) == [1, 0]
    assert b.overlaps(ids(1, 2), 15.0) == [0, 0]


def test_event_belief_applies_events_after_the_lag_in_order():
    b = build_belief(KVEvents(lag_s=2.0), 2)
    b.stored(1, ids(1, 2), 0.0)
    b.removed(1, ids(2), 1.0)
    assert b.overlaps(ids(1, 2), 1.5) == [0, 0]
    assert b.overlaps(ids(1, 2), 2.0) == [0, 2]
    assert b.overlaps(ids(1, 2), 3.0) == [0, 1]
    assert b.sizes() == [0, 1]


# --- decisions of the simple routers -----------------------------------------------------------
def _view(in_flight, now=0.0):
    return RouterView(now, tuple(ReplicaView(i, None, None, f, 0, 0)
                                 for i, f in enumerate(in_flight)))


def _route_req(session=0):
    return RouteRequest(0, session, 0.0, 100, ids(1, 2), 64)


def _bound(name, n, seed=0, **params):
    r = get_router(name, params)
    r.bind(n, 64, np.random.default_rng(seed))
    return r


def test_round_robin_cycles():
    r = _bound("round-robin", 3)
    assert [r.route(_route_req(), _view([9, 0, 0])) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_load_picks_fewest_in_flight_and_draws_ties():
    r = _bound("least-load", 4)
    assert r.route(_route_req(), _view([3, 1, 2, 5])) == 1
    picks = {_bound("least-load", 4, seed).route(_route_req(), _view([2, 0, 7, 0]))
             for seed in range(20)}
    assert picks == {1, 3}  # only the tied minima, both reachable


def test_power_of_two_takes_the_less_loaded_of_its_two_draws():
    for seed in range(20):
        r = _bound("power-of-two", 4, seed)
        rng = np.random.default_rng(seed)
        a, b = (int(x) for x in rng.choice(4, size=2, replace=False))
        loads = [5, 1, 3, 1]
        want = b if loads[b] < loads[a] else a  # ties: the first drawn (SMG)
        assert r.route(_route_req(), _view(loads)) == want


def test_random_uses_the_seeded_rng():
    picks = [_bound("random", 5, 7).route(_route_req(), _view([0] * 5)) for _ in range(3)]
    assert picks == [int(np.random.default_rng(7).integers(5))] * 3


def test_session_affinity_is_a_consistent_hash():
    r4, r5 = _bound("session-affinity", 4), _bound("session-affinity", 5)
    first = [r4.route(_route_req(s), _view([0] * 4)) for s in range(400)]
    assert first == [r4.route(_route_req(s), _view([9, 9, 9, 9])) for s in range(400)]
    assert set(first) == {0, 1, 2, 3}
    moved = sum(a != r5.route(_route_req(s), _view([0] * 5)) for s, a in enumerate(first))
    assert 0 < moved < 400 * 0.35  # a fifth replica takes ~1/5, the rest stay


# --- configuration and the user's router -------------------------------------------------------
def test_router_errors_are_config_errors():
    with pytest.raises(ConfigError, match="router"):
        check(BASE.with_fields(router="nope"))
    with pytest.raises(ConfigError, match="replicas"):
        check(BASE.with_fields(replicas=0))
    with pytest.raises(ConfigError, match="router_params"):
        check(BASE.with_fields(router_params={"x": 1}))
    with pytest.raises(ConfigError, match="context"):
        check(BASE.with_fields(replicas=2, context="drop:4"))
    with pytest.raises(PolicyError, match="no parameter"):
        get_router("session-affinity", {"nope": 1})


def test_user_router_from_the_cli(tmp_path):
    out = tmp_path / "o"
    res = CliRunner().invoke(cli, [
        "run", "--trace", "synthetic:claude-code?sessions=8", "--gpu-cache", "64k",
        "--max-context", "64k", "--gaps", "tool", "--preset", "penelope", "--replicas", "3",
        "--router", f"{EXAMPLE}:PrefixOrLeastLoad", "--router-param", "slack=2",
        "--router-param", "lag_s=0.5", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["runs"][0]["summary"]
    assert s["replicas"] == 3 and s["router"] == "prefix-or-least-load(slack=2,lag_s=0.5)"
    assert not math.isnan(s["belief_error_mean_tokens"])
    import pandas as pd

    req = pd.read_parquet(out / "penelope" / "requests.parquet")
    routing = pd.read_parquet(out / "penelope" / "routing.parquet")
    load = pd.read_parquet(out / "penelope" / "load.parquet")
    assert sorted(routing["request"]) == sorted(req["request"])
    assert (routing.set_index("request")["replica"].sort_index()
            == req.set_index("request")["replica"].sort_index()).all()
    assert len(load) == 3 * len(routing) and (routing["true_tokens"] <= routing["best_tokens"]
                                              ).all()
    assert routing["same_replica"].sum() / routing["follow_up"].sum() == pytest.approx(
        s["affinity"])
    plotted = CliRunner().invoke(cli, ["plot", str(out)])
    assert plotted.exit_code == 0, plotted.output
    assert (out / "replica_load_penelope.png").stat().st_size > 0
    bad = CliRunner().invoke(cli, ["run", "--replicas", "2", "--router", "nope"])
    assert bad.exit_code == 2 and "router" in bad.output


def test_user_router_from_a_sweep(tmp_path):
    (tmp_path / "sweep.yaml").write_text(
        "base: {trace: 'synthetic:claude-code?sessions=6', gaps: tool, gpu_cache: 64k,\n"
        "       max_context: 64k, preset: penelope}\n"
        "grid:\n  router: [round-robin, " + f"'{EXAMPLE}:PrefixOrLeastLoad']\n"
        "  replicas: [1, 2]\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["sweep", str(tmp_path / "sweep.yaml"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    import pandas as pd

    df = pd.read_parquet(out / "results.parquet")
    assert list(df["replicas"]) == ["1", "2", "1", "2"]  # grid values as written
    assert list(df["router"].str.endswith("PrefixOrLeastLoad")) == [False, False, True, True]
    assert df["affinity"].notna().all() and (df["requests"] > 0).all()


class Counting(Router):
    """Least load; counts the hooks the fleet calls (class-level: the run makes the
    instance)."""

    name = "test-counting"
    seen: ClassVar[dict] = {}

    def bind(self, n_replicas, block_size, rng) -> None:
        super().bind(n_replicas, block_size, rng)
        Counting.seen = {"first": [], "finish": [], "routed": {}}

    def route(self, request, view):
        r = self.argmin([x.in_flight for x in view.replicas])
        Counting.seen["routed"][request.rid] = r
        return r

    def on_first_token(self, rid, replica, now):
        Counting.seen["first"].append((rid, replica))

    def on_finish(self, rid, replica, now):
        Counting.seen["finish"].append((rid, replica))


register_router(Counting)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_router_hooks_are_called_once_per_request(engine):
    res = run(_cfg(engine, router="test-counting", replicas=2))
    seen = Counting.seen
    routed = seen["routed"]
    assert sorted(rid for rid, _ in seen["finish"]) == sorted(routed)  # each once
    assert all(routed[rid] == r for rid, r in seen["finish"] + seen["first"])
    served = set(res.requests.loc[~res.requests["dropped"].astype(bool), "request"])
    assert {rid for rid, _ in seen["first"]} == served


class NumpyChoice(Router):
    """Returns numpy integers (np.argmin), as a user's router may."""

    name = "test-numpy-choice"
    bad: bool = False

    def route(self, request, view):
        if self.bad:
            return len(view)
        return np.argmin([r.in_flight for r in view.replicas])


register_router(NumpyChoice)


def test_a_router_may_return_numpy_integers_but_not_outside_the_fleet():
    from sim.fleet.errors import RoutingError

    res = run(_cfg("sglang", router="test-numpy-choice", replicas=3))
    assert set(res.requests["replica"]) == {0, 1, 2}
    with pytest.raises(RoutingError, match="not a replica index"):
        run(_cfg("sglang", router="test-numpy-choice", router_params={"bad": True},
                 replicas=3))


def test_many_replicas():
    res = run(_cfg("sglang", router="least-load", replicas=70))
    assert res.summary["replicas"] == 70 and len(res.summary["replica_summaries"]) == 70


@pytest.mark.parametrize("extra", [
    dict(replay="open", time_scale=0.05),
    dict(cpu_cache=32768, tiering="unified", scheduler="lpm-cpu"),
    dict(cpu_cache=32768, tiering="hicache", scheduler="lpm-cpu"),
])
def test_one_replica_equals_single_server_open_loop_and_tiers(extra):
    cfg = BASE.with_fields(gpu_cache=49152, **extra).with_preset("sglang")
    single = run(cfg)
    for router in ("round-robin", EventsLongest.name, ScrapedProbe.name):
        fleet = run(cfg.with_fields(router=router))
        for k, v in single.summary.items():
            assert fleet.summary[k] == v or (v != v and fleet.summary[k] != fleet.summary[k]), \
                (router, k)
        t = fleet.requests
        assert t["routed_ideal_hit_tokens"].equals(t["ideal_hit_tokens"]), router
        assert t.drop(columns=["replica", "routed_ideal_hit_tokens"]).equals(
            single.requests), router
