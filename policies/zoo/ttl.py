"""TTL pinning (Continuum / CacheTTL, arXiv 2511.02230), run with the ``program-fcfs``
scheduler (``policies.scheduling``) for the paper's program-level FCFS.

When a reply ends in a tool call (``Reply.next_gap == "tool"``) the session's history (its
``Reply.leaf``) is pinned on the GPU until ``reply time + tau``. tau is chosen per reply, from
what the run has shown so far (no look at the trace's future):

    tau* = argmax over tau in {0} U {durations seen}  of  F(tau) * B - tau,  B = eta * T_q + C

- ``F``: the empirical CDF of tool durations seen so far in the run; a duration is the time
  from a tool-call reply to the session's next arrival (kvsim traces carry no tool names, so
  one pooled distribution stands for the paper's per-tool ones);
- ``C``: seconds to recompute the history, ``context.recompute_seconds(0, context_tokens)``;
- ``T_q``: an exponential moving mean (weight ``TQ_WEIGHT``) of the queue wait
  (``Reply.queue_s``) of requests that came back from a tool call to an unpinned history (pin
  expired or never set): what an evicted program pays in the queue on return;
- ``eta = -Corr(k, N - k)`` over the steps k = 1..N of every completed program (clipped to
  [0, 1]; 1 before any program completed).

Cold start (the reference's rule): while at most ``cold_start`` durations have been seen, the
prior is an exponential with mean ``mu_s`` and eta = 1, so tau* = mu * ln(B / mu) if B > mu
else 0. ``tau_s >= 0`` replaces the rule by a fixed tau (the sensitivity sweep).

A pin ends at its deadline (``now > deadline``), unless the session's next request arrived
before it: then the history stays pinned until that request is admitted (its lock protects the
history from then on) and its reply sets the next pin; if the server refuses that request
(``on_drop``), the pin ends then. Under the open loop a session's next request can arrive,
and even reply, before the previous one replied: a session keeps one pin, that of its latest
reply; a reply older than the session's latest (a later request replied first) is stale and
pins, unpins and learns nothing; a pin set while a later request of the session is in the
server already is held until that request replies, as if it had arrived during the pin.
Under memory pressure pinned histories
are freed after every unpinned one (the planner's rule), latest program arrival first (the
reference: Continuum unpins the latest-entered program). Unpinned histories go in LRU order.
"""

from __future__ import annotations

import math

from ..context import Arrival, CacheNode, Drop, Reply
from ..eviction import BLOCK, TAIL
from ..registry import register_policy
from ..ttl_rule import TtlLearner
from .common import ZooPolicy

__all__ = ["TTLPinning"]


@register_policy
class TTLPinning(ZooPolicy, TtlLearner):
    """Continuum's TTL pins: hold a tool-calling program's KV for tau (see module doc)."""

    name = "ttl"
    start, granularity = TAIL, BLOCK  # vLLM, where Continuum is built
    pins = True
    events = frozenset({"arrival", "reply", "drop"})
    tau_s: float = -1.0  # < 0: the learned rule; >= 0: a fixed tau in seconds
    mu_s: float = 1.0  # cold-start prior: exponential tool durations with this mean
    cold_start: int = 100  # durations needed before the empirical CDF replaces the prior
    # (policies.ttl_rule.TtlLearner has the rule; kept here: ZooPolicy reads parameters
    # from the class's own annotations)

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.until: dict[int, float] = {}  # leaf serial -> pin deadline (sim seconds)
        self.pinned: dict[int, int] = {}  # session -> serial of its pinned leaf
        self.program: dict[int, float] = {}  # session -> first arrival
        self.leaf_session: dict[int, int] = {}  # pinned leaf serial -> session
        self.called_at: dict[int, float] = {}  # session -> time of its tool-call reply
        self.returned_unpinned: set[int] = set()  # sessions back from a tool, pin gone
        self.turns: dict[int, int] = {}  # session -> replies so far
        self.latest_reply: dict[int, int] = {}  # session -> its latest replied request
        self.in_server: dict[int, set[int]] = {}  # session -> its requests not replied yet
        self.init_learner()

    # --- events -----------------------------------------------------------------------
    def on_arrival(self, event: Arrival) -> None:
        s, now = event.session, event.time
        self.program.setdefault(s, now)
        self.in_server.setdefault(s, set()).add(event.request)
        called = self.called_at.pop(s, None)
        if called is not None:
            self.add_duration(now - called)
        serial = self.pinned.get(s)
        if serial is not None and self.until.get(serial, -math.inf) > now:
            self.until[serial] = math.inf  # held until this request is admitted
        else:
            self._unpin(s)
            if called is not None:
                self.returned_unpinned.add(s)

    def on_reply(self, event: Reply) -> None:
        s = event.session
        self._left(s, event.request)
        if event.request < self.latest_reply.get(s, -1):
            return  # stale: the later request's reply set (or ended) the session's pin
        self.latest_reply[s] = event.request
        self.turns[s] = self.turns.get(s, 0) + 1
        if s in self.returned_unpinned:
            self.returned_unpinned.discard(s)
            self.observe_queue(event.queue_s)
        self._unpin(s)
        if event.next_gap == "end":
            self.program_done(self.turns.pop(s))
            return
        if event.next_gap != "tool" or event.leaf is None:
            return
        self.called_at[s] = event.time
        tau = self.tau(event.context_tokens)
        self.taus.append(tau)
        if tau > 0:
            serial = event.leaf.serial
            later = any(r > event.request for r in self.in_server.get(s, ()))
            self.until[serial] = math.inf if later else event.time + tau
            self.pinned[s] = serial
            self.leaf_session[serial] = s

    def on_drop(self, event: Drop) -> None:
        """The request its history was held for will never be admitted: release the pin
        (it would otherwise hold until the session's next reply, or forever)."""
        self._left(event.session, event.request)
        self._unpin(event.session)
        self.returned_unpinned.discard(event.session)

    def _left(self, session: int, request: int) -> None:
        """``request`` left the server (replied or dropped)."""
        mine = self.in_server.get(session)
        if mine is not None:
            mine.discard(request)
            if not mine:
                del self.in_server[session]

    def _unpin(self, session: int) -> None:
        serial = self.pinned.pop(session, None)
        if serial is not None:
            self.until.pop(serial, None)
            self.leaf_session.pop(serial, None)

    # --- tau (policies.ttl_rule) ---------------------------------------------------------
    def recompute_cost(self, tokens: int) -> float:
        rs = self.context.recompute_seconds
        # Without a run (a bare cache in tests) there is no price: count 1 s per 1K tokens.
        return rs(0, tokens) if rs is not None else tokens / 1024

    # --- decisions ----------------------------------------------------------------------
    def pinned_until(self, node: CacheNode) -> float:
        return self.until.get(node.serial, -math.inf)

    def key(self, node: CacheNode) -> tuple:
        s = node.serial
        if self.until.get(s, -math.inf) > self.context.now():
            # pinned: only compared with other pinned leaves; latest program first
            return (-self.program.get(self.leaf_session.get(s, -1), 0.0), s)
        return (node.last_access, s)
