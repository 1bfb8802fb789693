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
key can reach again). Eviction plans (``planner.py``) are carried out here too, by the
appliers (``apply_delete``, ``apply_demote``, ``apply_device_evict``) through the KV moves.
The tree also walks ids (``walk``, with a ``paths.WalkHint``), splits a node and merges runs:
none of these changes a counter. Once the cache enables KV events (``enable_events``), every
GPU loss the appliers make is queued as it happens (``events.BlockRemoved``).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Final

import numpy as np

from .node import Node, Tier, prune_upward
from .paths import WalkHint
from .results import EvictResult

if TYPE_CHECKING:
    from .events import KVEventQueue
    from .planner import Step

_GPU: Final = Tier.GPU
_NONE: Final = Tier.NONE
_CPU: Final = Tier.CPU
_DROPPED: Final = Tier.DROPPED


class RadixTree:
    """Nodes over block ids with exact counters (see the module docstring)."""

    def __init__(self, capacity_blocks: int, cpu_capacity_blocks: int = 0,
                 on_split: Callable[[Node, Node], None] | None = None) -> None:
        self.on_split = on_split  # told (prefix, node) after each split: the policy's event
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
        self._events: KVEventQueue | None = None  # GPU losses, once the cache enables events

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

    def enable_events(self, queue: KVEventQueue) -> None:
        """Report every GPU loss the appliers make (deleted or demoted KV) to ``queue``."""
        self._events = queue

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

    # ------------------------------------------------------------------ walks, splits, merges
    # Nothing here changes a counter: ``walk`` reads, ``split`` cuts a node in two of the
    # same tier, lock and stamp, ``merge_runs`` only joins nodes of equal tier, lock, stamp
    # and host copy (so every counter and the leaf set stay as they are).
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
        chain: list[Node] = []
        root = self.root
        nd: Node | None = node
        epoch = hint.epoch
        if epoch == self.epoch:  # no key changed since the hint: no node is keyed later
            while nd is not root:
                if nd is None:  # in a subtree removed from the tree
                    return None
                chain.append(nd)
                nd = nd.parent
        else:
            while nd is not root:
                if nd is None or nd.keyed > epoch:
                    return None
                chain.append(nd)
                nd = nd.parent
        if stop_at_holes and any(x.tier is _NONE for x in chain):
            return None
        chain.reverse()
        return chain

    def walk(self, ids: np.ndarray, stop_at_holes: bool, hint: WalkHint | None = None
             ) -> tuple[list[Node], Node | None, int, int]:
        """Follow ``ids`` down without changing anything: (nodes matched whole, the node the
        match ends inside or None, blocks of it matched, total matched blocks). Keys are
        chained (raw trace ids: docs/traces.md; edited keys: ``versions``), so a node whose last
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
        self._serial += 1  # next_serial(), inlined
        prefix = Node(ids[:k], node.start, parent, node.tier, self._serial, node.last_access)
        prefix.lock = node.lock
        prefix.hit_count = node.hit_count
        prefix.host = node.host
        prefix.keyed = node.keyed
        parent.children[ids.item(0)] = prefix
        node.ids = ids = ids[k:]
        node.start += k
        node.parent = prefix
        prefix.children[ids.item(0)] = node
        if self.on_split is not None:
            self.on_split(prefix, node)
        return prefix

    def merge_runs(self, chain: list[Node]) -> None:
        """Merge runs of ``chain`` (root-ward to leaf-ward, each the parent of the next) whose
        upper nodes have one child and equal tier, lock, stamp and host copy, into the run's
        deepest node (it keeps its identity, so lock handles stay valid). Counters and the leaf
        set do not change (same tier and lock)."""
        # Most chains merge nothing (a chunked prefill's path holds one lock more per chunk
        # up from its leaf): find the deepest pair that merges with one compare per node.
        i = len(chain) - 1
        lower = chain[i]
        while i > 0:
            up = chain[i - 1]
            if (up.lock == lower.lock and up.last_access == lower.last_access
                    and up.tier is lower.tier and up.host == lower.host
                    and len(up.children) == 1):
                break
            lower = up
            i -= 1
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
                parts = [nd.ids for nd in run]
                parts.append(child.ids)
                child.ids = np.concatenate(parts)
                child.start = top.start
                child.parent = parent
                hits, keyed = child.hit_count, child.keyed
                for nd in run:
                    if nd.hit_count > hits:
                        hits = nd.hit_count
                    if nd.keyed > keyed:
                        keyed = nd.keyed
                    nd.parent = None
                    nd.children = {}
                child.hit_count = hits
                child.keyed = keyed
            i = j - 1

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
        if self._events is not None:
            self._events.removed(node.ids)
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
        if node.children:  # a hole that stays
            return None
        # Childless: it leaves with its KV-less childless unlocked ancestors (prune_upward's
        # rule, reads inlined: a freed leaf takes the chain of holes in front of it along,
        # often a long one, as each eviction from a history's front leaves a hole node); the
        # ancestor that stays is returned if it just became a victim leaf.
        root = self.root
        cur = node
        while cur is not root and not cur.children:
            tier = cur.tier
            if tier is _GPU or tier is _CPU:
                break
            if cur.lock:
                return None
            parent = cur.parent
            self._detach(cur)
            cur = parent  # type: ignore[assignment]
        if cur is root or cur.lock or cur.children or (cur.tier is not _GPU
                                                       and cur.tier is not _CPU):
            return None
        return cur

    def truncate_tail(self, leaf: Node, k: int, result: EvictResult) -> None:
        """Free the last k blocks of an unlocked leaf (no hole: nothing follows them)."""
        keep = len(leaf.ids) - k
        gone = leaf.ids[keep:]
        result.freed.append(gone)
        result.deleted_blocks += k
        leaf.ids = leaf.ids[:keep]
        leaf.last = leaf.ids.item(keep - 1)
        if leaf.tier is _GPU:
            self._gpu -= k
            self._evictable -= k
            result.freed_blocks += k
            if self._events is not None:
                self._events.removed(gone)
            if leaf.host:  # a backed-up tail loses its host copy too
                self._cpu -= k
        else:
            self._cpu -= k

    # ------------------------------------------------------------------ plan appliers
    # Carry out eviction plans (``planner.Step`` lists) through the KV moves above.
    def apply_delete(self, steps: list[Step], result: EvictResult) -> None:
        """Carry out a deletion plan (GPU-only caches; unified deletions across tiers; HiCache
        host eviction). Holes still in the tree afterwards are counted in ``holes_made``."""
        made: list[Node] = []
        for node, k, head in steps:
            if k == len(node.ids):
                if node.children:
                    made.append(node)
                self.delete(node, result)
            elif head:
                hole = self.split(node, k)
                made.append(hole)
                self.delete(hole, result)
            else:
                self.truncate_tail(node, k, result)
        for x in made:
            if x.parent is not None and x.tier is _NONE:
                result.holes_made += len(x.ids)

    def _whole(self, step: Step) -> Node:
        """The node carrying exactly the step's blocks (split off when partial)."""
        node, k = step.node, step.blocks
        size = len(node.ids)
        if k == size:
            return node
        if step.head:
            return self.split(node, k)  # the prefix moves
        self.split(node, size - k)  # node keeps its identity
        return node

    def apply_demote(self, steps: list[Step], result: EvictResult) -> None:
        """Carry out a unified demotion plan: each step's blocks move GPU -> CPU."""
        for step in steps:
            self.move_to_host(self._whole(step), result)

    def apply_device_evict(self, steps: list[Step], result: EvictResult,
                           backup=None) -> None:
        """Carry out a HiCache device-eviction plan: a backed-up node is demoted (its device
        copy dropped), any other is deleted. ``backup(node, result)``, when given, is called
        first (write_back copies at eviction time)."""
        for step in steps:
            node = self._whole(step)
            if backup is not None and not node.host:
                backup(node, result)
            if node.host:
                self.drop_device_copy(node, result)
            else:
                assert not node.children, f"a device node with host children: {node!r}"
                self.delete(node, result)

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
            if self._events is not None:
                self._events.removed(node.ids)
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
        return prune_upward(node, self.root, _kvless, _child_count, self._detach)


def _kvless(node: Node) -> bool:
    return not node.has_kv


def _child_count(node: Node) -> int:
    return len(node.children)
