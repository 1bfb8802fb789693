"""Random victims: the floor every policy should beat.

Each time the planner orders the evictable leaves, every leaf gets a uniform key, so the victim
is uniform among them. The key is a hash of (the run's seed, the node's serial, the victims
taken so far), not a draw from a stream: the planner reads the leaves from a set, in an order
that varies from process to process, and a stream would hand out its numbers in that order.
Hashing makes the run a pure function of (trace, config, seed).

Start and granularity default to SGLang's (tail, whole nodes): against ``sglang`` only the
victim order differs.
"""

from __future__ import annotations

from ..context import CacheNode
from ..eviction import NODE, TAIL, ObservedStart
from ..registry import register_policy
from .common import ZooPolicy

_MASK = (1 << 64) - 1


def uniform(*words: int) -> float:
    """A uniform number in [0, 1) from integers (splitmix64 over the words)."""
    x = 0x9E3779B97F4A7C15
    for w in words:
        x = (x ^ (w & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
        x ^= x >> 31
    return (x >> 11) / float(1 << 53)


@register_policy
class RandomVictims(ZooPolicy):
    """Uniform victims, seeded (see module doc)."""

    name = "random"
    uses_seed = True
    start, granularity = TAIL, NODE

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.start = ObservedStart(self.start, self._victim)
        self.taken = 0  # victims popped so far: a new draw for every leaf after each

    def _victim(self, leaf: CacheNode) -> None:
        self.taken += 1

    def key(self, node: CacheNode) -> float:
        return uniform(self.context.seed, node.serial, self.taken)
