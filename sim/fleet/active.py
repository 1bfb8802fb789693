"""``ActivePrompts``: the block ids of the prompts a router believes are active on one worker,
as a multiset of chained block-id sequences (compiled with the core: every routed request
adds its prompt, and every reply removes it).

Dynamo's slot manager, which the fleet's predicted load keeps for its router
(sim/fleet/load.py, read by policies/routers/dynamo.py), counts per worker the UNIQUE blocks
of the active requests and how many leading blocks of a new prompt are already active. With
chained ids (the id of block i determines blocks 0..i) the union of active prompts is a tree
of shared prefixes, so both answers are sums over the tree's edges: this keeps the prompts in
a radix tree of block-id segments with a reference count per node (the prompts through it),
and costs Python work per branch point on a prompt's path, not per block (the segment
comparisons run in numpy).

It answers exactly what a per-block reference count (``dict[id, count]``) answers: ``unique``
is the number of ids with a positive count and ``prefix(ids)`` the leading ids of ``ids`` that
have one (tests/test_active_prompts.py checks it against that model on random prompt sets).
"""

from __future__ import annotations

import numpy as np


class _Node:
    __slots__ = ("children", "first", "ids", "key", "parent", "refs", "size")

    def __init__(self, ids: np.ndarray, parent: _Node | None, refs: int) -> None:
        self.ids = ids
        self.key = b""
        self.size = 0
        self.first: int = 0
        self.set_ids(ids)
        self.parent = parent
        self.refs = refs  # active prompts whose path covers this whole edge
        self.children: dict[int, _Node] = {}  # first block id of the child's edge -> child

    def set_ids(self, ids: np.ndarray) -> None:
        self.ids = ids  # this edge's blocks (empty at the root), int64
        # their bytes: a walk tests a whole edge against the prompt's bytes in C
        # (``_covers``), without an array operation
        self.key = ids.tobytes()
        self.size = len(self.key) // 8  # its blocks
        self.first = ids.item(0) if self.size else 0  # its key in the parent's children


def _covers(buf: bytes, pos: int, child: _Node) -> bool:
    """Whether the prompt whose int64 bytes are ``buf`` holds ``child``'s whole edge from
    block ``pos`` on."""
    return buf.startswith(child.key, pos * 8)


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    n = min(a.size, b.size)
    eq = a[:n] == b[:n]
    return n if eq.all() else int(eq.argmin())


class ActivePrompts:
    """A multiset of block-id prompts (module docstring): ``add``, ``remove`` (of a prompt
    added before), ``prefix`` and ``unique``."""

    def __init__(self) -> None:
        self._root = _Node(np.empty(0, dtype=np.int64), None, 0)
        self.unique = 0  # distinct blocks of the active prompts

    def __len__(self) -> int:
        """Distinct active blocks (``unique``), as the per-block count's length."""
        return self.unique

    @property
    def prompts(self) -> int:
        """Active prompts (each ``add`` not yet removed)."""
        return self._root.refs

    @property
    def edges(self) -> int:
        """Segments the tree keeps (its size in Python objects)."""
        count, stack = 0, [self._root]
        while stack:
            node = stack.pop()
            count += len(node.children)
            stack.extend(node.children.values())
        return count

    def prefix(self, ids: np.ndarray, buf: bytes | None = None) -> int:
        """Leading blocks of ``ids`` that some active prompt holds. ``buf``: ``ids``' int64
        bytes, when the caller asks one prompt of many workers (the bytes made once)."""
        if buf is None:
            ids = np.asarray(ids, dtype=np.int64)
            buf = ids.tobytes()
        node, pos, n = self._root, 0, int(ids.size)
        while pos < n:
            child = node.children.get(ids.item(pos))
            if child is None:
                return pos
            if _covers(buf, pos, child):
                pos += child.size
                node = child
                continue
            m = _common(child.ids, ids[pos:])
            pos += m
            if m < child.size:
                return pos
            node = child
        return pos

    def add(self, ids: np.ndarray) -> int:
        """Make ``ids`` active (once more); returns the blocks that became active."""
        ids = np.asarray(ids, dtype=np.int64)
        node, pos, n = self._root, 0, int(ids.size)
        buf = ids.tobytes()
        node.refs += 1
        while pos < n:
            key = ids.item(pos)
            child = node.children.get(key)
            if child is None:
                node.children[key] = _Node(ids[pos:].copy(), node, 1)
                self.unique += n - pos
                return n - pos
            m = child.size if _covers(buf, pos, child) else _common(child.ids, ids[pos:])
            if m < child.size:
                self._split(child, m)
            child.refs += 1
            pos += m
            node = child
        return 0

    def remove(self, ids: np.ndarray) -> int:
        """Make one earlier ``add(ids)`` inactive; returns the blocks no prompt holds now."""
        ids = np.asarray(ids, dtype=np.int64)
        node, pos, n = self._root, 0, int(ids.size)
        buf = ids.tobytes()
        path = [node]
        while pos < n:
            child = node.children.get(ids.item(pos))
            if child is None or not _covers(buf, pos, child):
                raise KeyError(f"prompt of {n} blocks is not active (no path at block {pos})")
            pos += child.size
            node = child
            path.append(node)
        if any(x.refs <= 0 for x in path):
            raise KeyError(f"prompt of {n} blocks is not active")
        freed = 0
        for x in path:
            x.refs -= 1
        for x in reversed(path[1:]):  # counts fall along a path: the dead ones are its tail
            if x.refs:
                break
            parent = x.parent
            assert parent is not None  # (below the root)
            del parent.children[x.first]
            freed += x.size
        self.unique -= freed
        live = [x for x in path[1:] if x.refs]
        for x in live:  # joined children are skipped (they left the tree)
            if x.parent is not None and x.parent.children.get(x.first) is x:
                self._merge_down(x)
        return freed

    # --- internals --------------------------------------------------------------------------
    @staticmethod
    def _split(node: _Node, m: int) -> None:
        """Cut ``node``'s edge after ``m`` blocks: the tail becomes its only child."""
        tail = _Node(node.ids[m:], node, node.refs)
        tail.children = node.children
        for c in tail.children.values():
            c.parent = tail
        node.set_ids(node.ids[:m])
        node.children = {tail.first: tail}

    @staticmethod
    def _merge_down(node: _Node) -> None:
        """Join ``node`` with its only child while no prompt ends at ``node`` (the child
        carries every prompt through it), so splits do not outlive the prompts that made
        them."""
        while len(node.children) == 1:
            (child,) = node.children.values()
            if child.refs != node.refs:
                return
            node.set_ids(np.concatenate((node.ids, child.ids)))
            node.children = child.children
            for c in node.children.values():
                c.parent = node
            child.parent = None  # it left the tree
