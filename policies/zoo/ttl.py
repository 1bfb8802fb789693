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
(``on_drop``), the pin ends then. Under memory pressure pinned histories
are freed after every unpinned one (the planner's rule), latest program arrival first (the
reference: Continuum unpins the latest-entered program). Unpinned histories go in LRU order.
"""

from __future__ import annotations

import math

import numpy as np

from ..context import Arrival, CacheNode, Drop, Reply
from ..eviction import BLOCK, TAIL
from ..registry import register_policy
from .common import ZooPolicy

TQ_WEIGHT = 0.1  # weight of the newest queue wait in T_q's moving mean


@register_policy
class TTLPinning(ZooPolicy):
    """Continuum's TTL pins: hold a tool-calling program's KV for tau (see module doc)."""

    name = "ttl"
    start, granularity = TAIL, BLOCK  # vLLM, where Continuum is built
    pins = True
    events = frozenset({"arrival", "reply", "drop"})
    tau_s: float = -1.0  # < 0: the learned rule; >= 0: a fixed tau in seconds
    mu_s: float = 1.0  # cold-start prior: exponential tool durations with this mean
    cold_start: int = 100  # durations needed before the empirical CDF replaces the prior

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.until: dict[int, float] = {}  # leaf serial -> pin deadline (sim seconds)
        self.pinned: dict[int, int] = {}  # session -> serial of its pinned leaf
        self.program: dict[int, float] = {}  # session -> first arrival
        self.leaf_session: dict[int, int] = {}  # pinned leaf serial -> session
        self.called_at: dict[int, float] = {}  # session -> time of its tool-call reply
        self.returned_unpinned: set[int] = set()  # sessions back from a tool, pin gone
        self.grid = np.empty(0)  # distinct tool durations seen, sorted ...
        self.counts = np.empty(0, dtype=np.int64)  # ... and how often each was seen
        self.seen = 0  # durations seen
        self._cdf: np.ndarray | None = None  # F at each value (lazily, after a change)
        self.turns: dict[int, int] = {}  # session -> replies so far
        self.moments = np.zeros(6)  # n, sum k, sum m, sum k^2, sum m^2, sum k*m (m = N-k)
        self.queue_s = 0.0  # T_q
        self.taus: list[float] = []  # every tau chosen (for reports and tests)

    # --- events -----------------------------------------------------------------------
    def on_arrival(self, event: Arrival) -> None:
        s, now = event.session, event.time
        self.program.setdefault(s, now)
        called = self.called_at.pop(s, None)
        if called is not None:
            self._add_duration(now - called)
        serial = self.pinned.get(s)
        if serial is not None and self.until.get(serial, -math.inf) > now:
            self.until[serial] = math.inf  # held until this request is admitted
        else:
            self._unpin(s)
            if called is not None:
                self.returned_unpinned.add(s)

    def on_reply(self, event: Reply) -> None:
        s = event.session
        self.turns[s] = self.turns.get(s, 0) + 1
        if s in self.returned_unpinned:
            self.returned_unpinned.discard(s)
            if not math.isnan(event.queue_s):
                self.queue_s += TQ_WEIGHT * (event.queue_s - self.queue_s)
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
            self.until[serial] = event.time + tau
            self.pinned[s] = serial
            self.leaf_session[serial] = s

    def on_drop(self, event: Drop) -> None:
        """The request its history was held for will never be admitted: release the pin
        (it would otherwise hold until the session's next reply, or forever)."""
        self._unpin(event.session)
        self.returned_unpinned.discard(event.session)

    def _unpin(self, session: int) -> None:
        serial = self.pinned.pop(session, None)
        if serial is not None:
            self.until.pop(serial, None)
            self.leaf_session.pop(serial, None)

    # --- tau ----------------------------------------------------------------------------
    def tau(self, context_tokens: int) -> float:
        """tau* for a history of ``context_tokens`` tokens, from what the run has seen."""
        if self.tau_s >= 0:
            return self.tau_s
        c = self.recompute_cost(context_tokens)
        n = self.seen
        if n <= self.cold_start:
            benefit = self.queue_s + c  # eta = 1 under the prior
            mu = self.mu_s
            return mu * math.log(benefit / mu) if benefit > mu else 0.0
        benefit = self.eta() * self.queue_s + c
        if self._cdf is None:
            self._cdf = np.cumsum(self.counts) / n
        gain = self._cdf * benefit - self.grid
        best = int(np.argmax(gain))  # the first maximum: the smallest tau among equals
        below = int(np.searchsorted(self.grid, 0.0, side="right"))  # durations <= 0
        at_zero = float(self._cdf[below - 1]) * benefit if below else 0.0
        return float(self.grid[best]) if gain[best] > at_zero else 0.0

    def recompute_cost(self, tokens: int) -> float:
        rs = self.context.recompute_seconds
        # Without a run (a bare cache in tests) there is no price: count 1 s per 1K tokens.
        return rs(0, tokens) if rs is not None else tokens / 1024

    def eta(self) -> float:
        n, sk, sm, skk, smm, skm = self.moments
        if n < 2:
            return 1.0
        var_k, var_m = skk / n - (sk / n) ** 2, smm / n - (sm / n) ** 2
        if var_k <= 0 or var_m <= 0:
            return 1.0
        corr = (skm / n - sk * sm / n**2) / math.sqrt(var_k * var_m)
        return min(1.0, max(0.0, -corr))

    def program_done(self, steps: int) -> None:
        """Add the pairs (k, N - k), k = 1..N, of a completed program (closed-form sums)."""
        n = steps
        sk, skk = n * (n + 1) / 2, n * (n + 1) * (2 * n + 1) / 6
        sm, smm = n * (n - 1) / 2, (n - 1) * n * (2 * n - 1) / 6
        self.moments += (n, sk, sm, skk, smm, n * sk - skk)

    def _add_duration(self, d: float) -> None:
        """One more duration: distinct values sorted with their counts (traces record
        waits at coarse resolution, so there are far fewer values than durations)."""
        i = int(np.searchsorted(self.grid, d))
        if i < self.grid.size and self.grid[i] == d:
            self.counts[i] += 1
        else:
            self.grid = np.insert(self.grid, i, d)
            self.counts = np.insert(self.counts, i, 1)
        self.seen += 1
        self._cdf = None

    # --- decisions ----------------------------------------------------------------------
    def pinned_until(self, node: CacheNode) -> float:
        return self.until.get(node.serial, -math.inf)

    def key(self, node: CacheNode) -> tuple:
        s = node.serial
        if self.until.get(s, -math.inf) > self.context.now():
            # pinned: only compared with other pinned leaves; latest program first
            return (-self.program.get(self.leaf_session.get(s, -1), 0.0), s)
        return (node.last_access, s)
