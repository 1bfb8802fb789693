"""cc-traces (Claude Code sessions, semianalysisai/cc-traces-weka-042026, kv-cache-tester).

One JSON object per session (``.json``/``.json.gz``) or one per line (``.jsonl(.gz)``); a folder
holds any number of them. ``requests`` mixes requests and sub-agent records in time order.

Semantics we derived from the published data (checked on all 38 sub-agents; docs/traces.md):
- a request's ``t`` is its send time in seconds since the session start; ``think_time`` is the
  client's wait after the previous reply (``t_k ~ t_{k-1} + api_time_{k-1} + think_time_k``);
  when null we use ``t_k - t_{k-1} - api_time_{k-1}`` (or ``t_k - t_{k-1}``);
- a sub-agent record's ``t`` is its COMPLETION time (``t - duration_ms/1000`` falls within ~1 s
  of the previous parent reply); its requests' ``t`` count from the sub-agent's own start;
- the parent's next request waits for its sub-agents, so its gap is measured from the last
  sub-agent's completion (its recorded think time includes the sub-agents' run time);
- ``hash_ids`` has one id per FULL block (``in // block_size``); ids are local to the file and
  shared by the parent and its sub-agents (one id scope per session object).
Gap kind: ``tool`` when ``input_types`` contains ``tool_result``, else ``human``.

Regions (traces.regions): every prompt starts with the tool definitions (``tool_tokens``), then
the system prompt (``system_tokens``): the Messages API renders tools, then system, then
messages, and the data agrees (non-append requests diverge right after the first
``tool_tokens`` + a few tokens when the system prompt changes, never at ``system_tokens``; see
docs/traces.md). Each request adds the previous reply (``assistant``, ``out`` tokens clipped to
what was added), then its input: ``input_types`` tool_result -> ``tool_result``, text ->
``user``, a list with tool_use/thinking: a re-sent history (traces.regions.RESENT). A first
prompt with over 16K tokens beyond system + tools carries an undescribed history (``unknown``;
traces.regions.FIRST_MESSAGE_MAX_TOKENS). Sub-agents use their own system and tool counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .blocks import UniqueIds, check_block_sizes, id_array, map_block_ids
from .builder import TraceBuilder
from .errors import RecordReader, TraceFormatError
from .files import iter_lines, list_files, load_json_ids, read_file, skip_file, strip_gz
from .kinds import GAP_HUMAN, GAP_TOOL, kinds_mask
from .regions import REGION_SYSTEM, REGION_TOOLS, first_input_region, input_region

SUFFIXES = (".json", ".jsonl")


def load_cc_traces(paths: list[str], b: TraceBuilder, lenient: bool) -> None:
    unique = UniqueIds()
    scope = 0
    for path in list_files(paths, SUFFIXES):
        if strip_gz(path.name).endswith(".jsonl"):
            docs: Iterator[tuple[str | None, bytes]] = iter_lines(path, lenient)
        else:
            data = read_file(path, lenient)  # None: skipped (lenient), counted as a file
            docs = iter([] if data is None else [(None, data)])
        for where, data in docs:
            scope += 1
            try:
                obj, table = load_json_ids(data, str(path), where)
            except TraceFormatError as e:
                if where is None:  # a .json file that is not JSON at all (truncated, binary)
                    skip_file(path, lenient, e)
                    continue
                if not lenient:
                    raise
                b.skipped += 1
                continue
            try:
                _session(b, str(path), where, obj, scope, unique, lenient,
                         None if where else path, table)
            except TraceFormatError:
                if not lenient:
                    raise
                b.skipped += 1


def _prefix_regions(rec: RecordReader) -> tuple[tuple[int, int], ...]:
    """The session prefix: tool definitions, then the system prompt."""
    return ((REGION_TOOLS, rec.count("tool_tokens", 0)),
            (REGION_SYSTEM, rec.count("system_tokens", 0)))


def _label(where: str | None, inner: str) -> str:
    return f"{where} {inner}" if where else inner


def _session(b: TraceBuilder, file: str, where: str | None, obj: Any, scope: int,
             unique: UniqueIds, lenient: bool, path: Path | None, table: list) -> None:
    rec = RecordReader(file, where or "session", obj)
    default_id = strip_gz(path.name).rsplit(".", 1)[0] if path else str(where)
    sid = str(rec.raw("id", default_id))
    bs_trace = rec.count("block_size", 64)
    if bs_trace < 1:
        raise rec.fail("block_size", "must be >= 1")
    check_block_sizes(bs_trace, b.block_size, file)
    prefix = _prefix_regions(rec)
    items = rec.obj_list("requests")
    if not items:
        raise rec.fail("requests", "no requests")
    h = b.open_session(sid, scope=scope, prefix_hint_tokens=sum(n for _, n in prefix),
                       prefix_regions=prefix)
    ctx = _Ctx(b, file, bs_trace, unique, lenient, table)
    ctx.run(h, items, _label(where, "requests"), t0=0.0, is_main=True, sid=sid, scope=scope,
            prefix_tokens=sum(n for _, n in prefix))
    b.close(h)


class _Ctx:
    def __init__(self, b: TraceBuilder, file: str, bs_trace: int, unique: UniqueIds,
                 lenient: bool, table: list):
        self.b, self.file, self.bs_trace, self.unique, self.lenient = (
            b, file, bs_trace, unique, lenient)
        self.table = table  # id lists parsed by numpy (blocks.parse_json_with_id_lists)

    def run(self, h: int, items: list, label: str, t0: float, is_main: bool, sid: str,
            scope: int, prefix_tokens: int) -> None:
        b = self.b
        prev_t = prev_end = None  # previous accepted request: send time and reply end
        sub_end: float | None = None  # latest completion of sub-agents since that request
        n_sub = 0
        for i, item in enumerate(items):
            where = f"{label}[{i}]"
            try:
                rec = RecordReader(self.file, where, item)
                typ = rec.string("type")
                if typ == "subagent":
                    if not is_main:
                        raise rec.fail("type", "nested sub-agents are not supported")
                    end = rec.seconds("t")
                    dur = rec.seconds("duration_ms", None)
                    start = end - dur / 1000.0 if dur is not None else end
                    sub_items = rec.obj_list("requests")
                    if not sub_items:
                        raise rec.fail("requests", "sub-agent without requests")
                    offset = max(0.0, start - prev_end) if prev_end is not None else start
                    n_sub += 1
                    prefix = _prefix_regions(rec)
                    sh = b.open_session(
                        f"{sid}/{rec.raw('agent_id', n_sub)}", scope=scope, parent=h,
                        after_local=b.n_requests(h) - 1, start_offset_s=max(0.0, offset),
                        agent_type=str(rec.raw("subagent_type", "")),
                        prefix_hint_tokens=sum(n for _, n in prefix), prefix_regions=prefix)
                    self.run(sh, sub_items, f"{where}.requests", t0=t0 + max(0.0, start),
                             is_main=False, sid=sid, scope=scope,
                             prefix_tokens=sum(n for _, n in prefix))
                    b.close(sh)
                    sub_end = end if sub_end is None else max(sub_end, end)
                    continue
                t = rec.seconds("t")
                if prev_t is not None and t < prev_t:
                    raise rec.fail("t", f"time goes backwards ({t} < {prev_t})")
                p = rec.count("in")
                o = rec.count("out")
                ids = id_array(rec, "hash_ids", self.table)
                if ids.shape[0] != p // self.bs_trace:
                    raise rec.fail("hash_ids", f"{ids.shape[0]} ids for {p} prompt tokens "
                                   f"(expected {p // self.bs_trace} full {self.bs_trace}-token "
                                   "blocks)")
                types = rec.str_list("input_types", [])
                api = rec.seconds("api_time", None)
                think = rec.seconds("think_time", None)
                model = rec.raw("model", "")
                if prev_end is None:
                    gap = 0.0
                elif sub_end is not None and sub_end > prev_end:
                    gap = t - sub_end
                elif think is not None:
                    gap = think
                else:
                    gap = t - prev_end
                cache_ids = map_block_ids(ids, self.bs_trace, p, b.block_size, self.unique)
                region = input_region(types)
                if prev_t is None:
                    region = first_input_region(p, prefix_tokens, region)
            except TraceFormatError:
                if not self.lenient:
                    raise
                b.skipped += 1
                continue
            b.add(h, prompt=p, output=o, ids=cache_ids, send_time_s=t0 + t, gap_s=gap,
                  gap_kind=GAP_TOOL if "tool_result" in types else GAP_HUMAN,
                  model=str(model), kinds=kinds_mask(types), input_region=region,
                  hash_ids=ids)
            prev_t, prev_end, sub_end = t, t + (api or 0.0), None
