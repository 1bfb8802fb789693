"""kvsim's vLLM block pool (sim.kvcache.blockpool): one hand-computed test per vLLM rule, the
two free orders, and a hypothesis test against a brute-force model written from vLLM's code
structure (a Python list for the free queue, dicts of lists for the hash map)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.eviction import penelope_free_order, vllm_free_order
from sim.kvcache.blockpool import BlockPool
from tests.chained import ids

BS = 4


def snapshot(p: BlockPool) -> tuple:
    return (p.block_ids().tolist(), p.ref_counts().tolist(), p.free_queue().tolist())


@pytest.fixture
def pool() -> BlockPool:
    return BlockPool(8, BS, debug=True)


def test_prompt_blocks_cached_at_admission_and_hit_by_a_running_request(pool: BlockPool) -> None:
    # 10 tokens: blocks 1, 2 full, 2 tokens of block 3; admission caches the 2 full blocks
    assert pool.admit(0, ids(1, 2, 3), 10, 10) == 0
    assert pool.table(0).tolist() == [1, 2, 3]  # vLLM hands out physical blocks 1, 2, 3
    assert pool.block_ids()[:3].tolist() == [1, 2, -1]
    # a concurrent request with the same 2 blocks + more hits them while 0 still runs
    assert pool.admit(1, ids(1, 2, 9), 12, 12) == 2
    assert pool.ref_counts()[:2].tolist() == [2, 2]


def test_lookup_is_read_only(pool: BlockPool) -> None:
    pool.admit(0, ids(1, 2), 9, 9)
    pool.free(0)
    before = snapshot(pool)
    assert pool.lookup(ids(1, 2), 9) == 2
    assert snapshot(pool) == before


def test_hit_capped_at_num_tokens_minus_one(pool: BlockPool) -> None:
    pool.admit(0, ids(1, 2), 8, 8)  # exactly 2 blocks: both cached at admission
    pool.free(0)
    assert pool.lookup(ids(1, 2), 8) == 1  # the last token is always computed
    assert pool.lookup(ids(1, 2), 9) == 2


def test_request_not_admitted_touches_nothing(pool: BlockPool) -> None:
    pool.admit(0, ids(1, 2, 3, 4), 17, 17)  # 5 blocks, 4 cached
    pool.free(0)
    pool.admit(1, ids(20, 21, 22), 12, 12)  # 3 blocks held: 5 free, 4 of them cached
    before = snapshot(pool)
    # 3 hits (ref 0) + 3 new blocks = 6 > 5 free: refused, hits not touched
    assert pool.admit(2, ids(1, 2, 3, 30, 31, 32), 24, 24) is None
    assert snapshot(pool) == before


def test_capacity_check_counts_ref0_hits_as_needing_allocation(pool: BlockPool) -> None:
    pool.admit(0, ids(1, 2), 8, 8)
    pool.free(0)
    pool.admit(1, ids(20, 21, 22, 23), 16, 16)  # 4 held: free 4, of which blocks 1, 2 cached
    # hit 1 (capped), needs 1 new block + the ref-0 hit = 2 <= 4: admitted
    assert pool.admit(2, ids(1, 2), 8, 8) == 1
    # the same prompt again: hit 1 is now held (ref 1): needs only 1 new block
    assert pool.free_blocks == 2
    assert pool.admit(3, ids(1, 2), 8, 8) == 1
    assert pool.free_blocks == 1


def test_free_order_is_tail_first_unhashed_to_front(pool: BlockPool) -> None:
    pool.admit(0, ids(1, 2, 3), 14, 14)  # 4 blocks: 3 cached + a partial one
    pool.free(0)
    # reversed: the partial block 4 to the FRONT, then 3, 2, 1 at the tail (tail evicted first)
    assert pool.free_queue().tolist() == [4, 5, 6, 7, 8, 3, 2, 1]


def test_lazy_eviction_freed_blocks_stay_hittable_until_popped(pool: BlockPool) -> None:
    pool.admit(0, ids(1, 2, 3), 12, 12)
    pool.free(0)
    assert pool.lookup(ids(1, 2, 3), 13) == 3  # freed, still cached
    pool.admit(1, ids(50, 51, 52, 53, 54, 55), 23, 23)  # 6 blocks: 5 unhashed + block 3
    assert not pool.is_cached(3) and pool.is_cached(2)  # the tail went first
    assert pool.lookup(ids(1, 2, 3), 13) == 2


def test_no_deduplication_duplicates_take_capacity_and_lookup_returns_first(
    pool: BlockPool,
) -> None:
    pool.admit(0, ids(1, 2), 8, 8)  # caches ids 1, 2 in blocks 1, 2
    # same prompt while 0 runs: hit capped at 1, so block 2's content is computed again and
    # cached in a second physical block (3): two copies of id 2
    assert pool.admit(1, ids(1, 2), 8, 8) == 1
    assert pool.table(1).tolist() == [1, 3]
    assert pool.cached_ids().tolist() == [1, 2, 2]
    assert pool.cached_blocks == 3
    pool.free(0)
    pool.free(1)
    # a longer prompt hits id 2 through its FIRST copy (block 2)
    assert pool.admit(2, ids(1, 2, 7), 12, 12) == 2
    assert pool.table(2).tolist()[:2] == [1, 2]


def test_decode_blocks_cached_as_they_fill(pool: BlockPool) -> None:
    pool.admit(0, ids(1, 2, 3), 6, 6)  # prompt: 1 full block + 2 tokens
    assert pool.cached_ids().tolist() == [1]
    assert pool.extend(0, 1)  # 7 tokens: block 2 not full yet
    assert not pool.is_cached(2)
    assert pool.extend(0, 1)  # 8 tokens: block 2 full -> cached
    assert pool.is_cached(2)
    assert pool.extend(0, 4)  # 12 tokens (a 4-token step): block 3 full -> cached
    assert pool.cached_ids().tolist() == [1, 2, 3]
    assert pool.table(0).tolist() == [1, 2, 3]


def test_extend_refused_changes_nothing() -> None:
    pool = BlockPool(3, BS, debug=True)
    pool.admit(0, ids(1, 2, 3, 4), 12, 12)
    before = snapshot(pool)
    assert not pool.extend(0, 1)  # a 4th block is needed, none free
    assert snapshot(pool) == before


def test_penelope_order_releases_private_front_first_shared_last() -> None:
    shared = np.array([True, True, False, False, False])
    assert penelope_free_order(shared).tolist() == [2, 3, 4, 1, 0]
    assert vllm_free_order(shared).tolist() == [4, 3, 2, 1, 0]


def test_penelope_pool_keeps_the_shared_prefix_and_evicts_private_front() -> None:
    pool = BlockPool(12, BS, "penelope", debug=True)
    # session A: system blocks 1, 2 then private 10, 11; session B: 1, 2 then 20
    pool.admit(0, ids(1, 2, 10, 11), 16, 16)
    pool.free(0)
    pool.admit(1, ids(1, 2, 20), 12, 12)
    pool.free(1)
    # A released 1, 2, 10, 11 front first (no branch yet: all private); B's hit took 1, 2 out
    # of the queue. Now id 2 has two cached continuations (10 and 20): 1, 2 are the shared
    # prefix, so B releases its private 20 first and the shared prefix last (2, then 1)
    queue_ids = pool.block_ids()[pool.free_queue() - 1]
    assert queue_ids[queue_ids >= 0].tolist() == [10, 11, 20, 2, 1]


def test_bad_calls() -> None:
    pool = BlockPool(4, BS)
    with pytest.raises(ValueError, match="already running"):
        pool.admit(0, ids(1), 5, 5)
        pool.admit(0, ids(1), 5, 5)
    with pytest.raises(ValueError, match="ids cover only"):
        pool.admit(1, ids(1), 9, 9)
    with pytest.raises(ValueError, match="block ids must be"):
        pool.admit(2, ids(-3), 5, 5)
    with pytest.raises(ValueError, match="unknown free order"):
        BlockPool(4, BS, "lru")


# ---- brute force ---------------------------------------------------------------------------


class BruteForce:
    """vLLM's block pool as plain Python, one block at a time (kv_cache_manager.py,
    block_pool.py, single_type_kv_cache_manager.py, a list as the free queue)."""

    def __init__(self, cap: int, bs: int, order) -> None:
        self.bs, self.order = bs, order
        self.queue = list(range(1, cap + 1))
        self.bid = [-1] * (cap + 1)
        self.ref = [0] * (cap + 1)
        self.copies: dict[int, list[int]] = {}
        self.parent: dict[int, int] = {}
        self.seqs: dict[int, list] = {}  # rid -> [ids, table, computed, cached]

    def lookup(self, ids, n) -> int:
        h = 0
        for x in ids[: min(len(ids), (n - 1) // self.bs)]:
            if not self.copies.get(int(x)):
                break
            h += 1
        return h

    def _pop(self, n: int) -> list[int]:
        out = self.queue[:n]
        del self.queue[:n]
        for p in out:
            if self.bid[p] >= 0:
                self.copies[self.bid[p]].remove(p)
                self.bid[p] = -1
            self.ref[p] = 1
        return out

    def _cache(self, seq) -> None:
        ids, table, computed, cached = seq
        for j in range(cached, computed // self.bs):
            x = int(ids[j])
            self.bid[table[j]] = x
            self.copies.setdefault(x, []).append(table[j])
            self.parent[x] = int(ids[j - 1]) if j else -1
        seq[3] = max(cached, computed // self.bs)

    def admit(self, rid, ids, n, k, full=True):
        h = self.lookup(ids, n)
        new = min(k, n - h * self.bs)
        hits = [self.copies[int(x)][0] for x in ids[:h]]
        ev = sum(self.ref[p] == 0 for p in hits)
        if full and max(-(-n // self.bs) - h, 0) + ev > len(self.queue):
            return None
        n_new = max(-(-(h * self.bs + new) // self.bs) - h, 0)
        if n_new + ev > len(self.queue):
            return None
        for p in hits:
            if self.ref[p] == 0:
                self.queue.remove(p)
            self.ref[p] += 1
        seq = [ids, hits + self._pop(n_new), h * self.bs + new, h]
        self.seqs[rid] = seq
        self._cache(seq)
        return h

    def extend(self, rid, k) -> bool:
        seq = self.seqs[rid]
        need = max(-(-(seq[2] + k) // self.bs) - len(seq[1]), 0)
        if need > len(self.queue):
            return False
        seq[1] += self._pop(need)
        seq[2] += k
        self._cache(seq)
        return True

    def free(self, rid) -> None:
        ids, table, _, cached = self.seqs.pop(rid)
        shared = np.zeros(len(table), bool)
        last = -1
        for j in range(cached):
            kids = {x for x, p in self.parent.items() if p == int(ids[j]) and self.copies.get(x)}
            if len(kids) >= 2 or self.ref[table[j]] >= 2:
                last = j
        shared[: last + 1] = True
        first, last_ = [], []
        for j in self.order(shared):
            p = table[j]
            self.ref[p] -= 1
            if self.ref[p] == 0:
                (last_ if self.bid[p] >= 0 else first).append(p)
        self.queue = first + self.queue + last_


@settings(max_examples=60, deadline=None)
@given(data=st.data(), order=st.sampled_from(["vllm", "penelope"]), cap=st.integers(3, 14))
def test_matches_brute_force(data, order: str, cap: int) -> None:
    """Random admit/extend/free sequences over chained ids (edits, shared prefixes, resends):
    same results and same physical state after every call, for both free orders."""
    order_fn = {"vllm": vllm_free_order, "penelope": penelope_free_order}[order]
    pool, ref = BlockPool(cap, BS, order, debug=True), BruteForce(cap, BS, order_fn)
    universe: dict[tuple, int] = {}
    running: list[int] = []
    for rid in range(data.draw(st.integers(1, 25))):
        action = data.draw(st.sampled_from(["admit", "admit", "extend", "free"]))
        if action == "admit" or not running:
            choices = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=6))
            chain = [universe.setdefault(tuple(choices[: i + 1]), len(universe)) for i in
                     range(len(choices))]
            n = data.draw(st.integers(1, len(chain) * BS))
            k = data.draw(st.integers(1, n))
            a = pool.admit(rid, np.array(chain, np.int64), n, k, full_sequence_must_fit=False)
            b = ref.admit(rid, chain, n, k, full=False)
            assert a == b
            if a is not None:
                running.append(rid)
        elif action == "extend":
            r = data.draw(st.sampled_from(running))
            room = len(ref.seqs[r][0]) * BS - ref.seqs[r][2]
            if room > 0:
                k = data.draw(st.integers(1, room))
                assert pool.extend(r, k) == ref.extend(r, k)
        else:
            r = data.draw(st.sampled_from(running))
            running.remove(r)
            pool.free(r)
            ref.free(r)
        assert pool.block_ids().tolist() == ref.bid[1:]
        assert pool.ref_counts().tolist() == ref.ref[1:]
        assert pool.free_queue().tolist() == ref.queue
        # read-only lookups of any chain: known ids, ids never admitted (beyond the arrays),
        # a negative one; a first block missing or not
        probe = data.draw(st.lists(st.sampled_from([*universe.values(), 10**6, -1]),
                                   max_size=6))
        if probe:
            n = data.draw(st.integers(1, len(probe) * BS + 1))
            assert pool.lookup(np.array(probe, np.int64), n) == ref.lookup(probe, n)
        assert pool.gpu_prefix_blocks(np.array(probe, np.int64)) == ref.lookup(
            probe, len(probe) * BS + 1)


def _free_queue_step(q, ref: list[int], hashed: set[int], op: str, k: int,
                     blocks: list[int]) -> list[int]:
    """One op on FreeQueue ``q`` and on its reference list ``ref`` (vLLM's semantics): pop
    ``k``, remove ``blocks`` (free hashed ones), append ``blocks`` (they become hashed) or
    prepend the unhashed of ``blocks``; ``hashed`` follows; the new list."""
    if op == "pop":
        k = min(k, len(ref))
        unhashed, popped = q.pop(k)
        assert unhashed.tolist() + popped.tolist() == ref[:k]
        hashed -= set(popped.tolist())
        ref = ref[k:]
    elif op == "remove":
        q.remove(np.array(blocks, np.int64))
        ref = [b for b in ref if b not in set(blocks)]
    elif op == "append":
        hashed |= set(blocks)
        q.append(np.array(blocks, np.int64))
        ref = ref + blocks
    else:
        blocks = [b for b in blocks if b not in hashed]
        q.prepend(np.array(blocks, np.int64))
        ref = blocks + ref
    q.check()
    return ref


@settings(max_examples=120, deadline=None)
@given(st.sampled_from([10, 300]),
       st.lists(st.tuples(st.sampled_from(["pop", "pop", "remove", "append", "prepend"]),
                          st.integers(0, 6), st.integers(0, 40)), max_size=80))
def test_free_queue_matches_a_list(cap: int, steps) -> None:
    """FreeQueue (stack + log of hashed blocks with dead entries, compaction) against vLLM's
    list semantics; with 300 blocks, batches of up to 280 blocks and hits anywhere in the
    hashed part, so pops run into dead entries, scan past them and the log compacts."""
    from sim.kvcache.freequeue import FreeQueue

    q, ref = FreeQueue(cap), list(range(1, cap + 1))
    hashed: set[int] = set()
    for op, k, skip in steps:
        if cap > 10:
            k, skip = k * 40 + skip, skip * 7
        held = [b for b in range(1, cap + 1) if b not in ref]
        if op == "remove":  # a hit on free cached blocks, not necessarily at the front
            blocks = [b for b in ref if b in hashed][skip : skip + k]
        else:
            blocks = held[skip : skip + k]
        ref = _free_queue_step(q, ref, hashed, op, k, blocks)
        assert q.blocks().tolist() == ref and len(q) == len(ref)
        assert q.hashed == len([b for b in ref if b in hashed])


@pytest.mark.parametrize("seed", range(6))
def test_free_queue_long_walk_matches_a_list(seed: int) -> None:
    """A long random walk (seeded) on a 200-block FreeQueue against the list: many times the
    log's length appended, so it compacts, and hits scattered over the hashed part, so pops
    scan past dead entries and find the next one."""
    from sim.kvcache.freequeue import FreeQueue

    rng = np.random.default_rng(seed)
    cap = 200
    q, ref = FreeQueue(cap), list(range(1, cap + 1))
    hashed: set[int] = set()
    for _ in range(600):
        op = rng.choice(["pop", "remove", "append", "prepend"], p=[0.35, 0.15, 0.35, 0.15])
        k = int(rng.integers(0, 60))
        blocks: list[int] = []
        if op == "remove":
            free_hashed = [b for b in ref if b in hashed]
            pick = rng.permutation(len(free_hashed))[: k // 4]
            blocks = [free_hashed[i] for i in sorted(pick)]
        elif op != "pop":
            held = [b for b in range(1, cap + 1) if b not in set(ref)]
            blocks = [held[i] for i in rng.permutation(len(held))[:k]]
        ref = _free_queue_step(q, ref, hashed, op, k, blocks)
        assert q.blocks().tolist() == ref and len(q) == len(ref)


def test_bench_vllm_cache_small_run_json(capsys: pytest.CaptureFixture[str]) -> None:
    """The speed benchmark (benchmarks/bench_vllm_cache.py) runs on 3 sessions and reports
    every side (skips cleanly without the traces)."""
    import json

    from conftest import CC_TRACES

    from benchmarks import bench_vllm_cache

    if not CC_TRACES.is_dir():
        assert bench_vllm_cache.main(["--trace-dir", str(CC_TRACES)]) == 0
        return
    argv = ["--trace-dir", str(CC_TRACES), "--sessions", "3", "--repeat", "1", "--json"]
    assert bench_vllm_cache.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    rows = {r["side"]: r for r in summary["rows"]}
    assert list(rows) == [
        "kvsim radix (sglang)",
        "kvsim blockpool (vllm)",
        "kvsim blockpool (penelope)",
        "vLLM V1 driver + blockpool",
    ]
    assert rows["kvsim radix (sglang)"]["vs_radix"] == 1.0
    assert rows["kvsim blockpool (vllm)"]["hit_blocks"] > 0
    assert "blockpool (vllm) / radix (sglang)" in bench_vllm_cache.format_table(summary)


@pytest.mark.parametrize("children", [False, True])
def test_cached_ids_grow_keeps_copies_and_marks_new_ids_uncached(children: bool) -> None:
    from sim.kvcache.cachedids import CachedIds

    m = CachedIds(children=children)
    m.grow(np.array([5], np.int64))
    m.add(np.array([1, 2], np.int64), np.array([5, 6], np.int64), -1)
    for top in (1500, 5000, 70_000):  # past each doubling and past twice the size
        m.grow(np.array([top], np.int64))
        assert len(m) > top
        assert m.firsts(np.array([5, 6, 7, top], np.int64), True).tolist() == [1, 2, -1, -1]
    m.add(np.array([3], np.int64), np.array([70_000], np.int64), 6)
    assert m.firsts(np.array([70_000], np.int64)).tolist() == [3]
    if children:
        assert m.children(np.array([5, 6, 70_000], np.int64)).tolist() == [1, 1, 0]
    else:  # not kept: asking is a caller's mistake, not a silent zero
        with pytest.raises(ValueError, match="children=True"):
            m.children(np.array([5], np.int64))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), children=st.booleans())
def test_cached_ids_match_a_dict_of_copies(seed: int, children: bool) -> None:
    """CachedIds against dicts (id -> copies in insertion order; id -> parent) with batches
    past SMALL, duplicate copies, one id dropped twice in one batch, and child counts read
    after any mix of queued changes: firsts, children and copy lists equal after every op."""
    from sim.kvcache.cachedids import SMALL, CachedIds

    rng = np.random.default_rng(seed)
    n_ids, n_blocks = 60, 90
    parent = [-1 if i < 3 else int(rng.integers(-1, i)) for i in range(n_ids)]

    def path(v: int) -> list[int]:
        out = []
        while v >= 0:
            out.append(v)
            v = parent[v]
        return out[::-1]

    m = CachedIds(children=children)
    m.grow(np.array([n_ids - 1], np.int64))
    copies: dict[int, list[int]] = {}
    bid = np.full(n_blocks + 1, -1, np.int64)
    for _ in range(120):
        free = np.flatnonzero(bid[1:] < 0) + 1
        if rng.random() < 0.55 and len(free):
            chain = path(int(rng.integers(0, n_ids)))
            a = int(rng.integers(0, len(chain)))
            b = min(len(chain), a + int(rng.integers(1, 3 * SMALL)), a + len(free))
            xs = chain[a:b]
            ps = rng.permutation(free)[: len(xs)].tolist()
            m.add(np.array(ps, np.int64), np.array(xs, np.int64), chain[a - 1] if a else -1)
            for p, x in zip(ps, xs, strict=True):
                copies.setdefault(x, []).append(p)
                bid[p] = x
        else:
            held = np.flatnonzero(bid[1:] >= 0) + 1
            ps = rng.permutation(held)[: int(rng.integers(0, 3 * SMALL))].tolist()
            xs = [int(bid[p]) for p in ps]
            lost = m.drop(np.array(ps, np.int64), np.array(xs, np.int64))
            expect = 0
            for p, x in zip(ps, xs, strict=True):
                copies[x].remove(p)
                bid[p] = -1
                if not copies[x]:
                    del copies[x]
                    expect += 1
            assert lost == expect
        every = np.arange(n_ids, dtype=np.int64)
        assert m.firsts(every).tolist() == [copies[x][0] if x in copies else -1
                                            for x in range(n_ids)]
        if children and rng.random() < 0.5:  # read the counts only sometimes: changes queue
            kids = [len({c for c in copies if parent[c] == x}) for x in range(n_ids)]
            assert m.children(every).tolist() == kids
        m.check(bid)
