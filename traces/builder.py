"""Assemble a ``Trace`` from sessions of requests, then apply the loading options.

Loaders (and generators) open sessions and add requests with their full cache-block ids in an
id *scope* (a cc-traces file, a Mooncake trace, a FreeInference week...). The builder keeps per
request only the number of leading blocks shared with the previous request of the session and
the new ids, so memory scales with distinct blocks. ``build`` then applies, in this order:

1. ``max_context``: a session ends before its first request with ``prompt_tokens > max_context``
   (sub-agents spawned after a removed request go too; a sub-agent's own requests are cut the
   same way). On the published cc-traces at 131,072 this leaves 12,530 main-agent requests.
2. ``select``: ``top-requests:K`` keeps the K top-level sessions with the most requests after
   the cut (ties: trace order), in trace order, with their sub-agents; ``first:K`` the first K.
3. ``shared_prefix``: the first N tokens (``auto``: the session's system + tool-definition
   tokens, where the trace records them) of every top-level session's first prompt become one
   global chain of shared ids ``0 .. N/block_size - 1``; every other id is made global by
   offsetting its scope. Sub-agents keep their own ids (their prompts differ from the parent's).

Regions (traces.regions): each session's ``Layout`` gives the region of every id a request adds;
they are stored beside the ids (uint8, aligned with the pool). An id added twice in a scope
keeps the region of its first addition, and a block of the global shared prefix is ``tools``
or ``system`` (from the first session holding it, anything else counting as ``system``), so
a region is a function of the block id across the whole Trace.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from .errors import OptionError
from .kinds import GAP_FIRST
from .model import Session, Trace
from .regions import REGION_SYSTEM, REGION_TOOLS, REGION_UNKNOWN, Layout

_EMPTY = np.zeros(0, np.int64)


@dataclass
class _Open:
    id: str
    scope: int
    parent: int
    after_local: int
    start_offset_s: float
    agent_type: str
    prefix_hint_tokens: int
    # per request, typed arrays (8 bytes a value, not a Python object each)
    prompt: array = field(default_factory=lambda: array("q"))
    output: array = field(default_factory=lambda: array("q"))
    send: array = field(default_factory=lambda: array("d"))
    gap: array = field(default_factory=lambda: array("d"))
    kind: array = field(default_factory=lambda: array("q"))
    model: array = field(default_factory=lambda: array("q"))
    kinds: array = field(default_factory=lambda: array("q"))
    prefix: array = field(default_factory=lambda: array("q"))
    new: list[np.ndarray] = field(default_factory=list)
    last: np.ndarray | None = None
    layout: Layout | None = None  # token-level regions of the current prompt
    reg_vals: array = field(default_factory=lambda: array("q"))  # new ids' regions, run-length
    reg_counts: array = field(default_factory=lambda: array("q"))
    # ``TraceBuilder(keep_within=...)``: nothing after this session's first request over it
    # is stored (cut), or nothing at all (dead: ``build`` would drop the whole session)
    cut: bool = False
    dead: bool = False
    # the trace's own hash ids (partial last block included), compact like ``new``
    src_len: list[int] = field(default_factory=list)
    src_new: list[np.ndarray] = field(default_factory=list)
    src_last: np.ndarray | None = None


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two id arrays (vectorized)."""
    m = min(a.shape[0], b.shape[0])
    if m == 0:
        return 0
    neq = a[:m] != b[:m]
    i = int(np.argmax(neq))
    return m if not neq[i] else i


def sorted_unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique's hash path is slow on millions of int64)."""
    a = np.sort(a)
    if a.shape[0] < 2:
        return a
    keep = np.empty(a.shape[0], bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def parse_select(select: str | None) -> tuple[str, int] | None:
    if select is None or select == "":
        return None
    kind, sep, arg = str(select).partition(":")
    if sep and kind in ("top-requests", "first") and arg.isdigit() and int(arg) > 0:
        return kind, int(arg)
    raise OptionError(f"bad --select {select!r}: expected top-requests:K or first:K (K >= 1)")


class TraceBuilder:
    """``keep_within``: the ``max_context`` of the one ``build`` to come (a generator that
    builds once, traces/synthetic.py): requests that cut would remove are not stored, so
    memory follows the trace built, not the one generated. ``build`` then requires that
    ``max_context``, and ``storage`` (which serves every one) is refused."""

    def __init__(self, name: str, format: str, source: str, block_size: int,
                 keep_within: int | None = None):
        if not isinstance(block_size, int) or block_size < 1:
            raise OptionError(f"block size must be a positive integer, got {block_size!r}")
        self.name, self.format, self.source, self.block_size = name, format, source, block_size
        self.keep_within = keep_within
        self.skipped = 0
        self.base_options: dict = {}  # recorded in every built Trace's options
        self._sessions: list[_Open] = []
        self._models: dict[str, int] = {}
        self._without_hash_ids = False  # a request came without the file's hash ids

    # -- input ------------------------------------------------------------------------------
    def open_session(self, id: str, *, scope: int = 0, parent: int = -1, after_local: int = -1,
                     start_offset_s: float = 0.0, agent_type: str = "",
                     prefix_hint_tokens: int = 0,
                     prefix_regions: tuple[tuple[int, int], ...] = ()) -> int:
        """A new session; ``after_local`` is the parent's local request index after whose reply
        a sub-agent starts (-1 = before its first request). ``prefix_regions``: (region,
        tokens) runs that start every prompt of the session (traces.regions)."""
        s = _Open(id, scope, parent, after_local, float(start_offset_s), agent_type,
                  int(prefix_hint_tokens), layout=Layout(prefix_regions))
        if parent >= 0 and self.keep_within is not None:
            p = self._sessions[parent]
            kept = len(p.prompt) - 1  # the parent's requests ``build`` keeps, when cut
            s.dead = p.dead or (p.cut and (kept == 0 or after_local >= kept))
        self._sessions.append(s)
        return len(self._sessions) - 1

    @property
    def n_sessions(self) -> int:
        return len(self._sessions)

    def n_requests(self, h: int) -> int:
        return len(self._sessions[h].prompt)

    def add(self, h: int, *, prompt: int, output: int, ids: np.ndarray, send_time_s: float,
            gap_s: float, gap_kind: int, model: str = "", kinds: int = 0,
            input_region: int | None = None, hash_ids: np.ndarray | None = None) -> None:
        """Append a request; ``ids`` are its full-block ids in the session's scope.

        ``input_region``: the region of its new input (traces.regions); None when the format
        cannot tell (its new blocks are ``unknown``). ``hash_ids``: the ids the trace file
        lists for the prompt, in its own block size, a partial last block's included (what
        its publisher counts); None for a format that has none."""
        s = self._sessions[h]
        if ids.shape[0] != prompt // self.block_size:
            raise ValueError("ids must have prompt // block_size entries")
        if s.cut or s.dead:  # ``build(max_context=keep_within)`` drops it: not stored
            self._models.setdefault(model, len(self._models))
            self._without_hash_ids |= hash_ids is None
            return
        if self.keep_within is not None and prompt > self.keep_within:
            s.cut = True  # stored (``build`` finds the cut there), the rest of it is not
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        k = 0 if s.last is None else common_prefix(s.last, ids)
        s.prefix.append(k)
        s.new.append(ids[k:].copy() if k else ids)
        if hash_ids is None:
            self._without_hash_ids = True
        else:
            src = np.ascontiguousarray(hash_ids, dtype=np.int64)
            j = 0 if s.src_last is None else common_prefix(s.src_last, src)
            s.src_len.append(int(src.shape[0]))
            if j == k and np.array_equal(src, ids):  # the cache's own blocks: share them
                s.src_new.append(s.new[-1])
            else:
                s.src_new.append(src[j:].copy() if j else src)
            s.src_last = src
        assert s.layout is not None, "add() after close()"
        vals, counts = s.layout.advance(int(prompt), int(output), k, self.block_size,
                                        input_region)
        s.reg_vals.extend(vals)
        s.reg_counts.extend(counts)
        s.last = ids
        s.prompt.append(int(prompt))
        s.output.append(int(output))
        s.send.append(float(send_time_s))
        s.gap.append(0.0 if not s.kind else max(0.0, float(gap_s)))
        s.kind.append(GAP_FIRST if not s.kind else int(gap_kind))
        s.model.append(self._models.setdefault(model, len(self._models)))
        s.kinds.append(int(kinds))

    def close(self, h: int) -> None:
        """Done with a session: drop its last prompt's ids and layout (memory)."""
        self._sessions[h].last = None
        self._sessions[h].src_last = None
        self._sessions[h].layout = None

    # -- storage (traces.cache) --------------------------------------------------------------
    # per request, as int64 or float64 (exact for what ``add`` stores)
    _REQUEST_INTS = ("prompt", "output", "kind", "model", "kinds", "prefix")
    _REQUEST_FLOATS = ("send", "gap")
    _SESSION_FIELDS = ("id", "scope", "parent", "after_local", "start_offset_s", "agent_type",
                       "prefix_hint_tokens")

    def storage(self) -> tuple[dict[str, np.ndarray], dict]:
        """Everything ``build`` reads, as arrays and a JSON-able dict: what a cache file holds
        to make the same builder again (``from_storage``), whatever ``build`` is asked later.
        The file's own hash ids are kept when every request had them (else ``build`` counts
        none); a request's that are its cache blocks are stored once."""
        if self.keep_within is not None:
            raise ValueError("a builder made with keep_within holds one build's requests only")
        ss = self._sessions
        new = [a for s in ss for a in s.new]
        src = [] if self._without_hash_ids else [a for s in ss for a in s.src_new]
        shared = [a is b for s in ss for a, b in zip(s.src_new, s.new, strict=True)] \
            if src else []
        own = [a for a, same in zip(src, shared, strict=True) if not same]
        arrays = {
            "req_ptr": np.cumsum([0] + [len(s.prompt) for s in ss], dtype=np.int64),
            "new_ptr": np.cumsum([0] + [a.shape[0] for a in new], dtype=np.int64),
            "new_ids": np.concatenate(new).astype(np.int64, copy=False) if new else _EMPTY,
            "reg_ptr": np.cumsum([0] + [len(s.reg_vals) for s in ss], dtype=np.int64),
            "reg_vals": np.asarray([v for s in ss for v in s.reg_vals], np.int64),
            "reg_counts": np.asarray([c for s in ss for c in s.reg_counts], np.int64),
            "src_len": np.asarray([n for s in ss for n in s.src_len] if src else [], np.int64),
            "src_shared": np.asarray(shared, bool),
            "src_ptr": np.cumsum([0] + [a.shape[0] for a in own], dtype=np.int64),
            "src_ids": np.concatenate(own).astype(np.int64, copy=False) if own else _EMPTY,
        }
        for k in self._REQUEST_INTS:
            arrays[k] = np.asarray([v for s in ss for v in getattr(s, k)], np.int64)
        for k in self._REQUEST_FLOATS:
            arrays[k] = np.asarray([v for s in ss for v in getattr(s, k)], np.float64)
        meta = {"name": self.name, "format": self.format, "source": self.source,
                "block_size": self.block_size, "skipped": self.skipped,
                "base_options": self.base_options, "models": list(self._models),
                "without_hash_ids": self._without_hash_ids,
                "sessions": [[getattr(s, k) for k in self._SESSION_FIELDS] for s in ss]}
        return arrays, meta

    @classmethod
    def from_storage(cls, arrays: dict[str, np.ndarray], meta: dict) -> TraceBuilder:
        """The builder ``storage`` describes (lists and scalars of the same values and Python
        types as ``add`` made, so ``build`` gives the same Trace). Raises ``ValueError`` on
        arrays that do not fit together."""
        b = cls(meta["name"], meta["format"], meta["source"], int(meta["block_size"]))
        b.restore(arrays, meta)
        return b

    def restore(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Fill this new builder with what ``storage`` describes (see ``from_storage``)."""
        self.skipped = int(meta["skipped"])
        self.base_options = dict(meta["base_options"])
        self._models = {m: i for i, m in enumerate(meta["models"])}
        self._without_hash_ids = bool(meta["without_hash_ids"])
        cls = type(self)
        req, new_ptr, reg = arrays["req_ptr"], arrays["new_ptr"], arrays["reg_ptr"]
        R, n_s = int(req[-1]), len(meta["sessions"])
        if (req.shape != (n_s + 1,) or reg.shape != (n_s + 1,) or new_ptr.shape != (R + 1,)
                or int(new_ptr[-1]) != arrays["new_ids"].shape[0]
                or any(arrays[k].shape != (R,) for k in (*cls._REQUEST_INTS,
                                                          *cls._REQUEST_FLOATS))
                or arrays["reg_vals"].shape != arrays["reg_counts"].shape
                or int(reg[-1]) != arrays["reg_vals"].shape[0]):
            raise ValueError("the stored builder's arrays do not fit together")
        ids, ptr = arrays["new_ids"], new_ptr.tolist()
        new = [ids[ptr[r]:ptr[r + 1]] for r in range(R)]
        src_len, shared = arrays["src_len"].tolist(), arrays["src_shared"].tolist()
        own_ids, own_ptr = arrays["src_ids"], arrays["src_ptr"].tolist()
        with_src = not self._without_hash_ids
        if with_src and (len(src_len) != R or len(shared) != R
                         or len(own_ptr) != R - sum(shared) + 1
                         or own_ptr[-1] != own_ids.shape[0]):
            raise ValueError("the stored builder's hash ids do not fit its requests")
        src: list[np.ndarray] = []
        k = 0
        for r in range(R if with_src else 0):
            if shared[r]:
                src.append(new[r])
            else:
                src.append(own_ids[own_ptr[k]:own_ptr[k + 1]])
                k += 1
        cols = {k: (arrays[k].astype(np.int64), "q") for k in cls._REQUEST_INTS}
        cols.update({k: (arrays[k].astype(np.float64), "d") for k in cls._REQUEST_FLOATS})
        vals, counts = arrays["reg_vals"].astype(np.int64), arrays["reg_counts"].astype(np.int64)
        for h, fields in enumerate(meta["sessions"]):
            s = _Open(*fields)
            a, z = int(req[h]), int(req[h + 1])
            for k, (v, code) in cols.items():
                setattr(s, k, array(code, v[a:z].tobytes()))
            s.new = new[a:z]
            if with_src:
                s.src_len, s.src_new = src_len[a:z], src[a:z]
            s.reg_vals = array("q", vals[reg[h]:reg[h + 1]].tobytes())
            s.reg_counts = array("q", counts[reg[h]:reg[h + 1]].tobytes())
            self._sessions.append(s)

    # -- output -----------------------------------------------------------------------------
    def build(self, *, shared_prefix: int | str | None = None, max_context: int | None = None,
              select: str | None = None, options: dict | None = None) -> Trace:
        bs = self.block_size
        if self.keep_within is not None and max_context != self.keep_within:
            raise ValueError(f"this builder keeps the requests of max_context="
                             f"{self.keep_within} only, not {max_context}")
        sel = parse_select(select)
        ss = self._sessions
        # 1. the context cut
        keep_n = []
        for s in ss:
            n = len(s.prompt)
            if max_context is not None:
                over = np.flatnonzero(np.asarray(s.prompt, np.int64) > int(max_context))
                if over.size:
                    n = int(over[0])
            keep_n.append(n)
        alive = [False] * len(ss)
        for i, s in enumerate(ss):  # parents are opened before their sub-agents
            if keep_n[i] == 0:
                continue
            if s.parent < 0:
                alive[i] = True
            else:
                alive[i] = alive[s.parent] and s.after_local < keep_n[s.parent]
        firsts = [s.prompt[0] for s in ss if s.parent < 0 and s.prompt]
        if max_context is not None and firsts and not any(alive):
            raise OptionError(f"--max-context {int(max_context):,}: no request is left (every "
                              f"session's first prompt is longer; the shortest has "
                              f"{min(firsts):,} tokens)")
        # 2. selection among top-level sessions
        tops = [i for i, s in enumerate(ss) if s.parent < 0 and alive[i]]
        if sel is not None:
            kind, k = sel
            if kind == "top-requests":
                ranked = sorted(tops, key=lambda i: (-keep_n[i], i))[:k]
            else:
                ranked = tops[:k]
            chosen = set(ranked)
            for i, s in enumerate(ss):
                if s.parent < 0:
                    alive[i] = i in chosen
                else:
                    alive[i] = alive[i] and alive[s.parent]
            tops = [i for i in tops if i in chosen]
        subs = [i for i, s in enumerate(ss) if s.parent >= 0 and alive[i]]
        order = tops + subs
        new_index = {old: j for j, old in enumerate(order)}

        # 3. shared prefix and global ids
        want: dict[int, int] = {}
        if shared_prefix is not None:
            for i in tops:
                s = ss[i]
                if shared_prefix == "auto":
                    n_tok = s.prefix_hint_tokens
                elif isinstance(shared_prefix, int) and shared_prefix >= 0:
                    n_tok = shared_prefix
                else:
                    raise OptionError(f"bad shared prefix {shared_prefix!r}: expected auto or "
                                      "a number of tokens")
                want[i] = min(n_tok // bs, s.prompt[0] // bs)
        s_max = max(want.values(), default=0)
        # every kept new id in ``order``, made global in place: the pool (a million-request
        # trace holds no second copy of its ids); each scope's ids are numbered apart
        counts = [keep_n[i] for i in order]
        firsts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        new_len = np.asarray([a.shape[0] for i in order for a in ss[i].new[:keep_n[i]]],
                             np.int64)
        new_end = np.concatenate([[0], np.cumsum(new_len)]).astype(np.int64)
        at = new_end[firsts]  # where each session's ids start in the pool
        sizes = np.diff(at)
        parts = [a for i in order for a in ss[i].new[:keep_n[i]]]
        pool = np.concatenate(parts).astype(np.int64, copy=False) if parts else _EMPTY.copy()
        region = _kept_regions([ss[i] for i in order], sizes)
        offset = s_max
        by_scope: dict[int, list[int]] = {}
        for i in order:
            by_scope.setdefault(ss[i].scope, []).append(i)
        column = {i: j for j, i in enumerate(order)}
        for members in by_scope.values():
            where = _positions([(int(at[column[i]]), int(at[column[i] + 1]))
                                for i in members])
            every = pool[where]
            uniq = sorted_unique(every)
            g = np.searchsorted(uniq, every)
            if uniq.shape[0] < every.shape[0]:  # an id seen twice takes its first region
                region[where] = _first_regions(g, region[where])[g]
            keys = [ss[i].new[0][:want[i]] for i in members if want.get(i, 0) > 0]
            g += offset
            if keys:
                kv = np.concatenate(keys)
                kpos = np.concatenate([np.arange(k.shape[0], dtype=np.int64) for k in keys])
                kv, first = np.unique(kv, return_index=True)
                kpos = kpos[first]
                j = np.searchsorted(kv, every)
                j[j >= kv.shape[0]] = 0
                hit = kv[j] == every if kv.shape[0] else np.zeros(every.shape, bool)
                g = np.where(hit, kpos[j], g)
            pool[where] = g
            offset += int(uniq.shape[0])
        if s_max:
            _shared_regions(tops, want, s_max, pool, region,
                            {i: int(at[column[i]]) for i in tops})
        hash_refs, hash_distinct = (0, 0) if self._without_hash_ids else \
            _hash_id_counts(ss, by_scope, keep_n)

        # 4. columns, sessions and the compact id store
        cut = any(keep_n[i] < len(ss[i].prompt) for i in order)

        def col(name: str, dtype: type) -> np.ndarray:
            typed = [getattr(ss[i], name) for i in order]
            if cut:
                typed = [a[:keep_n[i]] for a, i in zip(typed, order, strict=True)]
            if not typed:
                return np.empty(0, dtype)
            return np.frombuffer(b"".join([a.tobytes() for a in typed]),
                                 typed[0].typecode).astype(dtype)

        prompt = col("prompt", np.int64)
        prefix = col("prefix", np.int32)
        sessions = []
        for j, i in enumerate(order):
            s = ss[i]
            parent = new_index[s.parent] if s.parent >= 0 else -1
            after = -1
            if parent >= 0 and s.after_local >= 0:
                after = int(firsts[parent]) + s.after_local
            sessions.append(Session(
                id=s.id, first=int(firsts[j]), count=counts[j], parent=parent,
                after_request=after, start_offset_s=s.start_offset_s,
                shared_prefix_blocks=want.get(i, 0), agent_type=s.agent_type,
                prefix_hint_tokens=s.prefix_hint_tokens))
        pool.setflags(write=False)
        pool_region = region
        pool_region.setflags(write=False)
        new_start = new_end[:-1]
        seg_ptr, seg_start, seg_len = _segments(firsts, prefix, new_start, new_len)
        output = col("output", np.int64)
        n_p = prompt // bs
        n_f = np.maximum(n_p, (prompt + output - 1) // bs)
        out_ptr = np.concatenate([[0], np.cumsum(n_f - n_p)]).astype(np.int64)
        session_col = np.repeat(np.arange(len(order), dtype=np.int32), counts)
        opts = {"block_size": bs, "shared_prefix": shared_prefix, "max_context": max_context,
                "select": select}
        opts.update(self.base_options)
        opts.update(options or {})
        opts["skipped"] = self.skipped
        return Trace(
            name=self.name, block_size=bs, format=self.format, source=self.source,
            sessions=sessions, session=session_col, prompt_tokens=prompt, output_tokens=output,
            send_time_s=col("send", np.float64), gap_s=col("gap", np.float64),
            gap_kind=col("kind", np.int8), model=col("model", np.int16),
            models=list(self._models), input_kinds=col("kinds", np.uint16),
            prefix_blocks=prefix, skipped=self.skipped, options=opts, _pool=pool,
            _pool_region=pool_region,
            _seg_ptr=seg_ptr, _seg_start=seg_start, _seg_len=seg_len,
            _fresh_base=int(offset), _out_ptr=out_ptr, hash_id_refs=hash_refs,
            hash_id_distinct=hash_distinct)


def _hash_id_counts(ss: list[_Open], by_scope: dict[int, list[int]], keep_n: list[int]
                    ) -> tuple[int, int]:
    """References to the trace file's own hash ids over the kept requests, and the distinct
    ids among them (per scope: ids of different scopes are unrelated). A request's ids are
    its session predecessor's first ones plus its new ones, so the distinct ids of a scope are
    those of its requests' new parts."""
    refs = distinct = 0
    for members in by_scope.values():
        refs += sum(sum(ss[i].src_len[:keep_n[i]]) for i in members)
        parts = [a for i in members for a in ss[i].src_new[:keep_n[i]]]
        if parts:
            distinct += int(sorted_unique(np.concatenate(parts)).shape[0])
    return refs, distinct


def _segments(firsts: np.ndarray, prefix: np.ndarray, new_start: np.ndarray,
              new_len: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request, the pool segments whose concatenation is its prompt's ids.

    Request r = the first ``prefix[r]`` blocks of r-1 (same session) + its new ids. New ids
    are appended to the pool in request order, so an append-only chain stays ONE segment."""
    ptr = array("q", [0])  # (typed: a million-request trace has millions of segments)
    starts = array("q")
    lens = array("q")
    for j in range(len(firsts) - 1):
        prev: list[list[int]] = []
        for r in range(int(firsts[j]), int(firsts[j + 1])):
            k = int(prefix[r])
            cur: list[list[int]] = []
            for s, n in prev:
                if k <= 0:
                    break
                cur.append([s, min(n, k)])
                k -= n
            ns, nl = int(new_start[r]), int(new_len[r])
            if nl:
                if cur and cur[-1][0] + cur[-1][1] == ns:
                    cur[-1][1] += nl
                else:
                    cur.append([ns, nl])
            for s, n in cur:
                starts.append(s)
                lens.append(n)
            ptr.append(len(starts))
            prev = cur
    return (np.asarray(ptr, np.int64), np.asarray(starts, np.int64),
            np.asarray(lens, np.int64))


def _kept_regions(sessions: list[_Open], sizes: np.ndarray) -> np.ndarray:
    """uint8 regions of each session's first ``sizes[j]`` new ids, concatenated (each
    session's run-length regions expanded, cut where its kept ids end)."""
    if not sessions:
        return np.zeros(0, np.uint8)
    vals = np.frombuffer(b"".join([s.reg_vals.tobytes() for s in sessions]), np.int64)
    counts = np.frombuffer(b"".join([s.reg_counts.tobytes() for s in sessions]), np.int64)
    full = np.repeat(vals.astype(np.uint8), counts)
    runs = np.concatenate([[0], np.cumsum([len(s.reg_counts) for s in sessions])])
    ends = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    lengths = np.diff(ends[runs])  # each session's expanded regions
    if np.array_equal(lengths, sizes):
        return full
    starts = ends[runs[:-1]]
    kept = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    take = np.arange(int(kept[-1]), dtype=np.int64) + np.repeat(starts - kept[:-1], sizes)
    return full[take]


def _positions(ranges: list[tuple[int, int]]) -> slice | np.ndarray:
    """The pool positions of ``[start, end)`` ranges in order: a slice where they join into
    one (a view, no copy), else their indices."""
    merged: list[list[int]] = []
    for lo, hi in ranges:
        if merged and merged[-1][1] == lo:
            merged[-1][1] = hi
        elif hi > lo:
            merged.append([lo, hi])
    if len(merged) <= 1:
        return slice(*merged[0]) if merged else slice(0, 0)
    return np.concatenate([np.arange(lo, hi, dtype=np.int64) for lo, hi in merged])


def _first_regions(pos: np.ndarray, region: np.ndarray) -> np.ndarray:
    """Per distinct id, the region at its first position (``pos``: each position's index
    among the sorted distinct ids)."""
    order = np.argsort(pos, kind="stable")
    head = np.ones(order.shape[0], bool)
    np.not_equal(pos[order][1:], pos[order][:-1], out=head[1:])
    return region[order[head]]


def _shared_regions(tops: list[int], want: dict[int, int], s_max: int, pool: np.ndarray,
                    region: np.ndarray, at: dict[int, int]) -> None:
    """Shared-prefix block j takes its region from the first top-level session holding it
    (its first prompt's block j, from ``at[i]`` in the pool), as tools or system: the shared
    prefix stands for them. ``region`` is changed in place."""
    shared = np.full(s_max, REGION_UNKNOWN, np.uint8)
    filled = 0
    for i in tops:
        w = want.get(i, 0)
        if w > filled:
            shared[filled:w] = region[at[i] + filled:at[i] + w]
            filled = w
    shared[(shared != REGION_TOOLS) & (shared != REGION_SYSTEM)] = REGION_SYSTEM
    hit = pool < s_max
    region[hit] = shared[pool[hit]]
