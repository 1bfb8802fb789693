"""Walks, splits and merges of the radix tree (a mixin of ``RadixTree``).

Nothing here changes a counter: ``walk`` reads, ``split`` cuts a node in two of the same
tier, lock and stamp, ``merge_runs`` only joins nodes of equal tier, lock, stamp and host copy
(so every counter and the leaf set stay as they are).
"""

from __future__ import annotations

import numpy as np

from .node import Node, Tier

_NONE = Tier.NONE


class Paths:
    """Walks over block ids; mixed into ``RadixTree`` (uses its ``root``)."""

    root: Node

    def next_serial(self) -> int:  # provided by RadixTree
        raise NotImplementedError

    def walk(self, ids: np.ndarray, stop_at_holes: bool, exact: bool = False
             ) -> tuple[list[Node], Node | None, int, int]:
        """Follow ``ids`` down without changing anything: (nodes matched whole, the node the
        match ends inside or None, blocks of it matched, total matched blocks).

        Raw trace ids are chained (DESIGN.md), so a node whose last id equals the prompt's id
        at that position matches whole: one scalar comparison per node; only the last node
        needs a vector compare. Versioned keys (``versions``) are chained in their raw id and
        edit history but not in which earlier blocks a later edit dropped or moved, so
        ``exact=True`` (any prompt holding edited keys) compares every node in full.
        DROPPED nodes are walked through (their keys say the history dropped them)."""
        item = ids.item
        n = len(ids)
        node = self.root
        path: list[Node] = []
        pos = 0
        while pos < n:
            child = node.children.get(item(pos))
            if child is None or (stop_at_holes and child.tier is _NONE):
                break
            length = len(child.ids)
            end = pos + length
            if not exact:
                if end <= n and (length == 1 or child.last == item(end - 1)):
                    path.append(child)
                    node = child
                    pos = end
                    continue
                m = min(length, n - pos)
                if m == 1 or child.ids.item(m - 1) == item(pos + m - 1):
                    return path, child, m, pos + m
            m = min(length, n - pos)
            diff = child.ids[:m] != ids[pos : pos + m]
            i = int(diff.argmax())
            k = i if diff[i] else m
            if k == length:
                path.append(child)
                node = child
                pos = end
                continue
            return path, child, k, pos + k
        return path, None, 0, pos

    def split(self, node: Node, k: int) -> Node:
        """Split ``node`` after its first k blocks; return the new PREFIX node. ``node`` keeps
        its identity as the suffix (handles held by requests stay valid, as in SGLang)::

            parent -- node[s, e)   =>   parent -- prefix[s, s+k) -- node[s+k, e)
        """
        prefix = Node(node.ids[:k], node.start, node.parent, node.tier, self.next_serial(),
                      node.last_access)
        prefix.lock = node.lock
        prefix.hit_count = node.hit_count
        prefix.host = node.host
        parent = node.parent
        assert parent is not None
        parent.children[int(node.ids[0])] = prefix
        node.ids = node.ids[k:]
        node.start += k
        node.parent = prefix
        prefix.children[int(node.ids[0])] = node
        return prefix

    def merge_runs(self, chain: list[Node]) -> None:
        """Merge runs of ``chain`` (root-ward to leaf-ward, each the parent of the next) whose
        upper nodes have one child and equal tier, lock, stamp and host copy, into the run's
        deepest node (it keeps its identity, so lock handles stay valid). Counters and the leaf
        set do not change (same tier and lock)."""
        i = len(chain) - 1
        while i > 0:
            child = chain[i]
            j = i
            while j > 0:
                up = chain[j - 1]
                if (len(up.children) == 1 and up.lock == child.lock and up.tier is child.tier
                        and up.last_access == child.last_access and up.host == child.host):
                    j -= 1
                else:
                    break
            if j < i:
                run = chain[j:i]
                top = run[0]
                parent = top.parent
                assert parent is not None
                parent.children[top.ids.item(0)] = child
                child.ids = np.concatenate([*(nd.ids for nd in run), child.ids])
                child.start = top.start
                child.parent = parent
                child.hit_count = max(child.hit_count, *(nd.hit_count for nd in run))
                for nd in run:
                    nd.parent = None
                    nd.children = {}
            i = j - 1
