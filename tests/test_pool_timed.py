"""The shared pool on the fleet's clock (sim/fleet/pooltier.py), hand-computed timelines.

The replicas are real radix caches; the engine around each is a recording double
(``Replica``: its ``submit`` notes the time), so each timeline is arithmetic: a fetch of p
blocks takes latency + p x block bytes / bandwidth after the replica's link is free, and is
taken only when faster than the recompute price of its tokens."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import simpy

from sim.engines.sglang import SGLangServer
from sim.fleet.pool import SharedPool
from sim.fleet.pooltier import FleetPool
from sim.kvcache import RadixKVCache

# Its replica is a stand-in borrowing SGLangServer.insert_remote, which compiled applies to a
# real SGLangServer only (tests/conftest.py); tests/test_pool_accounting.py runs real replicas.
pytestmark = pytest.mark.pure_path("a stand-in replica borrows SGLangServer.insert_remote")

BS, BLOCK_BYTES, BANDWIDTH, LATENCY = 4, 1000, 1e6, 1e-3  # a 3-block fetch: 4 ms


class NullRecorder:
    def evicted(self, res) -> None:
        pass


class Replica:
    """The engine side of the hand-off: a cache, a submit that records when, and the sglang
    engine's own landing of fetched blocks."""

    insert_remote = SGLangServer.insert_remote

    def __init__(self, env: simpy.Environment, cache: RadixKVCache) -> None:
        self.env, self.cache, self.rec, self.got = env, cache, NullRecorder(), []
        self.ever: set[int] = set()

    def remember(self, ids) -> None:
        self.ever.update(ids.tolist())

    def submit(self, req) -> None:
        self.got.append((req.rid, self.env.now))


def pool_setup(per_token_s: float, pool_blocks: int = 100, replicas: int = 1, write="write-through",
          policy: str = "sglang", **cache_kw):
    env = simpy.Environment()
    engines = [Replica(env, RadixKVCache(16, policy, block_size=BS, **cache_kw))
               for _ in range(replicas)]
    pool = FleetPool(env, SharedPool(pool_blocks), engines, BS, BLOCK_BYTES, BANDWIDTH,
                     LATENCY, write,
                     lambda ranges: sum(b - a for a, b in ranges) * per_token_s)
    return env, engines, pool


def pool_request(rid: int, *blocks: int):
    ids = np.asarray(blocks, dtype=np.int64)
    return SimpleNamespace(rid=rid, ids=ids, prompt_tokens=ids.size * BS + 1)


def test_a_fetch_that_beats_recompute_lands_before_the_request():
    """Blocks 1-3 in the pool, none on the replica. Fetch: 1 ms + 3,000 B / 1 MB/s = 4 ms;
    recompute: 12 tokens x 1 ms = 12 ms: taken. The request reaches the replica at 4 ms with
    blocks 1-3 on its GPU; the blocks stay leased until then. A second request for the same
    blocks, routed at 0 to the same replica, waits for the link: it ends at 8 ms."""
    env, (rep,), fp = pool_setup(per_token_s=1e-3)
    fp.pool.put(np.asarray([1, 2, 3]))
    fp.submit(pool_request(7, 1, 2, 3, 9), 0)
    assert fp.pool.leases == {1: 1, 2: 1, 3: 1}
    fp.submit(pool_request(8, 1, 2, 3, 9), 0)
    env.run()
    assert rep.got == [(7, pytest.approx(0.004)), (8, pytest.approx(0.008))]
    assert rep.cache.gpu_prefix_blocks(np.asarray([1, 2, 3, 9])) == 3
    assert fp.pool.leases == {}
    assert fp.record.landed[7] == [(0, 3)] and fp.record.fetch_s[7] == pytest.approx(0.004)
    assert rep.ever == {1, 2, 3}  # the engine's unlimited cache holds what landed
    assert fp.record.fetch_s[8] == pytest.approx(0.008)
    assert (fp.fetches, fp.refusals, fp.fetched_blocks) == (2, 0, 6)
    assert fp.transfers == [(0.0, pytest.approx(0.004), 3000),
                            (pytest.approx(0.004), pytest.approx(0.008), 3000)]


def test_a_fetch_slower_than_recompute_is_refused():
    """Same fetch (4 ms) against 12 tokens x 0.1 ms = 1.2 ms of recompute: refused. The
    request reaches the replica at once and nothing lands or is leased."""
    env, (rep,), fp = pool_setup(per_token_s=1e-4)
    fp.pool.put(np.asarray([1, 2, 3]))
    fp.submit(pool_request(7, 1, 2, 3, 9), 0)
    assert fp.pool.leases == {}
    env.run()
    assert rep.got == [(7, 0.0)]
    assert rep.cache.gpu_prefix_blocks(np.asarray([1, 2, 3])) == 0
    assert (fp.fetches, fp.refusals, fp.refused_blocks) == (0, 1, 3)
    assert 7 not in fp.record.landed


def test_the_lookup_starts_after_the_replicas_own_prefix():
    """The replica holds block 1; the pool holds 1-3: only 2-3 are fetched (3 ms)."""
    env, (rep,), fp = pool_setup(per_token_s=1e-3)
    rep.cache.insert(np.asarray([1]))
    fp.pool.put(np.asarray([1, 2, 3]))
    fp.submit(pool_request(7, 1, 2, 3, 9), 0)
    env.run()
    assert rep.got == [(7, pytest.approx(0.003))]
    assert fp.record.landed[7] == [(1, 3)]


def test_eviction_at_the_watermark_skips_a_block_leased_by_a_fetch_in_flight():
    """Pool of 20 blocks (watermark 18). Replica 0 fetches blocks 1-2 (leased from 0 to
    1 + 2 ms = 3 ms); block 3, stored and then read, is more recent, so 1, 2 are the least
    recent. Replica 1 writes through blocks 100-114 (the pool holds 18), then 100-115: before
    block 115 enters, a pass drops ceil(0.05 x 18) = 1 block: not the leased 1 or 2 but the
    next least recent, 3."""
    env, (r0, r1), fp = pool_setup(per_token_s=1e-3, pool_blocks=20, replicas=2)
    fp.pool.put(np.asarray([1, 2]))
    fp.submit(pool_request(7, 1, 2, 50), 0)  # lease 1, 2 (most recent now)
    fp.pool.put(np.asarray([3]))  # 3 is now the most recent
    fp.pool.lease(np.asarray([3]))
    fp.pool.release(np.asarray([3]))
    order = list(fp.pool.blocks)
    assert order == [1, 2, 3]  # leased 1, 2 are the least recent
    r1.cache.insert(np.arange(100, 115))  # write-through: 15 new blocks -> 18 held
    assert len(fp.pool) == 18 and fp.pool.passes == 0
    r1.cache.insert(np.arange(100, 116))  # one more: the pass runs first
    assert fp.pool.passes == 1
    assert 1 in fp.pool and 2 in fp.pool and 3 not in fp.pool
    env.run()
    assert r0.got == [(7, pytest.approx(0.003))] and fp.pool.leases == {}


def test_write_back_stores_what_a_replica_drops_from_its_cpu_tier():
    """Write-back, a replica with a 16-block GPU and an 8-block CPU tier (unified, LRU
    nodes). A = blocks 0-7 and B = 100-107 fill the GPU: nothing enters the pool (computing
    does not store under write-back). Making room for 8 demotes A to the CPU tier: still
    nothing. C = 200-207 arrives and room for 8 more demotes B, which pushes A out of the
    CPU tier, its last copy: exactly A enters the pool."""
    _env, (rep,), fp = pool_setup(per_token_s=1e-3, write="write-back", cpu_capacity_blocks=8,
                            tiering="unified")
    cache = rep.cache
    cache.insert(np.arange(0, 8))
    cache.insert(np.arange(100, 108))
    assert len(fp.pool) == 0
    cache.make_room(8)  # A: GPU -> CPU
    assert len(fp.pool) == 0
    cache.insert(np.arange(200, 208))
    cache.make_room(8)  # B: GPU -> CPU; A: CPU -> gone
    assert list(fp.pool.blocks) == list(range(8))
    assert fp.pool.stored == 8


def test_write_through_stores_what_a_replica_writes():
    _env, (rep,), fp = pool_setup(per_token_s=1e-3)
    rep.cache.insert(np.arange(0, 5))
    rep.cache.insert(np.arange(0, 7))
    assert list(fp.pool.blocks) == list(range(7)) and fp.pool.stored == 7


def test_no_fetch_behind_a_prefix_in_the_replicas_cpu_tier():
    """Blocks 0-7 were demoted to the replica's CPU tier; the pool holds 8-9. The fetched
    blocks could not land behind a CPU-resident prefix: no fetch, the request goes at once."""
    env, (rep,), fp = pool_setup(per_token_s=1e-3, cpu_capacity_blocks=8, tiering="unified")
    rep.cache.insert(np.arange(0, 8))
    rep.cache.insert(np.arange(100, 108))
    rep.cache.make_room(8)  # 0-7: GPU -> CPU
    assert rep.cache.resident_prefix_blocks(np.arange(0, 10)) == 8
    fp.pool.put(np.asarray([8, 9]))
    fp.submit(pool_request(7, *range(10)), 0)
    env.run()
    assert rep.got == [(7, 0.0)]
    assert (fp.fetches, fp.behind_cpu, fp.wasted_blocks) == (0, 1, 0)


def holed(per_token_s: float):
    """A Penelope replica (16 blocks) holding A = blocks 1-12 with a hole at 1-4: A and
    B = 101-104 fill the GPU; making room for 4 frees the front of A's private history, the
    least recent. The pool holds 1-12 (written through)."""
    env, (rep,), fp = pool_setup(per_token_s=per_token_s, policy="penelope")
    rep.cache.insert(np.arange(1, 13))
    rep.cache.insert(np.arange(101, 105))
    assert rep.cache.make_room(4).ok
    assert [(s, e, t.name) for s, e, t in rep.cache.tier_runs(np.arange(1, 14))] == [
        (0, 4, "NONE"), (4, 12, "GPU")]
    return env, rep, fp


def test_a_fetch_behind_a_hole_moves_only_the_missing_blocks():
    """Prompt 1-13 on the holed replica: the lookup starts at block 0 (the hole) and the pool
    holds 1-12, but blocks 5-12 are on the replica's GPU behind the hole: only 1-4 are fetched
    (1 ms + 4,000 B / 1 MB/s = 5 ms, against 16 tokens x 1 ms of recompute), leased and moved;
    they fill the hole, and the whole prefix 1-12 is on the GPU when the request arrives
    (before: all 12 blocks, 13 ms and 12,000 bytes)."""
    env, rep, fp = holed(per_token_s=1e-3)
    ids = np.arange(1, 14)
    fp.submit(pool_request(7, *ids), 0)
    assert fp.pool.leases == {1: 1, 2: 1, 3: 1, 4: 1}
    env.run()
    assert rep.got == [(7, pytest.approx(0.005))]
    assert fp.transfers == [(0.0, pytest.approx(0.005), 4000)]
    assert (fp.fetched_blocks, fp.wasted_blocks) == (4, 0)
    assert fp.record.landed[7] == [(0, 4)]
    assert rep.cache.gpu_prefix_blocks(ids) == 12
    assert set(range(1, 13)) <= rep.ever


def test_a_hole_fetch_is_priced_against_recomputing_the_hole_only():
    """The same lookup at 0.3 ms per token: fetching the 4 missing blocks (5 ms) is slower
    than recomputing their 16 tokens (4.8 ms): refused, 4 blocks left in the pool (before:
    12 blocks in 13 ms against 48 tokens, 14.4 ms, taken)."""
    env, rep, fp = holed(per_token_s=3e-4)
    fp.submit(pool_request(7, *range(1, 14)), 0)
    env.run()
    assert rep.got == [(7, 0.0)]
    assert (fp.fetches, fp.refusals, fp.refused_blocks) == (0, 1, 4)


def test_a_landing_stops_where_a_block_between_the_fetched_ones_left_the_gpu():
    """While blocks 1-4 are fetched, the replica makes room for 8 blocks (4 are free):
    Penelope frees the front of A's GPU part (5-8, next to the hole). The landing fills 1-4
    and stops at block 5, which is neither fetched nor on the GPU any more: nothing is
    wasted, and the request finds 1-4 on the GPU, then a hole, then 9-12."""
    env, rep, fp = holed(per_token_s=1e-3)
    ids = np.arange(1, 14)
    fp.submit(pool_request(7, *ids), 0)
    assert rep.cache.make_room(8).ok
    env.run()
    assert fp.record.landed[7] == [(0, 4)] and (fp.fetched_blocks, fp.wasted_blocks) == (4, 0)
    assert [(s, e, t.name) for s, e, t in rep.cache.tier_runs(ids)] == [
        (0, 4, "GPU"), (4, 8, "NONE"), (8, 12, "GPU")]
