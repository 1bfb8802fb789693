"""TraceLab rounds (uw-syfi/TraceLab): JSONL, one LLM round per line, or its DuckDB file.

Columns used: session_id, round_index, model, input_tokens_total, prefix_tokens (provider
cached tokens), newly_append_tokens (= input - prefix, checked), output_tokens,
first_input_event_type, timing_events[] {event_type, timestamp}. The DuckDB form (tables
rounds, timing_events joined on round_pk; see TraceLab's DB_SCHEMA.md) is read into the same
rows. Rounds are grouped by session_id (first appearance order) and ordered by (round_index,
file order).

No block hashes: ids are synthesized per session on an append-only history (prompt + output
of the previous round). A round that does not shrink (input >= previous input) extends that
history: it shares min(previous input + output, input) tokens. A shrink starts a new branch
that shares only ``prefix_tokens`` (what the provider found cached). Timing: a round is sent
at its last input event (user_message / tool_result) and its reply ends at its last other
event; the gap is send minus the previous round's reply end. Kind: tool when the first input
event is a tool result.

Regions (traces.regions): the first round's ``prefix_tokens`` (what the provider had cached
before the session's first request: content shared with other conversations, i.e. tool
definitions and system prompt, not split) is ``system``; each round adds the previous output
(``assistant``) and its input events: tool results only -> ``tool_result``, user messages
only -> ``user``, both -> ``tool_result``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from .builder import TraceBuilder
from .errors import RecordReader, TraceFormatError
from .files import iter_jsonl, list_files
from .kinds import GAP_HUMAN, GAP_TOOL, kinds_mask
from .regions import REGION_SYSTEM, input_region

INPUT_EVENTS = ("user_message", "tool_result")


@dataclass
class Round:
    file: str
    record: str
    session: str
    index: int
    order: int
    model: str
    input: int
    prefix: int
    output: int
    tool: bool
    send_s: float  # NaN when unknown
    reply_end_s: float
    kinds: int
    region: int  # of the new input (traces.regions)


def _ts(rec: RecordReader, field: str, v: Any) -> float:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    if not isinstance(v, str):
        raise rec.fail(field, f"expected an ISO timestamp, got {type(v).__name__}")
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise rec.fail(field, f"bad timestamp {v!r}") from None


def _round(rec: RecordReader, order: int,
           events: list[tuple[str, float]] | None = None) -> Round:
    sid = rec.string("session_id")
    idx = rec.count("round_index")
    p = rec.count("input_tokens_total")
    pre = rec.count("prefix_tokens", None)
    pre = 0 if pre is None else pre
    app = rec.count("newly_append_tokens", None)
    if pre > p:
        raise rec.fail("prefix_tokens", f"{pre} prefix tokens exceed the {p} input tokens")
    if app is not None and pre + app != p:
        raise rec.fail("newly_append_tokens", f"prefix {pre} + append {app} != input {p}")
    o = rec.count("output_tokens", None)
    o = 0 if o is None else o
    if events is None:
        events = []
        for i, e in enumerate(rec.obj_list("timing_events", [])):
            if not isinstance(e, dict) or "event_type" not in e or "timestamp" not in e:
                raise rec.fail(f"timing_events[{i}]", "expected {event_type, timestamp}")
            events.append((str(e["event_type"]), _ts(rec, f"timing_events[{i}].timestamp",
                                                     e["timestamp"])))
    first = rec.raw("first_input_event_type", None)
    ins = [t for k, t in events if k in INPUT_EVENTS]
    outs = [t for k, t in events if k not in INPUT_EVENTS]
    if first is None:
        first = next((k for k, _ in events if k in INPUT_EVENTS), "user_message")
    send = max(ins) if ins else (min(t for _, t in events) if events else float("nan"))
    end = max(outs) if outs else send
    kinds = [("tool_result" if k == "tool_result" else "text") for k, _ in events
             if k in INPUT_EVENTS] or ["text"]
    return Round(rec.file, str(rec.record), sid, idx, order, str(rec.raw("model", "") or ""),
                 p, pre, o, first == "tool_result", send, end, kinds_mask(kinds),
                 input_region(kinds))


def _fingerprint(rs: list[Round]) -> tuple:
    """What a session's rounds say, without its (anonymized) ids."""
    def t(x: float) -> float | None:
        return None if x != x else x  # NaN != NaN would make equal sessions differ

    return tuple((r.index, r.model, r.input, r.prefix, r.output, r.tool, t(r.send_s),
                  t(r.reply_end_s)) for r in rs)


def _emit(rounds: list[Round], b: TraceBuilder, lenient: bool) -> None:
    by: dict[str, list[Round]] = {}
    for r in rounds:
        by.setdefault(r.session, []).append(r)
    # TraceLab publishes a session twice under different anonymized ids (the sanitized and
    # the derived JSONL of example_sessions/): rounds, token counts and timestamps equal.
    # Keep the first copy; count the others in options["duplicate_sessions"].
    seen: set[tuple] = set()
    dups = 0
    for sid in list(by):
        by[sid].sort(key=lambda r: (r.index, r.order))
        fp = _fingerprint(by[sid])
        if fp in seen:
            del by[sid]
            dups += 1
        seen.add(fp)
    b.base_options["duplicate_sessions"] = dups
    bs = b.block_size
    t0 = min((r.send_s for r in rounds if np.isfinite(r.send_s)), default=0.0)
    for scope, (sid, rs) in enumerate(by.items()):
        h = b.open_session(sid, scope=scope, prefix_regions=((REGION_SYSTEM, rs[0].prefix),))
        hist = np.zeros(0, np.int64)  # ids of the full blocks of (previous input + output)
        hist_tokens = 0
        prev: Round | None = None
        nxt = 0
        for r in rs:
            if prev is not None and np.isfinite(r.send_s) and np.isfinite(prev.send_s) \
                    and r.send_s < prev.send_s:
                if not lenient:
                    raise TraceFormatError(r.file, r.record, "timing_events",
                                           "time goes backwards within session "
                                           f"{sid!r} (round {r.index})")
                b.skipped += 1
                continue
            if prev is None:
                shared = 0
            elif r.input >= prev.input:
                shared = min(hist_tokens, r.input)
            else:
                shared = min(r.prefix, hist_tokens, r.input)
            keep = shared // bs
            n = r.input // bs
            ids = np.concatenate([hist[:keep], np.arange(nxt, nxt + n - keep, dtype=np.int64)])
            nxt += n - keep
            gap = 0.0
            if prev is not None and np.isfinite(r.send_s) and np.isfinite(prev.reply_end_s):
                gap = max(0.0, r.send_s - prev.reply_end_s)
            b.add(h, prompt=r.input, output=r.output, ids=ids, send_time_s=r.send_s - t0,
                  gap_s=gap, gap_kind=GAP_TOOL if r.tool else GAP_HUMAN, model=r.model,
                  kinds=r.kinds, input_region=r.region)
            n_hist = (r.input + r.output) // bs
            hist = np.concatenate([ids, np.arange(nxt, nxt + n_hist - n, dtype=np.int64)])
            nxt += n_hist - n
            hist_tokens = r.input + r.output
            prev = r
        b.close(h)


def load_tracelab_jsonl(paths: list[str], b: TraceBuilder, lenient: bool) -> None:
    rounds: list[Round] = []
    order = 0
    for path in list_files(paths, (".jsonl",)):
        skipped = [0]
        for line, obj in iter_jsonl(path, lenient, skipped):
            try:
                rounds.append(_round(RecordReader(str(path), line, obj), order))
            except TraceFormatError:
                if not lenient:
                    raise
                b.skipped += 1
            order += 1
        b.skipped += skipped[0]
    _emit(rounds, b, lenient)


_ROUND_COLS = ("round_pk", "session_id", "round_index", "model", "input_tokens_total",
               "prefix_tokens", "newly_append_tokens", "output_tokens", "first_input_event_type")


def load_tracelab_duckdb(paths: list[str], b: TraceBuilder, lenient: bool) -> None:
    try:
        import duckdb
    except ImportError:
        raise TraceFormatError(paths[0], None, None, "reading a TraceLab DuckDB file needs "
                               "the optional duckdb package: pip install 'kvsim[duckdb]'") \
            from None
    rounds: list[Round] = []
    files: list[Path] = []
    for p in paths:
        path = Path(p)
        files.extend(sorted(f for f in path.iterdir() if f.name.endswith((".duckdb", ".db")))
                     if path.is_dir() else [path])
    for path in files:
        try:
            con = duckdb.connect(str(path), read_only=True)
        except Exception as e:  # duckdb raises its own IOException / InvalidInputException
            raise TraceFormatError(str(path), None, None, f"cannot open DuckDB file: {e}") \
                from None
        try:
            try:
                rows = con.execute(f"SELECT {', '.join(_ROUND_COLS)} FROM rounds "
                                   "ORDER BY round_pk").fetchall()
                ev = con.execute("SELECT round_pk, event_type, "
                                 "CAST(epoch_us(timestamp) AS BIGINT) FROM timing_events "
                                 "ORDER BY round_pk, event_index").fetchall()
            except Exception as e:
                raise TraceFormatError(str(path), None, None,
                                       f"not a TraceLab DuckDB file: {e}") from None
        finally:
            con.close()
        events: dict[int, list[tuple[str, float]]] = {}
        for pk, kind, us in ev:
            if us is not None:
                events.setdefault(pk, []).append((str(kind), us / 1e6))
        for row in rows:
            obj = dict(zip(_ROUND_COLS, row, strict=True))
            try:
                rec = RecordReader(str(path), f"rounds.round_pk={obj['round_pk']}", obj)
                rounds.append(_round(rec, len(rounds), events.get(obj["round_pk"], [])))
            except TraceFormatError:
                if not lenient:
                    raise
                b.skipped += 1
    if not rounds and not b.skipped:
        raise TraceFormatError(str(files[0]) if files else paths[0], None, None, "no rounds")
    _emit(rounds, b, lenient)
