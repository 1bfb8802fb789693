"""Block-id conversion: trace hash lists -> int64 arrays, and other block sizes -> the cache's.

Cache block k covers tokens ``[k*bs, (k+1)*bs)``; its id must identify the whole prefix up to
its last token. With chained trace ids, the trace block m that holds that last token identifies
the prefix up to the end of m, so the cache id is the pair (id of m, offset of the last token in
m), packed as ``id * trace_bs + offset``. This maps 16-token blocks onto 64 (every 4th id) and
512 onto 64 (8 sub-ids per id) without loss; other ratios may miss a little sharing, never
invent it. Cache blocks beyond the last trace id (a trailing partial trace block that has no id)
get ids unique to the request (``unique_ids``): they are never shared.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import RecordReader

_MAX_PACK = np.iinfo(np.int64).max // 1024


def id_array(rec: RecordReader, field: str) -> np.ndarray:
    """A JSON list of integer ids (or integer strings) -> int64 array, else a named error."""
    v: Any = rec.id_list(field)
    if not v:
        return np.zeros(0, np.int64)
    if type(v[0]) is int and type(v[-1]) is int:  # the common case: fast typed conversion
        try:
            return np.array(v, dtype=np.int64)
        except (ValueError, TypeError, OverflowError):
            pass
    try:
        a = np.asarray(v)
    except (ValueError, TypeError, OverflowError):
        raise rec.fail(field, "expected a list of integers") from None
    if a.ndim != 1:
        raise rec.fail(field, "expected a flat list of integers")
    if a.dtype.kind in "iu":
        return a.astype(np.int64, copy=False)
    if a.dtype.kind == "U":
        try:
            return a.astype(np.int64)
        except (ValueError, OverflowError):
            pass
    raise rec.fail(field, "expected a list of integers")


class UniqueIds:
    """Ids no trace id uses: negative, unique within one loader run (dense-ranked later)."""

    def __init__(self) -> None:
        self.next = -1

    def take(self, n: int) -> np.ndarray:
        a = np.arange(self.next, self.next - n, -1, dtype=np.int64)
        self.next -= n
        return a


def map_block_ids(ids: np.ndarray, trace_bs: int, prompt_tokens: int, cache_bs: int,
                  unique: UniqueIds) -> np.ndarray:
    """Cache-block ids (``prompt_tokens // cache_bs`` of them) from chained trace-block ids."""
    n = prompt_tokens // cache_bs
    if trace_bs == cache_bs and ids.shape[0] >= n:
        return ids[:n]
    last_tok = (np.arange(1, n + 1, dtype=np.int64) * cache_bs) - 1
    m = last_tok // trace_bs
    have = m < ids.shape[0]
    k = int(np.count_nonzero(have))  # m is increasing, so the known ones are a prefix
    out = np.empty(n, np.int64)
    if k:
        mk = m[:k]
        src = ids[mk]
        if cache_bs % trace_bs == 0:  # every cache block ends at a trace block end
            out[:k] = src
        else:
            if src.size and (src.min() < 0 or src.max() > _MAX_PACK):
                # keep packing exact: remap huge or negative ids densely per call is not
                # consistent across requests, so fold them into the positive range instead
                src = np.abs(src) % _MAX_PACK
            out[:k] = src * trace_bs + (last_tok[:k] % trace_bs)
    if k < n:
        out[k:] = unique.take(n - k)
    return out
