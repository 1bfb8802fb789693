"""The field's routers as plug-ins (policies/routers/): each decides from a hand-built view
as its system's rule says (cases computed by hand), keeps its own ledger right, and has the
defaults and belief views its docstring cites."""

from __future__ import annotations

import math

import numpy as np
import pytest

from costmodel.estimate import PrefillEstimate
from costmodel.profile import load_profile
from costmodel.specs import get_spec
from costmodel.units import range_units
from policies import PolicyError
from policies.routers import sglang
from policies.routing import (
    ApproxRadix,
    ApproxTree,
    ApproxTTL,
    KVEvents,
    PodLRU,
    PredictedLoad,
    ReplicaView,
    RouteRequest,
    RouterView,
    ScrapedMetrics,
    get_router,
)

BS = 64


def request(rid: int, prompt: int, ids=None, now: float = 0.0) -> RouteRequest:
    ids = np.arange(prompt // BS, dtype=np.int64) if ids is None else np.asarray(ids, np.int64)
    return RouteRequest(rid, 0, now, prompt, ids, BS)


def view(now: float = 0.0, **cols) -> RouterView:
    n = len(next(iter(cols.values())))
    base = {"overlap_blocks": [0] * n, "belief_blocks": [0] * n, "in_flight": [0] * n,
            "in_flight_tokens": [0] * n, "routed": [0] * n}
    base.update(cols)
    return RouterView(now, tuple(ReplicaView(i, **{k: v[i] for k, v in base.items()})
                                 for i in range(n)))


def bound(spec: str, n: int, seed: int = 0, price=None):
    r = get_router(spec)
    r.bind(n, BS, np.random.default_rng(seed))
    if price is not None:
        r.bind_prefill_model(price)
    return r


def linear_price(cached: int, prompt: int) -> float:
    return max(0, prompt - cached) * 0.001


def test_sglang_113_hit_goes_to_the_least_loaded_holder_unless_it_spills():
    r = bound("sglang-cache-aware", 4)
    assert r.cache_view == ApproxRadix(max_blocks=(1 << 26) // 4 // BS,
                                       eviction_interval_s=60.0, refresh_every=8)
    assert r.load_view == ScrapedMetrics(scrape_s=10.0)
    # 10 of 15 blocks (640 / 1000 = 0.64 > 0.3) on replicas 1 and 2: the less loaded holder
    v = view(overlap_blocks=[0, 10, 10, 3], in_flight=[0, 5, 2, 0])
    assert r.candidates(request(0, 1000), v) == ([2], "hit")
    assert r.route(request(0, 1000), v) == 2
    # 4 blocks = 256 / 1000 = 0.256: a miss, a least-loaded worker drawn (0 or 3)
    v = view(overlap_blocks=[0, 4, 4, 0], in_flight=[0, 5, 2, 0])
    assert r.candidates(request(1, 1000), v) == ([0, 3], "miss")
    # loads 0, 0, 6, 0: mean 1.5, margin max(4, ceil(2 sqrt 1.5) = 3) = 4; 6 > 5.5 and
    # 6 > 2.25: the only holder trips the gate, the request spills to a least-loaded one
    v = view(overlap_blocks=[0, 0, 10, 0], in_flight=[0, 0, 6, 0])
    assert r.candidates(request(2, 1000), v) == ([0, 1, 3], "spill")
    # at 5 (5 > 1.25 + 4 is false) the holder keeps it
    v = view(overlap_blocks=[0, 0, 10, 0], in_flight=[0, 0, 5, 0])
    assert r.candidates(request(3, 1000), v) == ([2], "hit")
    # overload protection: replica 2 reported 8 waiting requests, replica 1 0.8 KV usage
    v = view(overlap_blocks=[0, 10, 10, 0], in_flight=[3, 0, 0, 1], queue=[0, 0, 8, 0],
             kv_usage=[0.1, 0.8, 0.1, 0.79])
    assert r.candidates(request(4, 1000), v) == ([3], "miss")
    v = view(overlap_blocks=[0, 0, 0, 0], in_flight=[3, 0, 2, 1], queue=[9, 9, 9, 9],
             kv_usage=[0.1, 0.1, 0.1, 0.1])
    assert r.candidates(request(5, 1000), v) == ([1], "overloaded")
    off = bound("sglang-cache-aware?overload_protection=false", 4)
    assert off.load_view is None and off.eligible(v) is None


def test_sglang_routes_without_building_a_load_view_spec(monkeypatch):
    """The fleet reads ``load_view`` once, when it is built; a route reads the rule only (a
    spec built and range-checked per request was a tenth of the router's time)."""
    r = bound("sglang-cache-aware", 4)
    v = view(overlap_blocks=[0, 10, 10, 0], in_flight=[3, 0, 0, 1], queue=[0, 0, 8, 0],
             kv_usage=[0.1, 0.8, 0.1, 0.79])

    def refused(self) -> None:
        raise AssertionError("a load_view spec built while routing")

    monkeypatch.setattr(ScrapedMetrics, "__post_init__", refused)
    assert r.eligible(v) == [0, 3]
    assert r.route(request(4, 1000), v) == 3
    off = bound("sglang-cache-aware?overload_protection=false", 4)
    assert off.eligible(v) is None


def test_sglang_spill_margin_is_the_capped_natural_swing():
    # min(64, max(4, ceil(2 sqrt(mean)))), in integers: mean 12.5 -> ceil(7.07) = 8
    assert sglang.spill_margin(50, 4, 64) == 8
    assert sglang.spill_margin(51, 4, 64) == 8  # 2 sqrt(12.75) = 7.14
    assert sglang.spill_margin(0, 4, 64) == 4
    assert sglang.spill_margin(16, 4, 64) == 4  # 2 sqrt(4) = 4 exactly
    assert sglang.spill_margin(17, 4, 64) == 5
    assert sglang.spill_margin(10 ** 6, 4, 64) == 64
    assert sglang.spill_margin(0, 4, 2) == 2  # an absolute threshold under 4 stands
    for total in range(0, 2000, 7):
        for n in (1, 2, 3, 4, 8):
            q = sglang.spill_margin(total, n, 10 ** 9)
            assert max(4, math.ceil(2 * math.sqrt(total / n) - 1e-12)) == q


def test_sglang_19_rule_and_old_miss_branch():
    r = bound("sglang-cache-aware?version=1.9", 3)
    assert r.cache_view == ApproxTree(max_blocks=(1 << 26) // 4 // BS, eviction_interval_s=60.0)
    assert r.load_view is None
    # 10 of 15 blocks (640 / 1000 tokens = 0.64 > 0.3) believed on replica 2: a hit
    v = view(overlap_blocks=[0, 3, 10], in_flight=[5, 0, 9], routed=[1, 1, 1])
    assert r.route(request(0, 1000), v) == 2
    # 4 blocks = 256 / 1000 = 0.256: a miss, the least-loaded replica
    v = view(overlap_blocks=[0, 3, 4], in_flight=[5, 0, 9], routed=[1, 1, 1])
    assert r.route(request(1, 1000), v) == 1
    # 70 - 0 > 64 and 70 > 0: imbalanced, the match is ignored
    v = view(overlap_blocks=[0, 0, 10], in_flight=[3, 0, 70], routed=[1, 1, 1])
    assert r.route(request(2, 1000), v) == 1
    assert {k: v for k, v in r.branches.items() if v} == {"hit": 1, "miss": 1,
                                                          "imbalanced": 1}
    old = bound("sglang-cache-aware?version=1.9&miss_branch=smallest-tree", 3)
    v = view(belief_blocks=[40, 7, 9], in_flight=[0, 6, 1])
    assert old.route(request(3, 1000), v) == 1
    for bad in ("miss_branch=largest", "version=2.0", "miss_branch=smallest-tree",
                "version=1.9&overload_kv_usage=0.5", "overload_kv_usage=0"):
        with pytest.raises(PolicyError):
            get_router(f"sglang-cache-aware?{bad}")


def test_dynamo_router_counts_the_request_blocks_not_active_yet():
    r = bound("dynamo-kv", 2)
    assert r.cache_view == KVEvents(lag_s=0.0, drop_orphans=True)
    assert r.load_view == PredictedLoad()
    assert bound("dynamo-kv?version=classic", 2).cache_view == KVEvents(lag_s=0.0)
    # 1.6.1's approximate mode has no tree-size bound; the classic one had 2^20 blocks
    assert bound("dynamo-kv?use_kv_events=false", 2).cache_view == ApproxTTL(
        ttl_s=120.0, max_blocks=0, prune_ratio=0.8)
    assert bound("dynamo-kv?use_kv_events=false&max_tree_size=1048576", 2).cache_view == \
        ApproxTTL(ttl_s=120.0, max_blocks=(1 << 20) * 16 // BS, prune_ratio=0.8)
    for bad in ("version=1.0", "max_tree_size=-1", "max_tree_size=100"):
        with pytest.raises(PolicyError):
            get_router(f"dynamo-kv?{bad}")
    req = request(0, 640)  # 10 blocks
    # W0: 10 prefill + 10 decode = 20; W1: (10 - 4) + 10 = 16
    v = view(overlap_blocks=[0, 4], active_prefill_tokens=[0, 0], active_blocks=[0, 0],
             active_prefix_blocks=[0, 0])
    assert r.route(req, v) == 1
    # the same prompt again, W1 still prefilling 384 tokens: W1 = (384 + 640) / 64 - 4 + 10
    # (its 10 blocks are active already) = 22; W0 = 20
    v = view(overlap_blocks=[0, 4], active_prefill_tokens=[0, 384], active_blocks=[0, 10],
             active_prefix_blocks=[0, 10])
    assert r.route(request(1, 640), v) == 0
    # 3 of W1's 10 active blocks lead this prompt: 7 more decode blocks, not 10
    v = view(overlap_blocks=[0, 0], active_prefill_tokens=[0, 0], active_blocks=[0, 10],
             active_prefix_blocks=[0, 3])
    assert r.costs(req, v) == [20.0, 10.0 + 10 + 7]
    with pytest.raises(PolicyError, match="predicted load"):  # a view without the load
        r.costs(req, view(overlap_blocks=[0, 0], active_prefill_tokens=[0, 0]))


def test_llmd_router_weighs_prefix_queue_and_kv_usage():
    r = bound("llm-d?auto_tune=false", 3)
    assert r.cache_view == PodLRU(capacity_blocks=31_250 * 16 // BS,
                                  max_prefix_blocks=256 * 16 // BS)
    assert r.load_view == ScrapedMetrics(scrape_s=0.05)
    # 1,000 tokens = 63 hashed 16-token blocks; 8 kvsim blocks = 512 tokens = 32 of them.
    # totals: 3 * 32/63 + 2 * 0.6 + 2 * 0.5 = 3.72; 0 + 2 + 0.2 = 2.2; 3 * 15.. capped:
    # 15 blocks = 960 tokens = 60/63 -> 2.857 + 0 + 1.6 = 4.46
    v = view(overlap_blocks=[8, 0, 15], queue=[4, 0, 10], kv_usage=[0.5, 0.9, 0.2])
    assert r.route(request(0, 1000), v) == 2
    # with no scrape yet: every queue and usage counts as zero, the prefix decides
    v = view(overlap_blocks=[0, 3, 0])
    assert r.route(request(1, 1000), v) == 1


def test_llmd_auto_tune_sizes_its_index_by_the_engines_report():
    r = bound("llm-d", 3)
    # hash blocks of max(64, 16) tokens; as many hashes per pod as the engine has 16-token
    # blocks: 4 kvsim blocks of index per kvsim block of cache; the first 256 x 64 tokens
    assert r.hash_tokens == 64
    assert r.cache_view == PodLRU(capacity_blocks=0, max_prefix_blocks=256,
                                  capacity_per_cache_block=4.0)
    # 1,000 tokens = ceil(1000 / 64) = 16 hash blocks (the partial last one too); 8 kvsim
    # blocks = 8 of them; the whole prompt's 15 full blocks = 15
    assert r.prefix_scores(request(0, 1000), view(overlap_blocks=[8, 0, 15])) == [
        pytest.approx(0.5), 0.0, pytest.approx(15 / 16)]
    precise = bound("llm-d?precise=true&event_lag_s=0.5", 3)
    assert precise.cache_view == KVEvents(lag_s=0.5)
    # the precise scorer: leading blocks held / the prompt's 15 full blocks
    assert precise.prefix_scores(request(1, 1000), view(overlap_blocks=[5, 0, 15])) == [
        pytest.approx(5 / 15), 0.0, 1.0]
    for bad in ("precise=true&lru_capacity=10", "block_tokens=64", "event_lag_s=1",
                "auto_tune=false&engine_block_tokens=32", "max_prefix_blocks=0"):
        with pytest.raises(PolicyError):
            get_router(f"llm-d?{bad}")


def test_mooncake_router_queues_its_own_estimates():
    r = bound("mooncake", 2, price=linear_price)
    assert r.cache_view == KVEvents(lag_s=0.0)
    v = view(overlap_blocks=[0, 10])  # 640 of 1,000 tokens cached on replica 1
    # prefill estimates 1.0 s and 0.36 s, queues empty: replica 1, busy until 0.36
    assert r.route(request(0, 1000), v) == 1
    # 0.36 queued + 0.36 = 0.72 < 1.0: replica 1 again, busy until 0.72
    assert r.route(request(1, 1000), v) == 1
    # 0.72 + 0.36 = 1.08 > 1.0: replica 0
    assert r.route(request(2, 1000), v) == 0
    assert r.busy_until == pytest.approx([1.0, 0.72])
    # time passes: the queue drains
    assert r.route(request(3, 1000, now=5.0), view(now=5.0, overlap_blocks=[0, 10])) == 1
    with pytest.raises(PolicyError):
        bound("mooncake", 2).route(request(4, 1000), v)


def test_preble_router_exploits_then_explores_by_windowed_cost():
    r = bound("preble?expected_output_tokens=100", 3, price=linear_price)
    # 640 cached of 1,000 (missed 360 < 640): exploit the holder although it is busier
    v = view(overlap_blocks=[10, 0, 0], in_flight=[2, 0, 0])
    assert r.route(request(0, 1000), v) == 0
    # 320 cached (missed 680): explore; load cost = window prefill + in_flight * 100 * 0.15:
    # replica 0: 0.36 + 15 = 15.36, replica 1: 0 + 30, replica 2: 0 + 15 -> 2
    v = view(overlap_blocks=[5, 0, 0], in_flight=[1, 2, 1])
    assert r.route(request(1, 1000), v) == 2
    assert r.window_prefill == pytest.approx([0.36, 0.0, 1.0])  # nothing cached on 2
    # after the 180 s window the prefill charges are gone: 0 + 15 vs 0 + 15 vs 0 + 30
    v = view(now=200.0, overlap_blocks=[0, 0, 0], in_flight=[1, 1, 2])
    assert r.load_costs(v) == pytest.approx([15.0, 15.0, 30.0])


def test_prefill_estimate_prices_the_uncached_part_in_engine_chunks():
    spec, prof = get_spec("qwen3-8b"), load_profile(None, "qwen3-8b")
    est = PrefillEstimate(spec, prof, 8192)
    want = (prof.prefill_seconds(range_units(spec, 2000, 10192))
            + prof.prefill_seconds(range_units(spec, 10192, 12000)))
    assert est(2000, 12000) == pytest.approx(want)
    assert est(12000, 12000) == 0.0
    assert est(0, 12000) > est(6000, 12000) > 0
