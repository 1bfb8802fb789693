"""sim/engines/known.py: the compact ever-inserted set answers exactly as a Python set does,
for dense trace ids, versioned and dropped keys (sim/kvcache/versions.py) and sparse ids."""

from __future__ import annotations

import numpy as np
import pytest

from sim.engines import known
from sim.engines.known import KnownBlocks


def _check_members(kb: KnownBlocks, ref: set[int], probes: np.ndarray) -> None:
    assert [int(x) in kb for x in probes] == [int(x) in ref for x in probes]
    assert kb.to_array().tolist() == sorted(ref)


@pytest.mark.parametrize("seed", range(4))
def test_random_inserts_match_a_python_set(seed, monkeypatch):
    """Mixed batches: dense ids from 0, ids just past the flags, negative (dropped) keys,
    keys with a version above bit 40, and repeats. A small floor makes the flags grow,
    and refuse to grow, within the test."""
    monkeypatch.setattr(known, "FLOOR_IDS", 64)
    rng = np.random.default_rng(seed)
    kb, ref = KnownBlocks(), set()
    for _ in range(60):
        kind = rng.integers(4)
        n = int(rng.integers(0, 200))  # both insert paths (SMALL)
        if kind == 0:
            ids = rng.integers(0, 4000, n)
        elif kind == 1:
            ids = -1 - rng.integers(0, 4000, n)
        elif kind == 2:
            ids = rng.integers(0, 4000, n) + (int(rng.integers(1, 5)) << 40)
        else:
            ids = rng.integers(0, 1 << 62, n)
        kb.add(ids.astype(np.int64))
        ref.update(ids.tolist())
        probes = np.concatenate([ids, rng.integers(-5000, 5000, 50),
                                 rng.integers(0, 1 << 62, 5)])
        _check_members(kb, ref, probes)


def test_the_flags_stay_dense():
    """One id far out cannot make the flags cover the range below it: past the floor it goes
    to the overflow set (the flags are at most DENSITY per id inserted)."""
    kb = KnownBlocks()
    kb.add(np.asarray([3, 1 << 39], dtype=np.int64))
    assert 3 in kb and (1 << 39) in kb and 4 not in kb and (1 << 39) + 1 not in kb
    assert kb.covered <= known.FLOOR_IDS


@pytest.mark.parametrize("seed", range(3))
def test_known_prefix_is_the_leading_known_run(seed):
    """Chained ids: whenever the known ids of ``ids`` form a prefix, ``known_prefix`` is its
    length, at every length from 0 to all."""
    rng = np.random.default_rng(seed)
    kb = KnownBlocks()
    chain = np.concatenate([rng.permutation(5000)[:300], [-7, 1 << 41, 9 << 40]])
    chain = chain.astype(np.int64)
    for k in range(chain.size + 1):
        assert kb.known_prefix(chain) == k
        if k < chain.size:
            kb.add(chain[k:k + 1])
    assert kb.known_prefix(chain[:0]) == 0
