"""Mooncake FAST'25 traces: JSONL, one request per line.

``{timestamp: ms, input_length, output_length, hash_ids: [one per 512-token block]}``; ids are
global across users and chained; the last id may cover a partial block (``ceil``) or be absent
(``floor``): both are accepted. There are no sessions and no reply times:
- default: every request is its own session, sent at its timestamp (open-loop replay);
- ``rebuild_sessions``: a request continues the session whose latest request's full 512-token
  blocks are a prefix of its own (the longest such session), else starts a new one; its gap is
  the send-to-send time (the trace has no reply times) with kind ``human``. A prompt whose last
  full block is a branching point of the trace (followed by different blocks in different
  requests, like the end of a shared system prompt) is never continued: that would merge
  unrelated users.
"""

from __future__ import annotations

import itertools

from .blocks import UniqueIds, check_block_sizes, id_array, map_block_ids
from .builder import TraceBuilder
from .errors import RecordReader, TraceFormatError
from .files import iter_jsonl, list_files
from .kinds import GAP_HUMAN, kinds_mask

MOONCAKE_BLOCK = 512


def load_mooncake(paths: list[str], b: TraceBuilder, lenient: bool,
                  rebuild_sessions: bool = False) -> None:
    check_block_sizes(MOONCAKE_BLOCK, b.block_size, "a Mooncake trace")
    unique = UniqueIds()
    text = kinds_mask(["text"])
    for scope, path in enumerate(list_files(paths, (".jsonl",))):
        skipped = [0]
        prev_ts: float | None = None
        tails: dict[tuple[int, int], int] = {}  # (last full id, n full blocks) -> session
        branching = _branching_ids(path) if rebuild_sessions else set()
        last_send: dict[int, float] = {}
        n = 0
        name = path.name
        # plain json: a Mooncake record's few dozen ids parse faster as Python ints than
        # through blocks.parse_json_with_id_lists (made for cc-traces' long lists)
        for line, obj in iter_jsonl(path, lenient, skipped):
            try:
                rec = RecordReader(str(path), line, obj)
                ts = rec.seconds("timestamp")
                if prev_ts is not None and ts < prev_ts:
                    raise rec.fail("timestamp", f"time goes backwards ({ts} < {prev_ts})")
                p = rec.count("input_length")
                o = rec.count("output_length")
                ids = id_array(rec, "hash_ids")
                lo, hi = p // MOONCAKE_BLOCK, -(-p // MOONCAKE_BLOCK)
                if not lo <= ids.shape[0] <= hi:
                    raise rec.fail("hash_ids", f"{ids.shape[0]} ids for {p} prompt tokens "
                                   f"(expected {lo} or {hi} {MOONCAKE_BLOCK}-token blocks)")
                cache_ids = map_block_ids(ids, MOONCAKE_BLOCK, p, b.block_size, unique)
            except TraceFormatError:
                if not lenient:
                    raise
                b.skipped += 1
                continue
            prev_ts = ts
            send = ts / 1000.0
            full = ids[:lo].tolist()
            h = -1
            if rebuild_sessions:
                for j in range(len(full) - 1, -1, -1):
                    h = tails.get((full[j], j + 1), -1)
                    if h >= 0:
                        del tails[(full[j], j + 1)]
                        break
            if h < 0:
                h = b.open_session(f"{name}#{n}", scope=scope)
                n += 1
            gap = send - last_send.get(h, send)
            b.add(h, prompt=p, output=o, ids=cache_ids, send_time_s=send, gap_s=gap,
                  gap_kind=GAP_HUMAN, model="", kinds=text, hash_ids=ids)
            last_send[h] = send
            if rebuild_sessions and full and full[-1] not in branching:
                tails[(full[-1], len(full))] = h
            if not rebuild_sessions:
                b.close(h)
        b.skipped += skipped[0]


def _branching_ids(path) -> set[int]:
    """Full-block ids followed by two different full-block ids somewhere in the file (a first
    pass; a trailing partial block is not a continuation)."""
    child: dict[int, int] = {}
    out: set[int] = set()
    for _line, obj in iter_jsonl(path, True, [0]):
        ids = obj.get("hash_ids") if isinstance(obj, dict) else None
        n = obj.get("input_length") if isinstance(obj, dict) else None
        if not isinstance(ids, list) or not isinstance(n, int):
            continue
        for a, b in itertools.pairwise(ids[: n // MOONCAKE_BLOCK]):
            if child.setdefault(a, b) != b:
                out.add(a)
    return out
