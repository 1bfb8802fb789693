"""FreeInference agent traces (CC BY 4.0): weekly JSONL or the three Parquet tables.

No copy is available here; this follows the published schema (docs/traces.md):
- Parquet: a folder with ``sessions.parquet`` (session_id, harness, parent_session_id,
  spawned_by_step, spawned_by_call_index), ``requests.parquet`` (session_id, step, start_ms,
  end_ms, model, step_trigger, waited_for, prompt_tokens, completion_tokens, transition, cause,
  role_tokens {system, tool_definitions, ...}, block_ids) and optionally ``tool_calls.parquet``;
- JSONL: ``traces/<YYYY-MM-DD>.jsonl`` (+ ``manifest.json``), one top-level session per line
  with its ``requests``; each request's ``tool_calls`` may carry the sub-agent session it
  spawned as ``subagent`` (an object) or ``subagents`` (a list) -- our reading of "sub-agent
  sessions nested in the tool call that spawned them".
Block ids are 16-token blocks (floor or ceil count accepted), chained, week-local: one id
scope per file (Parquet folder or weekly JSONL). Times are milliseconds; send time = start_ms
from the first request of the file. Gap = start_ms - previous end_ms (from the end of the
latest sub-agent spawned at the previous step when later; when the previous end_ms is
missing, the longest tool ``latency_ms`` of that step); kind: tool when step_trigger is
``tool``. A sub-agent starts after its spawning step's reply (start offset = its first
start_ms - that step's end_ms). Shared-prefix hint: role_tokens system + tool_definitions of
the first request.

Regions (traces.regions): the session prefix is the first request's role_tokens
tool_definitions then system for the ``claude-code`` harness (the Messages API renders tools
first), system then tool_definitions for other harnesses (chat templates put the system
message first); each step adds the previous completion (``assistant``) and its input:
step_trigger tool -> ``tool_result``, user -> ``user``, anything else ``unknown``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .blocks import ID_MARK, UniqueIds, check_block_sizes, id_array, map_block_ids
from .builder import TraceBuilder
from .errors import RecordReader, TraceFormatError
from .files import iter_jsonl_ids, strip_gz
from .kinds import GAP_HUMAN, GAP_TOOL, kinds_mask
from .regions import REGION_SYSTEM, REGION_TOOL_RESULT, REGION_TOOLS, REGION_UNKNOWN, REGION_USER

FI_BLOCK = 16


class _Sess:
    def __init__(self, sid: str, file: str, record: str, harness: str):
        self.id, self.file, self.record, self.harness = sid, file, record, harness
        self.parent: _Sess | None = None
        self.spawned_by_step = -1
        self.requests: list[RecordReader] = []
        self.children: list[_Sess] = []
        self.table: list = []  # id arrays the requests' block_ids markers point into
        self.latency: dict[int, float] = {}  # step -> longest tool latency_ms of its calls


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            if (path / "requests.parquet").is_file():
                out.append(path)
                continue
            sub = path / "traces" if (path / "traces").is_dir() else path
            found = sorted(f for f in sub.iterdir() if strip_gz(f.name).endswith(".jsonl"))
            if not found:
                raise TraceFormatError(str(path), None, None,
                                       "empty folder: no requests.parquet or traces/*.jsonl")
            out.extend(found)
        elif path.is_file():
            out.append(path.parent if path.name.endswith(".parquet") else path)
        else:
            raise TraceFormatError(str(path), None, None, "no such file or folder")
    return list(dict.fromkeys(out))


def load_freeinference(paths: list[str], b: TraceBuilder, lenient: bool) -> None:
    check_block_sizes(FI_BLOCK, b.block_size, "a FreeInference trace")
    unique = UniqueIds()
    for scope, f in enumerate(_files(paths)):
        tops = _read_parquet(f, b, lenient) if f.is_dir() else _read_jsonl(f, b, lenient)
        starts = [r.number("start_ms", None) for s in tops for r in s.requests[:1]]
        starts = [x for x in starts if x is not None]
        t0 = min(starts) if starts else 0.0
        for s in tops:
            _emit(s, b, scope, unique, lenient, t0)


def _nested(sess_obj: Any, file: str, record: str, parent: _Sess | None, step: int,
            b: TraceBuilder, lenient: bool, table: list) -> _Sess:
    rec = RecordReader(file, record, sess_obj)
    s = _Sess(str(rec.raw("session_id")), file, record, str(rec.raw("harness", "") or ""))
    s.parent, s.spawned_by_step, s.table = parent, step, table
    for i, r in enumerate(rec.obj_list("requests")):
        rr = RecordReader(file, f"{record}.requests[{i}]", r)
        s.requests.append(rr)
        step_i = rr.count("step", i)
        for j, call in enumerate(rr.obj_list("tool_calls", []) or []):
            if not isinstance(call, dict):
                continue
            _note_latency(s, step_i, call.get("latency_ms"))
            many = "subagents" in call
            subs = call.get("subagents") or ([call["subagent"]] if call.get("subagent") else [])
            for k, sub in enumerate(subs):
                where = f"{record}.requests[{i}].tool_calls[{j}]." + (
                    f"subagents[{k}]" if many else "subagent")
                try:
                    s.children.append(_nested(sub, file, where, s, step_i, b, lenient,
                                              table))
                except TraceFormatError:
                    if not lenient:
                        raise
                    b.skipped += 1
    return s


def _read_jsonl(path: Path, b: TraceBuilder, lenient: bool) -> list[_Sess]:
    skipped = [0]
    tops = []
    for line, obj, table in iter_jsonl_ids(path, lenient, skipped):
        try:
            tops.append(_nested(obj, str(path), line, None, -1, b, lenient, table))
        except TraceFormatError:
            if not lenient:
                raise
            b.skipped += 1
    b.skipped += skipped[0]
    return tops


def _read_parquet(folder: Path, b: TraceBuilder, lenient: bool) -> list[_Sess]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids_table: list = []

    def table(name: str) -> list[dict]:
        path = folder / f"{name}.parquet"
        try:
            t = pq.read_table(path)
            col = t.column("block_ids").combine_chunks() if "block_ids" in t.column_names \
                else None
            if col is not None and (pa.types.is_list(col.type) or pa.types.is_large_list(
                    col.type)) and pa.types.is_integer(col.type.value_type) \
                    and col.values.null_count == 0:  # id lists straight to numpy
                offsets = col.offsets.to_numpy()
                values = col.values.to_numpy(zero_copy_only=False).astype(np.int64)
                valid = col.is_valid().to_numpy(zero_copy_only=False)
                base = len(ids_table)
                ids_table.extend(values[offsets[i]:offsets[i + 1]] for i in range(len(col)))
                marks = [f"{ID_MARK}{base + i}" if valid[i] else None for i in range(len(col))]
                t = t.drop_columns(["block_ids"]).append_column("block_ids", pa.array(marks))
            return t.to_pylist()
        except (pa.ArrowException, OSError, ValueError) as e:
            raise TraceFormatError(str(path), None, None, f"cannot read Parquet: {e}") from None

    sess_rows = table("sessions") if (folder / "sessions.parquet").is_file() else []
    req_rows = table("requests")
    if not req_rows:
        raise TraceFormatError(str(folder / "requests.parquet"), None, None, "no requests")
    file_s, file_r = str(folder / "sessions.parquet"), str(folder / "requests.parquet")
    sessions: dict[str, _Sess] = {}
    meta: dict[str, tuple[str | None, int]] = {}
    for i, row in enumerate(sess_rows):
        rec = RecordReader(file_s, i, row)
        sid = str(rec.raw("session_id"))
        sessions[sid] = _Sess(sid, file_s, str(i), str(rec.raw("harness", "") or ""))
        parent = rec.raw("parent_session_id", None)
        step = rec.count("spawned_by_step", None)
        meta[sid] = (parent, -1 if step is None else step)
    for i, row in enumerate(req_rows):
        rec = RecordReader(file_r, i, row)
        sid = str(rec.raw("session_id"))
        if sid not in sessions:
            sessions[sid] = _Sess(sid, file_r, str(i), "")
        sessions[sid].requests.append(rec)
        sessions[sid].table = ids_table
    if (folder / "tool_calls.parquet").is_file():
        for row in table("tool_calls"):
            s = sessions.get(str(row.get("session_id")))
            if s is not None and isinstance(row.get("step"), int):
                _note_latency(s, row["step"], row.get("latency_ms"))
    tops = []
    for sid, s in sessions.items():
        parent, step = meta.get(sid, (None, -1))
        try:
            s.requests.sort(key=lambda r: r.count("step"))
        except TraceFormatError:
            if not lenient:
                raise
            b.skipped += len(s.requests)
            s.requests = []
        if parent is not None and parent in sessions:
            s.parent, s.spawned_by_step = sessions[parent], step
            sessions[parent].children.append(s)
        elif parent is not None:
            if not lenient:
                raise TraceFormatError(file_s, s.record, "parent_session_id",
                                       f"unknown parent session {parent!r}")
            b.skipped += 1
        else:
            tops.append(s)
    return tops


_TRIGGER_REGION = {"tool": REGION_TOOL_RESULT, "user": REGION_USER}


def _count(v: Any) -> int:
    """A role token count; anything but a non-negative finite number counts as 0."""
    if isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < float("inf"):
        return int(v)
    return 0


def _note_latency(s: _Sess, step: int, ms: Any) -> None:
    if isinstance(ms, int | float) and not isinstance(ms, bool) and ms >= 0:
        s.latency[step] = max(s.latency.get(step, 0.0), float(ms))


def _last_end(s: _Sess) -> float | None:
    ends = [r.number("end_ms", None) for r in s.requests]
    ends += [_last_end(c) for c in s.children]
    ends = [e for e in ends if e is not None]
    return max(ends) if ends else None


def _emit(s: _Sess, b: TraceBuilder, scope: int, unique: UniqueIds, lenient: bool, t0: float,
          h_parent: int = -1, after_local: int = -1, offset_s: float = 0.0) -> None:
    prefix: tuple[tuple[int, int], ...] = ()
    if s.requests:
        rt = s.requests[0].raw("role_tokens", None)
        if isinstance(rt, dict):
            tools = (REGION_TOOLS, _count(rt.get("tool_definitions")))
            system = (REGION_SYSTEM, _count(rt.get("system")))
            prefix = (tools, system) if s.harness == "claude-code" else (system, tools)
    h = b.open_session(s.id, scope=scope, parent=h_parent, after_local=after_local,
                       start_offset_s=offset_s, agent_type=s.harness,
                       prefix_hint_tokens=sum(n for _, n in prefix), prefix_regions=prefix)
    step_local: dict[int, int] = {}
    step_end: dict[int, float] = {}
    prev_start = prev_end = None
    prev_end_unknown = False
    child_end: dict[int, float] = {}
    for c in s.children:
        e = _last_end(c)
        if e is not None:
            child_end[c.spawned_by_step] = max(child_end.get(c.spawned_by_step, e), e)
    prev_step = None
    for rec in s.requests:
        try:
            step = rec.count("step")
            start = rec.seconds("start_ms")
            end = rec.seconds("end_ms", None)
            if end is not None and end < start:
                raise rec.fail("end_ms", f"ends before it starts ({end} < {start})")
            if prev_start is not None and start < prev_start:
                raise rec.fail("start_ms", f"time goes backwards ({start} < {prev_start})")
            p = rec.count("prompt_tokens")
            o = rec.count("completion_tokens", 0)
            ids = id_array(rec, "block_ids", s.table)
            lo, hi = p // FI_BLOCK, -(-p // FI_BLOCK)
            if not lo <= ids.shape[0] <= hi:
                raise rec.fail("block_ids", f"{ids.shape[0]} ids for {p} prompt tokens "
                               f"(expected {lo} or {hi} {FI_BLOCK}-token blocks)")
            trig = rec.raw("step_trigger", None)
            cache_ids = map_block_ids(ids, FI_BLOCK, p, b.block_size, unique)
        except TraceFormatError:
            if not lenient:
                raise
            b.skipped += 1
            continue
        gap = 0.0
        if prev_end is not None:
            ref = max(prev_end, child_end.get(prev_step, prev_end))
            gap = max(0.0, (start - ref) / 1000.0)
        if prev_end_unknown and prev_step in s.latency:  # no reply end: the tool latency
            gap = s.latency[prev_step] / 1000.0
        step_local[step] = b.n_requests(h)
        b.add(h, prompt=p, output=o, ids=cache_ids, send_time_s=(start - t0) / 1000.0,
              gap_s=gap, gap_kind=GAP_TOOL if trig == "tool" else GAP_HUMAN,
              model=str(rec.raw("model", "") or ""),
              kinds=kinds_mask(["tool_result"] if trig == "tool" else ["text"]),
              input_region=_TRIGGER_REGION.get(trig, REGION_UNKNOWN), hash_ids=ids)
        prev_start, prev_end, prev_step = start, (end if end is not None else start), step
        prev_end_unknown = end is None
        step_end[step] = prev_end
    b.close(h)
    for c in s.children:
        after = step_local.get(c.spawned_by_step, -1)
        first = c.requests[0].number("start_ms", None) if c.requests else None
        ref = step_end.get(c.spawned_by_step)
        off = max(0.0, (first - ref) / 1000.0) if first is not None and ref is not None else 0.0
        _emit(c, b, scope, unique, lenient, t0, h, after, off)

