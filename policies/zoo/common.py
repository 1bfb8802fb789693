"""What the zoo's policies share: labels that name a changed start or granularity, and the
map from cache nodes to the sessions whose histories run through them.

Histories are learned from ``Reply.leaf``: after every reply the policy walks from the leaf to
the root (nodes, never blocks: O(depth) per reply) and records which session each node serves.
A node seen on two sessions' paths is ``SHARED`` (the shared system prefix); a node that was on
a session's previous path and is not on its new one is ``DEAD`` (the session's prompt diverged
from it: an edited or compacted history). Serials identify nodes across splits and merges
(docs/policies.md), so the map stays valid while the cache reshapes the tree.
"""

from __future__ import annotations

from ..context import CacheNode
from ..eviction import EvictionPolicy

SHARED = -1  # on the paths of several sessions
DEAD = -2  # left behind by its session's latest history


class ZooPolicy(EvictionPolicy):
    """Base of the zoo: a registered policy whose start and granularity may be overridden
    (``--policy ttl?start=private-head&granularity=block``); the label then names them
    (``ttl@private-head+block``) so runs of the same order on two starts stay apart."""

    @property
    def spec(self) -> str:
        cls = type(self)
        own = (self.start.name, self.granularity.name)
        if own == (cls.start.name, cls.granularity.name):
            return self.name
        return f"{self.name}@{own[0]}+{own[1]}"


class HistoryOwners:
    """``owner(node)``: the session whose history runs through ``node``, ``SHARED``, ``DEAD``
    or None (never on a reply path). ``walk(session, leaf)`` after each of its replies."""

    __slots__ = ("owners", "paths")

    def __init__(self) -> None:
        self.owners: dict[int, int] = {}  # node serial -> session | SHARED | DEAD
        self.paths: dict[int, list[int]] = {}  # session -> serials of its latest path

    def walk(self, session: int, leaf: CacheNode | None) -> list[CacheNode]:
        """Record ``leaf``'s path (leaf first, root excluded) as ``session``'s history and
        return its nodes. Nodes of the session's previous path not on this one become DEAD."""
        owners = self.owners
        nodes: list[CacheNode] = []
        nd = leaf
        while nd is not None and nd.parent is not None:
            o = owners.get(nd.serial)
            if o is None or o == DEAD:
                owners[nd.serial] = session
            elif o != session:
                owners[nd.serial] = SHARED
            nodes.append(nd)
            nd = nd.parent
        serials = [n.serial for n in nodes]
        old = self.paths.get(session)
        if old:
            keep = set(serials)
            for s in old:
                if s not in keep and owners.get(s) == session:
                    owners[s] = DEAD
        self.paths[session] = serials
        return nodes

    def owner(self, node: CacheNode) -> int | None:
        return self.owners.get(node.serial)
