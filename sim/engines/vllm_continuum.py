"""Continuum (arXiv 2511.02230) as the vLLM patch it is: TTL pins and program-level FCFS.

Continuum is built on vLLM; its baseline is vLLM's FCFS scheduler with lazy block eviction.
Its two changes, each a named patch here (``--vllm-patch``):

- **pins** (``continuum-pins``): a request that finishes with a tool call keeps its blocks
  allocated (not returned to the free queue) for tau seconds. The pin ends
  (``policies.continuum``) when the program's next turn is admitted (it takes the blocks
  over: its lookup hits them, then the pinned request is freed in vLLM's order, so only
  what the turn did not reuse joins the free queue), when the deadline passes (checked at
  each scheduler step, earliest first), when the program's turn is dropped, or under memory
  pressure: an allocation the free queue cannot serve (a running request's next tokens,
  the waiting head's admission) first unpins whole requests, the latest program start first
  (never the admitting turn's own program unless nothing else is pinned), and only then
  preempts or refuses as vLLM does. Under the open loop a program holds one pin, that of
  its latest finished turn (``policies.continuum``: an earlier turn's pin is superseded, a
  stale finish pins nothing). A decode run needs no cut at a deadline: nothing in
  a run sees an expiry (no request finishes or is admitted inside it), and the step that
  ends it (a finish, an arrival, memory) is scheduled alone, expiries first.
- **program order** (``continuum-fcfs``): a turn joins the waiting queue in the order of
  its program's first arrival (then submission), behind requests that were preempted
  (vLLM puts those at the front).

``continuum`` is both with the paper's learned TTL (``policies.ttl_rule.TtlLearner``);
``continuum-fixed`` is both with the public code's fixed 2 s threshold.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from costmodel.units import range_units
from policies.continuum import ContinuumPins
from sim.kvcache.blockpool import BlockPool

from .vllm import Step, VllmReq, VllmServer


class PinningPool(BlockPool):
    """vLLM's pool whose failed allocations first ask ``relieve(rid)`` to unpin a request
    (True: something was freed, try again)."""

    relieve: Callable[[int], bool] | None = None

    def extend(self, rid: int, num_new_tokens: int, **kw: Any) -> bool:
        while True:
            if super().extend(rid, num_new_tokens, **kw):
                return True
            if self.relieve is None or not self.relieve(rid):
                return False

    def admit(self, rid: int, ids, num_tokens: int, num_new_tokens: int,
              **kw: Any) -> int | None:
        while True:
            h = super().admit(rid, ids, num_tokens, num_new_tokens, **kw)
            if h is not None or self.relieve is None or not self.relieve(rid):
                return h


class ContinuumVllmServer(VllmServer):
    """vLLM 0.33 with Continuum's pins and/or program-level FCFS (module doc)."""

    pool_class = PinningPool
    pool: PinningPool
    pinning: bool = True
    program_order: bool = True
    ttl_rule: str = "learned"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        def recompute_seconds(tokens: int) -> float:
            return self.profile.recompute_seconds(range_units(self.spec, 0, tokens))

        self.pins = ContinuumPins(self.ttl_rule, recompute_seconds)
        self.session_of: dict[int, int] = {}  # request id -> session (in the server)
        self.pool.relieve = self._relieve if self.pinning else None

    def patch_summary(self) -> dict[str, Any]:
        if not self.pinning:
            return {}
        taus = self.pins.taus
        return {"continuum_pins": dict(self.pins.pin_counts),
                "continuum_tau_mean_s": sum(taus) / len(taus) if taus else math.nan}

    # --- arrivals: program order, pins held for a waiting turn --------------------------
    def submit(self, req: VllmReq) -> None:
        self.pins.arrived(req.session, req.rid, self.env.now)
        self.session_of[req.rid] = req.session
        super().submit(req)
        if self.program_order and self.waiting and self.waiting[-1] is req:
            self._reorder_last()

    def _reorder_last(self) -> None:
        """Move the newest waiting request before every later program's (not before a
        preempted request: vLLM keeps those at the front)."""
        w = self.waiting
        req = w.pop()
        key = self.pins.order_key(req.session, req.seq)
        i = len(w)
        while i > 0 and math.isnan(w[i - 1].admitted_at) and (
                self.pins.order_key(w[i - 1].session, w[i - 1].seq) > key):
            i -= 1
        w.insert(i, req)

    def _drop(self, req: VllmReq) -> None:
        rid = self.pins.dropped(req.session, req.rid)
        if rid is not None:
            self.pool.free(rid)
        self.session_of.pop(req.rid, None)
        super()._drop(req)

    # --- pins ------------------------------------------------------------------------------
    def schedule(self) -> Step:
        if self.pinning:
            for rid in self.pins.expired(self.env.now):
                self.pool.free(rid)
        return super().schedule()

    def _release(self, req: VllmReq) -> None:
        """A finished request: pinned (blocks kept) or freed as vLLM does. An earlier turn's
        pin of its program ends first (the open loop: policies.continuum)."""
        self.session_of.pop(req.rid, None)
        if self.pinning:
            old = self.pins.superseded(req.session, req.rid)
            if old is not None:
                self.pool.free(old)
            queue_s = req.record.queue_wait_s if req.record is not None else math.nan
            if self.pins.finished(req.session, req.rid, self.env.now, req.next_gap,
                                  req.context_tokens, queue_s):
                return
        super()._release(req)

    def _admitted(self, req: VllmReq, hit_blocks: int) -> None:
        super()._admitted(req, hit_blocks)
        rid = self.pins.admitted(req.session, req.rid)
        if rid is not None:  # the turn holds what it reused; the rest joins the free queue
            self.pool.free(rid)

    def _relieve(self, rid: int) -> bool:
        """Memory pressure on request ``rid``'s allocation: unpin one request."""
        session = self.session_of.get(rid)
        victim = self.pins.victim(keep=session)
        if victim is None and session is not None:
            victim = self.pins.victim()
        if victim is None:
            return False
        self.pool.free(victim)
        return True


class ContinuumFixedVllmServer(ContinuumVllmServer):
    """Continuum's public code: pins of the fixed threshold rule, program-level FCFS."""

    ttl_rule = "fixed"


class PinsOnlyVllmServer(ContinuumVllmServer):
    """Continuum's learned pins on vLLM's own FCFS order."""

    program_order = False


class ProgramOrderVllmServer(ContinuumVllmServer):
    """Continuum's program-level FCFS, without pins."""

    pinning = False
