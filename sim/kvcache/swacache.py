"""SGLang's radix cache for a sliding-window hybrid: full and SWA KV on one tree (issue 54).

SGLang 0.5.23's default `UnifiedRadixCache` with components (FULL, SWA) (mem_cache/
unified_cache/components/swa.py and full.py, unified_tree_core.py), kept in blocks (page =
block). Proven equal op by op to the real code by tests/test_sglang_hybrid_diff.py through
benchmarks/sglang_swa_ref.py. docs/hybrid.md, "SGLang's hybrid cache in kvsim", says what it
keeps and why.

Every node holds full KV (a node without it leaves the tree) and may hold SWA KV; a node whose
SWA KV was freed while its full KV stays is a *tombstone*. Two pools: full and SWA pages
(`swa_full_tokens_ratio`). What SGLang does, and this class with it:

- **match**: walk the full KV; the hit ends at the deepest node whose last `window` tokens
  (the node and the nodes above it back to the last tombstone) all have SWA KV, or with no
  tombstone above it at all. A partial match splits the node. The SWA LRU refreshes only the
  nodes within `window + page` tokens of the hit (`reset_node_and_window_ancestors_mru`).
- **insert** (a request's checkpoint): a new leaf has SWA KV only from the request's SWA
  eviction cursor on (the request already freed its older SWA KV: `free_swa_out_of_window_
  slots`), split there, and is capped at `ceil(window / page)` pages so a lock pins one window
  of SWA; overlapping tombstones within the window take the request's fresh KV back.
- **lock**: full KV to the root, SWA KV only over the nodes covering the last `window` tokens
  (the boundary node is stamped, so the unlock walks the same segment).
- **evict**: full shortfall: leaves by last access time (both KVs go); SWA shortfall: the SWA
  LRU from its tail, deleting a node that is an evictable leaf and tombstoning any other
  (its full KV stays).

All work is per node (numpy id arrays), never per token. Sizes are in blocks; `window` is in
tokens, as SGLang's `sliding_window_size`.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np


class SwaNode:
    """A tree node: block ids, locks per component, SWA presence, SWA LRU links."""

    __slots__ = ("children", "full_lock", "ids", "next", "parent", "prev", "serial", "swa",
                 "swa_lock", "time", "uuid")

    def __init__(self, ids: np.ndarray, parent: SwaNode | None, time: float, serial: int) -> None:
        self.ids = ids
        self.parent = parent
        self.children: dict[int, SwaNode] = {}
        self.full_lock = 0
        self.swa_lock = 0
        self.swa = False
        self.uuid: int | None = None  # SWA lock segment boundary stamp
        self.time = time
        self.prev: SwaNode | None = None
        self.next: SwaNode | None = None
        self.serial = serial

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return (f"SwaNode({self.ids.tolist()}, swa={self.swa}, locks={self.full_lock}/"
                f"{self.swa_lock})")


@dataclass
class SwaRequest:
    """One request's KV row, in blocks: `ids` its full blocks, `owned` the pages it holds
    (allocated), `protected` the prefix the tree owns, `evicted` its SWA eviction cursor."""

    ids: np.ndarray
    node: SwaNode
    receipt: int | None
    hit: int
    branching: int | None
    protected: int = 0
    evicted: int = 0
    owned: int = 0

    def __post_init__(self) -> None:
        self.protected = self.hit
        self.owned = self.hit


@dataclass
class Freed:
    """Block ids freed by one op, per pool (a multiset: a block id may appear twice)."""

    full: list[np.ndarray] = field(default_factory=list)
    swa: list[np.ndarray] = field(default_factory=list)

    def ids(self) -> tuple[np.ndarray, np.ndarray]:
        return sorted_cat(self.full), sorted_cat(self.swa)


class SwaRadixCache:
    """SGLang 0.5.23's UnifiedRadixCache with FULL and SWA components (module docstring)."""

    def __init__(self, full_blocks: int, swa_blocks: int, window: int,
                 block_size: int = 64) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        self.full_capacity = int(full_blocks)
        self.swa_capacity = int(swa_blocks)
        self.window = int(window)
        self.bs = int(block_size)
        self.tail_blocks = math.ceil(window / block_size)  # the SWA lock cap of a leaf
        self._tick = 0.0
        self._serial = 0
        self._uuid = 0
        self.root = self._node(np.empty(0, np.int64), None)
        self.head = self._node(np.empty(0, np.int64), None)  # SWA LRU: head = MRU side
        self.tail = self._node(np.empty(0, np.int64), None)
        self.head.next, self.tail.prev = self.tail, self.head
        self.in_lru: set[SwaNode] = set()
        self.leaves: set[SwaNode] = set()  # evictable device leaves
        self.full_used = 0
        self.swa_used = 0
        self.full_evictable = 0
        self.full_protected = 0
        self.swa_evictable = 0
        self.swa_protected = 0
        # SWA KV freed from nodes that keep their full KV, and taken back by an insert
        self.tombstoned_blocks = 0
        self.recovered_blocks = 0

    # -- bookkeeping ---------------------------------------------------------------------------
    def tick(self) -> float:
        t = self._tick
        self._tick += 1.0
        return t

    def _node(self, ids: np.ndarray, parent: SwaNode | None) -> SwaNode:
        # SGLang's node constructor takes two clock values (last access, creation).
        t = self.tick()
        self.tick()
        self._serial += 1
        return SwaNode(ids, parent, t, self._serial)

    @property
    def full_free(self) -> int:
        return self.full_capacity - self.full_used

    @property
    def swa_free(self) -> int:
        return self.swa_capacity - self.swa_used

    def _is_leaf(self, node: SwaNode) -> bool:
        return (node is not self.root and node.full_lock == 0 and node.swa_lock == 0
                and not node.children)

    def _update_leaf(self, node: SwaNode) -> None:
        if self._is_leaf(node):
            self.leaves.add(node)
        else:
            self.leaves.discard(node)

    # SWA LRU (a doubly linked list between two sentinels)
    def _link_after(self, prev: SwaNode, node: SwaNode) -> None:
        nxt = prev.next
        node.prev, node.next = prev, nxt
        assert nxt is not None
        nxt.prev = node
        prev.next = node

    def _unlink(self, node: SwaNode) -> None:
        assert node.prev is not None and node.next is not None
        node.prev.next = node.next
        node.next.prev = node.prev
        node.prev = node.next = None

    def _lru_remove(self, node: SwaNode) -> None:
        self.in_lru.remove(node)
        self._unlink(node)

    def _prev_unlocked(self, node: SwaNode) -> SwaNode | None:
        x = node.prev
        assert x is not None
        while x.swa_lock > 0:
            x = x.prev
            assert x is not None
        return None if x is self.head else x

    def _set_swa(self, node: SwaNode) -> None:
        """A node's SWA KV materialized (set_component_device_value): MRU, ledger."""
        node.swa = True
        self.in_lru.add(node)
        self._link_after(self.head, node)
        if node.swa_lock > 0:
            self.swa_protected += len(node)
        else:
            self.swa_evictable += len(node)

    def _refresh_window(self, node: SwaNode) -> None:
        """reset_node_and_window_ancestors_mru over window + page tokens."""
        prev = self.head
        acc = 0
        limit = self.window + self.bs
        while node is not self.root and acc < limit:
            if node.swa:
                self._unlink(node)
                self._link_after(prev, node)
                prev = node
            acc += len(node) * self.bs
            assert node.parent is not None
            node = node.parent

    def _split(self, child: SwaNode, k: int) -> SwaNode:
        """Split `child` after its first k blocks; the new node is its parent."""
        parent = child.parent
        assert parent is not None and 0 < k < len(child)
        new = self._node(child.ids[:k], parent)
        new.children = {int(child.ids[k]): child}
        new.full_lock = child.full_lock
        new.swa_lock = child.swa_lock
        new.swa = child.swa
        new.uuid, child.uuid = child.uuid, None  # the segment boundary is the older edge
        child.parent = new
        child.ids = child.ids[k:]
        parent.children[int(new.ids[0])] = new
        if new.swa:
            self.in_lru.add(new)
            self._link_after(child, new)
        child.time = self.tick()
        self._update_leaf(new)
        self._update_leaf(child)
        return new

    # -- match ---------------------------------------------------------------------------------
    def match(self, ids: np.ndarray) -> tuple[int, SwaNode, int | None]:
        """match_prefix: (hit blocks, the node the hit ends at, swa_branching_seqlen in
        blocks: the full-KV match length where it reaches past the hit, else None)."""
        ids = np.asarray(ids, np.int64)
        n = len(ids)
        if n == 0:
            return 0, self.root, None
        node = self.root
        best, best_len = self.root, 0
        depth = 0
        run = math.inf  # SWA tokens since the last tombstone on the path
        while depth < n:
            child = node.children.get(int(ids[depth]))
            if child is None:
                break
            plen = _common(child.ids, ids[depth:])
            partial = plen < len(child)
            if partial:
                child = self._split(child, plen)
            node = child
            depth += plen
            if node.swa:
                run += plen * self.bs
                if run >= self.window:
                    best, best_len = node, depth
            else:
                run = 0
            if partial:
                break
        self._refresh_window(best)
        t = self.tick()
        cur: SwaNode | None = best
        while cur is not None:
            cur.time = t
            t -= 0.00001
            cur = cur.parent
        return best_len, best, (depth if depth > best_len else None)

    # -- locks ---------------------------------------------------------------------------------
    def lock(self, node: SwaNode) -> int | None:
        """inc_lock_ref: full KV to the root, SWA over the window; the receipt's uuid."""
        cur = node
        while cur is not self.root:
            if cur.full_lock == 0:
                self.full_evictable -= len(cur)
                self.full_protected += len(cur)
            cur.full_lock += 1
            self.leaves.discard(cur)
            assert cur.parent is not None
            cur = cur.parent
        cur, covered, uuid = node, 0, None
        while cur is not self.root and covered < self.window:
            if cur.swa_lock == 0 and cur.swa:
                self.swa_evictable -= len(cur)
                self.swa_protected += len(cur)
            cur.swa_lock += 1
            covered += len(cur) * self.bs
            if covered >= self.window:
                if cur.uuid is None:
                    self._uuid += 1
                    cur.uuid = self._uuid
                uuid = cur.uuid
            assert cur.parent is not None
            cur = cur.parent
        self._update_leaf(node)
        return uuid

    def unlock(self, node: SwaNode, uuid: int | None) -> None:
        """dec_lock_ref: SWA over the receipt's segment, then full to the root."""
        if node is not self.root:
            cur = node
            while cur is not self.root:
                ref = cur.swa_lock
                assert ref > 0, "SWA unlock below zero"
                if ref == 1 and cur.swa:
                    self.swa_evictable += len(cur)
                    self.swa_protected -= len(cur)
                cur.swa_lock = ref - 1
                if ref == 1:
                    self._update_leaf(cur)
                stop = uuid is not None and cur.uuid == uuid
                assert cur.parent is not None
                cur = cur.parent
                if stop:
                    break
        cur = node
        while cur is not self.root:
            assert cur.full_lock > 0, "full unlock below zero"
            if cur.full_lock == 1:
                self.full_evictable += len(cur)
                self.full_protected -= len(cur)
            cur.full_lock -= 1
            if cur.full_lock == 0:
                self._update_leaf(cur)
            assert cur.parent is not None
            cur = cur.parent
        self._update_leaf(node)

    # -- requests ------------------------------------------------------------------------------
    def admit(self, prompt: np.ndarray, ids: np.ndarray) -> SwaRequest:
        """Match `prompt` and lock (the scheduler's admission); `ids` are the full blocks the
        request will hold (its prompt's, then its output's)."""
        hit, node, branching = self.match(prompt)
        return SwaRequest(np.asarray(ids, np.int64), node, self.lock(node), hit, branching)

    def can_allocate(self, n: int) -> bool:
        """Whether evicting both shortfalls can give `n` pages in both pools."""
        return (n - self.full_free <= self.full_evictable
                and n - self.swa_free <= self.swa_evictable)

    def allocate(self, req: SwaRequest, n: int, freed: Freed) -> bool:
        """Evict both shortfalls (one evict_for_alloc) and give `req` `n` fresh pages in
        each pool; False (nothing allocated) where the pools cannot hold them."""
        if not self.can_allocate(n):
            return False
        self.evict(max(0, n - self.full_free), max(0, n - self.swa_free), freed)
        if n > self.full_free or n > self.swa_free:
            return False
        self.full_used += n
        self.swa_used += n
        req.owned = req.hit + n
        if req.owned > len(req.ids):  # pages past the full blocks (a partial block): id -1
            req.ids = np.concatenate([req.ids, np.full(req.owned - len(req.ids), -1, np.int64)])
        return True

    def _free_out_of_window(self, req: SwaRequest, pre_len: int, freed: Freed) -> None:
        """common.free_swa_out_of_window_slots: free the request's SWA KV older than its
        window (page-floored, keeping ceil(max(window, page)) tokens), above the tree-owned
        prefix."""
        bs = self.bs
        ev = req.evicted * bs
        if pre_len - self.window < ev + 1:
            return
        ev = max(ev, req.protected * bs)
        req.evicted = ev // bs
        threshold = pre_len - -(-max(self.window, bs) // bs) * bs
        new = max(ev, threshold) // bs
        if new > req.evicted:
            freed.swa.append(req.ids[req.evicted:new])
            self.swa_used -= new - req.evicted
            req.evicted = new

    def decode_to(self, req: SwaRequest, seq_tokens: int, freed: Freed) -> None:
        """The decode step's out-of-window free at a sequence of `seq_tokens` tokens."""
        self._free_out_of_window(req, seq_tokens - 1, freed)

    def checkpoint(self, req: SwaRequest, upto: int, finished: bool, freed: Freed) -> None:
        """checkpoint_into_tree(req, up_to=upto blocks): insert, move the lock."""
        eff = upto
        branching = None
        if req.branching is not None and req.branching > req.protected and req.branching <= upto:
            eff = branching = req.branching
        if not finished:
            self._free_out_of_window(req, eff * self.bs - 1, freed)
        if eff <= 0:
            return
        node, inserted_branch = self._insert(req, eff, branching, freed)
        self.unlock(req.node, req.receipt)
        req.receipt = self.lock(node)
        req.node = node
        req.protected = eff
        if inserted_branch:
            req.branching = None
            if not finished:
                self._free_out_of_window(req, upto * self.bs - 1, freed)

    def release(self, req: SwaRequest, freed: Freed) -> None:
        """release_kv_cache after the checkpoint: the row past the tree-owned prefix (SWA
        only where the request has not freed it), then unlock."""
        p = req.protected
        if req.owned > p:
            freed.full.append(req.ids[p:req.owned])
            self.full_used -= req.owned - p
            lo = max(req.evicted, p)
            if req.owned > lo:
                freed.swa.append(req.ids[lo:req.owned])
                self.swa_used -= req.owned - lo
        self.unlock(req.node, req.receipt)

    def drop(self, req: SwaRequest) -> None:
        """An admission that got no pages: unlock only."""
        self.unlock(req.node, req.receipt)

    # -- insert --------------------------------------------------------------------------------
    def _insert(self, req: SwaRequest, n: int, branching: int | None,
                freed: Freed) -> tuple[SwaNode, bool]:
        key = req.ids[:n]
        prev, ev = req.protected, req.evicted
        self.root.time = self.tick()
        node = self.root
        total = 0
        while total < n:
            child = node.children.get(int(key[total]))
            if child is None:
                break
            child.time = self.tick()
            plen = _common(child.ids, key[total:])
            if plen < len(child):
                child = self._split(child, plen)
            node = child
            consumed = plen
            if prev < total + plen and not node.swa:
                live = max(total, ev)
                if live < total + plen:
                    if live > total:
                        self._split(node, live - total)
                    # the tombstone's window takes the request's fresh KV back: one copy of
                    # the full KV is freed (old or incoming), the SWA KV is the request's
                    freed.full.append(node.ids)
                    self.full_used -= len(node)
                    self._set_swa(node)
                    self.recovered_blocks += len(node)
                    consumed = live - total
            dup_start = max(0, prev - total)
            if dup_start < consumed:
                dup = key[total + dup_start: total + consumed]
                freed.full.append(dup)
                self.full_used -= len(dup)
                done = min(max(ev - (total + dup_start), 0), len(dup))
                if done < len(dup):
                    freed.swa.append(dup[done:])
                    self.swa_used -= len(dup) - done
            total += plen
        target = node
        if total < n:
            leaf = self._node(key[total:].copy(), node)
            node.children[int(key[total])] = leaf
            self.full_evictable += len(leaf)
            self._update_leaf(leaf)
            self._update_leaf(node)
            target = leaf
            live = max(total, ev)
            if live < n:
                if live > total:
                    self._split(leaf, live - total)
                capped = None
                if leaf.swa_lock == 0 and len(leaf) > self.tail_blocks:
                    capped = self._split(leaf, len(leaf) - self.tail_blocks)
                if capped is not None:
                    self._set_swa(capped)
                self._set_swa(leaf)
        if target is not self.root:
            self._refresh_window(target)
        return target, branching is not None and n >= branching

    # -- evict ---------------------------------------------------------------------------------
    def _delete_leaf(self, leaf: SwaNode, freed: Freed) -> tuple[int, int]:
        n = len(leaf)
        freed.full.append(leaf.ids)
        self.full_used -= n
        self.full_evictable -= n
        swa = 0
        if leaf.swa:
            freed.swa.append(leaf.ids)
            self.swa_used -= n
            self.swa_evictable -= n
            self._lru_remove(leaf)
            leaf.swa = False
            swa = n
        self.leaves.discard(leaf)
        parent = leaf.parent
        assert parent is not None
        del parent.children[int(leaf.ids[0])]
        self._update_leaf(parent)
        return n, swa

    def evict(self, full_blocks: int, swa_blocks: int, freed: Freed) -> None:
        """evict_for_alloc(num_tokens, swa_num_tokens) in blocks: the full walk (leaves by
        last access) until the full pool has `full_blocks` more free, then the SWA walk (the
        SWA LRU from its tail) until the SWA pool has `swa_blocks` more free."""
        done_full = done_swa = 0
        swa_target = self.swa_free + swa_blocks  # both targets are taken before the walks
        if full_blocks > 0:
            target = self.full_free + full_blocks
            quota = max(full_blocks, self.full_evictable)
            heap = [(x.time, x.serial, x) for x in self.leaves]
            heapq.heapify(heap)
            last: SwaNode | None = None
            while True:
                if last is not None and last.parent in self.leaves:
                    p = last.parent
                    heapq.heappush(heap, (p.time, p.serial, p))
                last = None
                victim = None
                while done_full < quota and heap:
                    x = heapq.heappop(heap)[2]
                    if x in self.leaves:
                        victim = x
                        break
                if victim is None:
                    break
                last = victim
                f, s = self._delete_leaf(victim, freed)
                done_full += f
                done_swa += s
                if self.full_free >= target:
                    break
        if swa_blocks > 0:
            target = swa_target
            if self.swa_free >= target or done_swa >= swa_blocks:
                return
            cursor = self._prev_unlocked(self.tail)
            while True:
                if cursor is not None and cursor not in self.in_lru:
                    cursor = self._prev_unlocked(self.tail)
                if done_swa >= swa_blocks or cursor is None:
                    break
                x = cursor
                cursor = self._prev_unlocked(x)
                if x in self.leaves:
                    f, s = self._delete_leaf(x, freed)
                    done_full += f
                    done_swa += s
                else:  # a tombstone: the SWA KV goes, the full KV stays
                    freed.swa.append(x.ids)
                    self.swa_used -= len(x)
                    self.swa_evictable -= len(x)
                    self._lru_remove(x)
                    x.swa = False
                    done_swa += len(x)
                    self.tombstoned_blocks += len(x)
                    self._update_leaf(x)
                if self.swa_free >= target:
                    break

    # -- views ---------------------------------------------------------------------------------
    def resident(self) -> tuple[np.ndarray, np.ndarray]:
        """(full, SWA) block ids in the tree, sorted."""
        full, swa = [], []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            full.append(node.ids)
            if node.swa:
                swa.append(node.ids)
            stack.extend(node.children.values())
        return sorted_cat(full), sorted_cat(swa)


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two id arrays (vectorized)."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


def sorted_cat(parts: list[np.ndarray]) -> np.ndarray:
    """The sorted concatenation of id arrays (empty: an empty int64 array)."""
    return np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64)
