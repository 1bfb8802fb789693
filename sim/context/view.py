"""What one request is under a context strategy (``RequestView``) and the drop events of a
session's history (``Event``): plain data the session state fills and the engine reads."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


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
    blocks). The engine reads ``ids``, ``prompt_tokens``, ``finish``; applies ``edit`` on
    arrival; prices with ``hidden``; fills the counters at the bottom."""

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

    @property
    def dropped_tokens(self) -> int:
        """Tokens whose KV the history dropped by the end of this request: what its output
        (decode) does not attend."""
        return int((self.hid_e - self.hid_s).sum())
