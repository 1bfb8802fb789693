"""Continuum's TTL rules (arXiv 2511.02230): how long to hold a tool-calling program's KV.

Two rules, shared by the zoo's ``ttl`` policy on the SGLang engine (``policies.zoo.ttl``) and
the Continuum patch of the vLLM engine (``policies.continuum``):

- ``TtlLearner`` (the paper's rule, v6 Eq. 2)::

      tau* = argmax over tau in {0} U {durations seen}  of  F(tau) * B - tau,  B = eta * T_q + C

  ``F``: the empirical CDF of tool durations seen so far in the run (a duration: a tool-call
  reply to the program's next arrival; kvsim traces carry no tool names, so one pooled
  distribution stands for the paper's per-tool ones); ``C``: seconds to recompute the history
  (``recompute_cost``, the host's price); ``T_q``: an exponential moving mean (weight
  ``TQ_WEIGHT``) of the queue wait of turns that came back from a tool call to an unpinned
  history; ``eta = -Corr(k, N - k)`` over the steps k = 1..N of every completed program
  (clipped to [0, 1]; 1 before any program completed). Cold start: while at most
  ``cold_start`` durations have been seen, the prior is an exponential with mean ``mu_s`` and
  eta = 1, so tau* = mu * ln(B / mu) if B > mu else 0. ``tau_s >= 0``: a fixed tau instead.
- ``fixed_threshold_tau`` (Continuum's public preview code): pin ``FIXED_THRESHOLD_S`` seconds
  when the tool's running-mean duration is at most that (or unknown), else not at all (one
  pooled tool, as above).
"""

from __future__ import annotations

import math

import numpy as np

from costmodel import detmath

TQ_WEIGHT = 0.1  # weight of the newest queue wait in T_q's moving mean
FIXED_THRESHOLD_S = 2.0  # Continuum's public code: FIXED_THRESHOLD_CONTINUUM


def fixed_threshold_tau(mean_duration_s: float) -> float:
    """The public code's pin: ``FIXED_THRESHOLD_S`` when the tool's mean duration is at most
    that or unknown (NaN), else 0."""
    if math.isnan(mean_duration_s) or mean_duration_s <= FIXED_THRESHOLD_S:
        return FIXED_THRESHOLD_S
    return 0.0


class TtlLearner:
    """The learned rule's state and tau (module doc). A mixin: the host sets ``tau_s``,
    ``mu_s`` and ``cold_start``, calls ``init_learner`` once and prices ``recompute_cost``."""

    tau_s: float = -1.0  # < 0: the learned rule; >= 0: a fixed tau in seconds
    mu_s: float = 1.0  # cold-start prior: exponential tool durations with this mean
    cold_start: int = 100  # durations needed before the empirical CDF replaces the prior

    def init_learner(self) -> None:
        self.grid = np.empty(0)  # distinct tool durations seen, sorted ...
        self.counts = np.empty(0, dtype=np.int64)  # ... and how often each was seen
        self.seen = 0  # durations seen
        self.duration_sum = 0.0  # their sum (the fixed-threshold rule's running mean)
        self._cdf: np.ndarray | None = None  # F at each value (lazily, after a change)
        self.moments = np.zeros(6)  # n, sum k, sum m, sum k^2, sum m^2, sum k*m (m = N-k)
        self.queue_s = 0.0  # T_q
        self.taus: list[float] = []  # every tau chosen (for reports and tests)

    def recompute_cost(self, tokens: int) -> float:
        raise NotImplementedError

    def tau(self, context_tokens: int) -> float:
        """tau* for a history of ``context_tokens`` tokens, from what the run has seen."""
        if self.tau_s >= 0:
            return self.tau_s
        c = self.recompute_cost(context_tokens)
        n = self.seen
        if n <= self.cold_start:
            benefit = self.queue_s + c  # eta = 1 under the prior
            mu = self.mu_s
            return mu * detmath.log(benefit / mu) if benefit > mu else 0.0
        benefit = self.eta() * self.queue_s + c
        if self._cdf is None:
            self._cdf = np.cumsum(self.counts) / n
        gain = self._cdf * benefit - self.grid
        best = int(np.argmax(gain))  # the first maximum: the smallest tau among equals
        below = int(np.searchsorted(self.grid, 0.0, side="right"))  # durations <= 0
        at_zero = float(self._cdf[below - 1]) * benefit if below else 0.0
        return float(self.grid[best]) if gain[best] > at_zero else 0.0

    def mean_duration(self) -> float:
        """Mean tool duration seen so far (NaN before the first)."""
        return self.duration_sum / self.seen if self.seen else math.nan

    def observe_queue(self, queue_s: float) -> None:
        """A turn back from a tool call to an unpinned history waited ``queue_s`` (T_q)."""
        if not math.isnan(queue_s):
            self.queue_s += TQ_WEIGHT * (queue_s - self.queue_s)

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

    def add_duration(self, d: float) -> None:
        """One more duration: distinct values sorted with their counts (traces record
        waits at coarse resolution, so there are far fewer values than durations)."""
        i = int(np.searchsorted(self.grid, d))
        if i < self.grid.size and self.grid[i] == d:
            self.counts[i] += 1
        else:
            self.grid = np.insert(self.grid, i, d)
            self.counts = np.insert(self.counts, i, 1)
        self.seen += 1
        self.duration_sum += d
        self._cdf = None
