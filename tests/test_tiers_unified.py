"""Unified two-tier cache (Penelope): golden tests and a stateful test against references.

References used by the stateful test:
- the ONE deletion order, computed by brute force on a deep copy of the cache: delete every
  evictable block through the policy (``tiering.delete``), block by block in order (tail starts
  delete a run from its end). A make_room must delete exactly the first D = need - cpu_free
  blocks of that order and demote the next GPU blocks of it; a load must demote the first GPU
  blocks of it and delete nothing;
- a GPU-only shadow cache with capacity GPU + CPU and the same policy: under block-exact
  policies the set of blocks kept in some tier (and the holes) must equal the shadow's, since
  moves never delete.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from policies import TAIL, EvictionPolicy, get_policy
from sim.kvcache import EvictResult, RadixKVCache, Tier
from tests.chained import Universe, draw_prompt, ids, runs

GPU_CAP, CPU_CAP, SWAP = 6, 6, 2


def admit(cache: RadixKVCache, prompt: np.ndarray):
    """The engine's path for one request: match, lock, load, make room, compute, insert."""
    m = cache.match(prompt)
    cache.lock(m.node)
    ld = cache.load(m.node)
    assert ld.ok
    need = m.hole_blocks + len(prompt) - m.matched_blocks
    r = cache.make_room(need)
    assert r.ok
    cache.reserve(need)
    cache.release(need)
    ins = cache.insert(prompt)
    cache.unlock(m.node)
    return m, ld, r, ins


def tiers_of(cache: RadixKVCache) -> dict[int, Tier]:
    out: dict[int, Tier] = {}
    for nd in cache.iter_nodes():
        for b in nd.ids.tolist():
            assert b not in out, f"block {b} in two nodes"
            out[b] = nd.tier
    return out


# ---------------------------------------------------------------------------- golden tests
def test_gpu_pressure_demotes_the_private_head_first() -> None:
    cache = RadixKVCache(6, "penelope", cpu_capacity_blocks=6, swap_buffer_blocks=2, debug=True)
    admit(cache, ids(1, 2, 3, 4, 5, 6))
    _, _, r, _ = admit(cache, ids(11, 12, 13, 14))
    assert r.ok and r.deleted_blocks == 0 and r.freed == []
    assert runs(r.demoted) == [[1, 2, 3, 4]] and r.demoted_blocks == r.freed_blocks == 4
    assert cache.backup_pending() == 4 and cache.backup_pending() == 0
    assert cache.cpu_resident_block_ids().tolist() == [1, 2, 3, 4]
    assert cache.resident_block_ids().tolist() == [5, 6, 11, 12, 13, 14]


def test_swap_buffer_exchange_when_both_tiers_are_full() -> None:
    cache = RadixKVCache(6, "penelope", cpu_capacity_blocks=6, swap_buffer_blocks=2, debug=True)
    admit(cache, ids(1, 2, 3, 4, 5, 6))
    admit(cache, ids(11, 12, 13, 14, 15, 16))  # A -> CPU whole: both tiers now full
    assert (cache.free_blocks, cache.cpu_free_blocks) == (0, 0)
    m = cache.match(ids(1, 2, 3, 4, 5, 6, 7))
    assert m.hit_blocks == 0 and m.segments == ((0, 6, Tier.CPU),) and m.cpu_blocks == 6
    cache.lock(m.node)
    ld = cache.load(m.node)
    assert ld.ok and runs(ld.loaded) == [[1, 2, 3, 4, 5, 6]] and ld.loaded_blocks == 6
    assert runs(ld.demoted) == [[11, 12, 13, 14, 15, 16]] and ld.demoted_blocks == 6
    assert ld.deleted_blocks == 0
    assert (ld.swap_blocks, ld.swap_chunks) == (6, 3)  # 6 loads through a 2-block buffer
    assert cache.backup_pending() == 12  # 6 demoted by admit B, 6 by this load
    assert cache.resident_block_ids().tolist() == [1, 2, 3, 4, 5, 6]
    assert cache.cpu_resident_block_ids().tolist() == [11, 12, 13, 14, 15, 16]


def test_swap_buffer_partial_free_cpu_room_then_cross_tier_deletion() -> None:
    cache = RadixKVCache(6, "penelope", cpu_capacity_blocks=6, swap_buffer_blocks=2, debug=True)
    admit(cache, ids(1, 2, 3, 4, 5, 6))
    admit(cache, ids(11, 12, 13, 14))  # A's head [1..4] -> CPU; cpu_free 2
    m = cache.match(ids(1, 2, 3, 4, 5, 6))
    assert m.hit_blocks == 0 and m.segments == ((0, 4, Tier.CPU), (4, 6, Tier.GPU))
    cache.lock(m.node)
    ld = cache.load(m.node)
    # 4 loads, no free GPU: 2 pair with the 2 free CPU blocks, 2 go through the buffer
    assert runs(ld.loaded) == [[1, 2, 3, 4]] and runs(ld.demoted) == [[11, 12, 13, 14]]
    assert (ld.swap_blocks, ld.swap_chunks, ld.deleted_blocks) == (2, 1, 0)
    cache.unlock(m.node)
    # make_room(3): union free 2 -> delete 1 block in the one order (B is older: its head,
    # on the CPU), then demote the next 3 GPU blocks of the order (B's CPU rest is passed
    # over; A's private head [1,2,3])
    r = cache.make_room(3)
    assert r.ok and runs(r.freed) == [[11]] and r.deleted_blocks == 1 and r.holes_made == 1
    assert runs(r.demoted) == [[1, 2, 3]] and r.freed_blocks == 3
    assert cache.resident_block_ids().tolist() == [4, 5, 6]
    assert cache.cpu_resident_block_ids().tolist() == [1, 2, 3, 12, 13, 14]
    assert (cache.cpu_free_blocks, cache.hole_blocks) == (0, 1)


def test_load_fails_cleanly_when_everything_is_locked() -> None:
    cache = RadixKVCache(4, "penelope", cpu_capacity_blocks=4, swap_buffer_blocks=2, debug=True)
    admit(cache, ids(1, 2, 3, 4))
    _, _, _, ins = admit(cache, ids(11, 12, 13, 14))
    cache.lock(ins.node)  # B running: nothing on the GPU may move
    m = cache.match(ids(1, 2, 3, 4))
    cache.lock(m.node)
    before = cache.dump()
    ld = cache.load(m.node)
    assert not ld.ok and ld.loaded_blocks == 0 and cache.dump() == before


def test_zero_swap_buffer_refuses_a_full_exchange() -> None:
    cache = RadixKVCache(2, "penelope", cpu_capacity_blocks=2, swap_buffer_blocks=0, debug=True)
    admit(cache, ids(1, 2))
    admit(cache, ids(11, 12))
    m = cache.match(ids(1, 2))
    cache.lock(m.node)
    assert not cache.load(m.node).ok


def test_tail_policies_demote_the_tail() -> None:
    cache = RadixKVCache(6, "vllm", cpu_capacity_blocks=6, debug=True)
    admit(cache, ids(1, 2, 3, 4, 5, 6))
    _, _, r, _ = admit(cache, ids(11, 12))
    assert runs(r.demoted) == [[5, 6]]
    m = cache.match(ids(1, 2, 3, 4, 5, 6))
    assert m.hit_blocks == 4 and m.segments == ((0, 4, Tier.GPU), (4, 6, Tier.CPU))


def test_insert_through_a_cpu_node_promotes_it() -> None:
    cache = RadixKVCache(4, "penelope", cpu_capacity_blocks=4, debug=True)
    admit(cache, ids(1, 2, 3))
    cache.make_room(4)  # all of it to the CPU
    assert cache.cpu_blocks == 3 and cache.gpu_blocks == 0
    ins = cache.insert(ids(1, 2, 3, 4))  # the caller computed the blocks again
    assert (ins.new_blocks, ins.filled_blocks, ins.existing_blocks) == (1, 3, 0)
    assert (cache.gpu_blocks, cache.cpu_blocks) == (4, 0)


def test_gpu_only_is_unchanged_by_the_tier_options() -> None:
    for tiering in ("unified", "hicache"):
        cache = RadixKVCache(4, "sglang", tiering=tiering, debug=True)
        admit(cache, ids(1, 2, 3))
        r = cache.make_room(4)
        assert runs(r.freed) == [[1, 2, 3]] and r.demoted_blocks == 0
        assert r.deleted_blocks == r.freed_blocks == 3 and cache.backup_pending() == 0
        m = cache.match(ids(1))
        assert cache.load(m.node).loaded_blocks == 0


# ---------------------------------------------------------------------------- stateful
MORE_BLOCKS = st.lists(st.sampled_from([0, 0, 0, 1, 2]), max_size=5)


def deletion_order(cache: RadixKVCache) -> list[tuple[int, Tier]]:
    """Every evictable block of the cache in the one deletion order, with its tier."""
    clone = copy.deepcopy(cache)
    clone.debug = False
    tier = tiers_of(clone)
    result = EvictResult(ok=True)
    clone.tiering.delete(10**9, result)
    tail = cache.policy.start is TAIL
    out = []
    for run in result.freed:
        blocks = run.tolist()
        out += [(b, tier[b]) for b in (reversed(blocks) if tail else blocks)]
    return out


def first_gpu(order: list[tuple[int, Tier]], k: int) -> set[int]:
    """The first k GPU blocks of a deletion order."""
    return set([b for b, t in order if t is Tier.GPU][:k])


class UnifiedMachine(RuleBasedStateMachine):
    policy: EvictionPolicy = get_policy("penelope")

    @initialize()
    def setup(self) -> None:
        self.u = Universe()
        kw = {"cpu_capacity_blocks": CPU_CAP, "swap_buffer_blocks": SWAP}
        self.cache = RadixKVCache(GPU_CAP, self.policy, debug=True, **kw)
        self.exact = self.policy.block_exact
        self.shadow = RadixKVCache(GPU_CAP + CPU_CAP, self.policy) if self.exact else None
        self.held: list[tuple[object, object, dict[int, Tier]]] = []
        self.history: list[list[int]] = []

    def prompt(self, data) -> np.ndarray:
        return draw_prompt(data, self.u, self.history, MORE_BLOCKS, 9)

    def path_tiers(self, node) -> dict[int, Tier]:
        out = {}
        while node is not self.cache.root:
            out.update((b, node.tier) for b in node.ids.tolist())
            node = node.parent
        return out

    def checked_make_room(self, n: int):
        cache = self.cache
        need = n - cache.free_blocks
        cpu_free = cache.cpu_free_blocks
        order = deletion_order(cache) if self.exact and need > 0 else None
        r = cache.make_room(n)
        if need <= 0:
            assert r.ok and r.freed_blocks == 0
            return r
        if not r.ok:
            assert r.freed_blocks == r.deleted_blocks == 0
            return r
        assert cache.free_blocks >= n
        delete = max(0, need - cpu_free)
        if self.exact:
            assert r.deleted_blocks == delete  # moves caused no deletion
            assert set(r.freed_ids().tolist()) == {b for b, _ in order[:delete]}
            gpu_deleted = sum(1 for _, t in order[:delete] if t is Tier.GPU)
            demoted = set(np.concatenate(r.demoted).tolist()) if r.demoted else set()
            assert demoted == first_gpu(order[delete:], need - gpu_deleted)
            s = self.shadow.make_room(n)
            assert s.ok and sorted(s.freed_ids().tolist()) == sorted(r.freed_ids().tolist())
        else:
            assert r.deleted_blocks >= delete
        return r

    @rule(data=st.data(), keep=st.sampled_from([False, False, True]), squeeze=st.booleans())
    def request(self, data, keep, squeeze) -> None:
        """One request; ``squeeze`` holds every free GPU block during the load (a full GPU)."""
        cache = self.cache
        prompt = self.prompt(data)
        m = cache.match(prompt)
        cache.lock(m.node)
        held = cache.free_blocks if squeeze else 0
        cache.reserve(held)
        sm = None
        if self.shadow is not None:
            sm = self.shadow.match(prompt)
            self.shadow.lock(sm.node)
        if self.shadow is not None:
            self.shadow.reserve(held)
        g, c, load = max(cache.free_blocks, 0), cache.cpu_free_blocks, m.cpu_blocks
        kept = set(cache.resident_block_ids().tolist() + cache.cpu_resident_block_ids().tolist())
        order = deletion_order(cache) if self.exact else None
        ld = cache.load(m.node)
        cache.release(held)
        if self.shadow is not None:
            self.shadow.release(held)
        need = load - min(load, g)
        swap = max(0, need - c - min(load, g))
        if ld.ok:
            assert ld.loaded_blocks == load and ld.deleted_blocks == 0
            assert ld.demoted_blocks >= need and ld.swap_blocks == swap
            assert ld.swap_chunks == -(-swap // SWAP)
            assert all(t is not Tier.CPU for t in self.path_tiers(m.node).values())
            if self.exact:
                assert ld.demoted_blocks == need
                demoted = set(np.concatenate(ld.demoted).tolist()) if ld.demoted else set()
                assert demoted == first_gpu(order, need)
            after = cache.resident_block_ids().tolist() + cache.cpu_resident_block_ids().tolist()
            assert set(after) == kept
            n = m.hole_blocks + len(prompt) - m.matched_blocks
            if self.checked_make_room(n).ok:
                cache.reserve(n)
                cache.release(n)
                ins = cache.insert(prompt)
                assert ins.new_blocks + ins.filled_blocks == n
                if self.shadow is not None:
                    self.shadow.reserve(n)
                    self.shadow.release(n)
                    sins = self.shadow.insert(prompt)
                    if keep:
                        self.shadow.lock(sins.node)
                if keep:
                    cache.lock(ins.node)
                    self.held.append((ins.node, sins.node if sm else None,
                                      self.path_tiers(ins.node)))
        cache.unlock(m.node)
        if sm is not None:
            self.shadow.unlock(sm.node)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def finish(self, data) -> None:
        node, snode, _ = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.cache.unlock(node)
        if snode is not None:
            self.shadow.unlock(snode)

    @rule(data=st.data(), touch=st.booleans())
    def match_only(self, data, touch) -> None:
        prompt = self.prompt(data)
        m = self.cache.match(prompt, touch=touch)
        if self.shadow is not None:
            sm = self.shadow.match(prompt, touch=touch)
            assert sm.matched_blocks == m.matched_blocks
            assert sm.hit_blocks >= m.hit_blocks

    @rule(n=st.integers(1, GPU_CAP - 2))
    def pressure(self, n) -> None:
        self.checked_make_room(n)

    @rule(n=st.integers(1, 4))
    def reserve(self, n) -> None:
        if n <= self.cache.free_blocks:
            self.cache.reserve(n)
            if self.shadow is not None:
                self.shadow.reserve(n)

    @precondition(lambda self: self.cache.reserved_blocks > 0)
    @rule()
    def release(self) -> None:
        n = self.cache.reserved_blocks
        self.cache.release(n)
        if self.shadow is not None:
            self.shadow.release(n)

    @invariant()
    def tiers_hold(self) -> None:
        cache = self.cache
        cache.check()  # counters == recount, capacities, leaf set
        tier = tiers_of(cache)  # one node (hence one tier) per block
        gpu = cache.resident_block_ids().tolist()
        cpu = cache.cpu_resident_block_ids().tolist()
        assert len(gpu) == len(set(gpu)) and len(cpu) == len(set(cpu))
        assert not set(gpu) & set(cpu)
        assert cache.gpu_blocks + cache.reserved_blocks <= GPU_CAP
        assert cache.cpu_blocks <= CPU_CAP
        for node, _, want in self.held:  # locked blocks neither deleted nor moved
            assert node.parent is not None
            assert {b: tier[b] for b in want} == want
        if self.shadow is not None:
            assert sorted(gpu + cpu) == self.shadow.resident_block_ids().tolist()
            assert cache.hole_blocks == self.shadow.hole_blocks


SETTINGS = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize(
    "name", ["penelope", "vllm", "sglang", "lru+private-head+node", "lru+leaf-head+block"]
)
@pytest.mark.pure_path("its deletion order is read off a deep copy; a compiled cache is not copied")
def test_unified_invariants_and_one_deletion_order(name: str) -> None:
    policy = get_policy(name)
    machine = type(f"Unified_{policy.spec}", (UnifiedMachine,), {"policy": policy})
    machine.TestCase.settings = SETTINGS
    machine.TestCase().runTest()


def test_node_granularity_demotes_whole_nodes_unless_the_cpu_room_is_smaller() -> None:
    roomy = RadixKVCache(6, "sglang", cpu_capacity_blocks=8, debug=True)
    admit(roomy, ids(1, 2, 3, 4, 5, 6))
    r = roomy.make_room(1)
    assert runs(r.demoted) == [[1, 2, 3, 4, 5, 6]] and r.freed_blocks == 6  # SGLang overshoot
    tight = RadixKVCache(6, "sglang", cpu_capacity_blocks=2, debug=True)
    admit(tight, ids(1, 2, 3, 4, 5, 6))
    r = tight.make_room(1)
    assert runs(r.demoted) == [[5, 6]] and r.deleted_blocks == 0  # only what fits moves
    assert tight.resident_block_ids().tolist() == [1, 2, 3, 4]


def test_evict_under_a_cpu_tier_frees_gpu_blocks_by_demotion() -> None:
    cache = RadixKVCache(6, "penelope", cpu_capacity_blocks=2, debug=True)
    admit(cache, ids(1, 2, 3, 4, 5, 6))
    r = cache.evict(4)  # 2 fit on the CPU, 2 must be deleted first: the order's first 2
    assert r.ok and runs(r.freed) == [[1, 2]] and runs(r.demoted) == [[3, 4]]
    assert (r.freed_blocks, r.deleted_blocks, r.demoted_blocks) == (4, 2, 2)
    assert cache.cpu_resident_block_ids().tolist() == [3, 4]
    assert not cache.evict(10).ok
