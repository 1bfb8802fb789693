"""Block-id conversion: trace hash lists -> int64 arrays, and other block sizes -> the cache's.

Cache block k covers tokens ``[k*bs, (k+1)*bs)``; its id must identify the whole prefix up to
its last token. With chained trace ids, the trace block m that holds that last token identifies
the prefix up to the end of m, so the cache id is the pair (id of m, offset of the last token in
m), packed as ``id * trace_bs + offset``. This maps 16-token blocks onto 64 (every 4th id) and
512 onto 64 (8 sub-ids per id) without loss; other ratios would lose sharing, so loaders
refuse them (``check_block_sizes``). Cache blocks beyond the last trace id (a trailing partial
trace block that has no id) get ids unique to the request (``unique_ids``): they are never shared.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from .errors import OptionError, RecordReader

_MAX_PACK = np.iinfo(np.int64).max // 1024


_KEYS = (b'"hash_ids"', b'"block_ids"')
ID_MARK = "\u0000ids:"
_LEADING_ZERO = re.compile(rb"(?:^|,)-?0\d")  # JSON forbids 01 / -01
_I64 = np.iinfo(np.int64)


def _int_list(body: bytes) -> np.ndarray | None:
    """Parse ``1, 2, 3`` (strict JSON integers) in C, or None to leave it to json."""
    compact = body.strip().replace(b", ", b",")
    if not compact:
        return np.zeros(0, np.int64)
    if compact.translate(None, b"0123456789,-") or b",," in compact or compact.startswith(
            b",") or compact.endswith(b",") or _LEADING_ZERO.search(compact):
        return None  # not plain JSON integers: json and the strict checks decide
    try:
        a = np.fromstring(compact, dtype=np.int64, sep=",")
    except ValueError:
        return None
    if a.shape[0] != compact.count(b",") + 1 or (a.shape[0] and (
            a.max() == _I64.max or a.min() == _I64.min)):
        return None  # a parse stopped early, or a value may have overflowed (saturates)
    return a


def parse_json_with_id_lists(data: bytes) -> tuple[Any, list[np.ndarray]]:
    """``json.loads`` that parses well-formed integer id lists with numpy instead of Python.

    Each ``"hash_ids": [1, 2, ...]`` (strict JSON integers only) becomes a placeholder string
    pointing into the returned table; anything else is left for the strict per-record checks.
    Faster than plain json on cc-traces, and no Python int per id."""
    table: list[np.ndarray] = []
    parts: list[bytes] = []
    pos = 0
    nxt = {k: data.find(k) for k in _KEYS}  # next occurrence of each key (-1: none left)
    while True:
        for k in _KEYS:
            if 0 <= nxt[k] < pos:
                nxt[k] = data.find(k, pos)
        hits = [(i, k) for k, i in nxt.items() if i >= 0]
        if not hits:
            break
        i, key = min(hits)
        j = i + len(key)
        while j < len(data) and data[j] in b" \t\r\n:":
            j += 1
        if j >= len(data) or data[j] != ord("[") or b":" not in data[i + len(key):j]:
            parts.append(data[pos:j])
            pos = j
            continue
        close = data.find(b"]", j)
        ids = _int_list(data[j + 1:close]) if close > 0 else None
        if ids is None:
            parts.append(data[pos:j])
            pos = j
            continue
        table.append(ids)
        parts.append(data[pos:i])
        parts.append(b'%s: "\\u0000ids:%d"' % (key, len(table) - 1))
        pos = close + 1
    parts.append(data[pos:])
    return json.loads(b"".join(parts)), table


def id_array(rec: RecordReader, field: str, table: list[np.ndarray] | None = None) -> np.ndarray:
    """A JSON list of integer ids (or integer strings) -> int64 array, else a named error."""
    v0 = rec.raw(field)
    if table is not None and isinstance(v0, str) and v0.startswith(ID_MARK):
        i = v0[len(ID_MARK):]
        if i.isdigit() and int(i) < len(table):
            return table[int(i)]
    v: Any = rec.id_list(field)
    if not v:
        return np.zeros(0, np.int64)
    # numpy reads true as 1 and truncates 1.5 to 1, so the element types are checked first
    # (one C-level pass); integer strings are ids too
    kinds = set(map(type, v))
    if kinds == {int}:
        try:
            return np.array(v, dtype=np.int64)
        except OverflowError:
            raise rec.fail(field, "expected a list of integers that fit in 64 bits") from None
    if kinds <= {int, str}:
        try:
            return np.array([str(x) for x in v] if int in kinds else v).astype(np.int64)
        except (ValueError, OverflowError):
            pass
    odd = sorted(k.__name__ for k in kinds - {int, str})
    raise rec.fail(field, "expected a list of integers"
                   + (f" (got {', '.join(odd)})" if odd else ""))


class UniqueIds:
    """Ids no trace id uses: negative, unique within one loader run (dense-ranked later)."""

    def __init__(self) -> None:
        self.next = -1

    def fresh(self, n: int) -> np.ndarray:
        """``n`` ids never handed out before."""
        a = np.arange(self.next, self.next - n, -1, dtype=np.int64)
        self.next -= n
        return a


def check_block_sizes(trace_bs: int, cache_bs: int, where: str) -> None:
    """Refuse a cache block size that is neither a divisor nor a multiple of the trace's:
    the mapping above could then only keep the sharing of whole common blocks of both sizes,
    so the hit rate would silently fall (64-token traces under 63-token blocks: 74% -> 45%)."""
    if cache_bs % trace_bs and trace_bs % cache_bs:
        fits = sorted({d for d in (trace_bs // 2, trace_bs, 2 * trace_bs) if d >= 1})
        raise OptionError(f"--block-size {cache_bs}: {where} has {trace_bs}-token blocks; a "
                          f"block size must divide it or be a multiple of it (e.g. "
                          f"{', '.join(map(str, fits))}), else cached prefixes are lost")


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
        out[k:] = unique.fresh(n - k)
    return out
