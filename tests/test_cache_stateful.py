"""Stateful test: RadixKVCache against a brute-force per-block reference model.

The model keeps, per cached block id: its state (GPU / NONE), last-access stamp, lock count,
and whether a node starts at it (``boundary``). It has no tree: children are found by scanning
all blocks, a node is "a boundary block and its non-boundary successors", and every eviction
rescans all blocks for the least recently used evictable leaf. It implements the documented
semantics directly:

- match: walk while the ids are cached; stamp the matched blocks and the rest of the node the
  match ends in (SGLang stamps the whole node, then splits); a node boundary after the match;
- insert: the same walk (through holes), refill holes, new blocks get the next tick;
- evict: repeat {the unlocked childless GPU block with the oldest stamp names the victim
  history; free per start position and granularity}; NONE blocks without cached children and
  unlocked leave the model.

After every step the cache must equal the model: counters, resident ids, node structure
(boundaries, tiers, stamps, locks, positions), and every operation's result.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from policies import LEAF_HEAD, NODE, PRIVATE_HEAD, TAIL, EvictionPolicy
from sim.kvcache import CapacityError, Node, RadixKVCache, Tier
from tests.chained import Universe, draw_prompt

GPU, NONE = "GPU", "NONE"
CAPACITY = 24


class Model:
    def __init__(self, policy: EvictionPolicy, capacity: int, universe: Universe) -> None:
        self.policy = policy
        self.capacity = capacity
        self.u = universe
        self.state: dict[int, str] = {}
        self.stamp: dict[int, int] = {}
        self.lock: dict[int, int] = {}
        self.boundary: set[int] = set()
        self.clock = 0
        self.reserved = 0

    # ---------------------------------------------------------------- helpers
    def children(self, b: int | None) -> list[int]:
        return [c for c in self.state if self.u.parent[c] == b]

    def node_of(self, b: int) -> list[int]:
        """Blocks of the node containing b, from its first block to b's node end."""
        first = b
        while first not in self.boundary:
            first = self.u.parent[first]
        run = [first]
        while True:
            nxt = [c for c in self.children(run[-1]) if c not in self.boundary]
            if not nxt:
                return run
            run.append(nxt[0])

    def gpu(self) -> int:
        return sum(1 for s in self.state.values() if s == GPU)

    def evictable(self) -> int:
        return sum(1 for b, s in self.state.items() if s == GPU and self.lock[b] == 0)

    def free(self) -> int:
        return self.capacity - self.gpu() - self.reserved

    def walk(self, ids: np.ndarray, through_holes: bool) -> int:
        k = 0
        for b in ids.tolist():
            if b not in self.state or (self.state[b] == NONE and not through_holes):
                break
            k += 1
        return k

    def stamp_path(self, path: list[int], t: int) -> None:
        """Stamp the path and (node semantics) the rest of the node it ends in; then a
        boundary after it."""
        for b in path:
            self.stamp[b] = t
        if path and self.policy.block_exact:
            self.split_after(path[-1])
        elif path:
            rest = [c for c in self.node_of(path[-1]) if self.u.pos[c] > self.u.pos[path[-1]]]
            for b in rest:
                self.stamp[b] = t
            self.split_after(path[-1])

    def split_after(self, b: int) -> None:
        self.boundary.update(self.children(b))

    def prune(self) -> None:
        while True:
            dead = [
                b
                for b, s in self.state.items()
                if s == NONE and self.lock[b] == 0 and not self.children(b)
            ]
            if not dead:
                return
            for b in dead:
                del self.state[b], self.stamp[b], self.lock[b]
                self.boundary.discard(b)

    # ---------------------------------------------------------------- operations
    def match(self, ids: np.ndarray, touch: bool):
        k = self.walk(ids, self.policy.makes_holes)
        path = ids[:k].tolist()
        if touch:
            self.clock += 1
            self.stamp_path(path, self.clock)
        elif path:
            self.split_after(path[-1])
        hit = 0
        while hit < k and self.state[path[hit]] == GPU:
            hit += 1
        segments: list[tuple[int, int, Tier]] = []
        for i, b in enumerate(path):
            tier = Tier.GPU if self.state[b] == GPU else Tier.NONE
            if segments and segments[-1][2] == tier:
                segments[-1] = (segments[-1][0], i + 1, tier)
            else:
                segments.append((i, i + 1, tier))
        return k, hit, tuple(segments), (path[-1] if path else None)

    def added(self, ids: np.ndarray) -> int:
        k = self.walk(ids, True)
        return sum(1 for b in ids[:k].tolist() if self.state[b] == NONE) + len(ids) - k

    def insert(self, ids: np.ndarray):
        k = self.walk(ids, True)
        path = ids[:k].tolist()
        filled = sum(1 for b in path if self.state[b] == NONE)
        new = ids[k:].tolist()
        if self.gpu() + filled + len(new) > self.capacity:
            return None
        self.clock += 1
        self.stamp_path(path, self.clock)
        for b in path:
            self.state[b] = GPU
        if new:
            if not self.policy.block_exact:
                self.clock += 1  # SGLang: a new node gets a newer tick
            self.boundary.add(new[0])
            for b in new:
                self.state[b], self.stamp[b], self.lock[b] = GPU, self.clock, 0
        return len(new), filled, k - filled

    def lock_path(self, handle: int | None, delta: int) -> None:
        b = handle
        while b is not None:
            self.lock[b] += delta
            b = self.u.parent[b]
        self.prune()

    def block_exact_victims(self, leaf: int, need: int) -> list[int]:
        """Blocks freed from the victim history without looking at node boundaries."""
        if self.policy.start is TAIL:
            return [leaf]  # one block from the tail; the loop picks the next LRU leaf
        chain = [leaf]  # private head: walk up through private, unlocked, GPU parents
        while True:
            p = self.u.parent[chain[-1]]
            if p is None or len(self.children(p)) > 1 or self.lock[p] or self.state[p] == NONE:
                break
            chain.append(p)
        return chain[::-1][:need]

    def node_victims(self, leaf: int, need: int) -> list[int]:
        """Blocks freed from the victim history under node semantics (boundaries matter)."""
        whole = self.policy.granularity is NODE
        start = self.policy.start
        node = self.node_of(leaf)
        if start is TAIL or (whole and start is LEAF_HEAD):
            return node if whole or need >= len(node) else node[len(node) - need :]
        chain = [node]
        if start is PRIVATE_HEAD:
            while True:
                p = self.u.parent[chain[0][0]]
                if p is None or len(self.children(p)) > 1 or self.lock[p] or self.state[p] == NONE:
                    break
                chain.insert(0, self.node_of(p))
        gone: list[int] = []
        for nd in chain:
            if need <= 0:
                break
            if whole or need >= len(nd):
                gone += nd
                need -= len(nd)
            else:
                gone += nd[:need]
                self.boundary.add(nd[need])
                need = 0
        return gone

    def evict(self, n: int):
        freed: list[int] = []
        while len(freed) < n:
            leaves = [
                b
                for b, s in self.state.items()
                if s == GPU and self.lock[b] == 0 and not self.children(b)
            ]
            if not leaves:
                break
            stamps = sorted(self.stamp[b] for b in leaves)
            assert len(stamps) < 2 or stamps[0] < stamps[1], "tie between victim leaves"
            leaf = min(leaves, key=self.stamp.__getitem__)
            need = n - len(freed)
            if self.policy.block_exact:
                gone = self.block_exact_victims(leaf, need)
            else:
                gone = self.node_victims(leaf, need)
            for b in gone:
                self.state[b] = NONE
            freed += gone
            self.prune()
        holes = sum(1 for b in freed if self.state.get(b) == NONE)
        return freed, holes


POLICIES = [
    EvictionPolicy("lru", s, g)
    for s in ("tail", "leaf-head", "private-head")
    for g in ("node", "block")
]

choice_lists = st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=0, max_size=14)


class CacheMachine(RuleBasedStateMachine):
    policy: EvictionPolicy = POLICIES[0]

    @initialize()
    def setup(self) -> None:
        self.u = Universe()
        self.cache = RadixKVCache(CAPACITY, self.policy, debug=True)
        self.model = Model(self.policy, CAPACITY, self.u)
        self.locks: list[tuple[Node, int | None]] = []
        self.history: list[list[int]] = []

    def prompt(self, data) -> np.ndarray:
        return draw_prompt(data, self.u, self.history, choice_lists, 16)

    def check_evict(self, result, want) -> None:
        freed, holes = want
        assert sorted(result.freed_ids().tolist()) == sorted(freed)
        assert result.freed_blocks == len(freed)
        assert result.holes_made == holes

    @rule(data=st.data(), touch=st.booleans(), lock=st.booleans())
    def match(self, data, touch, lock) -> None:
        ids = self.prompt(data)
        m = self.cache.match(ids, touch=touch)
        k, hit, segments, handle = self.model.match(ids, touch)
        assert (m.matched_blocks, m.hit_blocks, m.segments) == (k, hit, segments)
        assert m.node.end == k
        if handle is None:
            assert m.node is self.cache.root
        else:
            assert int(m.node.ids[-1]) == handle
            if lock:
                self.cache.lock(m.node)
                self.model.lock_path(handle, +1)
                self.locks.append((m.node, handle))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data) -> None:
        node, handle = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.unlock(node)
        self.model.lock_path(handle, -1)

    @rule(data=st.data())
    def insert_with_room(self, data) -> None:
        """The engine's pattern: match and lock, make room, reserve, insert, release, unlock."""
        ids = self.prompt(data)
        m = self.cache.match(ids)
        handle = self.model.match(ids, True)[3]
        self.cache.lock(m.node)
        self.model.lock_path(handle, +1)
        need = self.model.added(ids)
        r = self.cache.make_room(need)
        if need - self.model.free() > self.model.evictable():
            assert not r.ok and r.freed_blocks == 0
        else:
            self.check_evict(r, self.model.evict(max(0, need - self.model.free())))
            assert r.ok
            self.cache.reserve(need)
            self.model.reserved += need
            ins = self.cache.insert(ids)
            want = self.model.insert(ids)
            assert (ins.new_blocks, ins.filled_blocks, ins.existing_blocks) == want
            assert int(ins.node.ids[-1]) == int(ids[-1])
            self.cache.release(need)
            self.model.reserved -= need
        self.cache.unlock(m.node)
        self.model.lock_path(handle, -1)

    @precondition(lambda self: self.model.reserved == 0)
    @rule(data=st.data())
    def insert_raw(self, data) -> None:
        ids = self.prompt(data)
        want = self.model.insert(ids)
        if want is None:
            with pytest.raises(CapacityError):
                self.cache.insert(ids)
        else:
            ins = self.cache.insert(ids)
            assert (ins.new_blocks, ins.filled_blocks, ins.existing_blocks) == want

    @rule(n=st.integers(0, 12))
    def evict(self, n) -> None:
        r = self.cache.evict(n)
        want = self.model.evict(n)
        self.check_evict(r, want)
        assert r.ok == (len(want[0]) >= n)

    @rule(n=st.integers(0, 6))
    def reserve(self, n) -> None:
        if n > self.model.free():
            with pytest.raises(CapacityError):
                self.cache.reserve(n)
        else:
            self.cache.reserve(n)
            self.model.reserved += n

    @precondition(lambda self: self.model.reserved > 0)
    @rule(data=st.data())
    def release(self, data) -> None:
        n = data.draw(st.integers(1, self.model.reserved))
        self.cache.release(n)
        self.model.reserved -= n

    @invariant()
    def equals_model(self) -> None:
        cache, model = self.cache, self.model
        cache.check()
        evictable = model.evictable()
        counters = (cache.gpu_blocks, cache.evictable_blocks, cache.reserved_blocks)
        assert counters == (model.gpu(), evictable, model.reserved)
        assert cache.protected_blocks == model.gpu() - evictable
        assert cache.hole_blocks == sum(1 for s in model.state.values() if s == NONE)
        assert cache.gpu_blocks + cache.reserved_blocks <= CAPACITY
        gpu_ids = sorted(b for b, s in model.state.items() if s == GPU)
        assert cache.resident_block_ids().tolist() == gpu_ids
        seen = 0
        for node in cache.iter_nodes():
            blocks = node.ids.tolist()
            seen += len(blocks)
            if not self.policy.block_exact:  # node semantics: the same node boundaries
                assert blocks[0] in model.boundary, (blocks, cache.dump())
                assert not model.boundary.intersection(blocks[1:]), (blocks, cache.dump())
            assert node.start == self.u.pos[blocks[0]]
            for b in blocks:
                assert model.state[b] == node.tier.name
                assert model.stamp[b] == node.last_access, (b, cache.dump())
                assert model.lock[b] == node.lock
        assert seen == len(model.state)
        # locked blocks are resident or locked holes: never evicted
        for _, handle in self.locks:
            assert handle in model.state


SETTINGS = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_cache_matches_reference_model(policy: EvictionPolicy) -> None:
    machine = type(f"Machine_{policy.spec}", (CacheMachine,), {"policy": policy})
    machine.TestCase.settings = SETTINGS
    machine.TestCase().runTest()


# ---------------------------------------------------------------------------- the zoo
# The zoo's orders read events, time and prices, so no brute-force model replays them; the
# machine below drives every zoo policy with random cache operations AND random events
# (arrivals, replies naming a cached leaf, the clock moving) and checks after each step:
# the DFS recount, capacity, locked histories never freed, evict's ok flag, and that the
# first history freed is the one the policy ranks first (pins, then key, then serial).
ZOO = ["ttl", "ttl?tau_s=3", "tlru?xi=256&q_hat=64", "greedydual", "memdecay",
       "clairvoyant", "clairvoyant?cost_aware=false", "random",
       "tlru?start=private-head&granularity=block", "greedydual?granularity=block",
       "random?start=leaf-head"]


def _price(a: int, b: int) -> float:
    return ((b - a) * 100 + (a + b - 1) * (b - a) / 2) * 1e-6


class ZooMachine(RuleBasedStateMachine):
    spec: str = "random"

    @initialize()
    def setup(self) -> None:
        from policies import PolicyContext, get_policy

        self.u = Universe()
        self.now = 0.0
        self.policy = get_policy(self.spec)
        self.policy.bind(PolicyContext(now=lambda: self.now, block_size=64, seed=7,
                                       recompute_seconds=_price))
        self.cache = RadixKVCache(CAPACITY, self.policy, debug=True)
        self.locks: list[Node] = []
        self.handles: list[Node] = []
        self.history: list[list[int]] = []
        self.reserved = 0

    def prompt(self, data) -> np.ndarray:
        return draw_prompt(data, self.u, self.history, choice_lists, 16)

    def first_victim_path(self) -> set[int] | None:
        """Block ids on the root path of the leaf the policy ranks first."""
        p = self.policy
        leaves = self.cache.evictable_leaves()
        if not leaves:
            return None

        def rank(n: Node):
            pinned = p.pins and p.pinned_until(n) > self.now
            return (pinned, p.sort_key(n), n.serial)

        leaf = min(leaves, key=rank)
        ids: set[int] = set()
        nd = leaf
        while nd is not self.cache.root:
            ids.update(nd.ids.tolist())
            nd = nd.parent
        return ids

    @rule(dt=st.floats(0, 5))
    def tick(self, dt) -> None:
        self.now += dt

    @rule(data=st.data(), session=st.integers(0, 3))
    def arrival(self, data, session) -> None:
        from policies import Arrival

        ids = self.prompt(data)
        regions = np.array(data.draw(st.lists(st.integers(0, 5), min_size=ids.size,
                                              max_size=ids.size)), dtype=np.uint8)
        if self.policy.events & {"arrival"}:
            self.policy.on_arrival(Arrival(self.now, session, 0, ids.size * 64, ids, regions))

    @precondition(lambda self: self.handles)
    @rule(data=st.data(), session=st.integers(0, 3),
          gap=st.sampled_from(["tool", "human", "end"]), gap_s=st.floats(0, 20),
          queue_s=st.floats(0, 5))
    def reply(self, data, session, gap, gap_s, queue_s) -> None:
        from policies import Reply

        leaf = data.draw(st.sampled_from(self.handles))
        if leaf.parent is None or "reply" not in self.policy.events:
            return  # evicted since: no longer a handle
        self.policy.on_reply(Reply(self.now, session, 0, leaf.end * 64, leaf, gap,
                                   gap_s if self.policy.clairvoyant else float("nan"),
                                   queue_s))

    @rule(data=st.data(), lock=st.booleans())
    def match(self, data, lock) -> None:
        m = self.cache.match(self.prompt(data))
        if lock and m.node is not self.cache.root:
            self.cache.lock(m.node)
            self.locks.append(m.node)

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data) -> None:
        node = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.unlock(node)

    @rule(data=st.data())
    def insert_with_room(self, data) -> None:
        ids = self.prompt(data)
        m = self.cache.match(ids)
        self.cache.lock(m.node)
        # blocks the insert adds: new ones past the path and the holes it refills
        path = self.cache.match(ids, touch=False)
        need = path.hole_blocks + ids.size - path.matched_blocks
        r = self.cache.make_room(need)
        if r.ok:
            self.cache.reserve(need)
            ins = self.cache.insert(ids)
            self.cache.release(need)
            self.handles.append(ins.node)
        self.cache.unlock(m.node)

    @rule(n=st.integers(0, 12))
    def evict(self, n) -> None:
        locked = {b for nd in self.locks for b in _path_ids(self.cache, nd)}
        before = set(self.cache.resident_block_ids().tolist())
        evictable = self.cache.evictable_blocks
        first = self.first_victim_path()
        r = self.cache.evict(n)
        got = r.freed_ids().tolist()
        assert r.ok == (r.freed_blocks >= n)
        assert r.freed_blocks >= min(n, evictable) or r.freed_blocks == evictable
        assert set(got) <= before and not set(got) & locked
        if got:
            assert first is not None and int(r.freed[0][0]) in first, (
                "the first history freed is not the policy's first choice")

    @rule(n=st.integers(0, 6))
    def reserve(self, n) -> None:
        if n <= self.cache.free_blocks:
            self.cache.reserve(n)
            self.reserved += n

    @precondition(lambda self: self.reserved > 0)
    @rule(data=st.data())
    def release(self, data) -> None:
        n = data.draw(st.integers(1, self.reserved))
        self.cache.release(n)
        self.reserved -= n

    @invariant()
    def consistent(self) -> None:
        c = self.cache
        c.check()
        assert c.gpu_blocks + c.reserved_blocks <= CAPACITY
        assert c.reserved_blocks == self.reserved
        for nd in self.locks:  # a running request's path is intact and resident
            assert nd.parent is not None
            x = nd
            while x is not c.root:
                assert x.lock > 0 and (x.tier == Tier.GPU or self.policy.makes_holes)
                x = x.parent


def _path_ids(cache: RadixKVCache, node: Node) -> list[int]:
    out: list[int] = []
    while node is not cache.root:
        if node.tier == Tier.GPU:
            out += node.ids.tolist()
        node = node.parent
    return out


@pytest.mark.parametrize("spec", ZOO)
def test_zoo_policies_keep_the_cache_invariants(spec: str) -> None:
    machine = type(f"Zoo_{spec}", (ZooMachine,), {"spec": spec})
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=50,
                                         deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
    machine.TestCase().runTest()
