"""Per-request records and the run summary (docs/engine.md, Metrics).

Token accounting of one request (prompt of ``P`` tokens; ``ideal`` = the prefix an unlimited
cache would hold, i.e. the longest prefix of its block ids ever inserted by any request):

    reused      tokens served from the GPU cache (every GPU segment of the match, holes
                notwithstanding)
    recomputed  tokens inside ``ideal`` that had to be computed again: holes restored by the
                phantom request, plus history evicted from the tail
    new         P - reused - recomputed (never seen before, or the always-recomputed last token)

This definition is policy-neutral: tail eviction and front eviction are charged the same way,
so their recomputation can be compared. ``private_lost`` is the fraction of the request's
private history (``ideal`` beyond the shared prefix) that was recomputed; the paper's
diagnostic is the share of recomputation carried by requests with ``private_lost >= 0.9``.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

import numpy as np

from sim.engines.columns import ColumnTable
from sim.engines.latency import TokenGaps

# Typed, not imported: pandas where a table is made (no pandas before a run's first
# request, issue 55 start-up); sim/engines/request.py imports this module.
if TYPE_CHECKING:
    import pandas as pd

    from sim.engines.request import Req

HIST_BIN_TOKENS: Final = 8192
HIST_BINS: Final = 64  # up to 512K positions; the last bin collects the rest
LOST_THRESHOLD: Final = 0.9


@dataclass(kw_only=True)
class RequestRecord:
    request: int
    session: str
    session_index: int
    turn: int
    subagent: bool
    send_s: float
    admit_s: float = math.nan
    first_token_s: float = math.nan
    end_s: float = math.nan
    ttft_s: float = math.nan
    queue_wait_s: float = math.nan
    prompt_tokens: int = 0
    output_tokens: int = 0
    hit_gpu_tokens: int = 0
    loaded_cpu_tokens: int = 0
    recomputed_tokens: int = 0
    hole_tokens: int = 0
    new_tokens: int = 0
    decoded_tokens: int = 0
    ideal_hit_tokens: int = 0
    private_lost: float = 0.0
    prefill_units: float = 0.0
    attention_units: int = 0
    recompute_units: float = 0.0
    retractions: int = 0
    # prefill computed again after a preemption (vLLM) or retraction (SGLang): positions
    # that had KV before it and were lost with it (not counted in recomputed_tokens)
    preempted_recompute_tokens: int = 0
    preempted_recompute_units: float = 0.0
    dropped: bool = False
    drop_reason: str = ""  # context: prompt above the model's context; cache: cannot fit
    # the server ended it before its output was complete (SGLang aborts a lone request that
    # cannot grow): admitted and computed, but not served (vllm bench serve: not successful)
    aborted: bool = False
    # context strategies (sim.context; zero under ``full``)
    kind: str = "turn"  # turn | summary (the summarization call of summarize:T:S)
    dropped_tokens: int = 0  # prompt tokens whose KV the history dropped: not computed
    restored_tokens: int = 0  # dropped tokens computed again for later kept ones
    reprefill_tokens: int = 0  # computed again because a text edit changed their keys
    rerotated_tokens: int = 0  # retained keys re-rotated by repos / splice on arrival
    # latency after the first token (vllm bench serve's definitions; NaN below 2 tokens)
    tpot_s: float = math.nan  # (end - first token) / (tokens - 1)
    itl_max_s: float = math.nan  # the longest gap between two of its tokens
    # its row in the recorder's columns (not a column itself; -1: none yet)
    row: int = field(default=-1, repr=False, compare=False)

    def values(self) -> tuple:
        """Its row of the request table: every field but ``row``, in order (``COLUMNS``)."""
        return _ROW(self)


# The request table's columns, in order: every field but ``row``.
COLUMNS: Final[tuple[str, ...]] = tuple(f.name for f in fields(RequestRecord) if f.name != "row")
_ROW: Final = operator.attrgetter(*COLUMNS)


def _type_name(annotation: Any) -> str:
    """A field's annotation as written (a string under postponed annotations, else a class)."""
    return annotation if isinstance(annotation, str) else annotation.__name__


_FIELD_TYPES: Final[dict[str, str]] = {f.name: _type_name(f.type) for f in fields(RequestRecord)}
_STR_COLUMNS: Final = frozenset(name for name, kind in _FIELD_TYPES.items() if kind == "str")
_BOOLS: Final = frozenset((bool, np.bool_))


def empty_table() -> pd.DataFrame:
    """A request table without rows, with the columns and dtypes of one with rows (so that
    joining it to others changes no dtype)."""
    return _empty_table().copy()


@functools.cache
def _empty_table() -> pd.DataFrame:
    import pandas as pd

    row = RequestRecord(request=0, session="", session_index=0, turn=0, subagent=False,
                        send_s=0.0).values()
    return pd.DataFrame([dict(zip(COLUMNS, row, strict=True))]).iloc[:0]


class _Columns:
    """Finished requests' records as one numpy array per column (``COLUMNS``), rows in the
    order the recorder numbered them, grown by doubling. A column's dtype is what pandas
    would infer from the values it holds: int64 for ints, float64 for floats (or ints and
    floats mixed), bool for bools, object for strings or anything else."""

    FLUSH = 4096  # rows buffered as tuples before they are written into the arrays

    def __init__(self) -> None:
        self.cols: list[np.ndarray] = [self._typed(name, 0) for name in COLUMNS]
        self._rows: list[int] = []  # buffered rows: their numbers and values
        self._vals: list[tuple] = []

    @staticmethod
    def _typed(name: str, n: int) -> np.ndarray:
        kind = _FIELD_TYPES[name]
        dtype = {"int": np.int64, "float": np.float64, "bool": np.bool_}.get(kind, object)
        return np.zeros(n, dtype) if dtype is not object else np.full(n, "", dtype=object)

    @property
    def capacity(self) -> int:
        return len(self.cols[0])

    def put(self, row: int, values: tuple) -> None:
        self._rows.append(row)
        self._vals.append(values)
        if len(self._rows) >= self.FLUSH:
            self.flush()

    def reserve(self, n: int) -> None:
        """Room for rows ``[0, n)``."""
        cap = self.capacity
        if n <= cap:
            return
        cap = max(n, 2 * cap, 1024)
        for i, c in enumerate(self.cols):
            grown = np.empty(cap, c.dtype)
            grown[:len(c)] = c
            self.cols[i] = grown

    def flush(self) -> None:
        if not self._rows:
            return
        rows = np.asarray(self._rows, dtype=np.int64)
        self.reserve(int(rows.max()) + 1)
        self.cols = write(self.cols, rows, self._vals)
        self._rows, self._vals = [], []


def _kind(a: np.ndarray) -> str:
    return {"b": "b", "i": "i", "u": "i", "f": "f"}.get(a.dtype.kind, "O")


def _joined(col: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``col`` and ``new`` in one dtype: as pandas infers a column of both's values."""
    a, b = _kind(col), _kind(new)
    if a == b:
        return col, new.astype(col.dtype, copy=False)
    if {a, b} <= {"i", "f"}:
        return col.astype(np.float64), new.astype(np.float64)
    return col.astype(object), new.astype(object)


def write(cols: list[np.ndarray], rows: np.ndarray, vals: list[tuple]) -> list[np.ndarray]:
    """``cols`` with ``vals`` (one tuple of ``COLUMNS`` each) written at ``rows``; a column
    whose dtype cannot hold its new values exactly is widened (``_joined``)."""
    out = []
    for name, col, column in zip(COLUMNS, cols, zip(*vals, strict=True), strict=True):
        new = np.array(column, dtype=object) if name in _STR_COLUMNS else np.asarray(column)
        if new.dtype.kind in "US":  # (a non-string in a string field: keep the objects)
            new = np.array(column, dtype=object)
        elif new.dtype.kind in "iuf":  # numpy would read a bool among numbers as a number
            types = set(map(type, column))
            if len(types) > 1 and types & _BOOLS:
                new = np.array(column, dtype=object)
        col, new = _joined(col, new)
        col[rows] = new
        out.append(col)
    return out


class RecordListener(Protocol):
    """Told what a recorder records (a fleet listens to its replicas' recorders)."""

    def opened(self, req: Any, found: Any) -> None:
        """``req``'s record opened at its first admission; ``found``: its match then, before
        any CPU load (its GPU runs are the blocks it hit on the GPU)."""

    def first_token(self, req: Any) -> None:
        """``req``'s first token came back."""


class RunRecorder:
    """Collects records and counters while a run executes. Knows nothing of policies.
    ``listener`` (optional) is told when a record opens and when a first token comes back."""

    def __init__(self, session_names: list[str], session_turn0: list[int],
                 session_is_sub: list[bool], shared_blocks: list[int],
                 listener: RecordListener | None = None) -> None:
        self.names, self.turn0, self.is_sub = session_names, session_turn0, session_is_sub
        self.shared_blocks = shared_blocks
        self.listener = listener
        # Requests' records: the open ones as objects (engines update them through
        # ``req.record``), finished ones folded into compact columns.
        self._live: dict[int, RequestRecord] = {}  # row -> record not folded yet
        self._cols = _Columns()
        self._n = 0  # rows numbered so far (one per record, in the order they were made)
        # Recomputed prompt positions per bin of HIST_BIN_TOKENS (``hist``): Python ints,
        # which every admission adds to without numpy's per-item calls.
        self._hist: list[int] = [0] * HIST_BINS
        # Every recomputed range's ends, flat (a0, b0, a1, b1, ...): priced per KV cache
        # group at the summary (``recomputed_ranges``), O(ranges), never per token.
        self._recomputed: list[int] = []
        self.counters: dict[str, float] = {
            "prefill_batches": 0, "prefill_seconds": 0.0, "decode_events": 0,
            "decode_steps": 0, "decode_seconds": 0.0, "evictions": 0, "evicted_blocks": 0,
            "holes_made_blocks": 0, "retractions": 0,
            "bytes_h2d": 0, "bytes_d2h": 0, "cpu_loads": 0, "loaded_blocks": 0,
            "swap_buffer_loads": 0, "swap_buffer_blocks": 0, "swap_chunks": 0,
            "load_demoted_blocks": 0, "load_deleted_blocks": 0, "demoted_blocks": 0,
            # context strategies (sim.context.run): reported only when one is used
            "context_edits": 0, "context_edits_blocked": 0, "context_freed_blocks": 0,
            "context_dropped_blocks": 0, "rerotated_tokens": 0, "rerotate_seconds": 0.0,
        }
        self.session_start: dict[int, float] = {}
        self.session_end: dict[int, float] = {}
        self.gaps = TokenGaps()
        self.observer: Any = None  # a sim/timeline.py Track, told of batches and evictions
        self._last_token: dict[int, float] = {}  # request id -> when its last token came

    # --- lifecycle ----------------------------------------------------------------------
    def _record(self, req: Req) -> RequestRecord:
        """A new record, numbered (its row) and kept live until ``_fold``."""
        s = req.session
        rec = RequestRecord(
            request=req.rid, session=self.names[s], session_index=s,
            turn=req.rid - self.turn0[s], subagent=self.is_sub[s], send_s=req.arrival,
            prompt_tokens=req.prompt_tokens, output_tokens=req.output_tokens,
            kind=req.prompt.kind, row=self._n)
        self._live[self._n] = rec
        self._n += 1
        return rec

    def _fold(self, rec: RequestRecord) -> None:
        """``rec`` is final: its values go to the columns; the object stays the request's
        (``req.record``) but the recorder no longer holds it."""
        del self._live[rec.row]
        self._cols.put(rec.row, rec.values())

    def _folded(self, rec: RequestRecord) -> bool:
        return self._live.get(rec.row) is not rec

    @property
    def records(self) -> list[RequestRecord]:
        """Every record, in the order they were made (rebuilt from the columns for finished
        requests: a copy, meant for small runs and tests)."""
        self._cols.flush()
        self._cols.reserve(self._n)
        cols = [c[:self._n].tolist() for c in self._cols.cols]
        out = []
        for row, vals in enumerate(zip(*cols, strict=True)):
            live = self._live.get(row)
            out.append(live if live is not None else
                       RequestRecord(**dict(zip(COLUMNS, vals, strict=True)), row=row))
        return out

    def __len__(self) -> int:
        """Records so far (one per request admitted or dropped)."""
        return self._n

    def open(self, req: Req, now: float, *, reused: int, holes: int, ideal: int,
             recomputed: list[tuple[int, int]], recompute_units: float, segments: Any,
             bs: int, loaded: int = 0, found: Any = None) -> RequestRecord:
        """``segments``: the match after any CPU load, so GPU runs are hit or loaded;
        ``found``: the match before it (its GPU runs are the hit; default ``segments``);
        ``recomputed``: the positions inside the ideal prefix computed again, which the
        engine priced as ``recompute_units`` (``EngineBase.open_record``)."""
        rec = self._record(req)
        rec.admit_s = now
        rec.queue_wait_s = now - req.arrival
        rec.hit_gpu_tokens = reused
        rec.loaded_cpu_tokens = loaded
        rec.hole_tokens = holes
        rec.ideal_hit_tokens = ideal
        prompt = req.prompt
        rec.dropped_tokens = prompt.skipped_tokens
        rec.restored_tokens = prompt.restored_tokens
        rec.reprefill_tokens = prompt.reprefill_tokens
        rec.rerotated_tokens = prompt.rerotated_tokens
        for a, b in recomputed:
            self._histogram(a, b)
            self._recomputed += (a, b)
        rec.recompute_units = recompute_units
        rec.recomputed_tokens = sum(b - a for a, b in recomputed)
        rec.new_tokens = (req.prompt_tokens - reused - loaded - rec.recomputed_tokens
                          - rec.dropped_tokens)
        shared = self.shared_blocks[req.session] * bs
        private_ideal = max(0, ideal - shared)
        private_lost = sum(max(0, b - max(a, shared)) for a, b in recomputed)
        rec.private_lost = private_lost / private_ideal if private_ideal else 0.0
        if self.listener is not None:
            self.listener.opened(req, segments if found is None else found)
        return rec

    def _histogram(self, a: int, b: int) -> None:
        """Count positions ``[a, b)`` into the bins they fall in (the last bin is open)."""
        width, last, hist = HIST_BIN_TOKENS, HIST_BINS - 1, self._hist
        a = max(a, 0)
        if a >= b:
            return
        i = min(a // width, last)
        j = min((b - 1) // width, last)  # the bin of the last position
        if i == j:
            hist[i] += b - a
            return
        hist[i] += (i + 1) * width - a
        for k in range(i + 1, j):  # the bins between are covered whole
            hist[k] += width
        hist[j] += b - j * width

    @property
    def hist(self) -> np.ndarray:
        """Recomputed prompt positions per bin of ``HIST_BIN_TOKENS`` (int64; the last bin
        collects the rest)."""
        return np.asarray(self._hist, dtype=np.int64)

    def prefill_units(self, req: Req, total: float, attention: int) -> None:
        """A prefill chunk of ``req`` the engine priced: ``total`` units, ``attention`` of
        them attention (``costmodel.units.Units``)."""
        rec = cast(RequestRecord, req.record)  # (an admitted request's)
        rec.prefill_units += total
        rec.attention_units += attention

    def first_token(self, req: Req, now: float) -> None:
        rec = cast(RequestRecord, req.record)  # (an admitted request's)
        rec.first_token_s = now
        rec.ttft_s = now - req.arrival
        self._last_token[req.rid] = now
        if self.listener is not None:
            self.listener.first_token(req)

    def tokens(self, reqs: Sequence[Req], n: int, first_at: float, last_at: float,
               step_s: float = 0.0, inc_s: float = 0.0) -> None:
        """Each of ``reqs`` (past its first token) got ``n`` tokens: the first at
        ``first_at``, then one every ``step_s + inc_s * i`` (``i = 0 .. n-2``, a decode run's
        steps), the last at ``last_at``. Gaps are kept in closed form (sim/engines/latency.py)."""
        last = self._last_token
        tail = step_s + inc_s * (n - 2) if n > 1 else -math.inf
        for r in reqs:
            before = last.get(r.rid)
            if before is not None:  # (a request without a first token has no gap yet)
                gap = first_at - before
                self.gaps.add(gap)
                rec = cast(RequestRecord, r.record)
                top = max(gap, tail)
                if not top <= rec.itl_max_s:  # (NaN at first)
                    rec.itl_max_s = top
                    if self._folded(rec):  # (a request in a decode run it finished in)
                        self._cols.flush()
                        self._cols.cols = write(self._cols.cols, np.asarray([rec.row]),
                                                [rec.values()])
            last[r.rid] = last_at
        self.gaps.add_series(step_s, inc_s, n - 1, len(reqs))

    def close(self, req: Req, now: float) -> None:
        rec = cast(RequestRecord, req.record)  # (an admitted request's)
        rec.end_s = now
        rec.decoded_tokens = max(0, req.generated - 1)
        last = self._last_token.pop(req.rid, None)
        if rec.decoded_tokens and last is not None:
            rec.tpot_s = (last - rec.first_token_s) / rec.decoded_tokens
        self._fold(rec)

    def drop(self, req: Req, now: float, reason: str = "cache") -> None:
        """``reason``: ``context`` (prompt above the model's context) or ``cache`` (prompt and
        decode reservation cannot fit in the cache even when it holds nothing else)."""
        rec = req.record or self._record(req)
        rec.dropped = True
        rec.drop_reason = reason
        rec.end_s = now
        self._fold(rec)

    def retracted(self, req: Req) -> None:
        cast(RequestRecord, req.record).retractions += 1
        self.counters["retractions"] += 1

    def redone(self, req: Req, tokens: int, units: float) -> None:
        """Prefill of positions the request had computed before a preemption/retraction,
        priced by the engine."""
        rec = cast(RequestRecord, req.record)
        rec.preempted_recompute_tokens += tokens
        rec.preempted_recompute_units += units

    def aborted(self, req: Req) -> None:
        """The server ends ``req`` before its output is complete (it closes it next): the
        row says so, and every count of aborts reads the rows."""
        cast(RequestRecord, req.record).aborted = True

    def evicted(self, freed_blocks: int, deleted_blocks: int, demoted_blocks: int = 0,
                holes_made: int = 0) -> None:
        """What one call that made room did (the engine reads it off the cache's result):
        ``freed_blocks`` GPU blocks freed; ``deleted_blocks``: last copies removed (either
        tier), whatever made them; ``demoted_blocks`` moved to the CPU tier (counted apart);
        ``holes_made``: deleted blocks left in the tree as holes. ``evictions`` counts the
        calls that freed GPU room."""
        c = self.counters
        if freed_blocks:
            c["evictions"] += 1
            if self.observer is not None:
                self.observer.evicted(deleted_blocks, demoted_blocks)
        # (an update that adds nothing is skipped: every pass under pressure evicts)
        if deleted_blocks:
            c["evicted_blocks"] += deleted_blocks
        if demoted_blocks:
            c["demoted_blocks"] += demoted_blocks
        if holes_made:
            c["holes_made_blocks"] += holes_made

    def loaded(self, ld: Any, bs: int) -> None:
        c = self.counters
        c["cpu_loads"] += 1
        if self.observer is not None:
            self.observer.loaded(ld.loaded_blocks)
        c["loaded_blocks"] += ld.loaded_blocks
        c["load_demoted_blocks"] += ld.demoted_blocks
        c["load_deleted_blocks"] += ld.deleted_blocks
        if ld.swap_blocks:
            c["swap_buffer_loads"] += 1
            c["swap_buffer_blocks"] += ld.swap_blocks
            c["swap_chunks"] += ld.swap_chunks

    def transferred(self, h2d_bytes: int, d2h_bytes: int) -> None:
        self.counters["bytes_h2d"] += h2d_bytes
        self.counters["bytes_d2h"] += d2h_bytes
        if self.observer is not None and (h2d_bytes or d2h_bytes):
            self.observer.transferred(h2d_bytes, d2h_bytes)

    def batch(self, seconds: float, n: int, start: float | None = None,
              tokens: int | None = None) -> None:
        """A batch with prefill work of ``n`` requests (``tokens`` computed), starting at
        ``start`` (the observer's clock now when not given)."""
        self.counters["prefill_batches"] += 1
        self.counters["prefill_seconds"] += seconds
        if self.observer is not None:
            self.observer.batch(self.observer.tl.now() if start is None else start, seconds,
                                n, tokens)

    def decode(self, seconds: float, steps: int, start: float | None = None,
               batch: int | None = None) -> None:
        """A decode event of ``steps`` steps of ``batch`` sequences that ran from ``start``
        (when not given: it just ended)."""
        self.counters["decode_events"] += 1
        self.counters["decode_steps"] += steps
        self.counters["decode_seconds"] += seconds
        if self.observer is not None:
            self.observer.decode(self.observer.tl.now() - seconds if start is None else start,
                                 seconds, steps, batch)

    def observe(self, observer: Any) -> None:
        """Tell ``observer`` (a sim/timeline.py Track) of every batch, eviction and load."""
        self.observer = observer

    def session_started(self, s: int, now: float) -> None:
        self.session_start[s] = now

    def session_ended(self, s: int, now: float) -> None:
        self.session_end[s] = now

    def adopt_sessions(self, source: RunRecorder, sessions: Iterable[int] | None = None
                       ) -> None:
        """Replace this recorder's session times with ``source``'s for ``sessions`` (all of
        them when None): a fleet's replay times the sessions once, for every replica's
        summary (sim/fleet/results.py)."""
        if sessions is None:
            self.session_start = dict(source.session_start)
            self.session_end = dict(source.session_end)
            return
        ids = list(sessions)
        self.session_start = {s: source.session_start[s] for s in ids
                              if s in source.session_start}
        self.session_end = {s: source.session_end[s] for s in ids if s in source.session_end}

    @classmethod
    def merged(cls, parts: list[RunRecorder], sessions: RunRecorder) -> RunRecorder:
        """One recorder of ``parts``' requests, counters, histogram and token gaps together,
        its session times ``sessions``' (a fleet's or PD pools' totals, in one summary)."""
        out = cls(sessions.names, sessions.turn0, sessions.is_sub, sessions.shared_blocks)
        for part in parts:
            out.absorb(part)
        out.adopt_sessions(sessions)
        return out

    @staticmethod
    def summaries(parts: list[RunRecorder], sessions: RunRecorder, homes: list[list[int]],
                  sim_end: float, block_size: int) -> list[dict[str, Any]]:
        """Each of ``parts``' summary over its own requests, its session times ``sessions``'
        for its ``homes`` (a fleet replica's: the sessions whose first request it served),
        without the fields that are tables (a dict or a list)."""
        out = []
        idle: tuple | None = None  # (counters, histogram, summary) of the first empty part
        for part, mine in zip(parts, homes, strict=True):
            if not part._n and not mine and idle is not None and part.counters == idle[0] \
                    and part._hist == idle[1]:
                out.append(dict(idle[2]))  # an empty part's summary is every such part's
                continue
            part.adopt_sessions(sessions, mine)
            s = part.summary(sim_end, block_size)
            s = {k: v for k, v in s.items() if not isinstance(v, (dict, list))}
            if not part._n and not mine and idle is None:
                idle = (dict(part.counters), list(part._hist), dict(s))
            out.append(s)
        return out

    def absorb(self, other: RunRecorder) -> None:
        """Add ``other``'s requests, prompt histogram, token gaps and counters to this
        recorder's (a fleet's totals from its replicas')."""
        self._cols.flush()
        other._cols.flush()
        base = self._n
        self._cols.reserve(base + other._n)
        mine = self._cols.cols
        for i, col in enumerate(other._cols.cols):
            mine[i], theirs = _joined(mine[i], col[:other._n])
            mine[i][base:base + other._n] = theirs
        for row, rec in other._live.items():  # still open there: the same objects
            self._live[base + row] = rec
        self._n += other._n
        self._hist = [x + y for x, y in zip(self._hist, other._hist, strict=True)]
        self._recomputed += other._recomputed
        self.gaps.extend(other.gaps)
        for k, v in other.counters.items():
            self.counters[k] = self.counters.get(k, 0) + v

    @property
    def recomputed_ranges(self) -> list[tuple[int, int]]:
        """Every recomputed range ``[a, b)`` of the first admissions, in order: what
        sim/run/summary.py prices per KV cache group (O(ranges), never per token)."""
        ends = self._recomputed
        return list(zip(ends[0::2], ends[1::2], strict=True))

    # --- results ------------------------------------------------------------------------
    def columns(self) -> ColumnTable:
        """Its requests as columns (``COLUMNS``), sorted by send time, then request."""
        if not self._n:  # a fleet replica that served nothing: no rows, the same dtypes
            return ColumnTable({name: _Columns._typed(name, 0) for name in COLUMNS}, _STR_COLUMNS)
        self._cols.flush()
        n = self._n
        self._cols.reserve(n)
        cols = [c[:n] for c in self._cols.cols]
        if self._live:  # requests still open at the end: their records as they stand
            rows = np.fromiter(self._live, dtype=np.int64, count=len(self._live))
            cols = write([c.copy() for c in cols], rows,
                         [r.values() for r in self._live.values()])
        by = dict(zip(COLUMNS, cols, strict=True))
        # sort_values(["send_s", "request"], kind="stable"): a stable lexsort, ties in order
        order = np.lexsort((by["request"], by["send_s"]))
        return ColumnTable({k: v[order] for k, v in by.items()}, _STR_COLUMNS)

    def table(self) -> pd.DataFrame:
        """Its requests table (``columns`` as a DataFrame)."""
        return self.columns().frame() if self._n else empty_table()

    def summary(self, sim_end: float, block_size: int,
                df: ColumnTable | pd.DataFrame | None = None) -> dict[str, Any]:
        t = self.columns() if df is None else ColumnTable.of(df)
        # One row per request is the one source of truth for what happened to it (a PD
        # request's drop on both workers is one row): ``ok`` were admitted (the work they
        # made the server do counts), ``served`` also got their whole reply (vllm bench
        # serve's successful requests: what latency, requests and output count).
        dropped = t["dropped"].astype(bool)
        ok = t.rows(~dropped)
        aborted = ok["aborted"].astype(bool)
        served = ok.rows(~aborted)
        reasons = t["drop_reason"][dropped]
        ttft = served["ttft_s"].astype(float)
        ttft = ttft[np.isfinite(ttft)]
        done = [s for s in sorted(self.session_end) if s in self.session_start]
        # A job is a top-level session; its sub-agents run inside it (own fields below).
        jct = np.array([self.session_end[s] - self.session_start[s]
                        for s in done if not self.is_sub[s]])
        sub_jct = np.array([self.session_end[s] - self.session_start[s]
                            for s in done if self.is_sub[s]])
        prompt = float(ok["prompt_tokens"].sum()) if len(ok) else 0.0
        recomputed = ok["recomputed_tokens"].astype(float)
        lost = ok["private_lost"].astype(float)
        rec_units = ok["recompute_units"].astype(float)

        def pct(q: float) -> float:
            return float(np.percentile(ttft, q)) if ttft.size else math.nan

        share_tokens = (float(recomputed[lost >= LOST_THRESHOLD].sum() / recomputed.sum())
                        if recomputed.sum() else math.nan)
        share_units = (float(rec_units[lost >= LOST_THRESHOLD].sum() / rec_units.sum())
                       if rec_units.sum() else math.nan)
        c = self.counters
        return {
            "requests": len(served),
            "sessions_completed": len(jct),
            "dropped_requests": int(dropped.sum()),
            "dropped_over_context": int((reasons == "context").sum()),
            "dropped_cache_too_small": int((reasons == "cache").sum()),
            "ttft_mean_s": float(ttft.mean()) if ttft.size else math.nan,
            "ttft_p50_s": pct(50),
            "ttft_p90_s": pct(90),
            "ttft_p99_s": pct(99),
            "jct_mean_s": float(jct.mean()) if jct.size else math.nan,
            "subagents_completed": len(sub_jct),
            "subagent_jct_mean_s": float(sub_jct.mean()) if sub_jct.size else math.nan,
            "queue_wait_mean_s": _mean(served["queue_wait_s"]),
            "hit_rate": float(ok["hit_gpu_tokens"].sum() / prompt) if prompt else math.nan,
            "ideal_hit_rate": float(ok["ideal_hit_tokens"].sum() / prompt) if prompt else math.nan,
            "prompt_tokens": int(prompt),
            "recomputed_tokens": int(recomputed.sum()),
            "hole_tokens": int(ok["hole_tokens"].sum()) if len(ok) else 0,
            "new_tokens": int(ok["new_tokens"].sum()) if len(ok) else 0,
            "recompute_units": float(rec_units.sum()),
            "prefill_units": _total(ok["prefill_units"]),
            "decoded_tokens": int(ok["decoded_tokens"].sum()) if len(ok) else 0,
            "loaded_cpu_tokens": int(ok["loaded_cpu_tokens"].sum()) if len(ok) else 0,
            "recompute_share_lost90_tokens": share_tokens,
            "recompute_share_lost90_units": share_units,
            "evictions": int(c["evictions"]),
            "evicted_tokens": int(c["evicted_blocks"] + c["load_deleted_blocks"]) * block_size,
            "holes_made_tokens": int(c["holes_made_blocks"]) * block_size,
            "demoted_tokens": int(c["demoted_blocks"] + c["load_demoted_blocks"]) * block_size,
            "retractions": int(c["retractions"]),
            "preempted_recompute_tokens": (int(ok["preempted_recompute_tokens"].sum())
                                           if len(ok) else 0),
            "preempted_recompute_units": _total(ok["preempted_recompute_units"]),
            "aborted": int(aborted.sum()),
            "bytes_h2d": int(c["bytes_h2d"]),
            "bytes_d2h": int(c["bytes_d2h"]),
            "cpu_hit_rate": float(ok["loaded_cpu_tokens"].sum() / prompt) if prompt else math.nan,
            "cpu_loads": int(c["cpu_loads"]),
            "swap_buffer_loads": int(c["swap_buffer_loads"]),
            "swap_buffer_tokens": int(c["swap_buffer_blocks"]) * block_size,
            "swap_chunks": int(c["swap_chunks"]),
            "prefill_batches": int(c["prefill_batches"]),
            "prefill_busy_s": float(c["prefill_seconds"]),
            "decode_events": int(c["decode_events"]),
            "decode_steps": int(c["decode_steps"]),
            "decode_busy_s": float(c["decode_seconds"]),
            "sim_end_s": float(sim_end),
            **latency_fields(served, self.gaps, sim_end),
            "recompute_position_hist": {
                "bin_tokens": HIST_BIN_TOKENS, "tokens": list(self._hist)},
        }


def _total(values: np.ndarray) -> float:
    """A float column's sum, NaN skipped (pandas' ``Series.sum``: NaN made 0, then summed)."""
    return float(np.nansum(values)) if len(values) else 0.0


def _mean(values: np.ndarray) -> float:
    """A column's mean, NaN skipped (pandas' ``Series.mean``: the sum with NaN made 0, over
    the count of the others); NaN when none is left."""
    a = values.astype(float)
    count = len(a) - int(np.isnan(a).sum())
    return float(np.nansum(a) / count) if count else math.nan


def _percentiles(values: np.ndarray, name: str) -> dict[str, float]:
    v = values[np.isfinite(values)]
    if not v.size:
        return {f"{name}_{k}_s": math.nan for k in ("mean", "p50", "p90", "p99")}
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {f"{name}_mean_s": float(v.mean()), f"{name}_p50_s": float(p50),
            f"{name}_p90_s": float(p90), f"{name}_p99_s": float(p99)}


def latency_fields(ok: ColumnTable, gaps: TokenGaps, sim_end: float) -> dict[str, Any]:
    """TPOT, inter-token latency, end-to-end latency and token rates of the served requests
    ``ok`` (docs/engine.md, Metrics). Rates are over the run's duration (0 to its end)."""
    if len(ok):
        tpot = ok["tpot_s"].astype(float)
        e2e = (ok["end_s"] - ok["send_s"]).astype(float)
        first = np.isfinite(ok["first_token_s"].astype(float))
        output = int(ok["decoded_tokens"].sum()) + int(first.sum())
        prompt = int(ok["prompt_tokens"].sum())
    else:
        tpot = e2e = np.array([])
        output = prompt = 0
    itl = dict(zip(("itl_p50_s", "itl_p90_s", "itl_p99_s"),
                   gaps.percentiles((50, 90, 99)), strict=True))
    return {
        **_percentiles(tpot, "tpot"),
        "itl_mean_s": gaps.mean(), **itl,
        **_percentiles(e2e, "e2e"),
        "output_tokens": output,
        "output_tokens_per_s": output / sim_end if sim_end > 0 else math.nan,
        "total_tokens_per_s": (prompt + output) / sim_end if sim_end > 0 else math.nan,
    }
