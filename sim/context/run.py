"""A run's context strategy: the per-session states, the views the replay sends, and what the
engine does with a view on arrival (the edit of the cached path) and when pricing it."""

from __future__ import annotations

from typing import Any

import numpy as np

from costmodel.profile import Profile
from costmodel.specs import ModelSpec
from costmodel.units import rerotation_seconds
from sim.kvcache.versions import VersionSpace

from .session import SessionState, session_prefix_blocks
from .strategies import Strategy
from .view import RequestView


class ContextRun:
    """Views of a trace's requests under one strategy (one instance per run: its version
    space and session states make the run a pure function of its inputs)."""

    def __init__(self, strategy: Strategy, trace, block_size: int) -> None:
        self.strategy = strategy
        self.trace = trace
        self.bs = block_size
        self.space = VersionSpace()
        self._states: dict[int, SessionState] = {}
        self._prefix: dict[int, int] = {}

    def views(self, r: int) -> list[RequestView]:
        """What the client sends for trace request ``r``: a summarization call first when
        one is due, then the turn (views are made in each session's request order)."""
        t = self.trace
        s = int(t.session[r])
        state = self._states.get(s)
        regions = t.block_regions(r)
        if state is None:
            state = self._states[s] = SessionState(self.strategy, self.space, self.bs, s)
            self._prefix[s] = session_prefix_blocks(regions, t.sessions[s].shared_prefix_blocks)
        # drop and budget keep the prompt's layout: the finish's regions are not needed
        fregions = regions if self.strategy.drops else t.finish_block_regions(r)
        views = state.turn(r, t.block_ids(r), regions, t.finish_block_ids(r), fregions,
                           int(t.prompt_tokens[r]), max(1, int(t.output_tokens[r])),
                           self._prefix[s])
        if r + 1 >= t.sessions[s].first + t.sessions[s].count:
            del self._states[s]  # the session's last request: its state is done
        return views


def apply_edit(cache, view: RequestView, spec: ModelSpec, profile: Profile,
               counters: dict[str, float], hint=None) -> tuple[float, bool]:
    """The server applies the history's edit of its cached path (on arrival for a splice,
    when the request finishes for a drop): dropped KV is freed, moved KV re-keyed. Returns
    the re-rotation seconds (the engine charges them to its next prefill batch). What an
    unlimited cache would hold after the same edit is ``RequestView.ideal_blocks``."""
    if view.edit is None:
        return 0.0
    old, new, dest = view.edit
    res = cache.edit(old, new, dest, view.rotates, hint)
    if not res.applied:
        counters["context_edits_blocked"] += 1
        return 0.0, False
    counters["context_edits"] += 1
    counters["context_freed_blocks"] += res.freed.freed_blocks
    counters["context_dropped_blocks"] += res.dropped_blocks
    tokens = res.rotated_blocks * cache.block_size
    seconds = rerotation_seconds(spec, profile, tokens)
    view.rerotated_tokens += tokens
    counters["rerotated_tokens"] += tokens
    counters["rerotate_seconds"] += seconds
    return seconds, res.complete


COUNTERS = ("context_edits", "context_edits_blocked", "context_freed_blocks",
            "context_dropped_blocks", "rerotated_tokens", "rerotate_seconds")


def context_summary(strategy: Strategy, table: Any, counters: dict[str, float],
                    sim_end: float, working_peak_tokens: int, bs: int) -> dict[str, Any]:
    """Run-level context metrics (every output says what kvsim does not model)."""
    from .strategies import ACCURACY_NOTE

    ok = table[~table["dropped"].astype(bool)] if len(table) else table
    lat = (ok["end_s"] - ok["send_s"]).to_numpy(dtype=float) if len(ok) else np.array([])
    lat = lat[np.isfinite(lat)]
    turns = ok[ok["kind"] == "turn"] if len(ok) else ok
    kv = ((ok["prompt_tokens"] - ok["dropped_tokens"] + ok["output_tokens"]).to_numpy()
          if len(ok) else np.array([]))
    return {
        "context": strategy.label,
        "context_note": ACCURACY_NOTE,
        "request_latency_mean_s": float(lat.mean()) if lat.size else float("nan"),
        "request_latency_p95_s": float(np.percentile(lat, 95)) if lat.size else float("nan"),
        "input_tokens_per_s": float(ok["prompt_tokens"].sum() / sim_end) if sim_end else 0.0,
        "output_tokens_per_s": float(ok["output_tokens"].sum() / sim_end) if sim_end else 0.0,
        # KV one request held: its prompt but the dropped part, and its output
        "kv_peak_tokens": int(kv.max()) if kv.size else 0,
        "kv_mean_tokens": float(kv.mean()) if kv.size else float("nan"),
        # most KV all running requests held at once (locked paths + their own new tokens)
        "kv_working_peak_tokens": int(working_peak_tokens),
        "summary_calls": int((ok["kind"] == "summary").sum()) if len(ok) else 0,
        "turn_requests": len(turns),
        "context_dropped_tokens": int(ok["dropped_tokens"].sum()) if len(ok) else 0,
        "reprefill_tokens": int(ok["reprefill_tokens"].sum()) if len(ok) else 0,
        "rerotated_tokens": int(counters["rerotated_tokens"]),
        "rerotate_seconds": float(counters["rerotate_seconds"]),
        "context_edits": int(counters["context_edits"]),
        "context_edits_blocked": int(counters["context_edits_blocked"]),
        "context_freed_tokens": int(counters["context_freed_blocks"]) * bs,
    }
