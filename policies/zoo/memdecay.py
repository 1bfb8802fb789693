"""Region-aware decay (MemDecay; Matam & Kim, arXiv 2607.10582; seed 003).

Every block belongs to a content region of the trace (``Arrival.block_regions``; the codes
are ``traces.REGION_NAMES``, repeated here as ``REGIONS``). Each region has a base priority
``b_r`` and a half-life ``h_r``; a block's retention score decays from the last time its
session used it (a request attends to its whole history, which refreshes every block of it):

    score(node) = sum over its blocks of  b_r * 2 ** (-age / (h_r * step_s))  / blocks,
    age = now - the session's last arrival or reply (simulated seconds)

and the lowest-scoring history goes first (LRU among equal scores). With ``pin_system`` a node
holding only system and tool-definition blocks (the shared prefix) is pinned: it is freed
only as a victim leaf of its own, after every unpinned history (``KeepFront`` keeps it out of the
chain of the last history below it).

What the sources give and what kvsim assumes (docs/policies.md):

- half-lives, in decode steps: system 148-189 -> 168 (the midpoint), scratchpad 14-16 -> 15
  [reference]; kvsim maps MemDecay's regions onto the trace's: system and tool definitions ->
  system (168), model output (text, thinking, tool calls) -> scratchpad (15); user text and
  tool results have no published half-life: kvsim assumes 50 steps (the geometric middle);
- no numeric base priorities are published: kvsim assumes system 1.0, tools 1.0, user 0.8,
  tool results 0.6, assistant 0.5, unknown 0.6;
- one decode step is ``step_s = 0.03`` simulated seconds (a Qwen3-8B decode step at batch 8
  with 64K-token contexts under the default H100 profile is 31 ms), so the half-lives are
  5.0 s (system), 1.5 s (user, tool results) and 0.45 s (assistant);
- MemDecay evicts single pages anywhere in the context. kvsim's holes are refilled before the
  next turn runs, so dropping a middle page saves nothing the front would not; the policy picks
  the history by score and frees it from its private head, block by block (Penelope's start),
  where refills are cheapest.
"""

from __future__ import annotations

import math

import numpy as np

from costmodel.detmath import exp2

from ..context import Arrival, CacheNode, Reply
from ..eviction import BLOCK, PRIVATE_HEAD, KeepFront
from ..registry import register_policy
from .common import DEAD, SHARED, HistoryOwners, ZooPolicy

# traces.REGION_NAMES (policies do not import traces; tests/test_zoo_golden.py pins them equal)
REGIONS = ("system", "tools", "user", "assistant", "tool_result", "unknown")
_OUTPUT = REGIONS.index("assistant")  # blocks past the prompt: the reply the model wrote


@register_policy
class RegionDecay(ZooPolicy):
    """MemDecay's region scores over histories (see module doc)."""

    name = "memdecay"
    start, granularity = PRIVATE_HEAD, BLOCK
    pins = True
    events = frozenset({"arrival", "reply"})
    step_s: float = 0.03
    half_life_system: float = 168.0  # decode steps
    half_life_tools: float = 168.0
    half_life_user: float = 50.0
    half_life_assistant: float = 15.0
    half_life_tool_result: float = 50.0
    half_life_unknown: float = 50.0
    base_system: float = 1.0
    base_tools: float = 1.0
    base_user: float = 0.8
    base_assistant: float = 0.5
    base_tool_result: float = 0.6
    base_unknown: float = 0.6
    pin_system: bool = True

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.base = tuple(float(getattr(self, f"base_{r}")) for r in REGIONS)
        self.half_life_s = tuple(getattr(self, f"half_life_{r}") * self.step_s for r in REGIONS)
        self.rates = tuple(1.0 / h for h in self.half_life_s)  # halvings per second
        if self.pin_system:
            self.start = KeepFront(self.start, self.is_pinned)
        self.owners = HistoryOwners()
        self.regions: dict[int, np.ndarray] = {}  # session -> its latest prompt's regions
        self.used: dict[int, float] = {}  # session -> last arrival or reply
        self.latest = -math.inf  # the latest use of any session (shared nodes)
        self.shared_from: dict[int, int] = {}  # shared node serial -> latest session on it
        self.counts: dict[int, tuple] = {}  # serial -> (start, end, session, region_counts)
        self.weights: dict[int, tuple[float, float, tuple]] = {}  # owner -> (now, use, w)
        # (node, start, end, region_counts) of the latest pinned_until; events clear it
        self.last: tuple = (None, 0, 0, None)

    # --- events -----------------------------------------------------------------------
    def on_arrival(self, event: Arrival) -> None:
        self.last = (None, 0, 0, None)
        if event.block_regions is not None:
            self.regions[event.session] = event.block_regions
        self._used(event.session, event.time)

    def on_reply(self, event: Reply) -> None:
        self.last = (None, 0, 0, None)
        for nd in self.owners.walk(event.session, event.leaf):
            if self.owners.owner(nd) == SHARED:
                self.shared_from[nd.serial] = event.session
        self._used(event.session, event.time)

    def _used(self, session: int, t: float) -> None:
        self.used[session] = t
        self.latest = max(self.latest, t)

    # --- scores -----------------------------------------------------------------------
    def region_counts(self, node: CacheNode) -> tuple[int, tuple[float, ...], bool] | None:
        """(owner, share of the node's blocks per region, whether all are system or tool
        definitions), from the prompt of the session whose path runs through the node (for a
        shared node the latest one); blocks past the prompt are the model's reply
        (assistant). None for a node no live history uses. Cached per node shape."""
        serial = node.serial
        o = self.owners.owners.get(serial)
        if o is None or o == DEAD:
            return None
        session = self.shared_from.get(serial, -1) if o == SHARED else o
        start, end = node.start, node.end
        got = self.counts.get(serial)
        if got is not None and got[0] == start and got[1] == end and got[2] == session:
            return got[3]
        regions = self.regions.get(session)
        size = end - start
        if regions is None:
            c = [0, 0, 0, 0, 0, size]  # unknown
        else:
            seen = regions[start:end]
            c = np.bincount(seen, minlength=len(REGIONS)).tolist()
            c[_OUTPUT] += size - seen.size
        share = tuple(x / size for x in c) if size else (0.0,) * len(REGIONS)
        out = (o, share, c[0] + c[1] == sum(c))
        self.counts[serial] = (start, end, session, out)
        return out

    def _weights(self, owner: int, now: float) -> tuple[float, ...]:
        # Cached per (now, last use): an event at this same instant refreshes the use.
        last = self.latest if owner == SHARED else self.used.get(owner, now)
        cached = self.weights.get(owner)
        if cached is not None and cached[0] == now and cached[1] == last:
            return cached[2]
        age = now - last if now > last else 0.0
        b, r = self.base, self.rates
        w = (b[0] * exp2(-age * r[0]), b[1] * exp2(-age * r[1]), b[2] * exp2(-age * r[2]),
             b[3] * exp2(-age * r[3]), b[4] * exp2(-age * r[4]), b[5] * exp2(-age * r[5]))
        self.weights[owner] = (now, last, w)
        return w

    def score(self, node: CacheNode) -> float:
        """Mean retention score of the node's blocks (0 for a node no live history uses)."""
        last = self.last  # the planner asks pinned_until, then key, of each victim
        if last[0] is node and last[1] == node.start and last[2] == node.end:
            got = last[3]
        else:
            got = self.region_counts(node)
        if got is None:
            return 0.0
        w = self._weights(got[0], self.context.now())
        f = got[1]
        return f[0] * w[0] + f[1] * w[1] + f[2] * w[2] + f[3] * w[3] + f[4] * w[4] + f[5] * w[5]

    def key(self, node: CacheNode) -> tuple[float, int]:
        return (self.score(node), node.last_access)

    def is_pinned(self, node: CacheNode) -> bool:
        """Only system and tool-definition blocks (with ``pin_system``)."""
        if not self.pin_system:
            return False
        got = self.region_counts(node)
        return got is not None and got[2]

    def pinned_until(self, node: CacheNode) -> float:
        got = self.region_counts(node)
        self.last = (node, node.start, node.end, got)
        return math.inf if self.pin_system and got is not None and got[2] else -math.inf
