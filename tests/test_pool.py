"""The shared KV pool (sim/fleet/pool.py): hand-computed puts, lookups, leases and evictions."""

from __future__ import annotations

import pytest

from sim.fleet.pool import SharedPool
from tests.chained import ids


def test_lookup_is_a_contiguous_prefix_from_the_start_position():
    pool = SharedPool(100)
    pool.put(ids(1, 2, 4))
    assert pool.prefix(ids(1, 2, 3, 4)) == 2
    assert pool.prefix(ids(1, 2, 3, 4), 3) == 1
    assert pool.prefix(ids(9, 1, 2), 0) == 0
    assert pool.prefix(ids(9, 1, 2), 1) == 2


def test_eviction_at_the_watermark_drops_five_percent_skipping_a_leased_block():
    """Capacity 40, watermark 0.9: the pass runs before the put that finds 36 blocks held and
    drops ceil(0.05 x 36) = 2 blocks, least recently used first. Block 0 is leased by a fetch
    in flight and then the least recent (the others were fetched after it), so blocks 1 and
    2 go; block 0 stays. Once released it is the first to go."""
    pool = SharedPool(40, watermark=0.90, evict_fraction=0.05)
    assert pool.put(ids(*range(36))) == 36
    assert pool.passes == 0
    pool.lease(ids(0))
    pool.lease(ids(0))  # two fetches of one block: leased until both complete
    rest = ids(*range(1, 36))
    pool.lease(rest)
    pool.release(rest)  # recency order now 0, 1, ..., 35
    pool.release(ids(0))
    assert pool.put(ids(100)) == 1
    assert pool.passes == 1
    assert 0 in pool and 1 not in pool and 2 not in pool and 3 in pool and 100 in pool
    assert (len(pool), pool.evicted) == (35, 2)
    pool.release(ids(0))
    pool.put(ids(101))  # 35 held: below 36, no pass
    assert pool.put(ids(102)) == 1  # 36 held: a pass drops ceil(1.8) = 2: now 0 and 3
    assert 0 not in pool and 3 not in pool and 4 in pool


def test_a_fetch_makes_blocks_most_recent():
    pool = SharedPool(10, watermark=0.9, evict_fraction=0.05)
    pool.put(ids(*range(9)))
    pool.lease(ids(0, 1))
    pool.release(ids(0, 1))
    pool.put(ids(50))  # 9 held >= 9: one pass drops max(1, ceil(0.45)) = 1 block: block 2
    assert 0 in pool and 1 in pool and 2 not in pool


def test_a_put_is_refused_when_every_block_is_leased():
    pool = SharedPool(2, watermark=1.0, evict_fraction=0.5)
    pool.put(ids(1, 2))
    pool.lease(ids(1, 2))
    assert pool.put(ids(3)) == 0
    assert (pool.rejected, len(pool)) == (1, 2)


@pytest.mark.parametrize("kw", [dict(capacity_blocks=0), dict(capacity_blocks=4, watermark=0),
                                dict(capacity_blocks=4, evict_fraction=1.5)])
def test_bad_pool_parameters(kw):
    with pytest.raises(ValueError):
        SharedPool(**kw)


def test_a_pass_during_a_put_can_drop_a_block_of_the_same_put():
    """One block, watermark 0.9: each new block first drops the one held. Putting [1, 2]
    twice: 1 goes in, 2 drops it; then 1 (absent) drops 2, and 2 (absent again) drops 1."""
    pool = SharedPool(1)
    assert pool.put(ids(1, 2)) == 2 and list(pool.blocks) == [2]
    assert pool.put(ids(1, 2)) == 2 and list(pool.blocks) == [2]
    assert (pool.stored, pool.evicted, pool.passes) == (4, 3, 3)
