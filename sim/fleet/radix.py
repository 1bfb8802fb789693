"""SMG 1.13's approximate tree as a router belief (``policies.routing.ApproxRadix``).

A radix tree over the kvsim block ids of the prompts the router sent, one per fleet (the
gateway keeps one per model, shared by its workers). Rules of SMG 1.13's
``crates/kv_index/src/string_tree.rs`` (``insert_from``, ``match_prefix_with_counts``,
``evict_tenant_by_size``), in blocks instead of characters:

- a node holds a run of blocks and, per worker ("tenant"), a stamp; a worker on a node is on
  all its ancestors (an insert attaches it along the whole path);
- insert: nodes passed through gain the worker with stamp 0 when it is new there (their
  stamps are not refreshed); a node split at a divergence copies the stamps; the node the
  prompt ends in gets a fresh epoch;
- match: walks while edges match; the matched node is the deepest fully matched node or the
  partially matched child; one epoch tick; when that epoch is a multiple of
  ``refresh_every`` the node's stamp is refreshed for its cached holder (the worker that
  created it while it still holds it, else the lowest index: the gateway takes the first
  entry of a hash map there);
- the epoch counter starts at the number of workers (the gateway registers each with an
  empty insert) and ticks once per match and once per insert;
- eviction, every ``eviction_interval_s``: while the blocks of all workers together exceed
  ``max_blocks``, pop the least stamped (worker, node) where no child holds that worker,
  remove the worker from the whole node (a node with no worker and no child goes), and push
  the parent when it became a leaf for that worker. Ties in stamp (the gateway's heap orders
  by stamp only) go by worker, then node creation order.

Ids are chained, so two runs that agree at an offset agree up to it: the shared length of a
prompt and an edge is the number of equal positions.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
from mypy_extensions import mypyc_attr

from policies.routing import ApproxRadix

from .beliefs import CacheBelief


class _Node:
    __slots__ = ("children", "ids", "last", "parent", "serial", "stamps", "tail")

    def __init__(self, ids: np.ndarray, parent: _Node | None, serial: int) -> None:
        self.ids = ids
        # its last id as a Python int: a walk's whole-edge test reads it without numpy
        self.tail: int = ids.item(ids.size - 1) if ids.size else -1
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.stamps: dict[int, int] = {}
        self.last: int | None = None  # the cached holder a match resolves to
        self.serial = serial


def _shared(a: np.ndarray, b: np.ndarray) -> int:
    """Equal leading positions of two chained runs: equal positions are a prefix, so equal
    last positions mean all agree (most edges a prompt walks), unequal first ones none."""
    m = min(a.size, b.size)
    if a[m - 1] == b[m - 1]:
        return m
    if a[0] != b[0]:
        return 0
    return int(np.count_nonzero(a[:m] == b[:m]))


def _shared_at(ids: np.ndarray, size: int, pos: int, node: _Node) -> int:
    """``_shared(ids[pos:], node.ids)`` without the slice or numpy scalars (a walk does it
    once per edge, and a session's prompt walks one edge per earlier turn): ``size`` is
    ``ids.size``; where the prompt covers the edge its last id decides alone."""
    edge = node.ids
    n = edge.size
    if size - pos >= n:
        if ids.item(pos + n - 1) == node.tail:
            return n
        m = n
    else:
        m = size - pos
        if ids.item(size - 1) == edge.item(m - 1):
            return m
    if ids.item(pos) != edge.item(0):
        return 0
    return int(np.count_nonzero(ids[pos:pos + m] == edge[:m]))


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled (sim/native.py)
class RadixBelief(CacheBelief):
    """SMG 1.13's tree over ``n`` workers (see the module docstring)."""

    def __init__(self, n: int, spec: ApproxRadix) -> None:
        super().__init__(n)
        if spec.max_blocks < 0 or not spec.eviction_interval_s > 0 or spec.refresh_every < 1:
            raise ValueError(f"bad ApproxRadix {spec}")
        self.max_blocks = spec.max_blocks
        self.interval = float(spec.eviction_interval_s)
        self.refresh_every = spec.refresh_every
        self.next_eviction = self.interval
        self.serial = 0
        self.root = _Node(np.empty(0, dtype=np.int64), None, self._next_serial())
        self.count = [0] * n
        self.total = 0
        # (node serial, worker) -> node, for every node below the root that holds the worker
        # where no child does: eviction's candidates, kept as the tree changes so that an
        # eviction need not walk the whole tree to find them
        self.leaves: dict[tuple[int, int], _Node] = {}
        self.epoch = 0
        for r in range(n):  # the gateway's registration inserts ""
            self.root.stamps[r] = self._tick()

    def _next_serial(self) -> int:
        self.serial += 1
        return self.serial

    def _tick(self) -> int:
        e = self.epoch
        self.epoch += 1
        return e

    def sizes(self) -> list[int]:
        return list(self.count)

    # --- match -----------------------------------------------------------------------------
    def overlaps(self, ids: np.ndarray, now: float) -> list[int]:
        self._evict_due(now)
        out = [0] * self.n
        node, pos = self.root, 0
        deepest = self.root
        size: int = ids.size
        while pos < size:
            child = node.children.get(ids.item(pos))
            if child is None:
                break
            k = _shared_at(ids, size, pos, child)
            pos += k
            for r in child.stamps:
                out[r] = pos
            deepest = child
            if k < child.ids.size:
                break
            node = child
        epoch = self._tick()
        if deepest is not self.root and epoch % self.refresh_every == 0:
            holder = self._holder(deepest)
            if holder is not None:
                deepest.stamps[holder] = epoch
        return out

    @staticmethod
    def _holder(node: _Node) -> int | None:
        if node.last is not None and node.last in node.stamps:
            return node.last
        if not node.stamps:
            return None
        node.last = min(node.stamps)
        return node.last

    # --- insert ----------------------------------------------------------------------------
    def routed(self, ids: np.ndarray, replica: int, now: float) -> None:
        self._evict_due(now)
        r, node, pos = replica, self.root, 0
        size: int = ids.size
        while pos < size:
            first: int = ids.item(pos)
            child = node.children.get(first)
            if child is None:
                leaf = _Node(ids[pos:].copy(), node, self._next_serial())
                leaf.last = r
                leaf.stamps[r] = self._tick()
                node.children[first] = leaf
                self._add(r, leaf.ids.size)
                self.leaves.pop((node.serial, r), None)
                self.leaves[(leaf.serial, r)] = leaf
                return
            k = _shared_at(ids, size, pos, child)
            if k < child.ids.size:
                child = self._split(node, child, k)
            if r not in child.stamps:  # nothing below holds r either: a leaf for it
                child.stamps[r] = 0
                self._add(r, child.ids.size)
                self.leaves[(child.serial, r)] = child
            self.leaves.pop((node.serial, r), None)
            pos += k
            node = child
        node.stamps[r] = self._tick()

    def _split(self, parent: _Node, child: _Node, k: int) -> _Node:
        """Cut ``child`` after its first ``k`` blocks; the new upper node keeps the stamps."""
        upper = _Node(child.ids[:k], parent, self._next_serial())
        upper.stamps = dict(child.stamps)
        upper.last = child.last
        child.ids = child.ids[k:]
        child.parent = upper
        upper.children[int(child.ids[0])] = child
        parent.children[int(upper.ids[0])] = upper
        return upper

    def _add(self, r: int, blocks: int) -> None:
        self.count[r] += blocks
        self.total += blocks

    # --- eviction --------------------------------------------------------------------------
    def _evict_due(self, now: float) -> None:
        if now < self.next_eviction:
            return
        self.next_eviction = (math.floor(now / self.interval) + 1) * self.interval
        if self.total > self.max_blocks:
            self._evict()

    def _evict(self) -> None:
        heap = [(nd.stamps[r], r, serial, nd) for (serial, r), nd in self.leaves.items()]
        heapq.heapify(heap)
        while self.total > self.max_blocks and heap:
            _, r, serial, nd = heapq.heappop(heap)
            if self.leaves.pop((serial, r), None) is None:
                continue
            del nd.stamps[r]
            self.count[r] -= nd.ids.size
            self.total -= nd.ids.size
            parent = nd.parent
            if not nd.children and not nd.stamps and parent is not None:
                del parent.children[int(nd.ids[0])]
            if (parent is not None and parent is not self.root and r in parent.stamps
                    and not any(r in c.stamps for c in parent.children.values())):
                self.leaves[(parent.serial, r)] = parent
                heapq.heappush(heap, (parent.stamps[r], r, parent.serial, parent))
