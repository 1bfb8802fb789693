"""SMG 1.13's router tree (sim/fleet/radix.py), case by case against its rules (computed by
hand from crates/kv_index string_tree.rs as the module docstring states them)."""

from __future__ import annotations

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.routing import ApproxRadix
from sim.fleet import radix
from sim.fleet.radix import RadixBelief
from tests.chained import Universe, ids


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


def leaf_for(nd, r) -> bool:
    return r in nd.stamps and all(r not in c.stamps for c in nd.children.values())


def leaf_pairs(b: RadixBelief) -> list:
    """Every (node, worker) below the root where no child holds the worker, by a walk."""
    out, stack = [], list(b.root.children.values())
    while stack:
        nd = stack.pop()
        stack.extend(nd.children.values())
        out += [(nd, r) for r in nd.stamps if leaf_for(nd, r)]
    return out


class RuleByRule(RadixBelief):
    """The eviction as the module docstring says it, spelled out: the candidates found by
    walking the whole tree, each checked one child at a time."""

    def _evict(self) -> None:
        heap = [(nd.stamps[r], r, nd.serial, nd) for nd, r in leaf_pairs(self)]
        heapq.heapify(heap)
        while self.total > self.max_blocks and heap:
            _, r, _, nd = heapq.heappop(heap)
            if not leaf_for(nd, r):
                continue
            del nd.stamps[r]
            self.count[r] -= nd.ids.size
            self.total -= nd.ids.size
            parent = nd.parent
            if not nd.children and not nd.stamps and parent is not None:
                del parent.children[int(nd.ids[0])]
            if parent is not None and parent is not self.root and leaf_for(parent, r):
                heapq.heappush(heap, (parent.stamps[r], r, parent.serial, parent))


def test_shared_counts_the_equal_leading_positions_of_chained_runs():
    u = Universe()
    prompts = [u.prompt(c) for c in ([1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 4, 6], [7], [1])]
    for a in prompts:
        for b in prompts:
            m = min(a.size, b.size)
            naive = next((i for i in range(m) if a[i] != b[i]), m)
            assert radix._shared(a, b) == naive


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_shared_at_counts_the_equal_leading_positions_from_an_offset(data):
    """The walks' edge compare (``_shared_at``: no slice, the edge's last id as an int)
    equals the equal leading positions of the prompt from ``pos`` and the edge, counted one
    by one: a prompt longer or shorter than the edge, diverging anywhere or not at all."""
    u = Universe()
    prompt = u.prompt(data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=8)))
    edge_path = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=8))
    pos = data.draw(st.integers(0, prompt.size - 1))
    whole = u.prompt(edge_path)
    start = data.draw(st.integers(0, whole.size - 1))
    node = radix._Node(whole[start:].copy(), None, 1)
    a, b = prompt[pos:], node.ids
    m = min(a.size, b.size)
    naive = next((i for i in range(m) if a[i] != b[i]), m)
    assert radix._shared_at(prompt, prompt.size, pos, node) == naive


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_tree_equals_the_rule_by_rule_eviction_on_random_streams(data):
    """Matches, inserts and evictions over random chained prompts of 3 workers under a small
    budget: every overlap, size and the surviving stamps agree with ``RuleByRule``, and the
    eviction candidates the tree keeps are the walk's."""
    spec = ApproxRadix(max_blocks=data.draw(st.integers(0, 12)), eviction_interval_s=1.0,
                       refresh_every=data.draw(st.sampled_from([1, 2, 8])))
    fast, slow = RadixBelief(3, spec), RuleByRule(3, spec)
    u, now = Universe(), 0.0
    for _ in range(data.draw(st.integers(1, 30))):
        choices = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=6))
        prompt = u.prompt(choices)
        now += data.draw(st.sampled_from([0.0, 0.5, 1.0]))
        if data.draw(st.booleans()):
            r = data.draw(st.integers(0, 2))
            fast.routed(prompt, r, now)
            slow.routed(prompt, r, now)
        else:
            assert fast.overlaps(prompt, now) == slow.overlaps(prompt, now)
        assert fast.sizes() == slow.sizes() and fast.total == slow.total
        assert sorted(fast.leaves) == sorted((nd.serial, r) for nd, r in leaf_pairs(fast))

    def stamps(b):
        out, stack = [], [((), b.root)]
        while stack:
            path, nd = stack.pop()
            out.append((path, sorted(nd.stamps.items())))
            stack += [((*path, *map(int, c.ids)), c) for c in nd.children.values()]
        return sorted(out)

    assert stamps(fast) == stamps(slow)
