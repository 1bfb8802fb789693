"""SMG 1.13's router tree (sim/fleet/radix.py), case by case against its rules (computed by
hand from crates/kv_index string_tree.rs as the module docstring states them)."""

from __future__ import annotations

from policies.routing import ApproxRadix
from sim.fleet.radix import RadixBelief
from tests.chained import ids


def test_overlaps_split_and_one_budget_for_all_workers():
    b = RadixBelief(3, ApproxRadix(max_blocks=9, eviction_interval_s=10.0, refresh_every=8))
    assert b.epoch == 3  # one empty insert per worker at registration
    b.routed(ids(1, 2, 3, 4), 0, 0.0)
    b.routed(ids(1, 2, 7), 1, 0.0)  # splits the 1-2-3-4 node after two blocks
    assert b.overlaps(ids(1, 2, 3, 9), 0.0) == [3, 2, 0]
    assert b.overlaps(ids(1, 2, 7, 8), 0.0) == [2, 3, 0]
    assert b.sizes() == [4, 3, 0] and b.total == 7
    b.routed(ids(5, 6, 8), 2, 0.0)  # 10 blocks: over the shared budget of 9
    assert b.sizes() == [4, 3, 3]
    # epochs: 3 registration, then per call: insert 3, insert 4, match 5, match 6, insert 7
    # stamps: worker 0's leaf 3-4 @3, its share of 1-2 @3 (copied at the split), worker 1's
    # leaf 7 @4 and 1-2 @0 (new there), worker 2's leaf 5-6-8 @7. At t = 10 the oldest leaf
    # (worker 0's 3-4, stamp 3) goes whole: 8 blocks, at the budget: stop
    assert b.overlaps(ids(1, 2, 3), 10.0) == [2, 2, 0]
    assert b.sizes() == [2, 3, 3] and b.total == 8


def test_a_removed_leaf_exposes_its_parent_whose_stamp_may_be_older():
    b = RadixBelief(2, ApproxRadix(max_blocks=2, eviction_interval_s=1.0, refresh_every=8))
    b.routed(ids(1, 2), 0, 0.0)  # @2
    b.routed(ids(1, 2, 3, 4), 1, 0.0)  # 1-2 gains worker 1 at stamp 0; leaf 3-4 @3
    b.routed(ids(9), 0, 0.0)  # @4
    assert b.total == 7
    # eviction, least stamp first: worker 0's 1-2 (@2, a leaf for it), worker 1's 3-4 (@3),
    # then worker 1's 1-2 (stamp 0, a leaf for it once 3-4 went): 1 block left, worker 0's 9
    assert b.overlaps(ids(1, 2, 3, 4), 1.0) == [0, 0]
    assert b.sizes() == [1, 0] and b.overlaps(ids(9), 1.0) == [1, 0]


def test_a_match_refreshes_its_node_once_every_eight_epochs():
    b = RadixBelief(1, ApproxRadix(max_blocks=2, eviction_interval_s=100.0, refresh_every=8))
    b.routed(ids(1), 0, 0.0)  # @1
    b.routed(ids(2), 0, 0.0)  # @2
    while b.epoch % 8:  # matches on node 1 tick the epoch; the one at a multiple refreshes
        b.overlaps(ids(1), 0.0)
    b.overlaps(ids(1), 0.0)  # epoch 8: node 1 now stamped 8, newer than node 2's 2
    b.routed(ids(3), 0, 0.0)  # 3 blocks > 2
    assert b.overlaps(ids(1), 100.0) == [1] and b.overlaps(ids(2), 100.0) == [0]
