"""Context strategies carried out per session: keys, edits and prices of every request.

For each trace request the session state turns the recorded prompt into what the client sends
and what the server must do (a ``RequestView``)::

    trace request r (raw ids, regions) --strategy--> what to take out (strategies.py)
        --> keys of the prompt and of its finish (versions.py: edited KV gets new keys)
        --> the edit of the path the session cached before (drop / repos / splice), applied
            when the request reaches the server (sim.kvcache.edits)
        --> the dropped keys' token intervals and triggers (pricing, restore: plan.py)

Coordinates: ``original`` block indices are the trace's; ``logical`` ones are the blocks the
client sends (trim, splice and summarize remove or replace blocks, drop and budget do not).

Drops (drop:K, budget:B) are events ``(trigger, dropped blocks)``: tokens at or after the
trigger do not attend the dropped blocks, tokens before it did. The trigger is the end of the
prompt that asked for the drop (AKV: after the trigger message), so the request's own prompt
still sees what it drops and its output does not. kvsim takes a drop's effect from the start
of the block holding the trigger (at most 63 tokens early): that block gets the new version,
and its prompt tokens -- recomputed by the next request, since a partial block is never
cached -- do not need the dropped KV back. A block's key names the events with their
trigger at or before the block (its KV was made under them) and, with ``+repos``, the position
its keys are rotated to now; a dropped block's key is negated (``versions``).

Non-append transitions (an edit, a compaction in the trace): the history before the first
changed block is kept; events that took effect after it belonged to the abandoned branch and
are forgotten (the strategy decides again on the new prompt).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import numpy as np

from sim.kvcache.versions import VersionSpace, encode
from traces.regions import REGION_SYSTEM, REGION_TOOL_RESULT, REGION_TOOLS, REGION_USER

from .strategies import (
    Strategy,
    budget_drops,
    keep_removed,
    mask_runs,
    stale_tool_mask,
    tool_spans,
)
from .summary import SessionSummary
from .view import Event, RequestView


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two arrays of chained raw ids."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    if a.item(n - 1) == b.item(n - 1):  # chained: the whole prefix agrees
        return n
    diff = a[:n] != b[:n]
    i = int(diff.argmax())
    return i if diff[i] else n


class SessionState:
    """One session's history under a strategy (module docstring)."""

    def __init__(self, strategy: Strategy, space: VersionSpace, bs: int, sid: int) -> None:
        self.st, self.space, self.bs, self.sid = strategy, space, bs, sid
        self.prev_raw = np.zeros(0, np.int64)  # previous finish, original raw ids
        self.prev_keys = np.zeros(0, np.int64)  # previous finish, logical keys
        self.prev_orig = np.zeros(0, np.int64)  # original index of each logical block
        self.prev_prompt_blocks = 0  # previous prompt's full blocks (original)
        self.dropped = np.zeros(0, bool)  # drop/budget: per original block
        self.events: list[Event] = []
        self.removed = np.zeros(0, bool)  # trim/splice: per original block
        self.summary = SessionSummary(strategy, space, bs, sid)  # summarize:T:S
        self._hid: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # of ``events``
        self._hid_n = 0  # events in ``_hid``
        self._dp: tuple[list[int], list[int], list[int]] = ([], [], [0])  # _dp_chain
        self._runs_cache: tuple[np.ndarray, np.ndarray] | None = None  # _dropped_runs
        self._runs_lists: tuple[list[int], list[int]] = ([], [])
        self._events_index: tuple[list[int], list[int]] | None = None  # _event_index
        self._spans: tuple[list[int], list[int]] = ([], [])  # tool results of the last prompt
        self._spans_dropped = 0  # leading tool results known dropped
        self._ndropped = 0  # dropped blocks (-1: count again)
        self._prompt_dropped = 0  # dropped blocks before the request's own drop

    # --- shared helpers -------------------------------------------------------------------
    def _grow(self, arr: np.ndarray, n: int, fill) -> np.ndarray:
        if len(arr) >= n:
            return arr
        return np.concatenate([arr, np.full(n - len(arr), fill, arr.dtype)])

    def _forget_after(self, k: int) -> None:
        """A non-append transition at original block ``k``: what came after it is gone.
        Removals and drops of later blocks go. A drop whose trigger lay after ``k`` keeps
        the blocks before ``k`` dropped (their KV is freed; the cached blocks before ``k``
        were made while they were visible) and now takes effect at block ``k``: the new
        content after the edit does not see them. Keys before ``k`` do not change."""
        self.dropped = self.dropped[:k].copy()
        self.removed = self.removed[:k].copy()
        self._runs_cache = None
        self._ndropped = -1
        bs = self.bs
        first = next((j for j, e in enumerate(self.events) if e.trigger // bs >= k), None)
        if first is None:
            return
        events = self.events[:first]
        parent = events[-1].vid if events else 0
        for e in self.events[first:]:
            keep = e.starts < k
            if not keep.any():
                continue
            s, t = e.starts[keep], np.minimum(e.ends[keep], k)
            parent = self.space.vid(("drop", parent, k * bs, s.tobytes(), t.tobytes(),
                                     self.st.repos))
            events.append(Event(k * bs, s, t, parent))
        self.events = events
        self._hid = self._events_index = None

    # --- drop / budget --------------------------------------------------------------------
    def _drop_keys(self, raw: np.ndarray, known: np.ndarray | None = None, valid: int = 0
                   ) -> np.ndarray:
        """Keys of ``raw`` (original blocks) under the session's drops: block i's version
        names the events that took effect at or before it (what its KV was made under) and
        the blocks dropped before it (so keys stay chained: equal keys, equal prefixes;
        with +repos that also fixes the position its keys are rotated to); dropped blocks'
        keys are negated (``versions``). ``known[:valid]``: keys already computed for a
        prefix under the same drops (only the rest is computed).

        The version is constant between trigger blocks and dropped-run boundaries, so the
        rest is cut there (a few pieces: usually one) and each piece encoded at once."""
        n = len(raw)
        if not self.events:
            return raw
        valid = min(valid, n) if known is not None else 0
        if known is not None and valid == n:
            return known[:n]
        trig, ev_vids = self._event_index()
        self._dropped_runs()
        rs, re_ = self._runs_lists
        dp_ids = self._dp_chain(rs, re_)
        cuts = {valid, n}
        cuts.update(trig[bisect_right(trig, valid):bisect_left(trig, n)])
        cuts.update(rs[bisect_right(rs, valid):bisect_left(rs, n)])
        cuts.update(re_[bisect_right(re_, valid):bisect_left(re_, n)])
        edges = sorted(cuts)
        space = self.space
        vids, flags = [], []
        for a in edges[:-1]:
            ev = bisect_right(trig, a)
            dp = bisect_right(re_, a)  # dropped runs that end at or before a
            flags.append(dp < len(rs) and rs[dp] <= a)
            vids.append(space.vid((ev_vids[ev], dp_ids[dp])) if ev or dp else 0)
        if len(vids) == 1:
            tail = encode(raw[valid:], vids[0], flags[0], check=False)
        else:
            lengths = np.diff(edges)
            tail = encode(raw[valid:], np.repeat(vids, lengths), np.repeat(flags, lengths),
                          check=False)
        return np.concatenate((known[:valid], tail)) if valid else tail

    def _event_index(self) -> tuple[list[int], list[int]]:
        """(trigger block of each event, the history's vid after 0, 1, ... events)."""
        if self._events_index is None:
            bs = self.bs
            self._events_index = ([e.trigger // bs for e in self.events],
                                  [0] + [e.vid for e in self.events])
        return self._events_index

    def _dropped_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """Runs of dropped blocks (kept until ``dropped`` changes)."""
        if self._runs_cache is None:
            rs, re_ = mask_runs(self.dropped)
            self._runs_cache = (rs, re_)
            self._runs_lists = (rs.tolist(), re_.tolist())
        return self._runs_cache

    def _add_runs(self, starts: list[int], ends: list[int]) -> None:
        """New dropped runs into the cached runs (sorted, touching runs joined)."""
        if self._runs_cache is None:
            return  # made again from ``dropped`` when next needed
        pairs = sorted(zip(self._runs_lists[0] + starts, self._runs_lists[1] + ends,
                           strict=True))
        rs: list[int] = []
        re_: list[int] = []
        for a, b in pairs:
            if re_ and a <= re_[-1]:
                re_[-1] = max(re_[-1], b)
            else:
                rs.append(a)
                re_.append(b)
        self._runs_lists = (rs, re_)
        self._runs_cache = (np.array(rs, np.int64), np.array(re_, np.int64))

    def _dp_chain(self, starts: list[int], ends: list[int]) -> list[int]:
        """Version ids of "these runs are dropped" for every prefix of the runs (chained;
        the previous chain is reused as far as the runs agree)."""
        cs, ce, ids = self._dp
        k = 0
        m = min(len(starts), len(cs))
        if starts[:m] == cs[:m] and ends[:m] == ce[:m]:
            k = m
        else:
            while k < m and starts[k] == cs[k] and ends[k] == ce[k]:
                k += 1
        ids = ids[:k + 1]
        space, repos = self.space, self.st.repos
        for a, b in zip(starts[k:], ends[k:], strict=True):
            ids.append(space.vid(("dropped", repos, ids[-1], a, b)))
        self._dp = (starts, ends, ids)
        return ids

    def _hidden(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token intervals of every drop so far and their triggers (one copy per event list:
        views share it, nobody writes it). Appending an event extends the last copy."""
        if self._hid is None:
            z = np.zeros(0, np.int64)
            self._hid, self._hid_n = (z, z, z), 0
        if self._hid_n < len(self.events):
            bs = self.bs
            new = self.events[self._hid_n:]
            s, e, t = self._hid
            self._hid = (np.concatenate([s, *(ev.starts * bs for ev in new)]),
                         np.concatenate([e, *(ev.ends * bs for ev in new)]),
                         np.concatenate([t, *(np.full(len(ev.starts), ev.trigger // bs * bs,
                                                      np.int64) for ev in new)]))
            self._hid_n = len(self.events)
        return self._hid

    def _new_drops(self, regions: np.ndarray, prompt_tokens: int, k: int,
                   prefix_blocks: int) -> np.ndarray | None:
        """Blocks the strategy drops now (not dropped yet), a bool mask over the prompt."""
        n = len(regions)
        if self.st.kind == "drop":
            return self._stale_tools(regions, k)
        dropped = self._grow(self.dropped, n, False)[:n]
        bs = self.bs
        pinned = np.isin(regions, (REGION_SYSTEM, REGION_TOOLS))
        pinned[:prefix_blocks] = True
        pinned[min(self.prev_prompt_blocks, n):] = True  # the last turn
        return budget_drops(regions, ~dropped, pinned, self.st.budget // bs,
                            (np.arange(n, dtype=np.int64) + 1) * bs, prompt_tokens)

    def _stale_tools(self, regions: np.ndarray, k: int) -> np.ndarray | None:
        """drop:K: tool results older than the K newest, not dropped yet (a bool mask, or
        None when there are none). The
        tool results that end before block ``k`` (shared with the previous request) are the
        previous prompt's: only the rest of the prompt is scanned."""
        ps, pe = self._spans
        # Tool results that end before the shared blocks do (and before the previous
        # prompt's end, where its scan stopped) cannot change: rescan from there, or from
        # the start of a tool result that reaches it (it may grow).
        limit = min(k, self.prev_prompt_blocks)
        j = bisect_left(pe, limit)
        s0 = min(ps[j], limit) if j < len(ps) else limit
        n = len(regions)
        starts, ends = ps[:j], pe[:j]
        if n - s0 <= 32:  # a short new part: scanned in Python
            run = -1
            for i, g in enumerate(regions[s0:].tolist(), s0):
                if g == REGION_TOOL_RESULT:
                    if run < 0:
                        run = i
                elif run >= 0:
                    starts.append(run)
                    ends.append(i)
                    run = -1
            if run >= 0:
                starts.append(run)
                ends.append(n)
        else:
            s, e = tool_spans(regions[s0:])
            starts, ends = starts + (s + s0).tolist(), ends + (e + s0).tolist()
        self._spans = (starts, ends)
        stale = max(0, len(starts) - self.st.keep)
        c = min(self._spans_dropped, j)  # leading tool results all dropped already
        if c >= stale:
            self._spans_dropped = c
            return None
        dropped = self._grow(self.dropped, n, False)
        while c < stale and dropped[starts[c]:ends[c]].all():
            c += 1
        new = np.zeros(n, dtype=bool)
        for a, b in zip(starts[c:stale], ends[c:stale], strict=True):
            new[a:b] = ~dropped[a:b]
        self._spans_dropped = stale
        return new

    # --- text edits (trim, splice) ------------------------------------------------------
    def _text_layout(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Logical keys and original indices of the kept blocks of ``raw``."""
        n = len(raw)
        removed = self._grow(self.removed, n, False)[:n]
        keep = np.flatnonzero(~removed)
        starts, ends = mask_runs(removed)
        vid = np.zeros(n, np.int64)
        v = 0
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            v = self.space.vid((self.st.kind, v, s, e))
            vid[e:] = v
        return encode(raw[keep], vid[keep]), keep

    # --- the request --------------------------------------------------------------------
    def turn(self, rid: int, raw: np.ndarray, regions: np.ndarray, finish_raw: np.ndarray,
             finish_regions: np.ndarray, prompt_tokens: int, output_tokens: int,
             prefix_blocks: int) -> list[RequestView]:
        """The views of trace request ``rid`` (a summarization call first, when one is due)
        and the session state after it. ``finish_raw`` extends ``raw`` (the trace's finish
        blocks start with the prompt's), so the prompt's keys are a prefix of the finish's."""
        st, bs = self.st, self.bs
        n = len(raw)
        k = _common(self.prev_raw, raw)
        lk = min(k, len(self.prev_raw))
        reuse = lk  # leading blocks whose previous keys stay valid (drops before k stay)
        if k < len(self.prev_raw):
            self._forget_after(k)
        pre: list[RequestView] = []
        view = RequestView("turn", rid, raw, prompt_tokens, output_tokens, finish_raw)
        forig = None
        if st.drops:
            if self._ndropped < 0:
                self._ndropped = int(np.count_nonzero(self.dropped))
            self._prompt_dropped = self._ndropped  # every dropped block lies in the prompt
            new = self._new_drops(regions, prompt_tokens, k, prefix_blocks)
            if new is None or not new.any():
                view.finish = self._drop_keys(finish_raw, self.prev_keys, reuse)
                view.ids = view.finish[:n]
            else:
                # the prompt: under the drops made before it
                before = self._drop_keys(raw, self.prev_keys, reuse)
                self.dropped = self._grow(self.dropped, n, False)
                self.dropped[:n] |= new
                self._ndropped = -1
                s, e = mask_runs(new)
                self._add_runs(s.tolist(), e.tolist())
                parent = self.events[-1].vid if self.events else 0
                vid = self.space.vid(("drop", parent, prompt_tokens, s.tobytes(),
                                      e.tobytes(), st.repos))
                self.events.append(Event(prompt_tokens, s, e, vid))
                self._events_index = None
                view.finish = self._drop_keys(finish_raw, before, int(s[0]))
                view.ids = before
                # The drop takes effect at the prompt's end (AKV: after the trigger message);
                # with +repos the retained blocks after it move (their keys re-rotate).
                view.edit = (view.ids, view.finish, np.arange(n, dtype=np.int64))
                view.edit_on_finish = True
                if st.repos:
                    first = int(np.argmax(new))
                    view.rotates = np.zeros(n, bool)
                    view.rotates[first:] = ~self.dropped[first:n]
            view.prompt_dropped_tokens = self._prompt_dropped * bs
            view.ideal_blocks = lk
            view.hid_s, view.hid_e, view.hid_t = self._hidden()
            view.prior_intervals = len(view.hid_s) - (len(self.events[-1].starts)
                                                      if view.edit_on_finish else 0)
            if st.repos:
                view.freed_positions = view.prompt_dropped_tokens
        elif st.removes_text:
            self.removed = self._grow(self.removed, n, False)
            spans = tool_spans(regions)
            stale = stale_tool_mask(regions, st.keep, n, spans)
            newly = stale & ~self.removed[:n]
            # Removals stay, except where the prompt (after an edit) made a removed block
            # part of a tool result it keeps: that text comes back.
            self.removed[:n] = (self.removed[:n] & keep_removed(regions, st.keep, n, spans)
                                ) | stale
            gone = int(self.removed[:n].sum())
            view.finish, forig = self._text_layout(finish_raw)
            view.ids = view.finish[:n - gone]  # the finish extends the prompt
            view.prompt_tokens = prompt_tokens - gone * bs
            if newly.any() and st.kind == "trim":  # a splice serves the edit from the cache
                lo = int(np.count_nonzero(~self.removed[:int(np.argmax(newly))]))
                view.reprefill_blocks = (lo, int(np.count_nonzero(~self.removed[:lk])))
            if st.kind == "splice" and len(self.prev_keys):
                okeep = self.prev_orig < lk
                old = self.prev_keys[okeep]
                where = np.full(len(finish_raw), -1, np.int64)
                where[forig] = np.arange(len(forig))
                dest = where[self.prev_orig[okeep]]
                view.ideal_blocks = int(np.count_nonzero(dest >= 0))
                if not (np.array_equal(dest, np.arange(len(dest)))
                        and np.array_equal(old, view.finish[:len(dest)])):
                    view.edit = (old, view.finish, dest)
                    view.rotates = (dest >= 0) & (dest != np.arange(len(dest)))
        elif st.kind == "summarize":
            pre = self.summary.summarize(view, raw, regions, finish_raw, k, lk, prefix_blocks,
                                         self.prev_prompt_blocks)
            forig = self.summary.orig(len(finish_raw), prefix_blocks)
        if st.kind in ("full", "drop", "budget"):
            view.regions = regions
        else:
            m = forig[:len(view.ids)]
            view.regions = np.where(m >= 0, finish_regions[np.maximum(m, 0)],
                                    REGION_USER).astype(np.uint8)
        self.prev_raw = finish_raw
        self.prev_keys = view.finish
        self.prev_orig = forig
        self.prev_prompt_blocks = n
        return [*pre, view]


def session_prefix_blocks(regions: np.ndarray, shared_blocks: int) -> int:
    """Leading blocks of tool definitions and system prompt (the part summarize keeps)."""
    lead = np.isin(regions, (REGION_SYSTEM, REGION_TOOLS))
    n = int(lead.argmin()) if not lead.all() else len(lead)
    return max(n, shared_blocks)
