"""The policy zoo: eviction policies proposed for agentic serving, written against the public
policy API (docs/policies.md) exactly as a user would write them, and registered by name.

=============  ==========================================================  ================
name           what it is                                                  start + gran.
=============  ==========================================================  ================
ttl            Continuum's TTL pins for tool calls (run it with the        tail + block
               ``program-fcfs`` scheduler)
tlru           Tail-optimized LRU: TEL-safe nodes first, then LRU          tail + node
greedydual     clock + recompute seconds x uses / size, lowest first       tail + node
memdecay       MemDecay's region scores with decay; system prefix pinned   private-head + block
clairvoyant    ORACLE: Belady over histories, front first (label           private-head + block
               ``clairvoyant-oracle``)
random         uniform victims, seeded: the floor                          tail + node
=============  ==========================================================  ================

Any of them runs on another start or granularity: ``ttl?start=private-head&granularity=block``
(labelled ``ttl@private-head+block``).
"""

from . import clairvoyant, greedydual, memdecay, random_victims, tlru, ttl
from .clairvoyant import Clairvoyant
from .common import ZooPolicy
from .greedydual import GreedyDual
from .memdecay import RegionDecay
from .random_victims import RandomVictims
from .tlru import TailOptimizedLRU
from .ttl import TTLPinning

ZOO = ("ttl", "tlru", "greedydual", "memdecay", "clairvoyant", "random")

__all__ = ["ZOO", "Clairvoyant", "GreedyDual", "RandomVictims", "RegionDecay",
           "TTLPinning", "TailOptimizedLRU", "ZooPolicy", "clairvoyant", "greedydual",
           "memdecay", "random_victims", "tlru", "ttl"]
