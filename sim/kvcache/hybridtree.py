"""SGLang's radix cache for a hybrid model: full KV plus SWA KV or recurrent states on one
tree (issue 54 item 3).

SGLang 0.5.23's default `UnifiedRadixCache` with components (FULL, SWA) for a sliding-window
hybrid (gpt-oss, Gemma 3) or (FULL, MAMBA) for a linear-attention one (Qwen3-Next), kept in
blocks (page = block) (mem_cache/unified_cache/components/swa.py, mamba.py, full.py,
unified_tree_core.py). Proven equal op by op to the real code by
tests/test_sglang_hybrid_diff.py through benchmarks/sglang_unified_ref.py (HybridRef).
docs/hybrid.md, "SGLang's hybrid cache in kvsim", says what it keeps and why.

Every node holds full KV (a node without it leaves the tree). With SWA it may hold SWA KV; a
node whose SWA KV was freed while its full KV stays is a *tombstone*. With Mamba it may hold a
recurrent state (one pool slot): the state after the node's last token.

- **match**: walk the full KV; the hit ends at the deepest node every component can serve:
  SWA: the node and the nodes above it back to the last tombstone hold the last `window`
  tokens (or no tombstone is above it); Mamba: the node holds a state. A partial match splits
  the node. The SWA LRU refreshes the nodes within `window + page` tokens of the hit; the Mamba
  LRU the hit node's state. With Mamba the request takes its own state slot at a state hit
  (copy on write).
- **insert** (a request's checkpoint): SWA: a new leaf has SWA KV only from the request's SWA
  eviction cursor on (the request freed its older SWA KV: `free_swa_out_of_window_slots`),
  split there and capped at `ceil(window / page)` pages so a lock pins one window of SWA;
  overlapping tombstones within the window take the request's fresh KV back. Mamba: the insert
  end gets a state (a fresh slot the running state is copied into, or at finish the request's
  own slot).
- **lock**: full KV to the root; SWA KV over the nodes covering the last `window` tokens (the
  boundary node is stamped, so the unlock walks the same segment); Mamba: the node's state.
- **evict**: full shortfall: leaves by last access time (everything on them goes); SWA or
  Mamba shortfall: that component's LRU from its tail, deleting a node that is an evictable
  leaf and dropping only that component's data from any other.

All work is per node (numpy id arrays), never per token. Sizes are in blocks (states in
slots); `window` is in tokens, as SGLang's `sliding_window_size`.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .refill import refill_plan

# Where the full-KV eviction starts in the victim's history (policies/eviction.py, starts)
STARTS = ("tail", "leaf-head", "private-head")


class HybridNode:
    """A tree node: block ids, locks per component, SWA KV and state presence."""

    __slots__ = ("children", "full_lock", "hole", "ids", "mamba_lock", "parent", "serial",
                 "state", "swa", "swa_lock", "time", "uuid")

    def __init__(self, ids: np.ndarray, parent: HybridNode | None, time: float,
                 serial: int) -> None:
        self.ids = ids
        self.parent = parent
        self.children: dict[int, HybridNode] = {}
        self.full_lock = 0
        self.swa_lock = 0
        self.mamba_lock = 0
        self.swa = False
        self.state = False
        self.hole = False  # every group's KV freed (a hole: penelope's deletions)
        self.uuid: int | None = None  # SWA lock segment boundary stamp
        self.time = time
        self.serial = serial

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return (f"HybridNode({self.ids.tolist()}, swa={self.swa}, state={self.state}, "
                f"hole={self.hole}, "
                f"locks={self.full_lock}/{self.swa_lock}/{self.mamba_lock})")


class _Lru:
    """SGLang's UnifiedLRUList: a doubly linked list, the front most recent; the eviction walk
    goes from the back, skipping nodes whose component is locked."""

    def __init__(self) -> None:
        self.head = object()
        self.tail = object()
        self.next: dict[object, object] = {self.head: self.tail}
        self.prev: dict[object, object] = {self.tail: self.head}

    def __contains__(self, node: object) -> bool:
        return node in self.next and node is not self.head

    def insert_after(self, prev: object, node: object) -> None:
        nxt = self.next[prev]
        self.prev[node], self.next[node] = prev, nxt
        self.next[prev] = node
        self.prev[nxt] = node

    def remove(self, node: object) -> None:
        prev, nxt = self.prev.pop(node), self.next.pop(node)
        self.next[prev] = nxt
        self.prev[nxt] = prev

    def to_front(self, node: object) -> None:
        self.remove(node)
        self.insert_after(self.head, node)

    def prev_unlocked(self, node: object, locked: str) -> HybridNode | None:
        """The next more recent node whose `locked` count is 0 (None at the front)."""
        x = self.prev[node]
        while x is not self.head and getattr(x, locked) > 0:
            x = self.prev[x]
        return None if x is self.head else x  # type: ignore[return-value]


@dataclass
class HybridRequest:
    """One request's KV row, in blocks: `ids` its full blocks, `owned` the pages it holds
    (allocated), `protected` the prefix the tree owns, `evicted` its SWA eviction cursor,
    `state` whether it holds a state slot of its own."""

    ids: np.ndarray
    node: HybridNode
    receipt: int | None
    hit: int
    branching: int | None
    mamba_branching: int | None = None
    protected: int = 0
    evicted: int = 0
    owned: int = 0
    state: bool = False
    # holes on the hit path (penelope): the hole nodes the phantom refills (pages taken by
    # ``fill``) and the phantom's block ranges (refill.py's plan: holes and their run-up)
    fill: list[HybridNode] = field(default_factory=list)
    refill: tuple[tuple[int, int], ...] = ()
    pins: list[tuple[HybridNode, int | None]] = field(default_factory=list)  # and receipts

    def __post_init__(self) -> None:
        self.protected = self.hit
        self.owned = self.hit


@dataclass
class Freed:
    """Block ids freed by one op, per pool (a multiset: a block id may appear twice), and the
    number of state slots freed."""

    full: list[np.ndarray] = field(default_factory=list)
    swa: list[np.ndarray] = field(default_factory=list)
    states: int = 0

    def ids(self) -> tuple[np.ndarray, np.ndarray]:
        return sorted_cat(self.full), sorted_cat(self.swa)


class HybridRadixCache:
    """SGLang 0.5.23's UnifiedRadixCache with FULL and SWA or MAMBA components (module
    docstring). `window` (tokens) enables SWA with a pool of `swa_blocks`; `state_slots`
    enables Mamba with that many state slots and checkpoints on a `grid`-block grid; `policy`
    the engine's eviction policy (sim/engines/sglang_hybrid.py), `start` and `block` what it
    frees."""

    def __init__(self, full_blocks: int, swa_blocks: int = 0, window: int | None = None,
                 block_size: int = 64, state_slots: int | None = None,
                 grid: int = 1, start: str = "tail", block: bool = False,
                 policy: Any = None) -> None:
        if start not in STARTS:
            raise ValueError(f"start must be one of {', '.join(STARTS)}, got {start!r}")
        if window is not None and window <= 0:
            raise ValueError("window must be positive")
        if (window is None) == (state_slots is None):
            raise ValueError("a hybrid cache has SWA (window) or Mamba (state_slots), one")
        self.full_capacity = int(full_blocks)
        self.swa_capacity = int(swa_blocks)
        self.window = int(window or 0)
        self.has_swa = window is not None
        self.has_mamba = state_slots is not None
        self.state_capacity = int(state_slots or 0)
        self.grid = int(grid)
        self.bs = int(block_size)
        self.tail_blocks = math.ceil(self.window / block_size)  # the SWA lock cap of a leaf
        self._tick = 0.0
        self._serial = 0
        self._uuid = 0
        self.root = self._node(np.empty(0, np.int64), None)
        self.swa_lru = _Lru()
        self.mamba_lru = _Lru()
        self.leaves: set[HybridNode] = set()  # evictable device leaves
        self.full_used = 0
        self.swa_used = 0
        self.state_used = 0
        self.full_evictable = 0
        self.full_protected = 0
        self.swa_evictable = 0
        self.swa_protected = 0
        self.state_evictable = 0
        self.state_protected = 0
        # most full blocks running requests held at once (locked paths and own pages)
        self.working_peak_blocks = 0
        # SWA KV freed from nodes that keep their full KV, and taken back by an insert;
        # states dropped from nodes that keep their full KV
        self.tombstoned_blocks = 0
        self.recovered_blocks = 0
        self.dropped_states = 0
        # The full-KV eviction (policy): SGLang's is tail + node; ``block`` frees exactly the
        # shortfall (a leaf is split), ``private-head`` / ``leaf-head`` free the front of the
        # victim's history first and leave holes (docs/hybrid.md, Penelope on the hybrid tree)
        self.start = start
        self.block = block
        self.policy = policy  # the eviction policy whose start and granularity these are
        self.deleted_blocks = 0  # full blocks an eviction freed (leaves deleted, holes made)
        self.hole_blocks = 0  # of them, left as holes
        self._events: Any = None  # a KVEventQueue once a consumer enables events
        self._survivor: HybridNode | None = None  # the node a deletion's pruning ended at
        self.last_fill: list[HybridNode] = []
        self.last_pins: list[HybridNode] = []  # the last match's holes before its hit
        self.last_refill: tuple[tuple[int, int], ...] = ()  # and its phantom ranges

    @classmethod
    def for_capacity(cls, name: str, groups: Sequence[Any], capacity: Any,
                     block_size: int = 64, **kw: Any) -> HybridRadixCache:
        """The cache of model `name` with KV cache `groups` (costmodel.specs.KVGroup: kind,
        window) in SGLang's pools `capacity` (costmodel.gpus.kv_capacity(..., "sglang"):
        full_tokens, swa_tokens, mamba_slots). ValueError naming the model where SGLang's
        UnifiedRadixCache has no (FULL, SWA) or (FULL, MAMBA) tree for it."""
        kinds = {str(g.kind) for g in groups}
        windows = {g.window for g in groups if str(g.kind) == "sliding"}
        full = capacity.full_tokens // block_size
        if kinds == {"full", "sliding"} and len(windows) == 1:
            return cls(full, capacity.swa_tokens // block_size, windows.pop(), block_size,
                       **kw)
        if kinds == {"full", "linear"}:
            return cls(full, block_size=block_size, state_slots=capacity.mamba_slots, **kw)
        raise ValueError(f"{name}: groups {sorted(kinds)} have no SGLang hybrid tree here "
                         "(full + one sliding window, or full + linear)")

    # -- bookkeeping ---------------------------------------------------------------------------
    def tick(self) -> float:
        t = self._tick
        self._tick += 1.0
        return t

    def _node(self, ids: np.ndarray, parent: HybridNode | None) -> HybridNode:
        # SGLang's node constructor takes two clock values (last access, creation).
        t = self.tick()
        self.tick()
        self._serial += 1
        return HybridNode(ids, parent, t, self._serial)

    def _working(self) -> None:
        """Sample the full blocks running requests hold: the used ones the tree may not evict
        (``RadixTree.working_peak_blocks``, the context summary's ``kv_working_peak_tokens``)."""
        self.working_peak_blocks = max(self.working_peak_blocks,
                                       self.full_used - self.full_evictable)

    @property
    def full_free(self) -> int:
        return self.full_capacity - self.full_used

    @property
    def swa_free(self) -> int:
        return self.swa_capacity - self.swa_used

    @property
    def state_free(self) -> int:
        return self.state_capacity - self.state_used

    def _is_leaf(self, node: HybridNode) -> bool:
        return (node is not self.root and node.full_lock == 0 and node.swa_lock == 0
                and node.mamba_lock == 0 and not node.children and not node.hole)

    # -- what the engine reads (sim/engines/sglang_hybrid.py) ---------------------------------
    @property
    def capacity_blocks(self) -> int:
        return self.full_capacity

    @property
    def free_blocks(self) -> int:
        return self.full_capacity - self.full_used

    @property
    def evictable_blocks(self) -> int:
        return self.full_evictable

    def gpu_prefix_blocks(self, ids: np.ndarray) -> int:
        """The hit a match of ``ids`` would give now, read only (no split, no touch): the
        deepest node end every component can serve, before any hole."""
        ids = np.asarray(ids, np.int64)
        node, depth, best, run = self.root, 0, 0, math.inf
        while depth < len(ids):
            child = node.children.get(int(ids[depth]))
            if child is None or child.hole:
                break
            plen = _common(child.ids, ids[depth:])
            depth += plen
            ok = True
            if self.has_swa:
                if child.swa:
                    run += plen * self.bs
                    ok = run >= self.window
                else:
                    run, ok = 0.0, False
            if self.has_mamba and (not child.state or plen < len(child)):
                ok = False
            if ok:
                best = depth
            if plen < len(child):
                break
            node = child
        return best

    def enable_events(self, clock: Any = None, kinds: Any = None) -> None:
        """Report KV events of the full KV from now on (``BlockPool.enable_events``): a node
        whose full KV became resident is stored, one whose full KV left is removed."""
        from .events import EVENT_KINDS, KVEventQueue

        if self._events is None:
            self._events = KVEventQueue(clock, kinds)
        else:
            self._events.want(EVENT_KINDS if kinds is None else kinds)

    def take_events(self) -> list:
        return self._events.take() if self._events is not None else []

    def _stored(self, node: HybridNode) -> None:
        if self._events is not None:
            p = node.parent
            self._events.stored(node.ids, -1 if p is None or p is self.root
                                else int(p.ids[-1]))

    def _removed(self, node: HybridNode) -> None:
        if self._events is not None:
            self._events.removed(node.ids)

    def _update_leaf(self, node: HybridNode) -> None:
        if self._is_leaf(node):
            self.leaves.add(node)
        else:
            self.leaves.discard(node)

    def _set_swa(self, node: HybridNode) -> None:
        """A node's SWA KV materialized (set_component_device_value): MRU, ledger."""
        node.swa = True
        self.swa_lru.insert_after(self.swa_lru.head, node)
        if node.swa_lock > 0:
            self.swa_protected += len(node)
        else:
            self.swa_evictable += len(node)

    def _set_state(self, node: HybridNode) -> None:
        node.state = True
        self.mamba_lru.insert_after(self.mamba_lru.head, node)
        if node.mamba_lock > 0:
            self.state_protected += 1
        else:
            self.state_evictable += 1

    def _refresh_window(self, node: HybridNode) -> None:
        """reset_node_and_window_ancestors_mru over window + page tokens."""
        lru = self.swa_lru
        prev: object = lru.head
        acc = 0
        limit = self.window + self.bs
        while node is not self.root and acc < limit:
            if node.swa:
                lru.remove(node)
                lru.insert_after(prev, node)
                prev = node
            acc += len(node) * self.bs
            assert node.parent is not None
            node = node.parent

    def _split(self, child: HybridNode, k: int) -> HybridNode:
        """Split `child` after its first k blocks; the new node is its parent (a state stays
        on the child: it is the state after the child's last token)."""
        parent = child.parent
        assert parent is not None and 0 < k < len(child)
        new = self._node(child.ids[:k], parent)
        new.children = {int(child.ids[k]): child}
        new.full_lock = child.full_lock
        new.swa_lock = child.swa_lock
        new.swa = child.swa
        new.hole = child.hole
        new.uuid, child.uuid = child.uuid, None  # the segment boundary is the older edge
        child.parent = new
        child.ids = child.ids[k:]
        parent.children[int(new.ids[0])] = new
        if new.swa:
            self.swa_lru.insert_after(child, new)
        child.time = self.tick()
        self._update_leaf(new)
        self._update_leaf(child)
        return new

    # -- match ---------------------------------------------------------------------------------
    def match(self, ids: np.ndarray) -> tuple[int, HybridNode, int | None, int | None]:
        """match_prefix: (hit blocks, the node the hit ends at, swa_branching_seqlen and
        mamba_branching_seqlen in blocks: the full-KV match length, page- or grid-floored,
        where it reaches past the hit, else None)."""
        ids = np.asarray(ids, np.int64)
        n = len(ids)
        self.last_fill, self.last_refill, self.last_pins = [], (), []
        if n == 0:
            return 0, self.root, None, None
        node = self.root
        best, best_len = self.root, 0
        depth = 0
        run = math.inf  # SWA tokens since the last tombstone on the path
        path: list[HybridNode] = []  # the matched nodes, kept for a path with holes
        holes = False
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
            path.append(node)
            holes = holes or node.hole
            ok = True
            if self.has_swa:
                if node.swa:
                    run += plen * self.bs
                    ok = run >= self.window
                else:
                    run = 0.0
                    ok = False
            if self.has_mamba and not node.state:
                ok = False
            if ok:
                best, best_len = node, depth
            if partial:
                break
        if holes:  # only penelope makes holes: the hit is refill.py's (a restart point)
            best, best_len = self._hole_hit(path, depth)
        if self.has_swa:
            self._refresh_window(best)
        if self.has_mamba and best.state:
            self.mamba_lru.to_front(best)
        t = self.tick()
        cur: HybridNode | None = best
        while cur is not None:
            cur.time = t
            t -= 0.00001
            cur = cur.parent
        swa_branch = depth if self.has_swa and depth > best_len else None
        grid = depth // self.grid * self.grid
        mamba_branch = grid if self.has_mamba and grid > best_len else None
        return best_len, best, swa_branch, mamba_branch

    def _hole_hit(self, path: list[HybridNode], depth: int) -> tuple[HybridNode, int]:
        """The hit of a matched path with holes (``refill.refill_plan`` in blocks: the holes,
        the live SWA KV, the states at node ends): the node it ends at (split there) and its
        length. The phantom's ranges and the holes it refills are left in ``last_refill``
        and ``last_fill``."""
        holes: list[tuple[int, int]] = []
        live: list[tuple[int, int]] = []
        states: list[int] = []
        ends: list[int] = []
        pos = 0
        for x in path:
            end = pos + len(x)
            if x.hole:
                holes.append((pos, end))
            if x.swa:
                if live and live[-1][1] == pos:
                    live[-1] = (live[-1][0], end)
                else:
                    live.append((pos, end))
            if x.state:
                states.append(end)
            ends.append(end)
            pos = end
        windows = [(-(-self.window // self.bs), live)] if self.has_swa else []
        plan = refill_plan(depth, holes, windows, states if self.has_mamba else None)
        h = plan.hit
        self.last_refill = plan.ranges
        # the refill passes start at restart points: the admission pins them (their window,
        # their state) until the request is done, so no eviction takes them first
        self.last_pins = [self._node_ending(path, ends, a) for a, _ in plan.ranges if a > 0]
        if h == 0:
            return self.root, 0
        node = self._node_ending(path, ends, h)
        i = bisect.bisect_left(ends, h)
        self.last_fill = [x for x in path[:i + 1] if x.hole]
        return node, h

    def _node_ending(self, path: list[HybridNode], ends: list[int], x: int) -> HybridNode:
        """The node of ``path`` (``ends``: where each ends) that ends at ``x``, split there
        when ``x`` falls inside one (both lists kept in step)."""
        i = bisect.bisect_left(ends, x)
        node = path[i]
        if ends[i] > x:
            node = self._split(node, len(node) - (ends[i] - x))
            path.insert(i, node)
            ends.insert(i, x)
        return node

    # -- locks ---------------------------------------------------------------------------------
    def lock(self, node: HybridNode) -> int | None:
        """inc_lock_ref: full KV to the root, SWA over the window, the node's state; the
        receipt's SWA boundary uuid."""
        cur = node
        while cur is not self.root:
            if cur.full_lock == 0 and not cur.hole:
                self.full_evictable -= len(cur)
                self.full_protected += len(cur)
            cur.full_lock += 1
            self.leaves.discard(cur)
            assert cur.parent is not None
            cur = cur.parent
        self._working()
        uuid = None
        if self.has_swa:
            cur, covered = node, 0
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
        if self.has_mamba and node is not self.root:
            if node.mamba_lock == 0 and node.state:
                self.state_evictable -= 1
                self.state_protected += 1
            node.mamba_lock += 1
        self._update_leaf(node)
        return uuid

    def unlock(self, node: HybridNode, uuid: int | None) -> None:
        """dec_lock_ref: the components in reverse (Mamba, SWA over the receipt's segment),
        then full to the root."""
        if self.has_mamba and node is not self.root:
            assert node.mamba_lock > 0, "Mamba unlock below zero"
            if node.mamba_lock == 1 and node.state:
                self.state_evictable += 1
                self.state_protected -= 1
            node.mamba_lock -= 1
            if node.mamba_lock == 0:
                self._update_leaf(node)
        if self.has_swa and node is not self.root:
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
            if cur.full_lock == 1 and not cur.hole:
                self.full_evictable += len(cur)
                self.full_protected -= len(cur)
            cur.full_lock -= 1
            if cur.full_lock == 0:
                self._update_leaf(cur)
            assert cur.parent is not None
            cur = cur.parent
        if node.hole and not node.children and node.full_lock == 0:
            self._prune(node)
        else:
            self._update_leaf(node)

    # -- requests ------------------------------------------------------------------------------
    def _take_state(self, pin: HybridNode | None, freed: Freed, strict: bool = True) -> bool:
        """A state slot, evicting one state first when none is free (pinning `pin`); False
        (not `strict`) when none can be freed."""
        if self.state_free <= 0:
            receipt = self.lock(pin) if pin is not None else None
            self.evict(0, 0, freed, states=1)
            if pin is not None:
                self.unlock(pin, receipt)
            if self.state_free <= 0:
                if not strict:
                    return False
                raise RuntimeError("no Mamba state slot to allocate")
        self.state_used += 1
        return True

    def _unpin(self, req: HybridRequest) -> None:
        for x, receipt in req.pins:
            self.unlock(x, receipt)
        req.pins = []

    def admit(self, prompt: np.ndarray, ids: np.ndarray, freed: Freed | None = None
              ) -> HybridRequest:
        """Match `prompt` and lock (the scheduler's admission); `ids` are the full blocks the
        request will hold (its prompt's, then its output's). A state hit gives the request its
        own state slot (copy on write)."""
        hit, node, branching, mamba_branching = self.match(prompt)
        req = HybridRequest(np.asarray(ids, np.int64), node, None, hit, branching,
                            mamba_branching, fill=self.last_fill, refill=self.last_refill)
        req.pins = [(x, self.lock(x)) for x in self.last_pins]
        if self.has_mamba and node.state:
            self._take_state(node, freed if freed is not None else Freed())
            req.state = True
        req.receipt = self.lock(node)
        return req

    def fill_blocks(self, req: HybridRequest) -> int:
        """Pages the holes before ``req``'s hit still need (the phantom's fresh full KV)."""
        return sum(len(x) for x in req.fill if x.hole)

    def fill(self, req: HybridRequest, freed: Freed) -> bool:
        """Take full pages for the holes before ``req``'s hit (its lock holds them) and
        give the holes their KV back: the phantom recomputes them in the request's first
        chunks (``req.refill``). Their SWA KV is not kept (tombstones: the request frees
        what lies out of its window as it runs) nor their states. False when the full pool
        cannot hold them."""
        n = self.fill_blocks(req)
        if n:
            if n - self.full_free > self.full_evictable:
                return False
            if n > self.full_free:
                self.evict(n - self.full_free, 0, freed)
            if n > self.full_free:
                return False
            self.full_used += n
            for x in req.fill:
                if x.hole:
                    self._fill_hole(x)
        req.fill = []
        return True

    def _fill_hole(self, node: HybridNode) -> None:
        """A hole's full KV is resident again (pages already counted in ``full_used``)."""
        node.hole = False
        if node.full_lock > 0:
            self.full_protected += len(node)
        else:
            self.full_evictable += len(node)
        self._stored(node)
        self._update_leaf(node)

    def _make_hole(self, node: HybridNode, freed: Freed) -> None:
        """Free every group's KV of an unlocked node that keeps its children: a hole."""
        n = len(node)
        freed.full.append(node.ids)
        self.full_used -= n
        self.full_evictable -= n
        if node.swa:
            freed.swa.append(node.ids)
            self.swa_used -= n
            self.swa_evictable -= n
            self.swa_lru.remove(node)
            node.swa = False
        if node.state:
            freed.states += 1
            self.state_used -= 1
            self.state_evictable -= 1
            self.mamba_lru.remove(node)
            node.state = False
        node.hole = True
        self.deleted_blocks += n
        self.hole_blocks += n
        self._removed(node)
        self._update_leaf(node)

    def _prune(self, node: HybridNode) -> HybridNode:
        """Holes left without children (nothing after them to refill for) leave the tree."""
        while (node is not self.root and node.hole and not node.children
               and node.full_lock == 0):
            parent = node.parent
            assert parent is not None
            del parent.children[int(node.ids[0])]
            node = parent
        self._update_leaf(node)
        return node

    def can_allocate(self, req: HybridRequest, n: int) -> bool:
        """Whether evicting the shortfalls can give `n` pages in each pool (and a state)."""
        ok = n - self.full_free <= self.full_evictable
        if self.has_swa:
            ok = ok and n - self.swa_free <= self.swa_evictable
        if self.has_mamba and not req.state:
            ok = ok and 1 - self.state_free <= self.state_evictable
        return ok

    def allocate(self, req: HybridRequest, n: int, freed: Freed) -> bool:
        """The request's state slot (if it has none), then `n` fresh pages in each pool, the
        shortfalls evicted first; False where the pools cannot hold them."""
        if not self.can_allocate(req, n):
            return False
        if self.has_mamba and not req.state:
            if self.state_free < 1:
                self.evict(0, 0, freed, states=1 - self.state_free)
            if self.state_free < 1:
                return False
            self.state_used += 1
            req.state = True
        full_short = max(0, n - self.full_free)
        swa_short = max(0, n - self.swa_free) if self.has_swa else 0
        if full_short or swa_short:
            self.evict(full_short, swa_short, freed)
        if n > self.full_free or (self.has_swa and n > self.swa_free):
            return False
        self.full_used += n
        if self.has_swa:
            self.swa_used += n
        self._working()
        req.owned += n  # (a request may allocate several times: chunks, decode runs)
        if req.owned > len(req.ids):  # pages past the full blocks (a partial block): id -1
            pad = np.empty(req.owned - len(req.ids), np.int64)  # (np.full is Python-level)
            pad.fill(-1)
            req.ids = np.concatenate((req.ids, pad))
        return True

    def _free_out_of_window(self, req: HybridRequest, pre_len: int, freed: Freed) -> None:
        """common.free_swa_out_of_window_slots: free the request's SWA KV older than its
        window (page-floored, keeping ceil(max(window, page)) tokens), above the tree-owned
        prefix."""
        if not self.has_swa:
            return
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

    def decode_to(self, req: HybridRequest, seq_tokens: int, freed: Freed) -> None:
        """The decode step's out-of-window free at a sequence of `seq_tokens` tokens."""
        self._free_out_of_window(req, seq_tokens - 1, freed)

    def checkpoint(self, req: HybridRequest, upto: int, finished: bool, freed: Freed) -> None:
        """checkpoint_into_tree(req, up_to=upto blocks): insert, move the lock."""
        eff = upto
        branching = None
        if (not self.has_mamba and req.branching is not None
                and req.protected < req.branching <= upto):
            eff = branching = req.branching
        if not finished:
            self._free_out_of_window(req, eff * self.bs - 1, freed)
        self._unpin(req)  # the phantom's passes ran before any checkpoint past the hit
        if eff <= 0:
            return
        took = True
        if self.has_mamba and not finished:
            # the checkpoint's own slot, the state copied in (none where every slot is
            # pinned: only holes' restart points pin more than SGLang does)
            took = self._take_state(None, freed, strict=False)
        node, inserted_branch, state_new = self._insert(req, eff, branching, freed, took)
        if self.has_mamba:
            if finished:  # the request's slot becomes the node's state, or is freed
                if not state_new:
                    self.state_used -= 1
                    freed.states += 1
                req.state = False
            elif took and not state_new:
                self.state_used -= 1
                freed.states += 1
        self.unlock(req.node, req.receipt)
        req.receipt = self.lock(node)
        req.node = node
        req.protected = eff
        if inserted_branch:
            req.branching = None
            if not finished:
                self._free_out_of_window(req, upto * self.bs - 1, freed)

    def release(self, req: HybridRequest, freed: Freed) -> None:
        """release_kv_cache after the checkpoint: the row past the tree-owned prefix (SWA
        only where the request has not freed it), its state slot, then unlock."""
        p = req.protected
        if req.owned > p:
            freed.full.append(req.ids[p:req.owned])
            self.full_used -= req.owned - p
            lo = max(req.evicted, p)
            if self.has_swa and req.owned > lo:
                freed.swa.append(req.ids[lo:req.owned])
                self.swa_used -= req.owned - lo
        self.drop(req, freed)

    def drop(self, req: HybridRequest, freed: Freed) -> None:
        """Unlock (an admission that got no pages ends here); a state slot still held goes."""
        self._unpin(req)
        if req.state:
            self.state_used -= 1
            freed.states += 1
            req.state = False
        self.unlock(req.node, req.receipt)

    # -- insert --------------------------------------------------------------------------------
    def _owned_path(self, req: HybridRequest, n: int) -> tuple[HybridNode, int]:
        """Where an insert of ``n`` blocks of ``req`` leaves the prefix the tree already owns
        for it (``req.node``, ``req.protected`` blocks down, locked by the request), with every
        node of root..there stamped in walk order, as SGLang's walk from the root does: that
        walk only stamps them (no split, hole or duplicate can lie inside a locked prefix), so
        their keys need no comparing. The root, unstamped, where the path does not cover
        exactly that prefix or the insert ends inside it."""
        chain: list[HybridNode] = []
        blocks = 0
        if 0 < req.protected <= n:
            nd: HybridNode | None = req.node
            while nd is not None and nd is not self.root:
                chain.append(nd)
                blocks += len(nd.ids)
                nd = nd.parent
            if nd is None or blocks != req.protected:
                chain, blocks = [], 0
        self.root.time = self.tick()
        for nd in reversed(chain):
            nd.time = self.tick()
        return (chain[0] if chain else self.root), blocks

    def _insert(self, req: HybridRequest, n: int, branching: int | None,
                freed: Freed, state: bool = True) -> tuple[HybridNode, bool, bool]:
        key = req.ids[:n]
        prev, ev = req.protected, req.evicted
        node, total = self._owned_path(req, n)
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
            if node.hole:  # past the request's own prefix: its fresh KV fills the hole
                assert prev <= total, "a hole inside a request's own prefix"
                self._fill_hole(node)  # (its pages become the node's full KV)
                if self.has_swa:  # its SWA KV where the request still holds it
                    live = max(total, ev)
                    if live == total:
                        self._set_swa(node)
                    elif live < total + plen:
                        freed.swa.append(key[live:total + plen])
                        self.swa_used -= total + plen - live
                consumed = 0
            elif self.has_swa and prev < total + plen and not node.swa:
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
                if self.has_swa:
                    done = min(max(ev - (total + dup_start), 0), len(dup))
                    if done < len(dup):
                        freed.swa.append(dup[done:])
                        self.swa_used -= len(dup) - done
            total += plen
        target = node
        new_leaf = total < n
        if new_leaf:
            leaf = self._node(key[total:].copy(), node)
            node.children[int(key[total])] = leaf
            self.full_evictable += len(leaf)
            self._stored(leaf)
            self._update_leaf(leaf)
            self._update_leaf(node)
            target = leaf
            live = max(total, ev)
            if self.has_swa and live < n:
                if live > total:
                    self._split(leaf, live - total)
                capped = None
                if leaf.swa_lock == 0 and len(leaf) > self.tail_blocks:
                    capped = self._split(leaf, len(leaf) - self.tail_blocks)
                if capped is not None:
                    self._set_swa(capped)
                self._set_swa(leaf)
        state_new = False
        if self.has_mamba and (state or target.state):
            if new_leaf or not target.state:
                self._set_state(target)
                state_new = True
                if not new_leaf:
                    target.time = self.tick()
            else:
                self.mamba_lru.to_front(target)
                target.time = self.tick()
        if self.has_swa and target is not self.root:
            self._refresh_window(target)
        return target, branching is not None and n >= branching, state_new

    # -- evict ---------------------------------------------------------------------------------
    def _delete_leaf(self, leaf: HybridNode, freed: Freed) -> tuple[int, int, int]:
        n = len(leaf)
        freed.full.append(leaf.ids)
        self.full_used -= n
        self.full_evictable -= n
        swa = states = 0
        if leaf.swa:
            freed.swa.append(leaf.ids)
            self.swa_used -= n
            self.swa_evictable -= n
            self.swa_lru.remove(leaf)
            leaf.swa = False
            swa = n
        if leaf.state:
            freed.states += 1
            self.state_used -= 1
            self.state_evictable -= 1
            self.mamba_lru.remove(leaf)
            leaf.state = False
            states = 1
        self.leaves.discard(leaf)
        self.deleted_blocks += n
        self._removed(leaf)
        parent = leaf.parent
        assert parent is not None
        del parent.children[int(leaf.ids[0])]
        self._survivor = self._prune(parent)
        return n, swa, states

    def evict(self, full_blocks: int, swa_blocks: int, freed: Freed, states: int = 0) -> None:
        """evict_for_alloc(num_tokens, swa_num_tokens, mamba_num) in blocks and slots: the
        full walk (leaves by last access) until the full pool has `full_blocks` more free,
        then the SWA walk and the Mamba walk (each its LRU from the tail) until their pools
        have `swa_blocks` and `states` more free."""
        done = [0, 0, 0]  # full blocks, SWA blocks, states evicted
        swa_target = self.swa_free + swa_blocks  # the targets are taken before the walks
        state_target = self.state_free + states
        if full_blocks > 0 and (self.start != "tail" or self.block):
            self._evict_policy(self.full_free + full_blocks, done, freed)
        elif full_blocks > 0:
            target = self.full_free + full_blocks
            quota = max(full_blocks, self.full_evictable)
            heap = [(x.time, x.serial, x) for x in self.leaves]
            heapq.heapify(heap)
            last: HybridNode | None = None
            while True:
                if last is not None and last.parent in self.leaves:
                    p = last.parent
                    heapq.heappush(heap, (p.time, p.serial, p))
                last = None
                victim = None
                while done[0] < quota and heap:
                    x = heapq.heappop(heap)[2]
                    if x in self.leaves:
                        victim = x
                        break
                if victim is None:
                    break
                last = victim
                for i, k in enumerate(self._delete_leaf(victim, freed)):
                    done[i] += k
                if self.full_free >= target:
                    break
        if swa_blocks > 0 and self.has_swa:
            self._walk(self.swa_lru, "swa_lock", 1, swa_blocks, swa_target, done, freed)
        if states > 0 and self.has_mamba:
            self._walk(self.mamba_lru, "mamba_lock", 2, states, state_target, done, freed)

    def _evict_policy(self, target: int, done: list[int], freed: Freed) -> None:
        """The full walk of another policy than SGLang's (lru victims, ``start``,
        ``block``): the least recently used leaf's history is freed from its start until
        the full pool has ``target`` blocks free."""
        heap = [(x.time, x.serial, x) for x in self.leaves]
        heapq.heapify(heap)
        while self.full_free < target and heap:
            x = heapq.heappop(heap)[2]
            if x not in self.leaves:
                continue
            self._take_survivor()
            self._free_history(x, target - self.full_free, done, freed)
            p = self._take_survivor()
            if x in self.leaves:  # a hole before it, or a split: still the oldest leaf
                heapq.heappush(heap, (x.time, x.serial, x))
            elif p is not None and p in self.leaves:
                heapq.heappush(heap, (p.time, p.serial, p))

    def _take_survivor(self) -> HybridNode | None:
        """The node the last deletion's pruning ended at, forgotten once read (a method, so
        that no caller's type narrowing outlives the deletions that set it)."""
        p, self._survivor = self._survivor, None
        return p

    def _free_history(self, leaf: HybridNode, need: int, done: list[int],
                      freed: Freed) -> None:
        """Free ``need`` blocks (whole nodes without ``block``) of the history ending at
        ``leaf``: from its end (tail), or from the start of the leaf (leaf-head) or of the
        private history (private-head: up to a root, shared, locked or hole parent) moved
        to its first restart point (``_restart_offset``), leaving holes."""
        if self.start == "tail":
            if self.block and need < len(leaf):
                self._split(leaf, len(leaf) - need)  # the leaf keeps its last `need` blocks
            for i, k in enumerate(self._delete_leaf(leaf, freed)):
                done[i] += k
            return
        s = leaf
        if self.start == "private-head":
            while True:
                p = s.parent
                assert p is not None
                if p is self.root or len(p.children) > 1 or p.full_lock > 0 or p.hole:
                    break
                s = p
        chain = [leaf]
        while chain[-1] is not s:
            up = chain[-1].parent
            assert up is not None
            chain.append(up)
        chain.reverse()
        skip = self._restart_offset(chain)
        left = need
        for node in chain:
            if left <= 0:
                break
            if skip >= len(node):
                skip -= len(node)
                continue
            if skip > 0:
                self._split(node, skip)  # the kept part before the restart point
                skip = 0
            if self.block and left < len(node):
                self._make_hole(self._split(node, left), freed)
                done[0] += left
                break
            if node is leaf:
                for i, k in enumerate(self._delete_leaf(node, freed)):
                    done[i] += k
                break
            self._make_hole(node, freed)
            done[0] += len(node)
            left -= len(node)

    def _restart_offset(self, chain: list[HybridNode]) -> int:
        """Blocks from the start of ``chain`` (a history's private part) to its first restart
        point before its end: where every group can resume a pass (SWA: the window before
        it live; Mamba: a state there). A hole that starts there is refilled without a
        run-up (refill.py). 0 when there is none (the refill pays its run-up)."""
        total = sum(len(x) for x in chain)
        parent = chain[0].parent
        assert parent is not None
        if self.has_mamba:
            if parent is self.root or parent.state:
                return 0
            pos = 0
            for x in chain:
                pos += len(x)
                if x.state and pos < total:
                    return pos
            return 0
        wb = -(-self.window // self.bs)
        run: float = 0.0
        cur = parent
        while cur is not self.root and cur.swa:
            run += len(cur)
            assert cur.parent is not None
            cur = cur.parent
        if cur is self.root or run >= wb:
            return 0
        pos = 0
        for x in chain:
            if x.swa:
                q = pos + max(1, wb - int(run))
                if q <= pos + len(x) and q < total:
                    return q
                run += len(x)
            else:
                run = 0.0
            pos += len(x)
        return 0

    def _free_of(self, which: int) -> int:
        return self.swa_free if which == 1 else self.state_free

    def _walk(self, lru: _Lru, locked: str, which: int, request: int, target: int,
              done: list[int], freed: Freed) -> None:
        """A component's eviction walk (SWA: which=1, Mamba: 2) from its LRU's tail: an
        evictable leaf is deleted, any other node loses this component's data only."""
        if self._free_of(which) >= target or done[which] >= request:
            return
        cursor = lru.prev_unlocked(lru.tail, locked)
        while True:
            if cursor is not None and cursor not in lru:
                cursor = lru.prev_unlocked(lru.tail, locked)
            if done[which] >= request or cursor is None:
                break
            x = cursor
            cursor = lru.prev_unlocked(x, locked)
            if x in self.leaves:
                for i, k in enumerate(self._delete_leaf(x, freed)):
                    done[i] += k
            elif which == 1:  # a tombstone: the SWA KV goes, the full KV stays
                freed.swa.append(x.ids)
                self.swa_used -= len(x)
                self.swa_evictable -= len(x)
                lru.remove(x)
                x.swa = False
                done[1] += len(x)
                self.tombstoned_blocks += len(x)
            else:  # the state goes, the KV stays
                freed.states += 1
                self.state_used -= 1
                self.state_evictable -= 1
                lru.remove(x)
                x.state = False
                done[2] += 1
                self.dropped_states += 1
            if self._free_of(which) >= target:
                break

    # -- views ---------------------------------------------------------------------------------
    def check(self) -> None:
        """Recount every counter, LRU list and the leaf set from the nodes (AssertionError
        on a difference): the invariants the differential test relies on."""
        full = [0, 0]  # evictable, protected
        swa = [0, 0]
        states = [0, 0]
        tree = [0, 0, 0]  # full blocks, SWA blocks, states
        with_swa, with_state, leaves = set(), set(), set()
        stack = list(self.root.children.items())
        while stack:
            key, node = stack.pop()
            parent = node.parent
            assert parent is not None and parent.children.get(key) is node and len(node) > 0
            assert int(node.ids[0]) == key
            assert min(node.full_lock, node.swa_lock, node.mamba_lock) >= 0
            assert parent is self.root or parent.full_lock >= node.full_lock
            n = len(node)
            if node.hole:  # no KV in any group; kept for what follows it (or a lock)
                assert not node.swa and not node.state, "a hole holds KV"
                assert node.children or node.full_lock > 0, "a hole at the end"
            else:
                full[node.full_lock > 0] += n
                tree[0] += n
            if node.swa:
                swa[node.swa_lock > 0] += n
                tree[1] += n
                with_swa.add(node)
            if node.state:
                states[node.mamba_lock > 0] += 1
                tree[2] += 1
                with_state.add(node)
            if self._is_leaf(node):
                leaves.add(node)
            stack.extend(node.children.items())
        assert full == [self.full_evictable, self.full_protected], "full sizes"
        assert swa == [self.swa_evictable, self.swa_protected], "SWA sizes"
        assert states == [self.state_evictable, self.state_protected], "state sizes"
        assert leaves == self.leaves, "evictable leaves"
        for lru, members in ((self.swa_lru, with_swa), (self.mamba_lru, with_state)):
            assert set(lru.next) - {lru.head} == members, "LRU membership"
        assert tree[0] <= self.full_used <= self.full_capacity, "full pool"
        assert tree[1] <= self.swa_used <= self.swa_capacity, "SWA pool"
        assert tree[2] <= self.state_used <= self.state_capacity, "state pool"

    def idle(self) -> bool:
        """No request holds anything: no lock anywhere, the pools hold the tree alone."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.full_lock or node.swa_lock or node.mamba_lock:
                return False
            stack.extend(node.children.values())
        full, swa, states = self.resident()
        return (self.full_used == len(full) and self.swa_used == len(swa)
                and self.state_used == len(states))

    def resident(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(full, SWA) block ids in the tree and the last block ids of the nodes holding a
        state, each sorted."""
        full, swa, states = [], [], []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if not node.hole:
                full.append(node.ids)
            if node.swa:
                swa.append(node.ids)
            if node.state:
                states.append(node.ids[-1:])
            stack.extend(node.children.values())
        return sorted_cat(full), sorted_cat(swa), sorted_cat(states)


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two id arrays (vectorized)."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    x, y = a[:m], b[:m]
    # the common case, the whole node matches, as one byte compare (equal int64 arrays are
    # equal bytes): no ufunc reduction and its Python wrapper per node of a walk
    if x.tobytes() == y.tobytes():
        return m
    eq = x == y  # (equal values of two dtypes: unequal bytes, the whole prefix)
    i = int(eq.argmin())
    return m if eq[i] else i


def sorted_cat(parts: list[np.ndarray]) -> np.ndarray:
    """The sorted concatenation of id arrays (empty: an empty int64 array)."""
    return np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64)
