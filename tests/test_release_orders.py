"""The block pool frees in the order the policy gives (policies/eviction.py ``ReleaseOrder``,
sim/kvcache/blockpool.py ``BlockPool.free``), as vLLM's ``free_blocks(ordered_blocks)``: the
start position owns its release order, and the pool reads nothing else of it."""

from __future__ import annotations

import numpy as np
import pytest

from policies import LEAF_HEAD, PRIVATE_HEAD, TAIL, KeepFront, ObservedStart, get_policy
from policies.eviction import (
    FREE_ORDERS,
    ReleaseOrder,
    penelope_free_order,
    vllm_free_order,
)
from sim.engines.vllm import free_order_name, release_order
from sim.kvcache.blockpool import BlockPool, HolePool

BS = 4


class FrontFirst(ReleaseOrder):
    """Head first. It carries the attribute the pool once read as "plain reverse order": the
    pool must obey the order, not an attribute."""

    name, reads_shared = "front-first", False
    reverse = True

    def __call__(self, shared: np.ndarray) -> np.ndarray:
        return np.arange(len(shared), dtype=np.int64)


def queued_ids(pool: BlockPool) -> list[int]:
    """Ids of the hashed blocks in the free queue, front (evicted first) to back."""
    b = pool.block_ids()[pool.free_queue() - 1]
    return b[b >= 0].tolist()


@pytest.mark.parametrize("pool_class", [BlockPool, HolePool])
@pytest.mark.parametrize(("order", "queued"), [(vllm_free_order, [3, 2, 1]),
                                                (FrontFirst(), [1, 2, 3]),
                                                (penelope_free_order, [1, 2, 3])])
def test_the_pool_frees_in_the_order_it_is_given(pool_class, order, queued):
    pool = pool_class(6, BS, order, debug=True)
    pool.admit(0, np.asarray([1, 2, 3], np.int64), 12, 12)
    pool.free(0)
    assert queued_ids(pool) == queued


@pytest.mark.parametrize("order", list(FREE_ORDERS.values()))
def test_release_is_the_table_in_the_orders_positions(order):
    rng = np.random.default_rng(7)
    for n in range(1, 12):
        table = rng.permutation(100)[:n].astype(np.int64)
        shared = np.zeros(n, bool)
        shared[: rng.integers(0, n + 1)] = True
        mask = shared if order.reads_shared else None
        assert order.release(table, mask).tolist() == table[order(shared)].tolist()


def test_each_start_owns_its_release_order():
    assert TAIL.release_order is vllm_free_order
    assert PRIVATE_HEAD.release_order is penelope_free_order
    assert LEAF_HEAD.release_order is None  # a block pool has no node to start from
    # a wrapped start changes chains or reports victims: no block pool counterpart
    assert KeepFront(TAIL, lambda node: False).release_order is None
    assert ObservedStart(PRIVATE_HEAD, lambda node: None).release_order is None
    assert release_order(get_policy("penelope")) is penelope_free_order
    assert free_order_name(get_policy("lru+tail+block")) == "vllm"
    with pytest.raises(ValueError, match="unknown free order 'lru'"):
        BlockPool(4, BS, "lru")
