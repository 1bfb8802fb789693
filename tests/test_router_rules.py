"""The field's routing rules, each against a case computed by hand from the system's rule
(policies/routers/*: SGLang's imbalance fallback and threshold, Dynamo's cost and tie-break,
llm-d's weighted score, Mooncake's TTFT estimate, Preble's exploit/explore)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from policies.routers import dynamo, llmd, mooncake, preble, sglang
from sim.fleet.active import ActivePrompts


# -- SGLang cache_aware ----------------------------------------------------------------------
def test_sglang_imbalance_fallback_ignores_a_full_match():
    # max - min = 68 > 64 and 70 > 2 * 1.5: imbalanced, the least loaded wins
    assert sglang.select([70, 2, 5], [0, 0, 0], matched=1000, input_len=1000,
                         holder=0) == (1, sglang.IMBALANCED)
    # 66 - 2 = 64 is not > 64: balanced, the full match goes to its holder
    assert sglang.select([66, 2, 5], [0, 0, 0], 1000, 1000, holder=0) == (0, sglang.HIT)
    # the relative test: 200 - 130 = 70 > 64 and 200 > 195: imbalanced; 190 < 195: not
    assert sglang.select([200, 130], [0, 0], 1000, 1000, holder=0) == (1, sglang.IMBALANCED)
    assert sglang.select([190, 130], [0, 0], 1000, 1000, holder=0) == (0, sglang.HIT)


def test_sglang_cache_threshold_is_strict():
    # 300 / 1000 = 0.3 is not > 0.3: a miss, the least-loaded worker (2)
    assert sglang.select([4, 3, 1], [0, 0, 0], 300, 1000, holder=0) == (2, sglang.MISS)
    assert sglang.select([4, 3, 1], [0, 0, 0], 301, 1000, holder=0) == (0, sglang.HIT)
    assert sglang.select([4, 3, 1], [0, 0, 0], 0, 0, holder=None) == (2, sglang.MISS)


def test_sglang_ties_and_the_old_smallest_tree_miss_branch():
    # equal loads: fewer processed requests, then the lower index (SMG PR #1714)
    assert sglang.min_load_worker([3, 3, 4], [10, 4, 0]) == 1
    assert sglang.min_load_worker([3, 3, 3], [4, 4, 4]) == 0
    # before PR #14650 a miss went to the smallest tree, whatever its load
    assert sglang.select([0, 9, 1], [0, 0, 0], 0, 1000, None, tree_sizes=[10, 5, 7],
                         miss_branch=sglang.SMALLEST_TREE) == (1, sglang.MISS)
    assert sglang.select([0, 9, 1], [0, 0, 0], 0, 1000, None, tree_sizes=[10, 5, 7]) == (
        0, sglang.MISS)


# -- Dynamo KV router ----------------------------------------------------------------------
def test_dynamo_cost_reproduces_the_documented_example():
    # kv_cache_routing.md: W1 8 prefill + 10 decode = 18, W2 5 + 5 = 10, W3 2 + 9 = 11.
    # ISL 128 tokens = 8 blocks of 16; W2 holds 3 of them, W3 6.
    c = dynamo.costs(128, 16, overlap_blocks=[0, 3, 6], active_prefill_tokens=[0, 0, 0],
                     decode_blocks=[10, 5, 9])
    assert c == [18.0, 10.0, 11.0]
    assert dynamo.sample(c, [0, 0, 0], 0.0, np.random.default_rng(0)) == 1
    # prefill_load_scale 2 doubles the prefill term: 26, 15, 13 -> W3
    c2 = dynamo.costs(128, 16, [0, 3, 6], [0, 0, 0], [10, 5, 9], prefill_load_scale=2.0)
    assert c2 == [26.0, 15.0, 13.0]
    # active prefill tokens add to the prefill term; the credit never makes it negative
    assert dynamo.costs(128, 16, [0, 20], [32, 0], [0, 0]) == [10.0, 0.0]
    # half credit for an overlap: (128/16 - 0.5 * 6) + 9 = 14
    assert dynamo.costs(128, 16, [6], [0], [9], overlap_credit=0.5) == [14.0]


def test_dynamo_zero_temperature_ties_uniform_or_classic_smallest_tree():
    rng = np.random.default_rng(0)
    # 1.6.1: a tie is drawn whatever the trees (a tree of 50 blocks against one of 20)
    assert {dynamo.sample([10, 10, 12], None, 0.0, rng) for _ in range(50)} == {0, 1}
    assert dynamo.lowest([10, 10, 12]) == [0, 1]
    # the classic selector: the smallest tree first, then at random
    assert dynamo.sample([10, 10, 12], [50, 20, 0], 0.0, rng) == 1
    picks = {dynamo.sample([10, 10, 12], [20, 20, 0], 0.0, rng) for _ in range(50)}
    assert picks == {0, 1}


def test_dynamo_temperature_softmax_over_range_normalised_costs():
    rng = np.random.default_rng(1)
    n = 20_000
    # costs 0 and 1 (range 1) at T = 1: p0 = 1 / (1 + e^-1) = 0.7311; scaling the costs
    # by 100 leaves p unchanged (range-normalised)
    for scale in (1.0, 100.0):
        share = sum(dynamo.sample([0.0, scale], [0, 0], 1.0, rng) == 0 for _ in range(n)) / n
        assert share == pytest.approx(1 / (1 + math.exp(-1)), abs=0.015)


# -- llm-d EPP -----------------------------------------------------------------------------
def test_llmd_weighted_score_and_max_score_picker():
    # a 1,000-token prompt hashes ceil(1000 / 16) = 63 blocks; 512 matched tokens = 32
    assert llmd.prefix_score(512, 1000) == pytest.approx(32 / 63)
    prefix = [32 / 63, 0.0, 1.0]
    # queues 4, 0, 10 -> (10 - q) / 10 = 0.6, 1, 0; KV usage 0.5, 0.9, 0.2 -> 0.5, 0.1, 0.8
    total = llmd.scores(prefix, [4, 0, 10], [0.5, 0.9, 0.2])
    assert total == pytest.approx([3 * 32 / 63 + 1.2 + 1.0, 0 + 2.0 + 0.2, 3.0 + 0 + 1.6])
    assert llmd.max_score(total, np.random.default_rng(0)) == 2
    # equal queues score 1 each; weights are parameters
    assert llmd.queue_scores([3, 3]) == [1.0, 1.0]
    assert llmd.scores([1.0, 0.0], [0, 0], [0, 0], prefix_weight=0.0) == [4.0, 4.0]
    rng = np.random.default_rng(0)
    assert {llmd.max_score([4.0, 4.0, 1.0], rng) for _ in range(50)} == {0, 1}


def test_llmd_hashes_only_the_first_256_blocks():
    # 256 blocks x 16 tokens: a pod holding the first 4,096 tokens of a 100K prompt scores 1
    assert llmd.hashed_blocks(100_000) == 256
    assert llmd.prefix_score(4096, 100_000) == 1.0
    assert llmd.prefix_score(2048, 100_000) == 0.5
    assert llmd.hashed_blocks(15) == 0 and llmd.prefix_score(15, 15) == 0.0


# -- Mooncake Conductor ----------------------------------------------------------------------
def test_mooncake_least_estimated_ttft():
    # queue 2.0 + 0.1, 0.5 + 1.0, 0 + 2.0: the second instance (1.5 s) wins although the
    # first holds more of the prompt and the third is idle
    assert mooncake.ttft([2.0, 0.5, 0.0], [0.1, 1.0, 2.0]) == [2.1, 1.5, 2.0]
    assert mooncake.select([2.0, 0.5, 0.0], [0.1, 1.0, 2.0], np.random.default_rng(0)) == 1
    rng = np.random.default_rng(0)
    assert {mooncake.select([1.0, 0.0, 0.5], [0.0, 1.0, 0.9], rng) for _ in range(50)} == {0, 1}


# -- Preble E2 -------------------------------------------------------------------------------
def test_preble_exploits_when_the_cached_part_is_longer_than_the_missed_part():
    rng = np.random.default_rng(0)
    cost = [5.0, 1.0, 3.0]
    # 600 cached, 400 missed: exploit the only holder, however loaded
    assert preble.select(600, 1000, [0], cost, rng) == (0, preble.EXPLOIT)
    # several holders: the least loaded among them (2), not the least loaded overall (1)
    assert preble.select(600, 1000, [0, 2], cost, rng) == (2, preble.EXPLOIT)
    # 500 cached, 500 missed is not "missed < cached": explore, the least load cost
    assert preble.select(500, 1000, [0], cost, rng) == (1, preble.EXPLORE)
    assert preble.select(0, 1000, [], cost, rng) == (1, preble.EXPLORE)
    # load cost: windowed prefill seconds + active * expected output * TPOT
    assert preble.window_cost([1.0, 2.5], 2, 100, 0.15) == pytest.approx(33.5)


def test_dynamo_active_prefix_counts_chained_ids_like_a_scan():
    rng = np.random.default_rng(3)
    for _ in range(200):
        # active: whole chained prompts (prefixes of one id chain), then a request on it
        chain = list(range(100, 100 + int(rng.integers(1, 40))))
        held = chain[: int(rng.integers(0, len(chain) + 1))]
        active = ActivePrompts()
        active.add(np.asarray(held, dtype=np.int64))
        ids = chain[: int(rng.integers(0, len(chain) + 1))] + [999, 1000][: int(rng.integers(3))]
        want = sum(1 for b in ids if b in set(held))
        a = np.asarray(ids, dtype=np.int64)
        assert active.prefix(a) == want
        assert active.prefix(a, a.tobytes()) == want  # the bytes given, as the router does


def test_replica_views_are_the_views_built_one_by_one():
    """The fleet builds a decision's views column by column (``replica_views``): each must
    be the ``ReplicaView`` its row gives, field for field, and a missing column is refused."""
    from policies.routing import ReplicaView
    from sim.fleet.fleet import replica_views
    rng = np.random.default_rng(5)
    for n in (1, 3, 8):
        cols = [list(range(n))]
        for f in ReplicaView.field_names()[1:]:
            cols.append([None if rng.random() < 0.3 else int(rng.integers(100)) for _ in range(n)]
                        if f != "kv_usage" else [float(rng.random()) for _ in range(n)])
        views = replica_views(cols)
        assert views == tuple(ReplicaView(*row) for row in zip(*cols, strict=True))
        assert all(type(v) is ReplicaView for v in views)
        assert [v.active_prefix_blocks for v in views] == cols[-1]
    with pytest.raises(TypeError, match=f"{len(ReplicaView.field_names())} columns"):
        replica_views([range(2), [0, 0]])
