"""KV events the caches own (sim/kvcache/events.py): hand-computed streams of the radix cache
(inserts at chunk checkpoints, holes, a unified CPU tier, HiCache loads and background
deletions) and of vLLM's block pools (stock and the Penelope patch); random op streams against
a brute-force model (events are exact: every block reported once, when its state changed, and
the events replayed equal the cache's contents after every operation); the fleet's feed
(emission order across replicas, the time each happened)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.fleet.kvevents import KVEventFeed
from sim.kvcache import CapacityError, RadixKVCache, Tier
from sim.kvcache.blockpool import BlockPool, HolePool
from sim.kvcache.events import BlockRemoved, BlocksDropped, BlockStored, ChainWritten
from tests.chained import ids

BS = 4


def taken(source) -> list[tuple]:
    """The events since the last call, as plain tuples (stored ones with their parent)."""
    out = []
    for _stamp, e in source.take_events():
        name = type(e).__name__
        out.append((name, e.ids.tolist(), e.parent) if name == "BlockStored"
                   else (name, e.ids.tolist()))
    return out


# --- the radix cache, by hand ------------------------------------------------------------------
def test_chunk_checkpoints_report_only_the_blocks_they_add():
    """A prefix inserted again (the next chunk checkpoint, a finish) reports only what was not
    on the GPU, with the block before it; every insert reports the chain it wrote, once."""
    c = RadixKVCache(16, "sglang", block_size=BS)
    c.enable_events()
    c.insert(ids(1, 2, 3))
    assert taken(c) == [("BlockStored", [1, 2, 3], -1), ("ChainWritten", [1, 2, 3])]
    c.insert(ids(1, 2, 3, 4, 5))
    assert taken(c) == [("BlockStored", [4, 5], 3), ("ChainWritten", [1, 2, 3, 4, 5])]
    c.insert(ids(1, 2, 3))
    assert taken(c) == [("ChainWritten", [1, 2, 3])]
    c.insert(ids(1, 2, 9))  # splits [1, 2, 3] after 2: the new leaf hangs below block 2
    assert taken(c) == [("BlockStored", [9], 2), ("ChainWritten", [1, 2, 9])]
    assert taken(c) == []


def test_evictions_and_holes_are_removed_then_refilled():
    # lru+tail+block: the last two blocks of the leaf go, their last copy with them
    c = RadixKVCache(4, "vllm", block_size=BS)
    c.enable_events()
    c.insert(ids(1, 2, 3))
    taken(c)
    c.evict(2)
    assert taken(c) == [("BlockRemoved", [2, 3]), ("BlocksDropped", [2, 3])]
    # penelope: the front of the private history becomes a hole; the insert refills it
    c = RadixKVCache(8, "penelope", block_size=BS)
    c.enable_events()
    c.insert(ids(10, 11, 12, 13))
    taken(c)
    c.evict(2)
    assert taken(c) == [("BlockRemoved", [10, 11]), ("BlocksDropped", [10, 11])]
    c.insert(ids(10, 11, 12, 13))
    assert taken(c) == [("BlockStored", [10, 11], -1), ("ChainWritten", [10, 11, 12, 13])]


def test_a_unified_demotion_is_removed_and_its_load_stored_without_a_parent():
    c = RadixKVCache(4, "sglang", cpu_capacity_blocks=4, tiering="unified", block_size=BS)
    c.enable_events()
    c.insert(ids(1, 2, 3, 4))
    taken(c)
    c.make_room(2)  # node granularity: the whole node moves to the CPU (its copy stays)
    assert taken(c) == [("BlockRemoved", [1, 2, 3, 4])]
    m = c.match(ids(1, 2, 3, 4, 5))
    c.lock(m.node)
    assert c.load(m.node).ok
    assert taken(c) == [("BlockStored", [1, 2, 3, 4], None)]


def test_a_hicache_load_reports_the_device_nodes_it_deletes():
    """write_back, 4 device blocks, 2 host blocks. A = [1, 2] is demoted (backed up at
    eviction), the host is full; C fills the device again. Loading A needs 2 device blocks:
    B = [5, 6] is the LRU device leaf, its backup finds no host room (A is locked), so it is
    deleted: removed from the GPU, dropped entirely, then A is stored behind the root."""
    c = RadixKVCache(4, "sglang", cpu_capacity_blocks=2, tiering="hicache",
                     write_policy="write_back", load_threshold_tokens=0, block_size=BS)
    c.enable_events()
    c.insert(ids(1, 2))
    c.insert(ids(5, 6))
    taken(c)
    c.make_room(2)
    assert taken(c) == [("BlockRemoved", [1, 2])]
    c.insert(ids(8, 9))
    taken(c)
    m = c.match(ids(1, 2, 3))
    assert m.segments == ((0, 2, Tier.CPU),)
    c.lock(m.node)
    assert c.load(m.node).ok
    assert taken(c) == [("BlockRemoved", [5, 6]), ("BlockStored", [1, 2], None),
                        ("BlocksDropped", [5, 6])]


def test_hicache_background_deletions_are_dropped_when_the_cache_reports_them():
    """write_through: inserting C backs it up, which deletes the host-only A to make room;
    the cache reports that deletion at ``background_evictions`` (the engine asks before its
    next batch), and so does its event."""
    c = RadixKVCache(4, "sglang", cpu_capacity_blocks=2, tiering="hicache", block_size=BS)
    c.enable_events()
    c.insert(ids(1, 2))
    c.insert(ids(5, 6))
    taken(c)
    c.make_room(2)  # A's device copy dropped (it was backed up at its insert)
    assert taken(c) == [("BlockRemoved", [1, 2])]
    c.insert(ids(8, 9))
    assert taken(c) == [("BlockStored", [8, 9], -1), ("ChainWritten", [8, 9])]
    assert [x.tolist() for x in c.background_evictions().freed] == [[1, 2]]
    assert taken(c) == [("BlocksDropped", [1, 2])]


def test_events_are_off_until_enabled_and_refused_where_they_cannot_be_exact():
    c = RadixKVCache(8, "sglang", block_size=BS)
    c.insert(ids(1, 2))
    c.evict(2)
    assert c.take_events() == []
    p = BlockPool(4, BS)
    p.admit(0, ids(1, 2), 8, 8)
    assert p.take_events() == []
    with pytest.raises(ValueError, match="versioned cache"):
        RadixKVCache(8, "penelope", block_size=BS, versioned=True).enable_events()
    c.enable_events()
    with pytest.raises(ValueError, match="context edits re-key"):
        c.edit(ids(1), ids(2), ids(0))


def test_stamps_come_from_the_consumers_clock():
    ticks = iter([(0.5, 1), (0.5, 2), (1.5, 3), (1.5, 4)])
    c = RadixKVCache(8, "sglang", block_size=BS)
    c.enable_events(lambda: next(ticks))
    c.insert(ids(1, 2))  # stored, written
    c.evict(2)  # removed, dropped
    assert [s for s, _e in c.take_events()] == [(0.5, 1), (0.5, 2), (1.5, 3), (1.5, 4)]
    d = RadixKVCache(8, "sglang", block_size=BS)
    d.enable_events()  # no clock: the emission order
    d.insert(ids(1, 2))
    assert [s for s, _e in d.take_events()] == [1, 2]


# --- vLLM's block pools, by hand ---------------------------------------------------------------
def test_block_pool_stores_hashed_runs_and_removes_last_copies():
    p = BlockPool(8, BS)
    p.enable_events()
    p.admit(0, ids(1, 2, 3), 12, 12)
    assert taken(p) == [("BlockStored", [1, 2, 3], -1)]
    p.free(0)
    p.admit(1, ids(1, 2, 7), 12, 12)  # hits 1, 2 (the last token is always computed)
    assert taken(p) == [("BlockStored", [7], 2)]


def test_patched_pool_stores_refilled_holes_behind_the_blocks_they_reuse():
    """Penelope patch, 8 blocks, the penelope order. A = 1-4 is freed front first; B (5 blocks)
    pops the 4 unhashed blocks and A's front (id 1: removed). After B is freed, A again (plus
    block 5) reuses 2-4 past the hole at 1, pops B's 9 and 10, and hashes only the hole and
    its new block 5, whose parent is the reused block 4."""
    p = HolePool(8, BS, "penelope")
    p.enable_events()
    p.admit(0, ids(1, 2, 3, 4), 16, 16)
    assert taken(p) == [("BlockStored", [1, 2, 3, 4], -1)]
    p.free(0)
    p.admit(1, ids(9, 10, 11, 12, 13), 20, 20)
    assert taken(p) == [("BlockRemoved", [1]), ("BlockStored", [9, 10, 11, 12, 13], -1)]
    p.free(1)
    assert p.admit(2, ids(1, 2, 3, 4, 5), 20, 20) == 0
    assert taken(p) == [("BlockRemoved", [9, 10]), ("BlockStored", [1], -1),
                        ("BlockStored", [5], 4)]
    assert p.gpu_prefix_blocks(ids(1, 2, 3, 4, 5)) == 5


# --- exact against a brute-force model ------------------------------------------------------
class Replayed:
    """What a consumer that applies the events knows: the GPU set (stored adds, removed
    takes away)."""

    def __init__(self) -> None:
        self.gpu: set[int] = set()

    def apply(self, events) -> dict[str, list]:
        kinds: dict[str, list] = {"stored": [], "removed": [], "written": [], "dropped": []}
        for _stamp, e in events:
            xs = e.ids.tolist()
            if type(e) is BlockStored:
                kinds["stored"].append(e)
                self.gpu.update(xs)
            elif type(e) is BlockRemoved:
                kinds["removed"].append(e)
                self.gpu.difference_update(xs)
            elif type(e) is ChainWritten:
                kinds["written"].append(e)
            else:
                assert type(e) is BlocksDropped
                kinds["dropped"].append(e)
        return kinds


def _flat(events) -> list[int]:
    return [x for e in events for x in e.ids.tolist()]


def _resident(c: RadixKVCache) -> set[int]:
    return set(c.resident_block_ids().tolist()) | set(c.cpu_resident_block_ids().tolist())


def _check_chain(e: BlockStored, prompt: np.ndarray, parent_said: bool = True) -> None:
    """A stored run is a slice of the prompt; its parent the block before it (-1: none), or
    None when not said (a load)."""
    xs = e.ids.tolist()
    k = prompt.tolist().index(xs[0])
    assert prompt[k:k + len(xs)].tolist() == xs
    assert e.parent == ((int(prompt[k - 1]) if k else -1) if parent_said else None)


CACHES = {
    "sglang": dict(policy="sglang"),
    "vllm": dict(policy="vllm"),
    "penelope": dict(policy="penelope"),
    "unified-sglang": dict(policy="sglang", cpu_capacity_blocks=6, tiering="unified"),
    "unified-penelope": dict(policy="penelope", cpu_capacity_blocks=6, tiering="unified"),
    "hicache-write-through": dict(policy="sglang", cpu_capacity_blocks=6, tiering="hicache",
                                  load_threshold_tokens=0),
    "hicache-write-back": dict(policy="sglang", cpu_capacity_blocks=6, tiering="hicache",
                               write_policy="write_back", load_threshold_tokens=0),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), kind=st.sampled_from(sorted(CACHES)), cap=st.integers(4, 12))
def test_radix_events_are_exact(data, kind: str, cap: int) -> None:
    """Random serves (match, lock, room, insert: whole prompts or chunk prefixes), evictions,
    loads and background reports over chained ids. Per operation the stored blocks are exactly
    the GPU's gains and the removed ones its losses, each once; stored runs are prompt slices
    with their parent (loads: none said); each insert writes its chain once; what evict,
    make_room and load drop is exactly what left every tier, and HiCache's deletions during
    inserts are dropped at the next background report; the replayed GPU set is the cache's."""
    c = RadixKVCache(cap, block_size=BS, debug=True, **CACHES[kind])
    c.enable_events()
    model = Replayed()
    universe: dict[tuple, int] = {}
    pending_drops: Counter[int] = Counter()
    for _ in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["serve", "serve", "chunk", "evict", "load",
                                        "background"]))
        choices = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=7))
        prompt = np.asarray([universe.setdefault(tuple(choices[:i + 1]), len(universe))
                             for i in range(len(choices))], dtype=np.int64)
        gpu0, any0 = set(c.resident_block_ids().tolist()), _resident(c)
        inserted = None
        if op in ("serve", "chunk"):
            seq = prompt[:data.draw(st.integers(1, len(prompt)))] if op == "chunk" else prompt
            m = c.match(seq)
            c.lock(m.node)
            missing = len(seq) - m.blocks_in(Tier.GPU)
            if c.make_room(missing).ok:
                c.reserve(missing)
                try:
                    c.insert(seq)
                    inserted = seq
                except CapacityError:
                    pass
                c.release(missing)
            c.unlock(m.node)
        elif op == "evict":
            c.evict(data.draw(st.integers(1, cap)))
        elif op == "load":
            m = c.match(prompt)
            c.lock(m.node)
            c.load(m.node)
            c.unlock(m.node)
        else:
            c.background_evictions()
        gpu1, any1 = set(c.resident_block_ids().tolist()), _resident(c)
        got = model.apply(c.take_events())
        stored, removed = _flat(got["stored"]), _flat(got["removed"])
        assert sorted(stored) == sorted(gpu1 - gpu0), "stored = the GPU's gains, once each"
        assert sorted(removed) == sorted(gpu0 - gpu1), "removed = the GPU's losses, once each"
        assert model.gpu == gpu1
        for e in got["stored"]:
            _check_chain(e, prompt, parent_said=op != "load")
        assert [w.ids.tolist() for w in got["written"]] == (
            [inserted.tolist()] if inserted is not None else [])
        dropped = Counter(_flat(got["dropped"]))
        lost = any0 - any1
        if op == "background":
            assert dropped == pending_drops
            pending_drops = Counter()
        elif op == "evict":
            assert sorted(dropped.elements()) == sorted(lost)
        else:
            # a serve's room and a load's deletions are dropped now; the host copies that a
            # match's or an insert's HiCache backups deleted wait for the background report
            assert set(dropped) <= lost and max(dropped.values(), default=1) == 1
            pending_drops.update(lost - set(dropped))
    c.background_evictions()
    assert Counter(_flat(model.apply(c.take_events())["dropped"])) == pending_drops


@settings(max_examples=60, deadline=None)
@given(data=st.data(), order=st.sampled_from(["vllm", "penelope"]), patched=st.booleans(),
       cap=st.integers(3, 14))
def test_block_pool_events_are_exact(data, order: str, patched: bool, cap: int) -> None:
    """Random admit/extend/free over chained ids, stock and patched pools: the replayed set is
    the pool's cached ids after every call, stored runs are each request's newly hashed
    blocks with the block before them as parent, and an id is removed only when its last
    copy went."""
    pool = (HolePool if patched else BlockPool)(cap, BS, order, debug=True)
    pool.enable_events()
    model = Replayed()
    universe: dict[tuple, int] = {}
    running: dict[int, np.ndarray] = {}
    for rid in range(data.draw(st.integers(1, 25))):
        action = data.draw(st.sampled_from(["admit", "admit", "extend", "free"]))
        before = Counter(pool.cached_ids().tolist())
        evicted = pool.evicted_blocks
        chain = None
        if action == "admit" or not running:
            choices = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=6))
            chain = np.asarray([universe.setdefault(tuple(choices[:i + 1]), len(universe))
                                for i in range(len(choices))], dtype=np.int64)
            n = data.draw(st.integers(1, len(chain) * BS))
            k = data.draw(st.integers(1, n))
            if pool.admit(rid, chain, n, k, full_sequence_must_fit=False) is not None:
                running[rid] = chain
        elif action == "extend":
            r = data.draw(st.sampled_from(sorted(running)))
            chain = running[r]
            room = len(chain) * BS - pool.computed_tokens(r)
            if room > 0:
                pool.extend(r, data.draw(st.integers(1, room)))
        else:
            r = data.draw(st.sampled_from(sorted(running)))
            del running[r]
            pool.free(r)
        after = Counter(pool.cached_ids().tolist())
        got = model.apply(pool.take_events())
        assert model.gpu == set(after)
        stored = Counter(_flat(got["stored"]))
        for e in got["stored"]:
            _check_chain(e, chain)
        # every copy hashed now is stored once (pops come before hashing: all still cached)
        assert stored <= after
        assert sum(after.values()) - sum(before.values()) == (
            sum(stored.values()) - (pool.evicted_blocks - evicted))
        for x in _flat(got["removed"]):
            assert before[x] >= 1 and (after[x] == 0 or stored[x] >= 1)
        assert not got["written"] and not got["dropped"]


# --- the fleet's feed --------------------------------------------------------------------------
def test_the_feed_hands_out_every_replicas_events_in_emission_order_with_their_times():
    """Replica 1 stores at t=1, replica 0 at t=2, then replica 1 evicts at t=2; delivered at
    t=3, each event keeps its replica, its order and the time it happened."""
    env = simpy.Environment()
    caches = [RadixKVCache(8, "sglang", block_size=BS) for _ in range(2)]
    feed = KVEventFeed(env, caches)
    got: list[tuple] = []
    feed.subscribe(lambda r, at, e: got.append((r, at, type(e).__name__, e.ids.tolist())))

    def script():
        yield env.timeout(1)
        caches[1].insert(ids(5))
        yield env.timeout(1)
        caches[0].insert(ids(1))
        caches[1].evict(1)
        yield env.timeout(1)
        feed.deliver()

    env.process(script())
    env.run()
    assert got == [(1, 1, "BlockStored", [5]), (1, 1, "ChainWritten", [5]),
                   (0, 2, "BlockStored", [1]), (0, 2, "ChainWritten", [1]),
                   (1, 2, "BlockRemoved", [5]), (1, 2, "BlocksDropped", [5])]
    feed.deliver()
    assert len(got) == 6


def test_a_cache_records_only_the_kinds_asked_for_and_a_second_call_adds_kinds():
    """Events of kinds nobody asked for are not recorded (radix cache and block pool alike);
    enabling again adds kinds and keeps the first clock; an unknown kind is refused."""
    c = RadixKVCache(8, "sglang", block_size=BS)
    ticks = iter(range(100, 200))
    c.enable_events(lambda: next(ticks), (BlockStored, BlockRemoved))
    c.insert(ids(1, 2))
    c.evict(2)
    assert taken(c) == [("BlockStored", [1, 2], -1), ("BlockRemoved", [1, 2])]
    c.enable_events(kinds=(BlocksDropped,))
    c.insert(ids(3))
    c.evict(1)
    got = c.take_events()
    assert [type(e).__name__ for _s, e in got] == ["BlockStored", "BlockRemoved",
                                                   "BlocksDropped"]
    assert [s for s, _e in got] == [102, 103, 104]  # the first clock, only kept events
    with pytest.raises(ValueError, match="not a KV event type"):
        c.enable_events(kinds=(int,))
    p = BlockPool(2, BS)
    p.enable_events(kinds=(ChainWritten,))  # the pool never writes chains: nothing at all
    p.admit(0, ids(1, 2), 8, 8)
    p.free(0)
    p.admit(1, ids(3, 4), 8, 8)  # evicts 1 and 2
    assert p.take_events() == []
    p.enable_events(kinds=(BlockRemoved,))
    p.free(1)
    p.admit(2, ids(5, 6), 8, 8)
    assert taken(p) == [("BlockRemoved", [4, 3])]  # vLLM frees a request tail first


def test_replica_subscribers_get_each_replicas_events_in_order_and_see_the_same_stream():
    """A replica subscriber receives, per delivery, each replica's events as one list in
    emission order: flattened and merged by stamp, the per-event subscriber's stream."""
    env = simpy.Environment()
    caches = [RadixKVCache(8, "sglang", block_size=BS) for _ in range(3)]
    feed = KVEventFeed(env, caches)
    per_event: list[tuple] = []
    per_replica: list[tuple] = []
    feed.subscribe(lambda r, at, e: per_event.append((r, at, type(e).__name__, e.ids.tolist())),
                   (BlockStored, BlockRemoved))
    feed.subscribe_replicas(
        lambda r, evs: per_replica.append((r, [(s, type(e).__name__, e.ids.tolist())
                                               for s, e in evs])), (BlockStored,))

    def script():
        for step, (r, block) in enumerate([(2, 1), (0, 2), (2, 3), (1, 4), (0, 5), (2, 6)]):
            yield env.timeout(1)
            caches[r].insert(ids(block))
            if step % 2:
                caches[(r + 1) % 3].evict(1)
            if step == 3:
                feed.deliver()
        feed.deliver()

    env.process(script())
    env.run()
    # replica by replica, per delivery; replica 1 has nothing after the first
    assert [r for r, _ in per_replica] == [0, 1, 2, 0, 2]
    for _r, evs in per_replica:
        assert [s for s, *_ in evs] == sorted(s for s, *_ in evs)
    flat = sorted((s, r, name, xs) for r, evs in per_replica for s, name, xs in evs)
    assert [(r, s[0], name, xs) for s, r, name, xs in flat] == per_event
    assert {name for _r, _at, name, _xs in per_event} == {"BlockStored", "BlockRemoved"}
