"""The radix tree's state: nodes, counters, the leaf set, and every operation that changes them.

This module is the only code that changes a counter or moves KV between states. The cache
(``cache.py``) decides what to do for a request, the tiering (``tiering.py``) what to do for a
tier, the planner (``planner.py``) what to free; all of them act through the methods here.

Counters, in blocks::

    capacity_blocks = gpu_blocks + reserved_blocks + free_blocks
    gpu_blocks      = evictable_blocks (GPU KV in unlocked nodes)
                    + protected_blocks (GPU KV in locked nodes)
    cpu_blocks      = blocks with a CPU copy (unified: CPU nodes; hicache: host copies)
    hole_blocks     = blocks of NONE nodes (ids known, KV freed)
    dropped_blocks  = blocks of DROPPED nodes (dropped on purpose: no KV, never refilled)

The leaf set holds the *evictable leaves*: attached, not the root, holding KV (GPU or CPU),
unlocked, childless. A childless, unlocked node without KV (NONE or DROPPED) does not exist: it
leaves the tree at once, with its KV-less ancestors that become childless (``delete``). A
DROPPED node holds no KV, so it is never a victim: eviction policies see it as a hole.

KV moves (``Node.host``: a HiCache host copy beside the device copy)::

    fill              NONE -> GPU    a hole recomputed by the phantom request
    move_to_host      GPU  -> CPU    unified demotion (a d2h copy)
    move_to_device    CPU  -> GPU    unified load / insert over a CPU node
    copy_to_host      GPU  -> GPU+host   HiCache backup (a d2h copy)
    drop_device_copy  GPU+host -> CPU    HiCache demotion (no copy)
    copy_to_device    CPU  -> GPU+host   HiCache load
    delete / truncate_tail  -> NONE (or out of the tree)
    drop              any  -> DROPPED    cache engineering (the caller re-keys it: versions.py)

Context edits (``sim.kvcache.edits`` plans them) use ``rekey`` (new keys, same or shifted
positions: a drop's keys, a repositioned or spliced run) and ``remove_subtree`` (branches no
key can reach again). Eviction plans are carried out by the appliers (``appliers.py``).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

import numpy as np

from .appliers import Appliers
from .node import Node, Tier
from .paths import Paths
from .results import EvictResult

_GPU, _NONE, _CPU, _DROPPED = Tier.GPU, Tier.NONE, Tier.CPU, Tier.DROPPED


class RadixTree(Paths, Appliers):
    """Nodes over block ids with exact counters (see the module docstring)."""

    def __init__(self, capacity_blocks: int, cpu_capacity_blocks: int = 0) -> None:
        self.capacity_blocks = int(capacity_blocks)
        self.cpu_capacity_blocks = int(cpu_capacity_blocks)
        self._serial = 0
        self._clock = 0
        self.root = Node(np.empty(0, dtype=np.int64), 0, None, Tier.GPU, self.next_serial())
        self._gpu = 0
        self._evictable = 0
        self._protected = 0
        self._reserved = 0
        self._holes = 0
        self._dropped = 0
        self._cpu = 0
        self._working_peak = 0  # most GPU blocks held by running requests (locked + reserved)
        self.epoch = 0  # counts key changes (rekey); nodes remember theirs (walk hints)
        self._d2h = 0  # d2h copies not yet reported by take_d2h
        self._leaves: set[Node] = set()

    # ------------------------------------------------------------------ reading
    @property
    def gpu_blocks(self) -> int:
        return self._gpu

    @property
    def reserved_blocks(self) -> int:
        return self._reserved

    @property
    def free_blocks(self) -> int:
        return self.capacity_blocks - self._gpu - self._reserved

    @property
    def evictable_blocks(self) -> int:
        return self._evictable

    @property
    def protected_blocks(self) -> int:
        return self._protected

    @property
    def cpu_blocks(self) -> int:
        return self._cpu

    @property
    def cpu_free_blocks(self) -> int:
        return self.cpu_capacity_blocks - self._cpu

    @property
    def hole_blocks(self) -> int:
        return self._holes

    @property
    def dropped_blocks(self) -> int:
        return self._dropped

    @property
    def working_peak_blocks(self) -> int:
        """High-water mark of ``protected + reserved`` blocks, sampled at every ``reserve``:
        the KV running requests hold (their locked paths and their own new tokens)."""
        return self._working_peak

    @property
    def clock(self) -> int:
        return self._clock

    def leaves(self) -> AbstractSet[Node]:
        """The evictable leaves: the live set, read only (iterate it before changing the
        tree, as the planner does)."""
        return self._leaves

    def take_d2h(self) -> int:
        """Blocks copied d2h since the last call, then reset."""
        n, self._d2h = self._d2h, 0
        return n

    def next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def tick(self) -> int:
        """Advance the logical clock; returns the new tick."""
        self._clock += 1
        return self._clock

    # ------------------------------------------------------------------ structure
    def add_leaf(self, parent: Node, ids: np.ndarray, start: int, tick: int) -> Node:
        """A new GPU leaf under ``parent`` holding ``ids`` (the caller made room)."""
        self._serial += 1  # next_serial(), inlined: every prefill chunk adds a leaf
        leaf = Node(ids, start, parent, _GPU, self._serial, tick)
        parent.children[ids.item(0)] = leaf
        size = len(ids)
        self._gpu += size
        self._evictable += size
        self._leaves.discard(parent)
        self._leaves.add(leaf)
        return leaf

    # ------------------------------------------------------------------ locks and reservations
    def lock(self, node: Node) -> None:
        """``node`` and its ancestors gain one lock (their GPU KV: evictable -> protected)."""
        root = self.root
        while node is not root:
            if node.lock == 0:
                if node.tier is _GPU:
                    size = len(node.ids)
                    self._evictable -= size
                    self._protected += size
                self._leaves.discard(node)
            node.lock += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        """Undo one ``lock(node)``; a NONE node left childless and unlocked is removed."""
        root = self.root
        while node is not root:
            if node.lock <= 0:
                raise ValueError(f"unlock of an unlocked node {node!r}")
            parent = node.parent
            node.lock -= 1
            if node.lock == 0:
                if node.tier is _GPU:
                    size = len(node.ids)
                    self._evictable += size
                    self._protected -= size
                    if not node.children:
                        self._leaves.add(node)
                elif node.tier is _NONE or node.tier is _DROPPED:
                    if not node.children:
                        self._detach(node)
                elif not node.children:  # CPU
                    self._leaves.add(node)
            node = parent  # type: ignore[assignment]

    def reserve(self, n: int) -> None:
        self._reserved += n
        working = self._protected + self._reserved
        if working > self._working_peak:
            self._working_peak = working

    def release(self, n: int) -> None:
        self._reserved -= n

    # ------------------------------------------------------------------ KV moves
    def _gain_gpu(self, node: Node) -> None:
        size = len(node.ids)
        self._gpu += size
        if node.lock:
            self._protected += size
        else:
            self._evictable += size

    def fill(self, node: Node) -> None:
        """NONE -> GPU (a hole recomputed)."""
        node.tier = _GPU
        self._holes -= len(node.ids)
        self._gain_gpu(node)
        if not node.lock and not node.children:
            self._leaves.add(node)

    def move_to_device(self, node: Node) -> None:
        """CPU -> GPU, the CPU copy released (unified)."""
        node.tier = _GPU
        self._cpu -= len(node.ids)
        self._gain_gpu(node)

    def copy_to_device(self, node: Node) -> None:
        """CPU (host only) -> GPU, the host copy kept (HiCache)."""
        node.tier = _GPU
        self._gain_gpu(node)

    def _lose_gpu(self, node: Node, result: EvictResult) -> None:
        size = len(node.ids)
        self._gpu -= size
        self._evictable -= size
        result.demoted.append(node.ids)
        result.demoted_blocks += size
        result.freed_blocks += size

    def move_to_host(self, node: Node, result: EvictResult) -> None:
        """GPU -> CPU for a whole unlocked node (unified demotion: one d2h copy)."""
        node.tier = _CPU
        size = len(node.ids)
        self._cpu += size
        self._d2h += size
        self._lose_gpu(node, result)

    def drop_device_copy(self, node: Node, result: EvictResult) -> None:
        """GPU -> host only, for a whole unlocked node backed up already (HiCache)."""
        assert node.host, f"demoting a node without a host copy: {node!r}"
        node.tier = _CPU
        self._lose_gpu(node, result)

    def copy_to_host(self, node: Node) -> None:
        """Back a device node up to the host (HiCache): the caller made host room."""
        node.host = True
        size = len(node.ids)
        self._cpu += size
        self._d2h += size

    def delete(self, node: Node, result: EvictResult) -> Node | None:
        """Free a whole unlocked node's KV (either tier, and a host copy): it becomes a hole
        if it has children, else it leaves the tree with its childless unlocked hole
        ancestors. Returns the surviving ancestor when it just became an evictable leaf."""
        self._free_kv(node, result)
        self._holes += len(node.ids)
        node.tier = _NONE
        if node.children:
            return None
        survivor = self._prune(node)
        return survivor if survivor in self._leaves else None

    def truncate_tail(self, leaf: Node, k: int, result: EvictResult) -> None:
        """Free the last k blocks of an unlocked leaf (no hole: nothing follows them)."""
        keep = len(leaf.ids) - k
        result.freed.append(leaf.ids[keep:])
        result.deleted_blocks += k
        leaf.ids = leaf.ids[:keep]
        leaf.last = leaf.ids.item(keep - 1)
        if leaf.tier is _GPU:
            self._gpu -= k
            self._evictable -= k
            result.freed_blocks += k
            if leaf.host:  # a backed-up tail loses its host copy too
                self._cpu -= k
        else:
            self._cpu -= k

    # ------------------------------------------------------------------ context edits
    def add_dropped(self, parent: Node, ids: np.ndarray, start: int, tick: int) -> Node:
        """A new DROPPED node under ``parent`` (an insert of dropped keys: no KV; the caller
        attaches a child at once, since a childless unlocked KV-less node must not exist)."""
        node = Node(ids, start, parent, _DROPPED, self.next_serial(), tick)
        parent.children[ids.item(0)] = node
        self._dropped += len(ids)
        self._leaves.discard(parent)
        return node

    def _free_kv(self, node: Node, result: EvictResult) -> None:
        """Release an unlocked node's KV (either tier, and a HiCache host copy beside a device
        copy) and its count (any tier); the caller sets the tier."""
        size = len(node.ids)
        tier = node.tier
        if tier is _GPU:
            self._gpu -= size
            self._evictable -= size
            result.freed_blocks += size
            result.deleted_blocks += size
            result.freed.append(node.ids)
            if node.host:
                self._cpu -= size
        elif tier is _CPU:
            self._cpu -= size
            result.deleted_blocks += size
            result.freed.append(node.ids)
        elif tier is _NONE:
            self._holes -= size
        else:
            self._dropped -= size
        node.host = False
        self._leaves.discard(node)

    def drop(self, node: Node, ids: np.ndarray, result: EvictResult) -> None:
        """Any unlocked node -> DROPPED under its dropped keys ``ids`` (KV freed, never
        refilled). A childless one leaves the tree at once, with KV-less ancestors."""
        assert node.lock == 0 and node.tier is not _DROPPED, f"cannot drop {node!r}"
        self._free_kv(node, result)
        self.rekey(node, ids, node.start)
        node.tier = _DROPPED
        self._dropped += len(ids)
        self._settle(node)

    def rekey(self, node: Node, ids: np.ndarray, start: int, parent: Node | None = None
              ) -> None:
        """Give ``node`` new keys (as many as it has) at block ``start``, under ``parent``
        (default: where it is). Counters do not change; the caller keeps ``start ==
        parent.end`` and makes sure no sibling already holds the first new key."""
        assert len(ids) == len(node.ids), f"rekey of {node!r} with {len(ids)} keys"
        self.epoch += 1
        node.keyed = self.epoch
        old = node.parent
        if old is not None and old.children.get(node.ids.item(0)) is node:
            del old.children[node.ids.item(0)]
        dest = old if parent is None else parent
        assert dest is not None and ids.item(0) not in dest.children, f"key taken: {node!r}"
        node.ids = ids
        node.last = ids.item(-1)
        node.start = start
        node.parent = dest
        dest.children[ids.item(0)] = node
        self._leaves.discard(dest)
        if old is not None and old is not dest:
            self._settle(old)

    def remove_subtree(self, node: Node, result: EvictResult) -> None:
        """Free every node of an unlocked subtree (branches no key can reach again) and
        detach it; KV-less ancestors left childless go too."""
        assert node.lock == 0, f"removing a locked subtree at {node!r}"
        stack = [node]
        while stack:
            nd = stack.pop()
            stack.extend(nd.children.values())
            self._free_kv(nd, result)
        parent = node.parent
        assert parent is not None
        del parent.children[node.ids.item(0)]
        node.parent = None
        self._settle(parent)

    def _settle(self, node: Node) -> None:
        """``node`` may have lost its last child: unlocked, it becomes an evictable leaf if it
        holds KV, else it leaves the tree (with its KV-less ancestors)."""
        if node is self.root or node.children or node.lock:
            return
        if node.has_kv:
            self._leaves.add(node)
        else:
            self._prune(node)

    def _detach(self, node: Node) -> None:
        """Remove a childless KV-less (NONE or DROPPED) node from its parent."""
        parent = node.parent
        tier = node.tier
        assert parent is not None and not node.children and (tier is _NONE or tier is _DROPPED)
        del parent.children[node.ids.item(0)]
        node.parent = None
        if tier is _NONE:
            self._holes -= len(node.ids)
        else:
            self._dropped -= len(node.ids)
        if not parent.children and parent.lock == 0 and (
                parent.tier is _GPU or parent.tier is _CPU) and parent is not self.root:
            self._leaves.add(parent)

    def _prune(self, node: Node) -> Node:
        """Remove ``node`` and its KV-less ancestors while childless and unlocked; return the
        first ancestor that stays."""
        root = self.root
        while node is not root and not node.children and (
                node.tier is _NONE or node.tier is _DROPPED):  # childless, no KV
            if node.lock:
                return node
            parent = node.parent
            self._detach(node)
            node = parent  # type: ignore[assignment]
        return node
