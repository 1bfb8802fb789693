"""A request in flight, as every engine sees it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import simpy
from mypy_extensions import mypyc_attr

from sim.context import Prompt
from sim.engines.recorder import RequestRecord
from sim.kvcache.paths import WalkHint


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(eq=False, kw_only=True)
class Req:
    """One request in flight. Token positions are absolute; blocks are ``block_size`` tokens."""

    rid: int
    session: int
    arrival: float
    seq: int
    prompt_tokens: int
    output_tokens: int
    ids: np.ndarray
    done: simpy.Event
    # The prompt as the run's context strategy shapes it (keys, edit, dropped keys, pricing):
    # a sim.context.FullPrompt under ``full``, else a sim.context.RequestView.
    prompt: Prompt
    shared_blocks: int = 0
    generated: int = 0  # output tokens produced so far (the first comes from prefill)
    # set at admission
    locks: list = field(default_factory=list)  # cache nodes this request holds locked
    ranges: list[tuple[int, int]] = field(default_factory=list)  # token ranges still to compute
    own_tokens: int = 0  # tokens this request holds outside the tree (computed, not inserted)
    reserved: int = 0  # blocks reserved for own_tokens
    admitted_at: float = math.nan
    first_token_at: float = math.nan
    record: RequestRecord | None = None
    known_blocks: int = 0  # leading ids already in the engine's ``ever`` (skip re-adding them)
    # What the client does after the reply (policies' Reply event): tool | human | end, and
    # the replay's wait before its next request (closed loop; NaN when not known). Under the
    # open loop the next request's send time is fixed in advance: ``next_send_s`` (NaN else).
    next_gap: str = "end"
    next_gap_s: float = math.nan
    next_send_s: float = math.nan
    # Tokens that had KV when the request was last preempted (vLLM) or retracted (SGLang):
    # computing a position below it again is work redone (``preempted_recompute_*``).
    redo_until: int = 0
    hint: WalkHint = field(default_factory=WalkHint)  # where the cache's last walk ended
    # A decode worker's lock on the prompt KV that landed for it (``land_remote``), held
    # until the request's admission locks its own match.
    landed: object | None = None

    def walk_from(self, hint: WalkHint) -> None:
        """Walk from ``hint`` from now on: a request that moves to another server's cache
        (a disaggregated fleet's pools, sim/fleet/pd.py) takes that cache's hint."""
        self.hint = hint

    @property
    def context_tokens(self) -> int:
        """Tokens whose KV the request needs now: its prompt plus what it generated since."""
        return self.prompt_tokens + max(0, self.generated - 1)

    @property
    def kv_read_tokens(self) -> int:
        """Keys a decode step reads: the context minus what its history dropped."""
        return self.context_tokens - self.prompt.dropped_tokens

    @property
    def kv_tokens(self) -> int:
        """Prompt tokens that need KV (dropped ones do not)."""
        return self.prompt_tokens - self.prompt.prompt_dropped_tokens

    @property
    def position_tokens(self) -> int:
        """Positions the prompt uses (what the context limit counts): repositioning gives
        the dropped ones back."""
        return self.prompt_tokens - self.prompt.freed_positions
