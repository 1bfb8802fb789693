"""Walks, splits and merges of the radix tree (a mixin of ``RadixTree``).

Nothing here changes a counter: ``walk`` reads, ``split`` cuts a node in two of the same
tier, lock and stamp, ``merge_runs`` only joins nodes of equal tier, lock, stamp and host copy
(so every counter and the leaf set stay as they are).
"""

from __future__ import annotations

import numpy as np

from .node import Node, Tier

_NONE = Tier.NONE


class WalkHint:
    """Where a caller's last walk of the same prompt ended (``RadixKVCache.match``/``insert``
    take one per request, the replay one per session): a later walk of that prompt, or of a
    prefix or extension of it, climbs from there to the root by parent links instead of
    looking up every node again. Valid while the node is in the tree, no node on its path got
    new keys since (``Node.keyed`` against the tree's ``epoch`` when the hint was taken), and
    the node's last key is the prompt's there (keys are chained: then the whole prefix is).
    Splits, merges and evictions keep the keys of a path, so they keep a hint valid."""

    __slots__ = ("epoch", "node")

    def __init__(self) -> None:
        self.node: Node | None = None
        self.epoch = -1

    def take(self, node: Node | None, epoch: int) -> None:
        self.node, self.epoch = node, epoch


class Paths:
    """Walks over block ids; mixed into ``RadixTree`` (uses its ``root``)."""

    root: Node
    epoch: int  # RadixTree: counts key changes (rekey)

    def _from_hint(self, hint: WalkHint, ids: np.ndarray, stop_at_holes: bool
                   ) -> list[Node] | None:
        """The path root..hint.node if it is still a prefix of ``ids`` (``WalkHint``)."""
        node = hint.node
        if node is None or node.parent is None:
            return None
        end = node.start + len(node.ids)
        # A dropped last key does not pin where its run of dropped keys starts: no hint.
        if end > len(ids) or node.last != ids.item(end - 1) or node.last < 0:
            return None
        chain = []
        append = chain.append
        root = self.root
        nd = node
        epoch = hint.epoch
        while nd is not root:
            if nd is None or nd.keyed > epoch:
                return None
            append(nd)
            nd = nd.parent
        if stop_at_holes and any(x.tier is _NONE for x in chain):
            return None
        chain.reverse()
        return chain

    def walk(self, ids: np.ndarray, stop_at_holes: bool, hint: WalkHint | None = None
             ) -> tuple[list[Node], Node | None, int, int]:
        """Follow ``ids`` down without changing anything: (nodes matched whole, the node the
        match ends inside or None, blocks of it matched, total matched blocks). Keys are
        chained (raw trace ids: DESIGN.md; edited keys: ``versions``), so a node whose last
        key equals the prompt's key at that position matches whole: one scalar comparison
        per node; only the last node needs a vector compare. DROPPED nodes are walked through
        (their keys say the history dropped them). ``hint``: start below the node a walk of
        the same prompt reached before (``WalkHint``)."""
        item = ids.item
        n = len(ids)
        node = self.root
        path: list[Node] = []
        pos = 0
        if hint is not None:
            chain = self._from_hint(hint, ids, stop_at_holes)
            if chain:
                path = chain
                node = chain[-1]
                pos = node.start + len(node.ids)
        while pos < n:
            child = node.children.get(item(pos))
            if child is None or (stop_at_holes and child.tier is _NONE):
                break
            length = len(child.ids)
            end = pos + length
            if end <= n and (length == 1 or child.last == item(end - 1)):
                path.append(child)
                node = child
                pos = end
                continue
            m = min(length, n - pos)
            if m == 1 or child.ids.item(m - 1) == item(pos + m - 1):
                k = m
            else:
                diff = child.ids[:m] != ids[pos : pos + m]
                i = int(diff.argmax())
                k = i if diff[i] else m
            return path, child, k, pos + k
        return path, None, 0, pos

    def split(self, node: Node, k: int) -> Node:
        """Split ``node`` after its first k blocks; return the new PREFIX node. ``node`` keeps
        its identity as the suffix (handles held by requests stay valid, as in SGLang)::

            parent -- node[s, e)   =>   parent -- prefix[s, s+k) -- node[s+k, e)
        """
        ids = node.ids
        parent = node.parent
        assert parent is not None
        prefix = Node(ids[:k], node.start, parent, node.tier, self.next_serial(),
                      node.last_access)
        prefix.lock = node.lock
        prefix.hit_count = node.hit_count
        prefix.host = node.host
        prefix.keyed = node.keyed
        parent.children[ids.item(0)] = prefix
        node.ids = ids = ids[k:]
        node.start += k
        node.parent = prefix
        prefix.children[ids.item(0)] = node
        return prefix

    def merge_runs(self, chain: list[Node]) -> None:
        """Merge runs of ``chain`` (root-ward to leaf-ward, each the parent of the next) whose
        upper nodes have one child and equal tier, lock, stamp and host copy, into the run's
        deepest node (it keeps its identity, so lock handles stay valid). Counters and the leaf
        set do not change (same tier and lock)."""
        i = len(chain) - 1
        while i > 0:
            child = chain[i]
            lock, tier, stamp, host = child.lock, child.tier, child.last_access, child.host
            j = i
            while j > 0:
                up = chain[j - 1]
                if (up.lock != lock or up.last_access != stamp or up.tier is not tier
                        or up.host != host or len(up.children) != 1):
                    break
                j -= 1
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
                child.keyed = max(child.keyed, *(nd.keyed for nd in run))
                for nd in run:
                    nd.parent = None
                    nd.children = {}
            i = j - 1
