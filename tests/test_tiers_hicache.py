"""SGLang HiCache baseline tier: golden tests and a stateful invariant test.

The stateful test checks after every step the debug recount (counters, capacities, backed-up
nodes and device nodes each prefix-closed, host-only nodes keep their host copy) and, for
device eviction at node granularity under write-through, compares every ``make_room`` with a
brute-force SGLang loop on a deep copy: rescan all nodes for device leaves (device, unlocked,
no device child), take the LRU one, demote it if backed up, delete it otherwise.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from policies import NODE, PolicyError
from sim.kvcache import RadixKVCache, Tier
from tests.chained import Universe, draw_prompt, ids, runs


def hicache(gpu: int, cpu: int, **kw) -> RadixKVCache:
    kw.setdefault("debug", True)
    return RadixKVCache(gpu, kw.pop("policy", "sglang"), cpu_capacity_blocks=cpu,
                        tiering="hicache", **kw)


def put(cache: RadixKVCache, prompt: np.ndarray) -> None:
    """Compute and insert a prompt (room made by device eviction), no hit counted."""
    m = cache.match(prompt, touch=False)
    cache.lock(m.node)
    need = len(prompt) - m.matched_blocks
    assert cache.make_room(need).ok
    cache.reserve(need)
    cache.release(need)
    cache.insert(prompt)
    cache.unlock(m.node)


# ---------------------------------------------------------------------------- golden tests
def test_write_through_backs_up_on_the_first_hit_insert_included() -> None:
    cache = hicache(8, 8)
    put(cache, ids(1, 2, 3))  # SGLang's _insert_helper counts a hit on the new node
    assert cache.cpu_resident_block_ids().tolist() == [1, 2, 3]
    assert cache.backup_pending() == 3 and cache.backup_pending() == 0
    m = cache.match(ids(1, 2, 3))
    assert m.hit_blocks == 3 and m.segments == ((0, 3, Tier.GPU),)
    assert cache.backup_pending() == 0  # already backed up: no second copy


def test_write_through_selective_waits_for_the_second_hit() -> None:
    cache = hicache(8, 8, write_policy="write_through_selective")
    put(cache, ids(1, 2, 3))  # first hit (the insert)
    assert cache.cpu_blocks == 0
    cache.match(ids(1, 2))  # splits: [1, 2] hit twice, [3] once
    assert cache.cpu_resident_block_ids().tolist() == [1, 2] and cache.backup_pending() == 2


def test_device_eviction_demotes_backed_up_and_deletes_the_rest() -> None:
    cache = hicache(6, 8, write_policy="write_through_selective")
    put(cache, ids(1, 2, 3))
    cache.match(ids(1, 2, 3))  # second hit: backed up
    put(cache, ids(11, 12, 13))  # one hit: no host copy
    r = cache.make_room(6)
    assert r.ok and r.freed_blocks == 6
    assert runs(r.demoted) == [[1, 2, 3]] and r.demoted_blocks == 3  # LRU first
    assert runs(r.freed) == [[11, 12, 13]] and r.deleted_blocks == 3
    assert cache.backup_pending() == 3  # the write-through copy only; demotion copies nothing
    m = cache.match(ids(1, 2, 3, 4))
    assert m.hit_blocks == 0 and m.segments == ((0, 3, Tier.CPU),) and m.cpu_blocks == 3
    assert cache.match(ids(11)).matched_blocks == 0


def test_load_back_keeps_the_host_copy() -> None:
    cache = hicache(6, 8)
    put(cache, ids(1, 2, 3, 4))
    cache.match(ids(1, 2, 3, 4))
    assert cache.make_room(6).ok  # demote all four
    put(cache, ids(11, 12))  # GPU has 4 free after this
    m = cache.match(ids(1, 2, 3, 4, 5))
    cache.lock(m.node)
    ld = cache.load(m.node)
    assert ld.ok and ld.loaded_blocks == 4 and runs(ld.loaded) == [[1, 2, 3, 4]]
    assert ld.demoted_blocks == ld.deleted_blocks == ld.swap_blocks == 0
    assert cache.gpu_blocks == 6 and cache.cpu_blocks == 6  # host copies kept (B backed too)
    cache.unlock(m.node)
    assert cache.match(ids(1, 2, 3, 4)).hit_blocks == 4


def test_load_makes_room_by_device_eviction_all_or_nothing() -> None:
    cache = hicache(4, 8)
    put(cache, ids(1, 2, 3, 4))
    cache.match(ids(1, 2, 3, 4))
    assert cache.make_room(4).ok  # A demoted
    put(cache, ids(11, 12, 13, 14))  # B on the device, not backed up
    m = cache.match(ids(1, 2, 3, 4))
    cache.lock(m.node)
    ld = cache.load(m.node)
    assert ld.ok and ld.loaded_blocks == 4 and runs(ld.demoted) == [[11, 12, 13, 14]]
    assert ld.deleted_blocks == 0  # B was backed up at its insert
    m2 = cache.match(ids(11, 12, 13, 14))
    assert m2.hit_blocks == 0 and m2.cpu_blocks == 4
    cache.lock(m2.node)  # everything on the device is locked now: no room for B
    before = cache.dump()
    assert not cache.load(m2.node).ok and cache.dump() == before


def test_load_threshold_skips_tiny_host_hits() -> None:
    cache = hicache(8, 8, block_size=4, load_threshold_tokens=10)
    put(cache, ids(1, 2))
    cache.match(ids(1, 2))
    cache.make_room(8)
    m = cache.match(ids(1, 2))  # 2 blocks = 8 tokens < 10
    cache.lock(m.node)
    ld = cache.load(m.node)
    assert ld.ok and ld.skipped and ld.loaded_blocks == 0 and cache.gpu_blocks == 0
    cache.unlock(m.node)
    put(cache, ids(1, 2, 3))  # promote [1, 2] (host copy kept), new [3]
    cache.match(ids(1, 2, 3))
    cache.make_room(8)
    m = cache.match(ids(1, 2, 3))  # 12 tokens >= 10
    cache.lock(m.node)
    ld = cache.load(m.node)
    assert ld.ok and not ld.skipped and ld.loaded_blocks == 3


def test_host_eviction_is_lru_over_host_only_leaves() -> None:
    cache = hicache(4, 4)
    put(cache, ids(1, 2))  # host: [1, 2]
    put(cache, ids(11, 12))  # host: [1, 2, 11, 12] (full)
    assert cache.make_room(4).ok  # both demoted: host-only now
    cache.match(ids(1, 2), touch=True)  # A recently used on the host
    put(cache, ids(21, 22))  # backing up C needs 2 host blocks: LRU host-only leaf B goes
    assert cache.cpu_resident_block_ids().tolist() == [1, 2, 21, 22]
    assert cache.match(ids(11, 12)).matched_blocks == 0


def test_write_back_copies_only_at_eviction() -> None:
    cache = hicache(4, 4, write_policy="write_back")
    put(cache, ids(1, 2))
    cache.match(ids(1, 2))
    assert cache.cpu_blocks == 0
    r = cache.make_room(4)
    assert runs(r.demoted) == [[1, 2]] and r.deleted_blocks == 0
    assert cache.backup_pending() == 2


def test_backups_form_a_prefix_and_policy_is_checked() -> None:
    cache = hicache(8, 2)
    put(cache, ids(1, 2, 3, 4))
    cache.match(ids(1, 2))  # splits; only [1, 2] hit
    cache.match(ids(1, 2, 3, 4))  # [3, 4] would need 2 more host blocks: none free
    assert cache.cpu_resident_block_ids().tolist() == [1, 2]
    with pytest.raises(PolicyError):
        hicache(4, 4, policy="penelope")


# ---------------------------------------------------------------------------- stateful
MORE_BLOCKS = st.lists(st.sampled_from([0, 0, 0, 1, 2]), max_size=5)


def reference_device_evict(cache: RadixKVCache, need: int) -> tuple[set[int], set[int]]:
    """Brute-force SGLang device eviction on a copy: (demoted ids, deleted ids)."""
    clone = copy.deepcopy(cache)
    key = clone.policy.sort_key
    demoted: set[int] = set()
    deleted: set[int] = set()
    while len(demoted) + len(deleted) < need:
        leaves = [
            nd for nd in clone.iter_nodes()
            if nd.tier is Tier.GPU and nd.lock == 0
            and all(c.tier is not Tier.GPU for c in nd.children.values())
        ]
        if not leaves:
            break
        x = min(leaves, key=key)
        if x.host:
            x.tier = Tier.CPU
            demoted.update(x.ids.tolist())
        else:
            assert not x.children
            del x.parent.children[int(x.ids[0])]
            deleted.update(x.ids.tolist())
    return demoted, deleted


GPU_CAP, CPU_CAP = 6, 4


class HiCacheMachine(RuleBasedStateMachine):
    policy = "sglang"
    write_policy = "write_through"

    @initialize()
    def setup(self) -> None:
        self.u = Universe()
        self.cache = hicache(GPU_CAP, CPU_CAP, policy=self.policy, write_policy=self.write_policy)
        self.reference = (self.cache.policy.granularity is NODE
                          and self.write_policy != "write_back")
        self.held: list = []
        self.history: list[list[int]] = []

    def prompt(self, data) -> np.ndarray:
        return draw_prompt(data, self.u, self.history, MORE_BLOCKS, 9)

    def checked_make_room(self, n: int):
        cache = self.cache
        need = n - cache.free_blocks
        backed = set(cache.cpu_resident_block_ids().tolist())
        want = reference_device_evict(cache, need) if self.reference and need > 0 else None
        r = cache.make_room(n)
        if need <= 0 or not r.ok:
            assert r.freed_blocks == 0
            return r
        demoted = set(np.concatenate(r.demoted).tolist()) if r.demoted else set()
        deleted = set(r.freed_ids().tolist())
        host = set(cache.cpu_resident_block_ids().tolist())
        assert demoted - deleted <= host and not deleted & host  # (write_back may host-evict)
        assert r.freed_blocks >= need and r.deleted_blocks == len(deleted)
        assert r.demoted_blocks == len(demoted)
        if self.write_policy != "write_back":
            assert demoted <= backed and not deleted & backed  # demote iff backed up
        if want is not None:
            assert (demoted, deleted) == want
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
        segs = m.segments
        assert all(t is not Tier.NONE for _, _, t in segs)
        assert [t for _, _, t in segs] in ([], [Tier.GPU], [Tier.CPU], [Tier.GPU, Tier.CPU])
        cpu_before = cache.cpu_blocks
        ld = cache.load(m.node)
        cache.release(held)
        if ld.ok:
            if self.write_policy != "write_back":  # write_back may copy while making room
                assert cache.cpu_blocks <= cpu_before  # host copies kept (or host-evicted)
            loaded = 0 if ld.skipped else m.cpu_blocks
            assert ld.loaded_blocks == loaded
            n = len(prompt) - m.matched_blocks + (m.cpu_blocks if ld.skipped else 0)
            if self.checked_make_room(n).ok:
                cache.reserve(n)
                cache.release(n)
                ins = cache.insert(prompt)
                if keep:
                    cache.lock(ins.node)
                    self.held.append(ins.node)
        else:
            assert ld.loaded_blocks == 0
        cache.unlock(m.node)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def finish(self, data) -> None:
        self.cache.unlock(self.held.pop(data.draw(st.integers(0, len(self.held) - 1))))

    @rule(data=st.data(), touch=st.booleans())
    def match_only(self, data, touch) -> None:
        self.cache.match(self.prompt(data), touch=touch)

    @rule(n=st.integers(1, GPU_CAP - 2))
    def pressure(self, n) -> None:
        self.checked_make_room(n)

    @rule(n=st.integers(1, 3))
    def reserve(self, n) -> None:
        if n <= self.cache.free_blocks:
            self.cache.reserve(n)

    @precondition(lambda self: self.cache.reserved_blocks > 0)
    @rule()
    def release(self) -> None:
        self.cache.release(self.cache.reserved_blocks)

    @invariant()
    def invariants_hold(self) -> None:
        cache = self.cache
        cache.check()  # includes both prefix invariants and the capacities
        assert cache.gpu_blocks + cache.reserved_blocks <= GPU_CAP
        assert cache.cpu_blocks <= CPU_CAP
        for node in self.held:
            assert node.parent is not None and node.tier is Tier.GPU


SETTINGS = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize(
    ("policy", "write_policy"),
    [
        ("sglang", "write_through"),
        ("sglang", "write_through_selective"),
        ("sglang", "write_back"),
        ("vllm", "write_through"),
    ],
)
@pytest.mark.pure_path("its reference evicts on a deep copy; a compiled cache is not copied")
def test_hicache_invariants(policy: str, write_policy: str) -> None:
    machine = type(
        f"HiCache_{policy}_{write_policy}",
        (HiCacheMachine,),
        {"policy": policy, "write_policy": write_policy},
    )
    machine.TestCase.settings = SETTINGS
    machine.TestCase().runTest()


def test_block_granularity_demotes_the_tail_blocks() -> None:
    cache = hicache(6, 8, policy="vllm")
    put(cache, ids(1, 2, 3, 4, 5, 6))
    r = cache.make_room(2)
    assert runs(r.demoted) == [[5, 6]] and r.freed_blocks == 2
    m = cache.match(ids(1, 2, 3, 4, 5, 6))
    assert m.hit_blocks == 4 and m.segments == ((0, 4, Tier.GPU), (4, 6, Tier.CPU))
