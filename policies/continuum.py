"""Continuum's pins and program-level FCFS as decisions a vLLM engine asks for
(arXiv 2511.02230; the engine side is ``sim.engines.vllm_continuum``).

A program is a trace session; its start is its first arrival. ``ContinuumPins`` decides:

- **pin start** (``finished``): a turn that ends in a tool call (the program goes on) keeps
  its blocks allocated until ``finish + tau`` (``ttl``: ``learned``, the paper's rule, or
  ``fixed``, the public code's threshold: ``policies.ttl_rule``); tau = 0 pins nothing. A
  turn that ends its program, or is followed by a human, pins nothing.
- **pin end**, whichever comes first: the program's next turn is admitted (``admitted``: it
  takes the blocks over, the engine frees the pinned request after that turn's admission);
  the deadline passes (``expired``: strictly ``now > deadline``, checked when the scheduler
  runs, earliest deadline first) unless the program's next turn already waits (``arrived``
  holds the pin until that turn's admission); the program's turn is dropped (``dropped``);
  memory pressure (``victim``: whole pinned requests, the latest program start first).
- **open loop**: a program's next turn can arrive, and even run, before the previous one
  finished. A program holds at most one pin, that of its latest finished turn: a turn that
  finishes while an earlier turn of its program is pinned ends that pin first
  (``superseded``), whatever it decides for itself; a turn that finishes
  after a later turn of its program did pins nothing and teaches the rule nothing (a stale
  finish); a pin set while a later turn of its program already waits is held until that
  turn's admission, as if the turn had arrived during the pin.
- **waiting order** (``order_key``): program start, then submission.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from .ttl_rule import TtlLearner, fixed_threshold_tau

TTL_RULES = ("learned", "fixed")


@dataclass
class Pin:
    """A finished request whose blocks stay allocated."""

    rid: int
    session: int
    deadline: float  # inf while the program's next turn waits


class ContinuumPins(TtlLearner):
    """Pin bookkeeping and the TTL rule for one server (module doc)."""

    def __init__(self, ttl: str, recompute_cost: Callable[[int], float], *,
                 tau_s: float = -1.0, mu_s: float = 1.0, cold_start: int = 100) -> None:
        if ttl not in TTL_RULES:
            raise ValueError(f"unknown TTL rule {ttl!r}: expected one of {TTL_RULES}")
        self.ttl = ttl
        self._recompute = recompute_cost
        self.tau_s, self.mu_s, self.cold_start = tau_s, mu_s, cold_start
        self.init_learner()
        self.pins: dict[int, Pin] = {}  # session -> its pin
        self._deadlines: list[tuple[float, int, int]] = []  # (deadline, rid, session) heap
        self.program_start: dict[int, float] = {}  # session -> first arrival
        self.turns: dict[int, int] = {}  # session -> turns finished
        self.called_at: dict[int, float] = {}  # session -> time of its tool-call reply
        self.returned_unpinned: set[int] = set()  # sessions back from a tool, pin gone
        self.waiting: dict[int, set[int]] = {}  # session -> its turns arrived, not admitted
        self.latest_finished: dict[int, int] = {}  # session -> its latest finished turn
        # what the pins did (run summary): pins set, and how each ended
        self.pin_counts = {"pins": 0, "handed_over": 0, "expired": 0, "pressure": 0,
                           "dropped": 0, "superseded": 0}

    def recompute_cost(self, tokens: int) -> float:
        return self._recompute(tokens)

    # --- program order --------------------------------------------------------------------
    def order_key(self, session: int, seq: int) -> tuple[float, int]:
        """Waiting-queue key of a turn: its program's start, then submission order."""
        return (self.program_start[session], seq)

    # --- events -----------------------------------------------------------------------
    def arrived(self, session: int, rid: int, now: float) -> None:
        """Turn ``rid`` of ``session`` was submitted at ``now``."""
        self.program_start.setdefault(session, now)
        self.waiting.setdefault(session, set()).add(rid)
        called = self.called_at.pop(session, None)
        if called is not None:
            self.add_duration(now - called)
        pin = self.pins.get(session)
        if pin is not None and now <= pin.deadline:
            pin.deadline = math.inf  # held until this turn is admitted
        elif called is not None:
            self.returned_unpinned.add(session)

    def finished(self, session: int, rid: int, now: float, next_gap: str,
                 context_tokens: int, queue_s: float) -> bool:
        """Request ``rid`` of ``session`` finished: True when its blocks are pinned (the
        engine keeps them until ``rid`` is released by one of the pin-end events). The
        engine ends an earlier turn's pin first (``superseded``); a stale finish (a later
        turn of the program finished already) pins nothing and changes nothing."""
        if rid < self.latest_finished.get(session, -1):
            return False
        self.latest_finished[session] = rid
        held = self.pins.get(session)
        if held is not None:  # a broken protocol, not a decision: never overwrite a pin
            raise RuntimeError(f"session {session}: request {rid} finished while request "
                               f"{held.rid} is pinned; call superseded() first")
        self.turns[session] = self.turns.get(session, 0) + 1
        if session in self.returned_unpinned:
            self.returned_unpinned.discard(session)
            self.observe_queue(queue_s)
        if next_gap == "end":
            self.program_done(self.turns.pop(session))
            return False
        if next_gap != "tool":
            return False
        self.called_at[session] = now
        if self.ttl == "fixed":
            tau = self.tau_s if self.tau_s >= 0 else fixed_threshold_tau(self.mean_duration())
        else:
            tau = self.tau(context_tokens)
        self.taus.append(tau)
        if tau <= 0:
            return False
        if self.waiting.get(session):  # a later turn waits already: held for its admission
            self.pins[session] = Pin(rid, session, math.inf)
        else:
            self.pins[session] = Pin(rid, session, now + tau)
            heapq.heappush(self._deadlines, (now + tau, rid, session))
        self.pin_counts["pins"] += 1
        return True

    def superseded(self, session: int, rid: int) -> int | None:
        """Request ``rid`` of ``session`` finished: the pinned request of an earlier turn of
        its program (free it before deciding ``rid``'s own pin), or None. A later turn's pin
        stays (``rid``'s finish is stale)."""
        pin = self.pins.get(session)
        if pin is None or pin.rid > rid:
            return None
        return self._end(session, "superseded")

    def admitted(self, session: int, rid: int) -> int | None:
        """Turn ``rid`` of ``session`` was admitted: the pinned request whose blocks it took
        over (the engine frees it now), or None."""
        self._admitted_or_dropped(session, rid)
        return self._end(session, "handed_over")

    def dropped(self, session: int, rid: int) -> int | None:
        """Turn ``rid`` of ``session`` will never run: its pinned request (free it), or
        None."""
        self._admitted_or_dropped(session, rid)
        self.returned_unpinned.discard(session)
        return self._end(session, "dropped")

    def _admitted_or_dropped(self, session: int, rid: int) -> None:
        waiting = self.waiting.get(session)
        if waiting is not None:
            waiting.discard(rid)
            if not waiting:
                del self.waiting[session]

    def expired(self, now: float) -> list[int]:
        """Pinned requests whose deadline passed (``now > deadline``), earliest first (ties:
        request id); a pin held for a waiting turn is not among them."""
        out = []
        heap = self._deadlines
        while heap and heap[0][0] < now:
            _deadline, rid, session = heapq.heappop(heap)
            pin = self.pins.get(session)
            if pin is None or pin.rid != rid or pin.deadline >= now:
                continue  # ended otherwise, or held for a waiting turn
            out.append(self._end(session, "expired"))
        return out

    def victim(self, keep: int | None = None) -> int | None:
        """Memory pressure: unpin the pin of the latest program start (ties: the larger
        session), other than session ``keep``'s; its request (free it), or None."""
        best = None
        for s in self.pins:
            if s == keep:
                continue
            k = (self.program_start.get(s, 0.0), s)
            if best is None or k > best:
                best = k
        return None if best is None else self._end(best[1], "pressure")

    def _end(self, session: int, why: str) -> int | None:
        pin = self.pins.pop(session, None)
        if pin is None:
            return None
        self.pin_counts[why] += 1
        return pin.rid
