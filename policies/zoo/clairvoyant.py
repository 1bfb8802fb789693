"""The clairvoyant heuristic: Belady's rule over histories, with position-aware costs.
An ORACLE -- it reads the replay's future -- shown as ``clairvoyant-oracle`` in every table.

It knows when each session will next send a request in this replay (``clairvoyant = True``:
``Reply.next_gap_s``: under the closed loop the wait the replay inserts after the reply,
under the open loop the time left until the next request's recorded send time). Definition:

- a session's *next use* is ``reply time + next_gap_s`` after a reply, its arrival time once
  its next request is waiting (due: kept), and never (+inf) after its last reply;
- a node's next use is its session's (learned from reply paths, ``HistoryOwners``); a node on
  several sessions' paths (the shared prefix) is needed by the next request of every session:
  it is kept out of every chain (``KeepFront``) and, as a victim leaf, goes last; a node no
  live history runs through (a branch its session left, a history that ended) is never used
  again: first;
- histories are freed from their private head, block by block: a block at position p costs
  W + p to recompute, so a history's cheapest blocks go first (Penelope's start);
- victim order, two rules (``cost_aware``):
  * ``cost_aware = False`` -- Belady: the furthest next use first (LRU among equals);
  * ``cost_aware = True`` -- the lowest recompute seconds of the history's next block (at the
    head of its private run) per second until its next use first: a history far in the future
    still goes first, but between histories needed at similar times the one whose next block
    is cheaper goes, which spreads eviction over the fronts of several histories.
  ``kvsim reproduce policies`` runs both and reports the better per configuration as the
  oracle: each is better somewhere (Belady on light load, the cost-aware rule on heavy load
  and the larger model, where recomputed positions cost most).

Why it is a heuristic, not a bound. Belady's rule is optimal for unit-size, unit-cost pages
and a fixed request sequence. Here (1) histories differ in size and their blocks in cost
(W + p), and offline caching with sizes or costs is NP-hard in general; (2) the metric is
TTFT, not misses: a recompute delays every request batched or queued behind it, so where the
misses fall in time matters (a rule with fewer recomputed units can still have a higher mean
TTFT); (3) the closed loop makes the future depend on the policy: a faster reply sends the
next request sooner (the open loop's future is fixed); (4) the next request is known by
time, not content: a session whose next prompt diverges from its history (an edit, a
compaction) still counts that history as needed, and sub-agents can delay a parent's next
request past ``next_gap_s``; (5) the scheduler
(``lpm``) is the same as every other policy's: the oracle does not reorder requests. It is
the best rule kvsim knows with this oracle, checked against every policy of the experiment.
"""

from __future__ import annotations

import math

from ..context import HOLE, Arrival, CacheNode, Reply
from ..eviction import BLOCK, PRIVATE_HEAD, KeepFront
from ..registry import register_policy
from .common import DEAD, SHARED, HistoryOwners, ZooPolicy


@register_policy
class Clairvoyant(ZooPolicy):
    """Furthest next use first, front of the history first (see module doc). Oracle."""

    name = "clairvoyant"
    start, granularity = PRIVATE_HEAD, BLOCK
    clairvoyant = True
    events = frozenset({"arrival", "reply"})
    cost_aware: bool = True  # False: pure Belady (furthest next use first)

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.start = KeepFront(self.start, self.is_shared)
        self.owners = HistoryOwners()
        self.next_use: dict[int, float] = {}  # session -> time of its next request
        self.costs: dict[int, float] = {}  # block position -> recompute seconds

    @property
    def spec(self) -> str:
        return super().spec.replace(self.name, "clairvoyant-oracle", 1)

    def on_arrival(self, event: Arrival) -> None:
        self.next_use[event.session] = event.time

    def on_reply(self, event: Reply) -> None:
        self.owners.walk(event.session, event.leaf)
        gap = event.next_gap_s
        if event.next_gap == "end" or math.isnan(gap):
            self.next_use[event.session] = math.inf
        else:
            self.next_use[event.session] = event.time + gap

    def next_use_of(self, node: CacheNode) -> float:
        o = self.owners.owner(node)
        if o is None or o == DEAD:
            return math.inf
        if o == SHARED:
            return -math.inf
        return self.next_use.get(o, math.inf)

    def is_shared(self, node: CacheNode) -> bool:
        return self.owners.owner(node) == SHARED

    def head_position(self, leaf: CacheNode) -> int:
        """Block position where freeing ``leaf``'s history starts: the head of its private
        run (the walk ``PRIVATE_HEAD`` makes, on the tree as it is), below any shared node."""
        node = leaf
        while True:
            parent = node.parent
            if (parent is None or parent.parent is None or len(parent.children) > 1
                    or parent.lock > 0 or parent.tier == HOLE or self.is_shared(parent)):
                return node.start
            node = parent

    def block_cost(self, position: int) -> float:
        """Seconds to recompute the block at ``position`` (blocks) where it is."""
        c = self.costs.get(position)
        if c is None:
            bs = self.context.block_size
            rs = self.context.recompute_seconds
            a = position * bs
            c = self.costs[position] = rs(a, a + bs) if rs is not None else float(a + bs)
        return c

    def key(self, node: CacheNode) -> tuple[float, int]:
        nxt = self.next_use_of(node)
        if not self.cost_aware:
            return (-nxt, node.last_access)
        wait = nxt - self.context.now()
        if wait <= 0:  # due now (waiting) or the shared prefix: keep to the last
            return (math.inf, node.last_access)
        if wait == math.inf:
            return (0.0, node.last_access)
        nxt_block = self.head_position(node) if self.start.from_head else node.end - 1
        return (self.block_cost(nxt_block) / wait, node.last_access)
