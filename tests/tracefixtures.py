"""Small example traces in every supported format, written from one token-level model.

The tests' traces (the real ones are never copied into the repository). Sessions are token
sequences, so the expected block ids at ANY block size follow from the tokens themselves
(``TokenWorld``): a loader's output can be checked against that truth.
Each session: a system prompt shared by all sessions, a first user message, then per request
the previous prompt + the previous output + a tool result (or a user message); request 3 is an
edit (the last 70 prompt tokens change), request 5 a compaction (system prompt + summary).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np


class TokenWorld:
    """Chained block ids of token sequences: equal ids <=> equal token prefix."""

    def __init__(self, block_size: int):
        self.bs = block_size
        self.table: dict[tuple[int, bytes], int] = {}

    def ids(self, tokens: np.ndarray, ceil: bool = False) -> list[int]:
        bs, out, prev = self.bs, [], -1
        n = -(-len(tokens) // bs) if ceil else len(tokens) // bs
        for k in range(n):
            key = (prev, tokens[k * bs:(k + 1) * bs].tobytes())
            prev = self.table.setdefault(key, len(self.table))
            out.append(prev)
        return out


@dataclass
class FxRequest:
    tokens: np.ndarray  # the prompt
    output: int
    t: float  # send time, seconds since the session start
    api: float  # reply duration
    think: float  # wait before this request
    tool: bool  # follows a tool result


@dataclass
class FxSession:
    id: str
    system: int
    tools: int
    requests: list[FxRequest]
    subagents: list[tuple[int, FxSession, float]] = field(default_factory=list)
    # (parent request index after whose reply it starts, sub-agent, start offset seconds)


SYSTEM = np.arange(1, 1601, dtype=np.int64)  # 1,600 shared system + tool tokens


def make_sessions(seed: int = 0, n_sessions: int = 3, n_requests: int = 7,
                  subagent: bool = True) -> list[FxSession]:
    rng = np.random.default_rng(seed)

    def fresh(n: int) -> np.ndarray:
        return rng.integers(10_000, 2**40, n, dtype=np.int64)

    def session(sid: str, system: np.ndarray, n_req: int, t0: float = 0.0) -> FxSession:
        reqs: list[FxRequest] = []
        prompt = np.concatenate([system, fresh(300 + 37 * len(sid))])
        t = t0
        for k in range(n_req):
            out = int(rng.integers(20, 400))
            if k > 0:
                prev = reqs[-1]
                tool = k % 3 != 0
                think = 2.0 + k if tool else 30.0
                if k == 5:  # compaction
                    prompt = np.concatenate([system, fresh(700)])
                elif k == 3:  # edit: the tail changes
                    prompt = np.concatenate([prev.tokens[:-70], fresh(prev.output + 200)])
                else:
                    prompt = np.concatenate([prev.tokens, fresh(prev.output + 150 + 10 * k)])
                t = prev.t + prev.api + think
            else:
                tool, think = False, 0.0
            reqs.append(FxRequest(prompt, out, t, 1.0 + 0.01 * out, think, tool))
        return FxSession(sid, len(system) - 400, 400, reqs)

    sessions = [session(f"s{i}", SYSTEM, n_requests) for i in range(n_sessions)]
    if subagent and n_requests >= 3:
        parent = sessions[0]
        r1 = parent.requests[1]
        start = r1.t + r1.api + 0.5
        sub = session("s0/agent-a", np.arange(5000, 5900, dtype=np.int64), 2, t0=start)
        sub.system, sub.tools = 900, 0
        parent.subagents.append((1, sub, 0.5))
        # the parent's next request waits for the sub-agent, then 3 s
        end = sub.requests[-1].t + sub.requests[-1].api
        shift = end + 3.0 - parent.requests[2].t
        for r in parent.requests[2:]:
            r.t += shift
        parent.requests[2].think += shift
    return sessions


# -- cc-traces ----------------------------------------------------------------------------
def _cc_request(r: FxRequest, world: TokenWorld, t0: float = 0.0) -> dict:
    return {"t": round(r.t - t0, 3), "type": "n", "model": "claude-test", "in": len(r.tokens),
            "out": r.output, "hash_ids": world.ids(r.tokens),
            "input_types": ["tool_result"] if r.tool else ["text"], "output_types": ["text"],
            "stop": "tool_use", "api_time": round(r.api, 3), "think_time": round(r.think, 3)}


def cc_session_doc(s: FxSession, strings: bool = False) -> dict:
    world = TokenWorld(64)  # ids local to the session file, shared with its sub-agents
    items = []
    for i, r in enumerate(s.requests):
        items.append(_cc_request(r, world))
        for after, sub, _off in s.subagents:
            if after == i:
                start = sub.requests[0].t
                end = sub.requests[-1].t + sub.requests[-1].api
                rec = {"t": round(end, 3), "type": "subagent", "agent_id": sub.id.split("/")[-1],
                       "subagent_type": "Explore", "duration_ms": round((end - start) * 1000),
                       "total_tokens": 1, "tool_use_count": 1, "status": "completed",
                       "models": ["claude-test"], "tool_tokens": sub.tools,
                       "system_tokens": sub.system,
                       "requests": [_cc_request(q, world, start) for q in sub.requests]}
                if strings:  # cc-traces may store numbers as strings in sub-agent records
                    for k in ("t", "duration_ms", "total_tokens", "tool_use_count",
                              "tool_tokens", "system_tokens"):
                        rec[k] = str(rec[k])
                items.append(rec)
    return {"id": s.id, "models": ["claude-test"], "block_size": 64, "hash_id_scope": "local",
            "tool_tokens": s.tools, "system_tokens": s.system, "totals": {},
            "requests": items}


def write_fx_cc_traces(folder: Path, sessions: list[FxSession], gz: bool = True) -> list[Path]:
    """The cc-traces folder of these token-level sessions (tests/enginekit.py write_cc_traces
    writes a random one of a given size instead)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, s in enumerate(sessions):
        data = json.dumps(cc_session_doc(s, strings=True)).encode()
        p = folder / f"trace_{i:04d}.json{'.gz' if gz else ''}"
        p.write_bytes(gzip.compress(data, mtime=0) if gz else data)
        out.append(p)
    return out


# -- Mooncake -------------------------------------------------------------------------------
def mooncake_records(sessions: list[FxSession]) -> list[dict]:
    world = TokenWorld(512)  # ids global across users
    rows = []
    for j, s in enumerate(sessions):
        for r in s.requests:
            rows.append((round((r.t + 0.25 * j) * 1000), r))
    rows.sort(key=lambda x: x[0])
    return [{"timestamp": ts, "input_length": len(r.tokens), "output_length": r.output,
             "hash_ids": world.ids(r.tokens, ceil=True)} for ts, r in rows]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return path


# -- TraceLab ---------------------------------------------------------------------------------
_EPOCH = datetime(2026, 6, 1, tzinfo=UTC)


def _iso(t: float) -> str:
    return (_EPOCH + timedelta(seconds=t)).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def tracelab_records(sessions: list[FxSession]) -> list[dict]:
    rows = []
    for s in sessions:
        prev = None
        for i, r in enumerate(s.requests):
            n = len(r.tokens)
            if prev is None:
                pre = 0
            else:  # provider-cached tokens: the common prefix with the previous prompt
                m = min(n, len(prev.tokens))
                neq = np.flatnonzero(prev.tokens[:m] != r.tokens[:m])
                pre = int(neq[0]) if neq.size else m
            first = "tool_result" if r.tool else "user_message"
            rows.append({
                "provider": "claude", "session_id": f"claude:{s.id}", "round_index": i,
                "model": "claude-test", "input_tokens_total": n, "prefix_tokens": pre,
                "newly_append_tokens": n - pre, "output_tokens": r.output,
                "first_input_event_type": first,
                "timing_events": [
                    {"event_type": first, "timestamp": _iso(r.t)},
                    {"event_type": "text", "timestamp": _iso(r.t + r.api)}],
                "tools": []})
            prev = r
    return rows


def write_tracelab_duckdb(path: Path, records: list[dict]) -> Path:
    import duckdb

    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE rounds (round_pk BIGINT, ingest_seq BIGINT, provider VARCHAR, "
                "session_id VARCHAR, round_index BIGINT, model VARCHAR, "
                "input_tokens_total BIGINT, prefix_tokens BIGINT, newly_append_tokens BIGINT, "
                "output_tokens BIGINT, first_input_event_type VARCHAR)")
    con.execute("CREATE TABLE timing_events (round_pk BIGINT, event_index BIGINT, "
                "event_type VARCHAR, timestamp TIMESTAMP)")
    for pk, r in enumerate(records):
        con.execute("INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [pk, pk, r["provider"], r["session_id"], r["round_index"], r["model"],
                     r["input_tokens_total"], r["prefix_tokens"], r["newly_append_tokens"],
                     r["output_tokens"], r["first_input_event_type"]])
        for j, e in enumerate(r["timing_events"]):
            ts = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00"))
            con.execute("INSERT INTO timing_events VALUES (?, ?, ?, ?)",
                        [pk, j + 1, e["event_type"], ts.replace(tzinfo=None)])
    con.close()
    return path


# -- FreeInference ----------------------------------------------------------------------------
def freeinference_sessions(sessions: list[FxSession]) -> list[dict]:
    """Top-level session objects (JSONL form) with nested sub-agents; 16-token block ids
    global to the week."""
    world = TokenWorld(16)
    base_ms = 1_780_000_000_000

    def one(s: FxSession, k: int, parent: str | None = None) -> dict:
        sid = f"{k:032x}"
        reqs = []
        for i, r in enumerate(s.requests):
            start = base_ms + round(r.t * 1000)
            req = {"session_id": sid, "step": i,
                   "link_reason": None if i == 0 else "tool_call_id",
                   "start_ms": start, "end_ms": start + round(r.api * 1000),
                   "ttft_ms": 300, "model": "m", "provider": "p", "stream": True,
                   "step_trigger": "tool" if r.tool else "user",
                   "waited_for": "tool" if r.tool else "user",
                   "prompt_tokens": len(r.tokens), "completion_tokens": r.output,
                   "cache_read_tokens": 0,
                   "role_tokens": {"system": s.system, "tool_definitions": s.tools,
                                   "user": 0, "assistant": 0, "tool": 0},
                   "transition": None if i == 0 else "append", "cause": None,
                   "block_ids": world.ids(r.tokens), "tool_calls": []}
            for after, sub, _off in s.subagents:
                if after == i:
                    req["tool_calls"].append({"call_index": 0, "name": "Task",
                                              "latency_ms": 1000,
                                              "subagent": one(sub, k + 100, sid)})
            reqs.append(req)
        return {"session_id": sid, "user_id": "u", "harness": "claude-code",
                "parent_session_id": parent, "requests": reqs}

    return [one(s, k) for k, s in enumerate(sessions)]


def write_freeinference_jsonl(folder: Path, sessions: list[FxSession]) -> Path:
    (folder / "traces").mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps({"format_version": 1}))
    write_jsonl(folder / "traces" / "2026-06-01.jsonl", freeinference_sessions(sessions))
    return folder


def write_freeinference_parquet(folder: Path, sessions: list[FxSession]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    srows, rrows, trows = [], [], []

    def walk(doc: dict, parent: str | None, step: int | None) -> None:
        srows.append({"session_id": doc["session_id"], "user_id": "u",
                      "harness": doc["harness"], "parent_session_id": parent,
                      "spawned_by_step": step, "spawned_by_call_index": 0 if parent else None})
        for r in doc["requests"]:
            calls = r.pop("tool_calls")
            rrows.append(r)
            for c in calls:
                trows.append({"session_id": doc["session_id"], "step": r["step"],
                              "call_index": c["call_index"], "name": c["name"],
                              "latency_ms": c["latency_ms"]})
                if "subagent" in c:
                    walk(c["subagent"], doc["session_id"], r["step"])

    for doc in freeinference_sessions(sessions):
        walk(doc, None, None)
    pq.write_table(pa.Table.from_pylist(srows), folder / "sessions.parquet")
    pq.write_table(pa.Table.from_pylist(rrows), folder / "requests.parquet")
    pq.write_table(pa.Table.from_pylist(trows), folder / "tool_calls.parquet")
    return folder
