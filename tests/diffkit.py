"""The lockstep driver of the differential tests for SGLang's trees (the legacy RadixCache,
the UnifiedRadixCache and its hybrids: tests/test_sglang_diff.py, test_sglang_unified_diff.py,
test_sglang_hybrid_diff.py): the real code and kvsim's driven together, failing at the first
difference."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from benchmarks.opreplay import replay
from benchmarks.opstream import ALLOC, CHUNK, FINISH, OP_NAMES, OpStream
from benchmarks.sglang_ref import torch_single_thread


def _id_list(x: np.ndarray | None) -> list[int]:
    return [] if x is None else x.tolist()


def sglang_lockstep(stream: OpStream, theirs: Any, ours: Any,
                    limits: dict[tuple[str, ...], int], label: str = "") -> Counter:
    """Replay ``stream`` through SGLang (``theirs``) and kvsim (``ours``), two sides of
    benchmarks/opreplay.py or benchmarks/sglang_unified_ops.py; after every op both agree on
    the hit, the branching point, the admission, the block ids freed in each pool and every
    key of the state (sizes, resident ids), and each sum of state keys in ``limits`` stays
    within its capacity. Returns what happened (ops by kind, hits, branching points, aborts,
    blocks freed; a hybrid's SWA blocks and Mamba states freed)."""
    seen: Counter = Counter()
    with torch_single_thread():
        for a, b in zip(replay(stream, theirs), replay(stream, ours), strict=True):
            where = f"{stream.name}{label} op {a.index} {OP_NAMES[a.op]} r{a.rid}"
            assert (a.hit, a.branching, a.ok) == (b.hit, b.branching, b.ok), (
                f"{where}: hit/branching/ok {(a.hit, a.branching, a.ok)} (SGLang) != "
                f"{(b.hit, b.branching, b.ok)} (kvsim)")
            fa, sa = _id_list(a.freed), _id_list(a.swa)
            fb, sb = _id_list(b.freed), _id_list(b.swa)
            assert fa == fb, f"{where}: freed {fa} (SGLang) != {fb} (kvsim)"
            assert sa == sb, f"{where}: SWA freed {sa} (SGLang) != {sb} (kvsim)"
            assert a.state is not None and b.state is not None
            assert a.state.keys() == b.state.keys(), f"{where}: observed keys differ"
            for k, va in a.state.items():
                vb = b.state[k]
                if isinstance(va, np.ndarray):
                    assert np.array_equal(va, vb), (
                        f"{where}: resident {k} differ: only SGLang {np.setdiff1d(va, vb)[:8]}, "
                        f"only kvsim {np.setdiff1d(vb, va)[:8]}")
                else:
                    assert va == vb, f"{where}: {k} {va} (SGLang) != {vb} (kvsim)"
            for keys, cap in limits.items():
                assert sum(a.state[k] for k in keys) <= cap, f"{where}: {keys} over {cap}"
            seen["ops"] += 1
            seen[OP_NAMES[a.op]] += 1
            seen["hit"] += max(a.hit, 0)
            seen["branching"] += a.branching is not None
            seen["aborted"] += not a.ok
            seen["freed"] += len(fa)
            seen["duplicates_freed"] += len(fa) if a.op in (CHUNK, FINISH) else 0
            if a.swa is not None:  # a hybrid's second pool: SWA block ids, a Mamba state -1
                states = sa.count(-1)
                seen["states_freed"] += states
                seen["swa_freed"] += len(sa) - states
                if a.op == ALLOC:
                    seen["swa_only_freed"] += len(sa) - states - len(fa)
    return seen
