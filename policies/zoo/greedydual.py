"""Cost-aware eviction, GreedyDual style (Young 1994; Cao & Irani's GreedyDual-Size, with
Cherkasova's frequency term): each cached node has a priority

    H(node) = clock_at_its_last_access + cost(node) * uses(node) / size(node)

and the node with the lowest H goes first. ``cost`` is the seconds to recompute the node's
blocks at their positions under the run's model and profile (``context.recompute_seconds``:
W + p units per token and layer, Section 2.2), so deep blocks are dear and front blocks cheap;
``uses`` = ``hit_count + 1`` (matches so far, plus the insert that created it); ``size`` =
its blocks. GreedyDual's inflation: the clock is the priority of the last victim, so a node
that is not used again ages by the rising clock and is eventually evicted however dear it was.

Victims are observed through ``ObservedStart`` (the planner asks ``chain`` once per popped
victim, in order). The clock a node gets is the one in effect when its current access stamp
happened: the policy notes the newest access stamp it has seen (every key, every reply's leaf)
at each clock rise, and a node stamped after that note gets the newer clock. Leaves are seen at
every eviction, so for them this is exact; a node first seen later (a parent exposed when its
last child goes) is placed by its stamp among those notes.

Without a run context (a bare cache) the cost is the token count. Start and granularity
default to whole nodes from the tail (GreedyDual evicts whole objects).
"""

from __future__ import annotations

import bisect

from ..context import CacheNode, Reply
from ..eviction import NODE, TAIL, ObservedStart
from ..registry import register_policy
from .common import ZooPolicy


@register_policy
class GreedyDual(ZooPolicy):
    """Lowest clock + recompute seconds x uses / size first (see module doc)."""

    name = "greedydual"
    start, granularity = TAIL, NODE
    events = frozenset({"reply"})

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.start = ObservedStart(self.start, self._victim)
        self.clock = 0.0  # L: the priority of the last victim (never decreases)
        self.notes: list[int] = []  # newest access stamp seen at each clock rise ...
        self.levels: list[float] = []  # ... and the clock from then on
        self.newest = 0  # newest access stamp seen so far
        self.base: dict[int, tuple[int, float]] = {}  # serial -> (stamp, clock at that stamp)
        self.costs: dict[tuple[int, int], float] = {}  # (start, end) blocks -> seconds
        self.last_h: dict[int, float] = {}  # serial -> H at its latest key

    def on_reply(self, event: Reply) -> None:
        if event.leaf is not None and event.leaf.last_access > self.newest:
            self.newest = event.leaf.last_access

    def clock_at(self, stamp: int) -> float:
        """The clock in effect when access stamp ``stamp`` happened."""
        i = bisect.bisect_left(self.notes, stamp)
        return self.levels[i - 1] if i else 0.0

    def cost(self, node: CacheNode) -> float:
        span = (node.start, node.end)
        c = self.costs.get(span)
        if c is None:
            bs = self.context.block_size
            rs = self.context.recompute_seconds
            a, b = span[0] * bs, span[1] * bs
            c = self.costs[span] = rs(a, b) if rs is not None else float(b - a)
        return c

    def priority(self, node: CacheNode) -> float:
        stamp = node.last_access
        if stamp > self.newest:
            self.newest = stamp
        base = self.base.get(node.serial)
        if base is None or base[0] != stamp:
            base = self.base[node.serial] = (stamp, self.clock_at(stamp))
        h = base[1] + self.cost(node) * (node.hit_count + 1) / node.num_blocks
        self.last_h[node.serial] = h
        return h

    def key(self, node: CacheNode) -> tuple[float, int]:
        return (self.priority(node), node.last_access)

    def _victim(self, leaf: CacheNode) -> None:
        h = self.last_h.get(leaf.serial, self.clock)
        if h > self.clock:
            self.clock = h
            if self.notes and self.notes[-1] == self.newest:
                self.levels[-1] = h
            else:
                self.notes.append(self.newest)
                self.levels.append(h)
