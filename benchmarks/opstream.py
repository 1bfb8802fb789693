"""Cache op streams (replayed through SGLang's RadixCache or our cache by benchmarks/opreplay.py).

An op stream is what a serving engine does to its prefix cache, without timing or batching:

ARRIVE r   the scheduler admits request r: match its prompt (all full blocks of the first
           in-1 tokens, as SGLang caps a hit at len-1) and lock the matched node.
ALLOC r    allocate r's KV: need = ceil((in+out-1)/bs) blocks (the prompt plus every decoded
           token that gets KV) minus the hit (for hole-making presets: minus every matched
           GPU block; holes are recomputed). If free < need, evict the shortfall first (SGLang's
           evict_to_free_tokens); if free + evictable < need, nothing is evicted and r is
           aborted (SGLang's admission check would keep it waiting): it holds nothing and
           inserts nothing.
FINISH r   insert the full blocks of the first in+out-1 tokens (cache_finished_req), free the
           request's own copies of blocks someone else inserted since its arrival (duplicates:
           blocks [hit, already-present)), unlock the arrival node, release the allocation.
TOUCH r    fcfs periodic refresh: match r's prompt without locking (splits and stamps only).
CHUNK r    (SGLang 0.5.23's chunked prefill, ``with_chunks``; benchmarks/sglang_unified_ops.py)
           the next prefill chunk of r finished: its computed prefix is checkpointed into the
           tree. A boundary at or past the prompt's end is no chunk: the op does nothing.

Capacity is counted in blocks: free = capacity - blocks in the tree - blocks held by running
requests. Block ids are chained (an id implies its prefix), int64, non-negative, < 2**56.

Streams are built (a) from real cc-traces sessions, K active at a time, in a round-robin closed
loop with a fixed number of requests in flight and (b) at random from a seed, small enough for a
differential test to observe every op.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ARRIVE, ALLOC, FINISH, TOUCH, CHUNK = 0, 1, 2, 3, 4
_RESENT = ("match_ids", "finish_ids", "need_blocks", "in_tokens", "out_tokens")
OP_NAMES = ("ARRIVE", "ALLOC", "FINISH", "TOUCH", "CHUNK")


@dataclass(frozen=True)
class Request:
    """One request of a stream, in blocks of `block_size` tokens.

    match_ids: full blocks of the first in-1 prompt tokens (what ARRIVE matches);
    finish_ids: full blocks of the first in+out-1 tokens (what FINISH inserts; starts with
    match_ids); need_blocks: ceil((in+out-1)/bs), the KV the request holds at its end;
    in_tokens, out_tokens: prompt and output lengths (the vLLM protocol works in tokens).
    """

    rid: int
    session: int
    match_ids: np.ndarray
    finish_ids: np.ndarray
    need_blocks: int
    in_tokens: int = 0
    out_tokens: int = 0


def make_request(
    rid: int,
    session: int,
    prompt_ids: np.ndarray,
    cont_ids: np.ndarray,
    in_tokens: int,
    out_tokens: int,
    block_size: int,
) -> Request:
    """Build a Request from the prompt's full-block ids and the ids of the blocks after them.

    `cont_ids` must hold at least (in+out-1)//bs - len(prompt_ids) ids.
    """
    if in_tokens < 1 or out_tokens < 1:
        raise ValueError(f"request {rid}: in and out must be >= 1 (got {in_tokens}, {out_tokens})")
    if len(prompt_ids) != in_tokens // block_size:
        raise ValueError(f"request {rid}: {len(prompt_ids)} prompt blocks for {in_tokens} tokens")
    kv_tokens = in_tokens + out_tokens - 1
    n_finish = kv_tokens // block_size
    all_ids = np.concatenate([prompt_ids, cont_ids]).astype(np.int64, copy=False)
    if len(all_ids) < n_finish:
        raise ValueError(f"request {rid}: {len(all_ids)} ids for {n_finish} finished blocks")
    finish_ids = all_ids[:n_finish].copy()
    match_ids = finish_ids[: (in_tokens - 1) // block_size]
    return Request(
        rid, session, match_ids, finish_ids, -(-kv_tokens // block_size), in_tokens, out_tokens
    )


@dataclass
class OpStream:
    """(op, rid) pairs over requests 0..n_requests-1; TOUCH names the request whose prompt is
    touched. Requests come from `source(rid)`, which may build them lazily (a 360-session
    trace materialized at once would take ~400 MB of ids). `sessions`: the rids of each
    session in order (what protocol drivers other than these ops replay, benchmarks/vllm_ops.py).
    """

    name: str
    block_size: int
    capacity_blocks: int
    ops: list[tuple[int, int]]
    n_requests: int
    source: Callable[[int], Request]
    sessions: list[list[int]] | None = None

    def request(self, rid: int) -> Request:
        return self.source(rid)

    @classmethod
    def of_requests(
        cls,
        name: str,
        block_size: int,
        capacity_blocks: int,
        requests: list[Request],
        ops: list[tuple[int, int]],
    ) -> OpStream:
        by_session: dict[int, list[int]] = {}
        for r in requests:
            by_session.setdefault(r.session, []).append(r.rid)
        sessions = [by_session[s] for s in sorted(by_session)]
        return cls(
            name, block_size, capacity_blocks, ops, len(requests), requests.__getitem__, sessions
        )


# --------------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------------


def closed_loop_ops(
    sessions: Sequence[Sequence[int]],
    active: int,
    in_flight: int,
    touch_every: int = 32,
) -> list[tuple[int, int]]:
    """Interleave sessions (lists of rids in order) into ops, without timing.

    `active` sessions take turns (round-robin); when one ends the next unused session takes its
    place. Each turn sends the session's next request (ARRIVE, ALLOC); whenever `in_flight`
    requests are running the oldest finishes. A session never has two requests running. Every
    `touch_every` arrivals, the next waiting request of each active session is touched in
    reverse order (SGLang's fcfs refresh of the waiting queue).
    """
    if active < 1 or in_flight < 1:
        raise ValueError("active and in_flight must be >= 1")
    pending = deque(deque(s) for s in sessions if len(s))
    ring: deque[deque[int]] = deque()
    running: deque[int] = deque()
    running_session: dict[int, int] = {}  # rid -> id(session deque)
    ops: list[tuple[int, int]] = []
    arrivals = 0

    def finish_oldest() -> None:
        rid = running.popleft()
        running_session.pop(rid)
        ops.append((FINISH, rid))

    while ring or pending:
        while len(ring) < active and pending:
            ring.append(pending.popleft())
        session = ring.popleft()
        while id(session) in running_session.values():
            finish_oldest()
        rid = session.popleft()
        ops.append((ARRIVE, rid))
        ops.append((ALLOC, rid))
        running.append(rid)
        running_session[rid] = id(session)
        arrivals += 1
        if session:
            ring.append(session)
        while len(running) >= in_flight:
            finish_oldest()
        if touch_every and arrivals % touch_every == 0:
            ops.extend((TOUCH, s[0]) for s in reversed(ring))
    while running:
        finish_oldest()
    return ops


def random_stream(
    seed: int,
    n_ops: int = 400,
    capacity_blocks: int = 48,
    block_size: int = 64,
    n_sessions: int = 6,
    max_in_flight: int = 4,
    aligned: float = 0.0,
    resend: float = 0.0,
) -> OpStream:
    """A random stream over a small id universe that stresses splits, locks and eviction.

    Sessions share a random system prefix (some of them), grow by appending, sometimes edit
    (truncate to a random block and continue with fresh ids) and sometimes repeat a prompt.
    Prompt and output lengths are random in tokens, so partial blocks and exact multiples both
    occur. Requests finish in random order; TOUCH hits random prompts, running or not.
    With `aligned` > 0 that fraction of prompts is cut to a multiple of the block size; with
    `resend` > 0 that fraction of requests resends a previous request of its session exactly
    (same prompt, same output ids). Both 0 (the default) draw exactly the original streams.
    """
    rng = np.random.default_rng(seed)
    next_id = 1

    def fresh(n: int) -> np.ndarray:
        nonlocal next_id
        ids = np.arange(next_id, next_id + n, dtype=np.int64)
        next_id += n
        return ids

    system = [fresh(int(rng.integers(1, 6))) for _ in range(2)]
    # Per session: the token history (as full-block ids + a token length) it appends to.
    hist_ids: list[np.ndarray] = []
    hist_tokens: list[int] = []
    for _ in range(n_sessions):
        shared = rng.random() < 0.7
        base = system[int(rng.integers(0, 2))] if shared else fresh(int(rng.integers(1, 4)))
        hist_ids.append(base.copy())
        hist_tokens.append(len(base) * block_size + int(rng.integers(0, block_size)))

    requests: list[Request] = []
    ops: list[tuple[int, int]] = []
    running: list[int] = []
    allocated: set[int] = set()
    session_busy: set[int] = set()
    max_prompt = max(2, capacity_blocks // 2) * block_size

    sent: list[list[Request]] = [[] for _ in range(n_sessions)]

    def new_request(s: int) -> Request:
        if resend and sent[s] and rng.random() < resend:
            old = sent[s][int(rng.integers(0, len(sent[s])))]
            req = Request(len(requests), s, *(getattr(old, f) for f in _RESENT))
            requests.append(req)
            return req
        r = rng.random()
        ids, tokens = hist_ids[s], hist_tokens[s]
        if r < 0.1 and len(ids) > 1:  # edit: keep a prefix, continue with fresh ids
            keep = int(rng.integers(1, len(ids)))
            ids, tokens = ids[:keep], keep * block_size
        elif r < 0.15:  # repeat the same prompt
            pass
        grow = int(rng.integers(1, 4 * block_size))
        in_tokens = min(tokens + grow, max_prompt)
        in_tokens = max(in_tokens, 1)
        if aligned and in_tokens >= block_size and rng.random() < aligned:
            in_tokens -= in_tokens % block_size
        n_prompt = in_tokens // block_size
        prompt = np.concatenate([ids, fresh(max(0, n_prompt - len(ids)))])[:n_prompt]
        out_tokens = int(rng.integers(1, 2 * block_size))
        n_fin = (in_tokens + out_tokens - 1) // block_size
        cont = fresh(max(0, n_fin - n_prompt))
        req = make_request(len(requests), s, prompt, cont, in_tokens, out_tokens, block_size)
        requests.append(req)
        sent[s].append(req)
        # The session continues from prompt + output (append-only history).
        if rng.random() < 0.8:
            hist_ids[s] = req.finish_ids
            hist_tokens[s] = in_tokens + out_tokens
        return req

    while len(ops) < n_ops:
        roll = rng.random()
        idle = [s for s in range(n_sessions) if s not in session_busy]
        if roll < 0.35 and idle and len(running) < max_in_flight:
            s = idle[int(rng.integers(0, len(idle)))]
            req = new_request(s)
            session_busy.add(s)
            running.append(req.rid)
            ops.append((ARRIVE, req.rid))
        elif roll < 0.6 and any(r not in allocated for r in running):
            waiting = [r for r in running if r not in allocated]
            rid = waiting[int(rng.integers(0, len(waiting)))]
            allocated.add(rid)
            ops.append((ALLOC, rid))
        elif roll < 0.9 and allocated:
            done = sorted(allocated)
            rid = done[int(rng.integers(0, len(done)))]
            allocated.discard(rid)
            running.remove(rid)
            session_busy.discard(requests[rid].session)
            ops.append((FINISH, rid))
        elif requests:
            ops.append((TOUCH, int(rng.integers(0, len(requests)))))
    for rid in list(running):  # drain: every request finishes
        if rid not in allocated:
            ops.append((ALLOC, rid))
        ops.append((FINISH, rid))
    return OpStream.of_requests(f"random-{seed}", block_size, capacity_blocks, requests, ops)


def trace_stream(
    trace_dir: Path,
    sessions: int | None = None,
    active: int = 4,
    in_flight: int = 2,
    capacity_blocks: int = 4096,
    block_size: int = 64,
    max_requests_per_session: int | None = None,
    shared_prefix: int | str | None = "auto",
    max_context: int | None = None,
) -> OpStream:
    """The op stream of the top-level sessions of the first `sessions` cc-traces files (sorted
    by name), loaded with the `traces` package (global chained ids; `shared_prefix="auto"`
    makes every session's system + tool-definition tokens one shared chain, as in the paper).
    Sub-agent sessions are left out (their timing depends on the parent's replies). A request's
    FINISH inserts `Trace.finish_block_ids`. Requests are built when the replay asks for them.
    `max_context` cuts each session before its first prompt longer than that (tokens).
    """
    from traces import load_trace

    files = sorted(Path(trace_dir).glob("*.json.gz"))[:sessions]
    if not files:
        raise FileNotFoundError(f"{trace_dir}: no *.json.gz session files")
    trace = load_trace(
        [str(f) for f in files],
        format="cc-traces",
        block_size=block_size,
        shared_prefix=shared_prefix,
        max_context=max_context,
    )
    per_session = []
    for si, sess in enumerate(trace.sessions):
        if sess.parent < 0:
            n = (
                sess.count
                if max_requests_per_session is None
                else min(sess.count, max_requests_per_session)
            )
            per_session.append((si, range(sess.first, sess.first + n)))
    session_of = {r: si for si, rids in per_session for r in rids}

    def source(rid: int) -> Request:
        prompt = trace.block_ids(rid)
        finish = trace.finish_block_ids(rid)
        return make_request(
            rid,
            session_of[rid],
            prompt,
            finish[len(prompt) :],
            int(trace.prompt_tokens[rid]),
            max(int(trace.output_tokens[rid]), 1),
            block_size,
        )

    sessions_rids = [list(rids) for _, rids in per_session]
    ops = closed_loop_ops(sessions_rids, active, in_flight)
    name = f"cc-traces-{len(files)}x{active}"
    return OpStream(
        name, block_size, capacity_blocks, ops, len(session_of), source, sessions_rids
    )


def with_chunks(stream: OpStream, chunk_tokens: int, seed: int = 0) -> OpStream:
    """`stream` with CHUNK ops for every request: as many as its prompt could need (hit 0),
    each placed at a random point after its ALLOC and before its FINISH, in order."""
    if chunk_tokens < 1:
        raise ValueError("chunk_tokens must be >= 1")
    rng = np.random.default_rng(seed)
    alloc_at: dict[int, int] = {}
    finish_at: dict[int, int] = {}
    for i, (op, rid) in enumerate(stream.ops):
        if op == ALLOC:
            alloc_at[rid] = i
        elif op == FINISH:
            finish_at[rid] = i
    inserts: dict[int, list[tuple[int, int]]] = {}  # op index -> CHUNK ops placed after it
    for rid, a in alloc_at.items():
        n = -(-stream.request(rid).in_tokens // chunk_tokens) - 1
        if n <= 0:
            continue
        spots = np.sort(rng.integers(a, finish_at[rid], size=n))
        for s in spots.tolist():
            inserts.setdefault(s, []).append((CHUNK, rid))
    ops: list[tuple[int, int]] = []
    for i, op in enumerate(stream.ops):
        ops.append(op)
        ops.extend(inserts.get(i, ()))
    return replace(stream, name=f"{stream.name}-chunk{chunk_tokens}", ops=ops)
