"""The canonical in-memory trace every loader and generator produces.

Requests live in numpy columns (length R). Each session's requests are contiguous and in order;
top-level sessions come first in trace order, then sub-agent sessions (linked to their parent).

Token identity is by cache block (``block_size`` tokens, 64 by default): ``block_ids(r)`` are
the ids of the FULL blocks of request r's prompt. Ids are global and chained: two prompts share
a cached prefix exactly as far as their ids agree from the start; different sessions share ids
only through the optional shared prefix (``--shared-prefix``); sub-agents share their parent's
id space as in the data.

Storage is compact: per request, the number of leading blocks shared with the previous request
of its session plus the new ids (``_pool``); ``block_ids`` reassembles a prompt from a few
contiguous pool segments (one for an append-only chain), so memory scales with distinct blocks.
Each pool entry also has a content region (uint8 code into ``REGION_NAMES``, see traces.regions):
``block_regions(r)`` is aligned with ``block_ids(r)``, and equal ids have equal regions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import OptionError
from .kinds import GAP_TOOL
from .regions import REGION_ASSISTANT, REGION_NAMES, REGION_UNKNOWN

AHEAD_KEPT = 256  # next prompts' ids a trace keeps for their readers (``Trace._gather_ahead``)


def longest_known_prefix(ids: np.ndarray, known: Callable[[int], bool]) -> int:
    """The largest ``h`` with ``known(ids[i])`` for every ``i < h``, when known ids are
    prefix-closed along ``ids`` (chained ids: a server that holds block i of a prompt held
    every block before it): a bisection, one test per halving."""
    n = ids.size
    item = ids.item
    if n and known(item(n - 1)):
        return n
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if known(item(mid - 1)):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class Session:
    """A client conversation: requests ``[first, first + count)`` of the trace columns."""

    id: str
    first: int
    count: int
    parent: int = -1  # index of the parent session (-1 = top level)
    # For a sub-agent: the global index of the parent's request after whose REPLY it starts
    # (-1 = before the parent's first request). The parent's request that follows it waits
    # until every sub-agent spawned there has finished.
    after_request: int = -1
    start_offset_s: float = 0.0  # recorded delay from that reply to the sub-agent's first request
    shared_prefix_blocks: int = 0  # leading blocks of its first prompt in the global shared prefix
    agent_type: str = ""  # sub-agent type (cc-traces ``subagent_type``), harness, ...
    prefix_hint_tokens: int = 0  # system + tool-definition tokens when the trace records them


@dataclass
class Trace:
    name: str
    block_size: int
    format: str
    source: str
    sessions: list[Session]
    session: np.ndarray  # int32, index into sessions
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    send_time_s: np.ndarray  # float64 s from the trace clock's start (NaN: unknown)
    gap_s: np.ndarray  # float64, recorded wait since the session's previous reply (0 for the first)
    gap_kind: np.ndarray  # int8, index into GAP_KINDS
    model: np.ndarray  # int16, index into models
    models: list[str]
    input_kinds: np.ndarray  # uint16 bit mask over KIND_NAMES: content kinds of the new tokens
    prefix_blocks: np.ndarray  # int32, leading blocks shared with the session's previous request
    skipped: int = 0
    options: dict[str, Any] = field(default_factory=dict)  # how it was loaded (recorded in results)
    # compact ids: pool of new ids; request r = concat(pool[s:s+l] for its segments)
    _pool: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    _seg_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64), repr=False)
    _seg_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    _seg_len: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    _fresh_base: int = 0  # output ids no prompt uses start here
    _out_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64), repr=False)
    # region of each pool entry (uint8 into REGION_NAMES); None: every block ``unknown``
    _pool_region: np.ndarray | None = field(default=None, repr=False)
    # the trace file's own hash ids over every request, a partial last block's included (as
    # its publisher counts them; 0 refs: the format has none): references and distinct ids
    hash_id_refs: int = 0
    hash_id_distinct: int = 0

    def storage(self) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """The columns and compact stores as arrays (keyed by constructor argument), and the
        scalars beside them: everything two traces must share to be the same trace."""
        names = ("session", "prompt_tokens", "output_tokens", "send_time_s", "gap_s",
                 "gap_kind", "model", "input_kinds", "prefix_blocks", "_pool", "_seg_ptr",
                 "_seg_start", "_seg_len", "_out_ptr", "_pool_region")
        return {k: getattr(self, k) for k in names}, {
            "_fresh_base": self._fresh_base, "hash_id_refs": self.hash_id_refs,
            "hash_id_distinct": self.hash_id_distinct}

    def hash_id_hits(self) -> int | None:
        """Hash-id references an unbounded cache of the file's own blocks hits (each
        distinct id misses once, at its first reference); None for a format without them."""
        return self.hash_id_refs - self.hash_id_distinct if self.hash_id_refs else None

    def infinite_cache_hits(self) -> np.ndarray:
        """Per request, prompt blocks already sent earlier in the trace (any session).

        Request r = the first ``prefix_blocks[r]`` blocks of its predecessor (all sent before)
        + its new ids, stored in the pool in request order; a new id was sent before iff it
        occurs at an earlier request's pool position. Chained ids make these a prefix."""
        R = len(self)
        new_len = self.prompt_tokens // self.block_size - self.prefix_blocks
        req = np.repeat(np.arange(R, dtype=np.int64), new_len)
        pool = self._pool
        if pool.shape[0] != req.shape[0]:  # not a builder-made store: use the reference
            return self.infinite_cache_hits_reference()
        order = np.lexsort((req, pool))  # by id, then request
        ids_sorted = pool[order]
        first = np.ones(order.shape[0], bool)
        first[1:] = ids_sorted[1:] != ids_sorted[:-1]
        first_req = req[order][first]  # earliest request of each distinct id
        group = np.cumsum(first) - 1
        earliest = np.empty(order.shape[0], np.int64)
        earliest[order] = first_req[group]
        seen = (earliest < req).astype(np.int64)
        return self.prefix_blocks.astype(np.int64) + np.bincount(
            req, weights=seen, minlength=R).astype(np.int64)

    def infinite_cache_hits_reference(self) -> np.ndarray:
        """The same by brute force: a set of every id sent so far, per request in order."""
        seen: set[int] = set()
        hits = np.zeros(len(self), np.int64)
        for r in range(len(self)):
            hits[r] = longest_known_prefix(self.block_ids(r), seen.__contains__)
            a, b = int(self._seg_ptr[r]), int(self._seg_ptr[r + 1])
            if b > a:  # only the newest segment can hold ids not seen yet
                s, ln = int(self._seg_start[b - 1]), int(self._seg_len[b - 1])
                seen.update(self._pool[s:s + ln].tolist())
        return hits

    def __post_init__(self) -> None:
        # Next prompts' ids that ``finish_block_ids`` gathered, until ``block_ids`` asks for
        # them: a replay gathers request r + 1 when r finishes and again when it is sent.
        self._ahead: dict[int, np.ndarray] = {}
        # Each request's finish layout (``_finish_layouts``), computed at the first finish.
        self._finish_len = np.zeros(0, np.int32)
        self._finish_next: np.ndarray | None = None
        if self._pool_region is None:
            self._pool_region = np.full(self._pool.shape[0], REGION_UNKNOWN, np.uint8)
        if self._pool_region.shape != self._pool.shape:
            raise ValueError("one region per stored id is required")

    def __len__(self) -> int:
        return int(self.prompt_tokens.shape[0])

    # -- identity -------------------------------------------------------------------------
    def n_blocks(self, r: int) -> int:
        return int(self.prompt_tokens[r]) // self.block_size

    def block_ids(self, r: int) -> np.ndarray:
        """int64 ids of the full cache blocks of request r's prompt (read-only array)."""
        ids = self._ahead.pop(r, None)
        return ids if ids is not None else self._gather(self._pool, r)

    def _gather_ahead(self, r: int) -> np.ndarray:
        """``block_ids(r)`` gathered for a finish, kept for the next ``block_ids(r)`` where it
        was a copy (several segments): at most ``AHEAD_KEPT`` wait, one per session the
        replay runs, and the oldest go first when a reader never asks (a study's scan)."""
        ptr = self._seg_ptr
        if ptr.item(r + 1) - ptr.item(r) <= 1:  # a view of the pool: no copy to save
            return self._gather(self._pool, r)
        ids = self._ahead.get(r)
        if ids is None:
            ids = self._gather(self._pool, r)
            ids.flags.writeable = False  # shared by the finish and the next prompt
            if len(self._ahead) >= AHEAD_KEPT:
                del self._ahead[next(iter(self._ahead))]
            self._ahead[r] = ids
        return ids

    def block_regions(self, r: int) -> np.ndarray:
        """uint8 region codes (index into ``REGION_NAMES``) of request r's prompt blocks,
        aligned with ``block_ids(r)`` (read-only array)."""
        return self._gather(self._pool_region, r)

    def _gather(self, store: np.ndarray, r: int) -> np.ndarray:
        # Python ints (item): the engine gathers every prompt at least once, and numpy
        # scalar arithmetic per segment cost more than the copy.
        ptr = self._seg_ptr
        a, b = ptr.item(r), ptr.item(r + 1)
        starts, lens = self._seg_start, self._seg_len
        s = starts.item(a) if b > a else 0
        if b - a == 1:
            return store[s:s + lens.item(a)]
        if b == a:
            return store[:0]
        parts = [store[s:s + lens.item(a)]]
        for i in range(a + 1, b):
            s = starts.item(i)
            parts.append(store[s:s + lens.item(i)])
        return np.concatenate(parts)

    def finish_blocks(self) -> np.ndarray:
        """Per request, the length of ``finish_block_ids``: the full blocks of prompt +
        output - 1 tokens, at least the prompt's."""
        bs = self.block_size
        n_p = self.prompt_tokens // bs
        return np.maximum(n_p, (self.prompt_tokens + self.output_tokens - 1) // bs)

    def _finish_layout(self, r: int) -> tuple[int, int, int]:
        """(prompt blocks, finish blocks, the next request whose prompt repeats r's output or
        -1) of request r: what ``finish_block_ids`` and ``finish_block_regions`` align on."""
        if self._finish_next is None:
            self._finish_len, self._finish_next = self._finish_layouts()
        return (self.prompt_tokens.item(r) // self.block_size, self._finish_len.item(r),
                self._finish_next.item(r))

    def _finish_layouts(self) -> tuple[np.ndarray, np.ndarray]:
        """Every request's finish length and the next request that repeats its output (-1:
        none), computed once for the trace (int32): a finish reads its layout instead of
        deriving it."""
        n_p = self.prompt_tokens // self.block_size
        n_f = self.finish_blocks()
        nxt = np.full(len(self), -1, np.int32)
        if len(self) > 1:
            same = self.session[1:] == self.session[:-1]
            repeats = (n_f[:-1] > n_p[:-1]) & same & (self.prefix_blocks[1:] >= n_p[:-1])
            nxt[:-1][repeats] = np.flatnonzero(repeats) + 1
        return n_f.astype(np.int32), nxt

    def finish_block_ids(self, r: int) -> np.ndarray:
        """Full blocks of prompt + output minus one token, what SGLang inserts when r finishes.

        The prompt's blocks, then for the output positions the NEXT request's ids when the next
        prompt (same session) extends this one: the reply reappears there; positions beyond the
        next prompt (or with no extending next request) get fresh ids no prompt uses.
        """
        n_p, n_f, nxt = self._finish_layout(r)
        nid = None
        if nxt >= 0:  # the next prompt starts with this one: its first n_f ids, no copy
            nid = self._gather_ahead(nxt)
            if nid.shape[0] >= n_f:
                return nid[:n_f]
        ids = self._gather(self._pool, r)
        if n_f == n_p:
            return ids
        parts = [ids]
        pos = n_p
        if nid is not None:
            take = nid[n_p:n_f]
            parts.append(take)
            pos += take.shape[0]
        if pos < n_f:
            base = self._fresh_base + int(self._out_ptr.item(r)) + (pos - n_p)
            parts.append(np.arange(base, base + (n_f - pos), dtype=np.int64))
        return np.concatenate(parts)

    def finish_block_regions(self, r: int) -> np.ndarray:
        """Regions aligned with ``finish_block_ids(r)``: the prompt's, then the next prompt's
        for the output blocks it repeats, then ``assistant`` for fresh output blocks."""
        n_p, n_f, nxt = self._finish_layout(r)
        regs = self.block_regions(r)
        if n_f == n_p:
            return regs
        parts = [regs]
        take = 0
        if nxt >= 0:
            t = self.block_regions(nxt)[n_p:n_f]
            parts.append(t)
            take = t.shape[0]
        if n_p + take < n_f:
            parts.append(np.full(n_f - n_p - take, REGION_ASSISTANT, np.uint8))
        return np.concatenate(parts)

    # -- gap models -----------------------------------------------------------------------
    def gaps(self, model: str) -> np.ndarray:
        """Client waits before each request under a gap model (see ``parse_gap_model``)."""
        return apply_gap_model(model, self.gap_s, self.gap_kind)

    def start_offsets(self, model: str) -> np.ndarray:
        """Sub-agent start delays (one per session; 0 for top level) under a gap model.

        A sub-agent is spawned by a tool call, so its delay counts as a tool wait."""
        off = np.array([s.start_offset_s for s in self.sessions], dtype=np.float64)
        kind = np.full(off.shape, GAP_TOOL, dtype=np.int8)
        return apply_gap_model(model, off, kind)

    # -- helpers --------------------------------------------------------------------------
    def main_mask(self) -> np.ndarray:
        """True for requests of top-level sessions."""
        top = np.array([s.parent < 0 for s in self.sessions], dtype=bool)
        return top[self.session] if len(self) else np.zeros(0, bool)

    def session_requests(self, i: int) -> range:
        s = self.sessions[i]
        return range(s.first, s.first + s.count)

    def stats(self, gap_model: str = "recorded") -> dict[str, Any]:
        """What ``kvsim trace stats --json`` prints (see traces.stats)."""
        from .stats import trace_stats

        return trace_stats(self, gap_model)

    def region_blocks(self) -> tuple[np.ndarray, np.ndarray]:
        """Blocks per region (index into REGION_NAMES) over every prompt of the trace, and
        over distinct block ids.

        Every prompt is a few pool segments, so per region a prefix count over the pool sums
        the prompts without materializing them; region is a function of the id, so the first
        occurrence of each distinct id gives its region."""
        G = len(REGION_NAMES)
        reg = self._pool_region
        starts, lens = self._seg_start, self._seg_len
        prompts = np.zeros(G, np.int64)
        c = np.zeros(reg.shape[0] + 1, np.int64)
        for g in range(G):
            np.cumsum(reg == g, out=c[1:])
            prompts[g] = int((c[starts + lens] - c[starts]).sum())
        _, first = np.unique(self._pool, return_index=True)
        distinct = np.bincount(reg[first], minlength=G).astype(np.int64)
        return prompts, distinct

    @property
    def distinct_blocks(self) -> int:
        a = np.sort(self._pool)
        return int(a.shape[0] and 1 + np.count_nonzero(a[1:] != a[:-1]))

    def nbytes(self) -> int:
        """Bytes held by the numpy columns and the id store."""
        arrs = [self.session, self.prompt_tokens, self.output_tokens, self.send_time_s,
                self.gap_s, self.gap_kind, self.model, self.input_kinds, self.prefix_blocks,
                self._pool, self._seg_ptr, self._seg_start, self._seg_len, self._out_ptr,
                self._pool_region]
        return int(sum(a.nbytes for a in arrs))


def parse_gap_model(model: str) -> tuple[str, float]:
    """``recorded`` | ``tool`` | ``cap:SECONDS`` | ``scale:FACTOR`` -> (kind, parameter).

    recorded: every recorded wait; tool: the recorded wait after a tool result, none after a
    human message; cap: recorded waits capped at SECONDS; scale: recorded waits times FACTOR.
    """
    text = str(model).strip()
    if text in ("recorded", "tool"):
        return text, 0.0
    kind, sep, arg = text.partition(":")
    if sep and kind in ("cap", "scale"):
        try:
            x = float(arg)
        except ValueError:
            x = float("nan")
        if np.isfinite(x) and x >= 0:
            return kind, x
    raise OptionError(f"bad gap model {model!r}: expected recorded, tool, cap:SECONDS or "
                      "scale:FACTOR with a finite non-negative number")


def apply_gap_model(model: str, gap: np.ndarray, kind: np.ndarray) -> np.ndarray:
    name, x = parse_gap_model(model)
    if name == "recorded":
        return gap.copy()
    if name == "tool":
        return np.where(kind == GAP_TOOL, gap, 0.0)
    if name == "cap":
        return np.minimum(gap, x)
    return gap * x
