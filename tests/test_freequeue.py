"""The free queue's per-block calls (sim/kvcache/freequeue.py ``pop_list``, ``append_one``,
``prepend_list``: a block edge's few blocks without arrays) against its array calls on a twin
queue: the same blocks popped, the same order front to back, after every op. The array calls
themselves are held to vLLM's list semantics by tests/test_vllm_blockpool.py."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kvcache.freequeue import FreeQueue


def _same(a: FreeQueue, b: FreeQueue) -> None:
    a.check()
    b.check()
    assert a.blocks().tolist() == b.blocks().tolist()
    assert len(a) == len(b) and a.hashed == b.hashed


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([6, 40]),
       st.lists(st.tuples(st.sampled_from(["pop", "pop", "remove", "append", "prepend"]),
                          st.integers(0, 8), st.integers(0, 40)), max_size=120))
def test_per_block_calls_are_the_array_calls(cap: int, steps) -> None:
    """Pops past dead entries (a hit took a hashed block out of the middle), appends that
    fill the log (it compacts), prepends of several blocks, and pops of both parts at once."""
    ours, twin = FreeQueue(cap), FreeQueue(cap)
    free = list(range(1, cap + 1))  # front to back
    hashed: set[int] = set()
    for op, k, skip in steps:
        held = [b for b in range(1, cap + 1) if b not in set(free)]
        if op == "pop":
            k = min(k, len(free))
            got = ours.pop_list(k)
            want = twin.pop(k)
            assert got == (want[0].tolist(), want[1].tolist())
            assert got[0] + got[1] == free[:k]
            hashed -= set(got[1])
            free = free[k:]
        elif op == "remove":  # not a per-block call: it makes the dead entries pops skip
            blocks = [b for b in free if b in hashed][skip % 7 : skip % 7 + k]
            for q in (ours, twin):
                q.remove(np.array(blocks, np.int64))
            free = [b for b in free if b not in set(blocks)]
        elif op == "append":
            blocks = held[skip % 5 : skip % 5 + k]
            for b in blocks:
                ours.append_one(b)
            twin.append(np.array(blocks, np.int64))
            hashed |= set(blocks)
            free = free + blocks
        else:
            blocks = [b for b in held if b not in hashed][skip % 5 : skip % 5 + k]
            ours.prepend_list(blocks)
            twin.prepend(np.array(blocks, np.int64))
            free = blocks + free
        _same(ours, twin)
        assert ours.blocks().tolist() == free


def test_append_one_compacts_a_full_log() -> None:
    """One block at a time through a 2-block queue: many times the log's length appended and
    popped, so ``append_one`` finds the log full and compacts it, its order kept."""
    ours, twin = FreeQueue(2), FreeQueue(2)
    for q in (ours, twin):
        q.pop(2)
    for i in range(500):
        b = 1 + i % 2
        ours.append_one(b)
        twin.append(np.array([b], np.int64))
        _same(ours, twin)
        if i % 2:
            got = ours.pop_list(2)
            want = twin.pop(2)
            assert got == ([], want[1].tolist()) == ([], [2 - i % 2, 1 + i % 2])
            _same(ours, twin)
