"""sim/fleet/active.py ``ActivePrompts`` against the per-block reference count it replaces
(``dict[id, count]``, one entry per block of every active prompt): the same unique count, the
same active prefix of any prompt and the same blocks gained and freed, on random streams of
chained prompts (prefixes of a few branching token sequences, ids chained as the traces'
are: one id per distinct prefix)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.fleet.active import ActivePrompts

# a prompt: a short sequence over a small alphabet, so prompts share and diverge often
tokens = st.lists(st.integers(0, 2), max_size=12)


class Chain:
    """Chained ids: one id per distinct token prefix (the id of block i names blocks 0..i)."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, ...], int] = {}

    def __call__(self, seq: list[int]) -> np.ndarray:
        out = [self.ids.setdefault(tuple(seq[: i + 1]), len(self.ids) + 7)
               for i in range(len(seq))]
        return np.asarray(out, dtype=np.int64)


class RefCount:
    """The block-by-block model."""

    def __init__(self) -> None:
        self.refs: dict[int, int] = {}

    def add(self, ids: np.ndarray) -> int:
        new = 0
        for b in ids.tolist():
            new += b not in self.refs
            self.refs[b] = self.refs.get(b, 0) + 1
        return new

    def remove(self, ids: np.ndarray) -> int:
        freed = 0
        for b in ids.tolist():
            self.refs[b] -= 1
            if not self.refs[b]:
                del self.refs[b]
                freed += 1
        return freed

    def prefix(self, ids: np.ndarray) -> int:
        k = 0
        while k < len(ids) and int(ids[k]) in self.refs:
            k += 1
        return k


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "add"]), tokens,
                          st.integers(0, 1000)), max_size=40))
def test_active_prompts_equal_per_block_refcounts(ops):
    chain, fast, model = Chain(), ActivePrompts(), RefCount()
    live: list[np.ndarray] = []
    for op, seq, pick in ops:
        ids = chain(seq)
        assert fast.prefix(ids) == model.prefix(ids)
        if op == "add" or not live:
            assert fast.add(ids) == model.add(ids)
            live.append(ids)
        else:
            gone = live.pop(pick % len(live))
            assert fast.remove(gone) == model.remove(gone)
        assert fast.unique == len(model.refs)
        assert fast.prompts == len(live) and len(fast) == fast.unique
    for ids in live:  # draining leaves nothing behind
        assert fast.remove(ids) == model.remove(ids)
    assert fast.unique == 0 and not model.refs
    assert fast.prefix(chain([0, 1, 2])) == 0


def test_splits_and_joins_by_hand():
    chain, act = Chain(), ActivePrompts()
    a, b, c = chain([0, 0, 0, 0]), chain([0, 0, 1]), chain([0, 0])
    assert act.add(a) == 4
    assert act.add(b) == 1  # shares [0, 0]: the edge splits after two blocks
    assert act.add(c) == 0  # ends at the split
    assert act.unique == 5
    assert act.prefix(chain([0, 0, 0, 1])) == 3
    assert act.remove(a) == 2  # its own two blocks leave; [0, 0] stays for b and c
    assert act.remove(c) == 0
    assert act.prefix(chain([0, 0, 1, 2])) == 3
    assert act.remove(b) == 3
    assert act.unique == 0 and act.edges == 0


def test_splits_do_not_outlive_the_prompts_that_made_them():
    chain, act = Chain(), ActivePrompts()
    long = chain([0] * 10)
    act.add(long)
    for k in range(1, 10):  # each shorter prompt splits the edge where it ends
        act.add(chain([0] * k))
    assert act.edges == 10
    for k in range(1, 10):
        act.remove(chain([0] * k))
    assert act.edges == 1 and act.unique == 10
    act.add(chain([0, 0, 1]))  # a branch, then gone again: one edge again
    act.remove(chain([0, 0, 1]))
    assert act.edges == 1


def test_removing_what_was_not_added_is_an_error():
    chain, act = Chain(), ActivePrompts()
    act.add(chain([1, 2, 3]))
    with pytest.raises(KeyError):
        act.remove(chain([1, 2]))  # a prefix of an active prompt, never added itself
    with pytest.raises(KeyError):
        act.remove(chain([2]))
