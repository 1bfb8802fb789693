"""What one request is under a context strategy (``RequestView``) and the drop events of a
session's history (``Event``): plain data the session state fills and the engine reads."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

import numpy as np

from costmodel.specs import ModelSpec
from costmodel.units import Units, hidden_key_sum, position_sum, range_units

from .prefill import prefill_ranges


@dataclass
class Event:
    """Blocks ``[starts, ends)`` dropped from token ``trigger`` on (block ``trigger // bs``
    carries the new version); ``vid``: the history's version after this event."""

    trigger: int
    starts: np.ndarray
    ends: np.ndarray
    vid: int


@dataclass
class RequestView:
    """What one request is under the run's context strategy (sizes in tokens unless named
    blocks): a ``sim.context.prompt.Prompt``. The engine reads ``ids``, ``prompt_tokens``,
    ``finish``; applies ``edit``; prices with ``units`` (the dropped keys ``hid_*`` are not
    attended); the plan fills the counters at the bottom."""

    kind: str  # "turn" | "summary" (the summarization call before a summarized turn)
    rid: int  # the trace request
    ids: np.ndarray  # keys of the prompt's full blocks
    prompt_tokens: int
    output_tokens: int
    finish: np.ndarray  # keys of prompt + output full blocks (what the finish inserts)
    regions: np.ndarray | None = None  # per prompt block (policies' Arrival event)
    edit: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (old, new, dest)
    # when the server applies ``edit``: on arrival (a splice: the prompt's own keys need it)
    # or when the request finishes (a drop: it takes effect after the prompt, AKV's trigger)
    edit_on_finish: bool = False
    rotates: np.ndarray | None = None  # per old block of ``edit``: its position moves
    # dropped token intervals [hid_s, hid_e) and the trigger from which each is not attended
    hid_s: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    hid_e: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    hid_t: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    freed_positions: int = 0  # positions repos gave back (the context limit counts the rest)
    prompt_dropped_tokens: int = 0  # prompt tokens dropped before this request: no KV needed
    prior_intervals: int = 0  # leading hidden intervals dropped before this request
    ideal_blocks: int = 0  # leading blocks an unlimited cache holds (the edited history)
    # logical blocks [lo, hi) whose content the session computed before but whose keys a
    # text edit changed now (trim, summarize): computing them again is re-prefill
    reprefill_blocks: tuple[int, int] = (0, 0)
    # filled by the engine
    rerotated_tokens: int = 0
    restored_tokens: int = 0  # dropped tokens computed again for later kept ones
    skipped_tokens: int = 0  # dropped tokens neither reused nor computed
    reprefill_tokens: int = 0  # prefilled again after a text edit changed their keys
    _index: tuple | None = field(default=None, repr=False)

    def pricing_index(self) -> tuple[list[int], list[int], list[int]]:
        """(triggers, hidden length of the first j intervals, their largest end), as lists
        indexed by j = intervals whose trigger is at or before a position (``hid_t`` is
        sorted: events come in time order)."""
        idx = self._index
        if idx is None:
            cum = np.concatenate(([0], np.cumsum(self.hid_e - self.hid_s)))
            mx = np.concatenate(([-1], np.maximum.accumulate(self.hid_e)))
            idx = self._index = (self.hid_t.tolist(), cum.tolist(), mx.tolist())
        return idx

    def units(self, spec: ModelSpec, a: int, b: int) -> Units:
        """Units of computing tokens [a, b) of this request: keys dropped before a token's
        position (by an event whose trigger it is at or after) are not attended.

        The range is cut at the triggers inside it. In each piece every hidden interval lies
        before the piece (an event drops blocks of the prompt that asked for it), so a full
        attention layer hides their whole length from every token; a sliding-window layer only
        the part inside its window (``costmodel.units.hidden_key_sum``, for the few near ones)."""
        if not len(self.hid_t):
            return range_units(spec, a, b)
        trig, cum, maxend = self.pricing_index()
        total = Units()
        lo, hi = bisect_right(trig, a), bisect_left(trig, b)
        cuts = sorted({t for t in trig[lo:hi] if a < t < b})
        for u, v in zip([a, *cuts], [*cuts, b], strict=True):
            j = bisect_right(trig, u)
            if j == 0:
                total = total + range_units(spec, u, v)
                continue
            att = 0
            for count, cap in spec.window_caps:
                if cap is None:
                    att += count * (position_sum(u, v) - (v - u) * cum[j])
                    continue
                near = 0
                if maxend[j] > u - cap:
                    near = hidden_key_sum(u, v, self.hid_s[:j], self.hid_e[:j], cap)
                att += count * (position_sum(u, v, cap) - near)
            n = v - u
            total = total + Units(spec.layers * n * spec.W, att, n)
        return total

    def prefill_ranges(self, segments, usable: int, fill_tokens: int, bs: int
             ) -> tuple[list[tuple[int, int]], int, int, int]:
        """Dropped blocks are skipped or restored (sim/context/prefill.py)."""
        return prefill_ranges(self, segments, usable, fill_tokens, bs)

    def recomputed_ranges(self, segments, planned: list[tuple[int, int]], ideal: int,
                          bs: int) -> list[tuple[int, int]]:
        """The plan knows what is computed (dropped blocks skipped, restored ones added):
        its ranges inside ``ideal``."""
        return [(a, min(b, ideal)) for a, b in planned if a < ideal]

    @property
    def dropped_tokens(self) -> int:
        """Tokens whose KV the history dropped by the end of this request: what its output
        (decode) does not attend."""
        return int((self.hid_e - self.hid_s).sum())
