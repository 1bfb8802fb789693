"""The radix KV cache over block ids: what a request does to it (match, insert, lock, room).

The cache owns three parts and keeps them apart::

    RadixKVCache   request operations and their SGLang semantics (this module)
     |-- RadixTree     nodes, counters, KV moves, the appliers (tree.py)
     |-- Tiering       GpuOnly | Unified | HiCache: freeing and loading per tier (tiering.py)
     `-- policy        an EvictionPolicy: decides what to free (policies/, via planner.py)

Capacity (blocks): ``gpu_blocks + reserved_blocks <= capacity_blocks`` at all times, except
between an ``insert`` and the caller's matching ``release`` (the caller reserved the blocks it
then hands to the tree; see ``insert``). ``reserved_blocks`` are owned by running requests,
outside the tree (new tokens being computed, hole refills, decode tokens).

Matching follows SGLang's RadixCache (docs/engine.md, SGLang engine): walk down while the ids
agree; if the match ends inside a node, split it there; stamp the path with one tick of a
logical clock (never wall time). Two node semantics, chosen by the policy
(``EvictionPolicy.block_exact``)::

    node semantics (sglang, any node granularity, leaf-head)   block exact (vllm, penelope)
    - the node a match ends in is stamped WHOLE, then split     - only matched blocks stamped
      (its unmatched suffix becomes recent: SGLang exactly)     - a new leaf shares the tick
    - a new leaf gets a newer tick                              - insert merges path runs of
    - nodes are never merged                                      only children with equal
                                                                  tier, lock and stamp

Under node semantics the split history decides what a whole-node eviction frees, so it is kept
exactly as SGLang keeps it. Block-exact policies free block by block from the tail or the
private head, so boundaries carry no meaning there; merging keeps their paths short.

``debug=True`` recounts every counter by DFS after every public operation (``invariants``)
and checks every chain a start strategy returns.

KV events (``enable_events``/``take_events``, ``events``; off by default): an insert reports
the blocks it made GPU-resident (new, refilled, promoted) and the chain it wrote; a load the
runs it brought to the GPU; the tree's appliers every GPU loss (deleted or demoted); each
evict, make_room, load and ``background_evictions`` the blocks whose last copy its result
reports gone. Read-only queries for a consumer: ``gpu_prefix_blocks``,
``resident_prefix_blocks``, ``tier_runs``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import numpy as np

from policies import EvictionPolicy, get_policy

from .edits import EditResult, edit_path
from .errors import CapacityError
from .events import EVENT_KINDS, KVEvent, KVEventQueue, concat
from .invariants import recount
from .node import Node, Tier
from .paths import WalkHint
from .results import EvictResult, InsertResult, LoadResult, Match
from .tiering import GpuOnly, HiCache, Unified
from .tree import RadixTree
from .versions import add_versioned

_GPU: Final = Tier.GPU
_NONE: Final = Tier.NONE
_CPU: Final = Tier.CPU
_DROPPED: Final = Tier.DROPPED
TIERINGS: Final = ("unified", "hicache")
_new: Final = tuple.__new__

_INT64: Final = np.dtype(np.int64)


def as_block_ids(ids: np.ndarray | list[int]) -> np.ndarray:
    """A 1-D int64 array (no copy when it already is one)."""
    if type(ids) is np.ndarray and ids.ndim == 1:
        dtype = ids.dtype  # numpy's own int64 descriptor, as a rule: no comparison call
        if dtype is _INT64 or dtype == _INT64:
            return ids  # what np.asarray would return: the array itself
    arr = np.asarray(ids, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"block ids must be 1-D, got shape {arr.shape}")
    return arr


def _segments(path: list[Node]) -> tuple[int, tuple[tuple[int, int, Tier], ...]]:
    """(hit blocks, merged tier runs) along a matched path."""
    segments: list[tuple[int, int, Tier]] = []
    hit = 0
    gpu_run = True
    for nd in path:
        tier = nd.tier
        end = nd.start + len(nd.ids)
        if gpu_run:
            if tier is _GPU:
                hit = end
            else:
                gpu_run = False
        if segments and segments[-1][2] is tier:
            segments[-1] = (segments[-1][0], end, tier)
        else:
            segments.append((nd.start, end, tier))
    return hit, tuple(segments)


class RadixKVCache:
    """Radix tree of block-id runs with GPU KV, holes (NONE), an optional CPU tier and locks.

    ``policy`` (an ``EvictionPolicy`` or anything ``get_policy`` accepts) decides eviction;
    ``cpu_capacity_blocks > 0`` adds a CPU tier managed as ``tiering`` = ``unified``
    (Penelope) or ``hicache`` (SGLang HiCache; ``write_policy``, ``load_threshold_tokens``).
    ``versioned=True``: prompts may hold dropped keys (``versions``): inserts make DROPPED
    nodes for them.
    """

    def __init__(
        self,
        capacity_blocks: int,
        policy: EvictionPolicy | str = "sglang",
        *,
        cpu_capacity_blocks: int = 0,
        tiering: str = "unified",
        swap_buffer_blocks: int = 16,
        write_policy: str = "write_through",
        load_threshold_tokens: int = 10,
        block_size: int = 64,
        debug: bool = False,
        versioned: bool = False,
    ) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        if cpu_capacity_blocks < 0 or swap_buffer_blocks < 0 or block_size <= 0:
            raise ValueError(f"bad tier sizes: cpu {cpu_capacity_blocks}, swap buffer "
                             f"{swap_buffer_blocks}, block size {block_size}")
        if tiering not in TIERINGS:
            raise ValueError(f"tiering must be one of {TIERINGS}, got {tiering!r}")
        self.policy = get_policy(policy)
        self.block_size = int(block_size)
        self.debug = debug
        self.tree = RadixTree(capacity_blocks, cpu_capacity_blocks,
                              self.policy.on_split if "split" in self.policy.events else None)
        self.root = self.tree.root
        if cpu_capacity_blocks == 0:
            self.tiering: GpuOnly = GpuOnly(self.tree, self.policy, debug)
        elif tiering == "unified":
            self.tiering = Unified(self.tree, self.policy, int(swap_buffer_blocks), debug)
        else:
            self.tiering = HiCache(self.tree, self.policy, self.block_size, write_policy,
                                   int(load_threshold_tokens), debug)
        self._makes_holes = self.policy.makes_holes
        self._block_exact = self.policy.block_exact
        self._has_cpu = self.tiering.has_cpu
        # The tiering's insert hook, None when it does nothing (no CPU tier, unified).
        self._insert_hook = (None if type(self.tiering).on_insert is GpuOnly.on_insert
                             else self.tiering.on_insert)
        self._hit_hook = (None if type(self.tiering).on_hit is GpuOnly.on_hit
                          else self.tiering.on_hit)
        self.versioned = versioned
        if versioned and self.tiering.host_copies:
            raise ValueError("context edits (dropped or moved KV) are not modelled with "
                             "HiCache host copies")
        self._events: KVEventQueue | None = None  # off until a consumer enables them

    # ------------------------------------------------------------------ KV events
    def enable_events(self, clock: Callable[[], Any] | None = None,
                      kinds: Iterable[type] | None = None) -> None:
        """Report KV events from now on (``sim.kvcache.events``), each stamped by ``clock()``
        when it happens: blocks stored on and removed from the GPU where the appliers change
        them, the chain each insert writes, and the blocks each operation drops entirely
        (evictions, loads, HiCache's background deletions when ``background_evictions``
        reports them); only ``kinds`` of them (default: all). A second call adds its kinds
        and keeps the first clock. A cache whose keys context edits change reports none."""
        if self.versioned:
            raise ValueError("a versioned cache (context edits) reports no KV events: an "
                             "edit re-keys cached KV")
        if self._events is None:
            self._events = KVEventQueue(clock, kinds)
            self.tree.enable_events(self._events)
        else:
            self._events.want(EVENT_KINDS if kinds is None else kinds)

    def take_events(self) -> list[tuple[Any, KVEvent]]:
        """The ``(stamp, event)`` pairs since the last call, oldest first (none while events
        are off)."""
        return self._events.take() if self._events is not None else []

    def evictable_leaves(self) -> list[Node]:
        """Current eviction candidates, in ascending serial order (deterministic)."""
        return sorted(self.tree.leaves(), key=lambda n: n.serial)

    # ------------------------------------------------------------------ counters (blocks)
    @property
    def capacity_blocks(self) -> int:
        return self.tree.capacity_blocks

    @property
    def cpu_capacity_blocks(self) -> int:
        return self.tree.cpu_capacity_blocks

    @property
    def gpu_blocks(self) -> int:
        """GPU blocks owned by the tree."""
        return self.tree.gpu_blocks

    @property
    def reserved_blocks(self) -> int:
        """GPU blocks owned by running requests outside the tree."""
        return self.tree.reserved_blocks

    @property
    def free_blocks(self) -> int:
        return self.tree.free_blocks

    @property
    def evictable_blocks(self) -> int:
        """GPU blocks in unlocked nodes (all of them can be freed by repeated eviction)."""
        return self.tree.evictable_blocks

    @property
    def protected_blocks(self) -> int:
        """GPU blocks in locked nodes."""
        return self.tree.protected_blocks

    @property
    def cpu_blocks(self) -> int:
        """Blocks resident on CPU: unified = blocks of CPU-only nodes; hicache = host copies
        (host-only nodes and backed-up device nodes)."""
        return self.tree.cpu_blocks

    @property
    def cpu_free_blocks(self) -> int:
        return self.tree.cpu_free_blocks

    @property
    def hole_blocks(self) -> int:
        """Blocks in NONE nodes (ids known, KV freed)."""
        return self.tree.hole_blocks

    @property
    def dropped_blocks(self) -> int:
        """Blocks in DROPPED nodes (context edits: KV dropped on purpose, never refilled)."""
        return self.tree.dropped_blocks

    @property
    def working_peak_blocks(self) -> int:
        """Most GPU blocks running requests held at once (locked paths + reservations)."""
        return self.tree.working_peak_blocks

    @property
    def clock(self) -> int:
        """The logical clock: the tick of the latest stamping operation."""
        return self.tree.clock

    # ------------------------------------------------------------------ inspection
    def cpu_resident_block_ids(self) -> np.ndarray:
        """Block ids with a CPU copy (unified: CPU nodes; hicache: host copies), sorted."""
        runs = [nd.ids for nd in self.iter_nodes() if nd.tier is _CPU or nd.host]
        return np.sort(np.concatenate(runs)) if runs else np.empty(0, dtype=np.int64)

    def resident_block_ids(self) -> np.ndarray:
        """All GPU-resident block ids in the tree, sorted."""
        runs = [nd.ids for nd in self.iter_nodes() if nd.tier is _GPU]
        return np.sort(np.concatenate(runs)) if runs else np.empty(0, dtype=np.int64)

    def gpu_prefix_blocks(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` resident on the GPU now (read only: no stamp, no split):
        the hit an arriving request would see before any eviction."""
        return self._prefix_blocks(as_block_ids(ids), gpu_only=True)

    def resident_prefix_blocks(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` held on the GPU or the CPU tier now (read only): where a
        lookup in a pool below the cache starts."""
        return self._prefix_blocks(as_block_ids(ids), gpu_only=False)

    def _prefix_blocks(self, ids: np.ndarray, gpu_only: bool) -> int:
        path, partial, _k, pos = self.tree.walk(ids, stop_at_holes=True)
        hit = 0
        for nd in path:
            if gpu_only and nd.tier is not _GPU:
                return hit
            hit = nd.start + len(nd.ids)
        if partial is not None and (not gpu_only or partial.tier is _GPU):
            hit = pos
        return hit

    def tier_runs(self, ids: np.ndarray) -> list[tuple[int, int, Tier]]:
        """Where the blocks of ``ids`` are now, read only (no stamp, no split): runs
        ``(start, end, tier)`` of the tree's path for ``ids``, through holes (tier NONE), in
        prefix order; blocks past the last run are not in the tree."""
        path, partial, k, _pos = self.tree.walk(as_block_ids(ids), stop_at_holes=False)
        runs = [(nd.start, nd.start + len(nd.ids), nd.tier) for nd in path]
        if partial is not None:
            runs.append((partial.start, partial.start + k, partial.tier))
        return runs

    def iter_nodes(self) -> Iterator[Node]:
        """All nodes except the root, depth first (children in key order)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root:
                yield node
            stack.extend(node.children[k] for k in sorted(node.children, reverse=True))

    def dump(self) -> str:
        """The tree as indented text (debugging, test failure messages)."""
        lines = []

        def walk(node: Node, depth: int) -> None:
            for key in sorted(node.children):
                child = node.children[key]
                ids = child.ids.tolist()
                shown = ids if len(ids) <= 6 else [*ids[:3], "...", *ids[-2:]]
                lines.append(f"{'  ' * depth}{child!r} ids={shown}")
                walk(child, depth + 1)

        walk(self.root, 0)
        return "\n".join(lines)

    # ------------------------------------------------------------------ request operations
    def match(self, ids: np.ndarray, *, touch: bool = True, hint: WalkHint | None = None
              ) -> Match:
        """Longest cached prefix of ``ids`` (block ids).

        Walks through NONE nodes (only hole-making policies have them). Splits the node the
        match ends in, so ``Match.node.end == matched_blocks``. ``touch`` stamps the path
        with one tick and counts a hit on each path node; under node semantics the node the
        match ends in is stamped whole before the split, as SGLang does (its unmatched suffix
        becomes recent too); block-exact policies stamp exactly the matched blocks.
        ``touch=False`` stamps nothing but still splits. ``hint`` (one per request): where
        the caller's last walk of this prompt ended; updated (``paths.WalkHint``).
        """
        ids = as_block_ids(ids)
        tree = self.tree
        path, partial, k, pos = tree.walk(ids, stop_at_holes=not self._makes_holes,
                                          hint=hint)
        if self.debug:
            self._check_chained(path, ids)
            self._check_hinted(ids, not self._makes_holes, hint, path, partial, k, pos)
        if partial is not None:
            if touch and not self._block_exact:
                partial.last_access = tree.clock + 1  # SGLang: the whole node, then split
            path.append(tree.split(partial, k))
        if hint is not None and path:
            hint.point_at(path[-1], tree.epoch)
        if touch:
            tick = tree.tick()
            for nd in path:
                nd.last_access = tick
                nd.hit_count += 1
            if path and self._hit_hook is not None:
                self._hit_hook(path)
        segments: tuple[Any, ...]
        if not path:
            node, hit, segments = self.root, 0, ()
        elif tree.hole_blocks == 0 and not self._has_cpu and not tree.dropped_blocks:
            node, hit, segments = path[-1], pos, ((0, pos, _GPU),)
        else:
            node = path[-1]
            hit, segments = _segments(path)
        if self.debug:
            self.check()
        return _new(Match, (node, pos, hit, segments))  # Match(...), no Python-level __new__

    def insert(self, ids: np.ndarray, hint: WalkHint | None = None, *, lock: bool = False
               ) -> InsertResult:
        """Make every block of ``ids`` GPU-resident in the tree.

        Blocks beyond the tree become one new leaf (splitting where the ids diverge or end
        inside a node); NONE nodes on the path are refilled (the phantom request recomputed
        them; a partial hole is split first); GPU blocks already there are left alone.
        CPU-resident path nodes (the caller computed or loaded those blocks) are promoted to
        GPU and counted as filled (hicache keeps their host copy). Stamps the path like
        ``match`` (under node semantics the new leaf gets the next tick, as in SGLang).
        Block-exact policies then merge each run of path nodes that are only children with
        equal tier, lock and stamp into its deepest node. ``lock``: then lock the node that
        holds ``ids[-1]`` (as ``lock(InsertResult.node)`` would: a chunk checkpoint's insert
        and lock are one operation).

        Capacity: the tree gains ``new_blocks + filled_blocks`` GPU blocks. Insert does not
        touch ``reserved_blocks``: the caller reserved those blocks before computing them and
        calls ``release`` right after. Raises ``CapacityError`` (tree unchanged) if the tree
        alone would exceed capacity.
        """
        ids = as_block_ids(ids)
        tree = self.tree
        n = len(ids)
        path, partial, k, pos = tree.walk(ids, stop_at_holes=False, hint=hint)  # no change
        if self.debug:
            self._check_chained(path, ids)
            self._check_hinted(ids, False, hint, path, partial, k, pos)
        fill = dropped = 0
        if tree.hole_blocks or self._has_cpu or tree.dropped_blocks:
            for nd in path:
                t = nd.tier
                if t is not _GPU:
                    if t is _DROPPED:
                        dropped += len(nd.ids)
                    else:
                        fill += len(nd.ids)
            if partial is not None and partial.tier is not _GPU:
                if partial.tier is _DROPPED:
                    dropped += k
                else:
                    fill += k
        new = n - pos
        if self.versioned and new:
            new = int(np.count_nonzero(ids[pos:] >= 0))  # dropped keys hold no KV
        if tree.gpu_blocks + fill + new > tree.capacity_blocks:
            raise CapacityError(
                f"insert of {fill + new} blocks exceeds capacity: gpu {tree.gpu_blocks} "
                f"+ {fill + new} > {tree.capacity_blocks}")
        tick = tree.tick()
        exact = self._block_exact
        if partial is not None:
            if not exact:
                partial.last_access = tick  # SGLang: the whole node, then split
            path.append(tree.split(partial, k))
        for nd in path:
            nd.last_access = tick
        events = self._events
        if fill:
            for nd in path:
                t = nd.tier
                if t is _NONE:
                    tree.fill(nd)
                elif t is _CPU:
                    self.tiering.promote(nd)
                else:
                    continue
                if events is not None:
                    events.stored(nd.ids, ids.item(nd.start - 1) if nd.start else -1)
        existing = pos - fill - dropped
        node = path[-1] if path else self.root
        if new:
            leaf_tick = tick if exact else tree.tick()  # SGLang: a new node, a newer tick
            if self.versioned:
                node = add_versioned(tree, node, ids, pos, leaf_tick, path)
            else:
                node = tree.add_leaf(node, ids[pos:], pos, leaf_tick)
                path.append(node)
                if events is not None:
                    events.stored(node.ids, ids.item(pos - 1) if pos else -1)
        if events is not None and n:
            events.written(ids)
        if path and self._insert_hook is not None:
            self._insert_hook(path)
        if exact and len(path) > 1:
            tree.merge_runs(path)
        if hint is not None and path:
            hint.point_at(path[-1], tree.epoch)
        if lock:
            tree.lock(node)
        if self.debug:
            added = fill + new
            assert tree.gpu_blocks + max(0, tree.reserved_blocks - added) \
                <= tree.capacity_blocks, (
                f"insert exceeded capacity: gpu {tree.gpu_blocks} + reserved "
                f"{tree.reserved_blocks} (of which {added} just inserted) > "
                f"{tree.capacity_blocks}")
            self.check()
        return _new(InsertResult, (node, new, fill, existing))  # no Python-level __new__

    def lock(self, node: Node) -> None:
        """A running request pins ``node`` and its ancestors (their GPU KV: evictable ->
        protected). Lock the ``Match.node`` right after the match."""
        self._require_attached(node)
        self.tree.lock(node)
        if self.debug:
            self.check()

    def unlock(self, node: Node) -> None:
        """Undo one ``lock(node)``. A NONE node left childless and unlocked is removed."""
        self._require_attached(node)
        self.tree.unlock(node)
        if self.debug:
            self.check()

    def reserve(self, n: int) -> None:
        """Request-owned blocks outside the tree; raises CapacityError if free_blocks < n."""
        if n < 0:
            raise ValueError(f"reserve({n})")
        if n > self.tree.free_blocks:
            raise CapacityError(f"reserve({n}) with only {self.tree.free_blocks} free blocks")
        self.tree.reserve(n)
        if self.debug:
            self.check()

    def release(self, n: int) -> None:
        """Return request-owned blocks."""
        if n < 0 or n > self.tree.reserved_blocks:
            raise ValueError(f"release({n}) with {self.tree.reserved_blocks} reserved")
        self.tree.release(n)
        if self.debug:
            self.check()

    def evict(self, n: int) -> EvictResult:
        """Free at least ``n`` GPU blocks of the tree through the policy (node granularity may
        overshoot). If less is evictable, frees all of it and returns ok=False (as SGLang).
        Under a CPU tier GPU blocks are freed by demotion or deletion (``tiering``)."""
        result = self.tiering.free_gpu(min(n, self.tree.evictable_blocks))
        result.ok = result.freed_blocks >= n
        if self._events is not None and result.freed:
            self._events.dropped(concat(result.freed))
        if self.debug:
            self.check()
        return result

    def make_room(self, n: int) -> EvictResult:
        """Evict until ``free_blocks >= n``. If that is impossible (too much is locked or
        reserved) nothing is evicted and ok is False."""
        tree = self.tree
        need = n - tree.free_blocks
        if need <= 0:
            return EvictResult(ok=True)
        if need > tree.evictable_blocks:
            return EvictResult(ok=False)
        result = self.tiering.free_gpu(need)  # = self.evict(need), one call less
        if self._events is not None and result.freed:
            self._events.dropped(concat(result.freed))
        if self.debug:
            self.check()
        result.ok = tree.free_blocks >= n
        return result

    def load(self, node: Node, limit_blocks: int | None = None) -> LoadResult:
        """Make the CPU-resident blocks on the path root..``node`` GPU-resident (the caller
        locked ``node`` first, so nothing on the path moves while room is made). Unified: every
        CPU node on the path; hicache: the host-only run below the device prefix, all or
        nothing, skipped under ``load_threshold_tokens``. Only blocks before ``limit_blocks``
        are loaded (a request reuses at most (prompt - 1) // block_size blocks; a CPU node
        across the limit is split there). ok=False (nothing changed) when GPU room cannot be
        made. Semantics and swap-buffer accounting: ``tiering``."""
        self._require_attached(node)
        if node is not self.root and node.lock <= 0:
            raise ValueError(f"load of an unlocked node {node!r}: lock the match first")
        limit = node.end if limit_blocks is None else min(limit_blocks, node.end)
        result = self.tiering.load(node, limit)
        events = self._events
        if events is not None:  # its demotions and deletions were reported as they happened
            for run in result.loaded:  # root-ward first, each behind a GPU-resident prefix
                events.stored(run, None)
            if result.deleted:
                events.dropped(concat(result.deleted))
        if self.debug:
            self.check()
        return result

    def edit(self, old: np.ndarray, new: np.ndarray, dest: np.ndarray,
             rotates: np.ndarray | None = None, hint: WalkHint | None = None) -> EditResult:
        """A history's context edit of its cached path: ``old[i]`` becomes ``new[dest[i]]``
        (drops, repositions) or leaves the logical prefix (``dest[i] < 0``: a splice). Frees
        dropped and removed KV, re-keys the rest (``rotates``: the blocks whose position
        moved); nothing changes when a running request holds the path
        (``EditResult.applied`` False). See ``sim.kvcache.edits``. Not while KV events are
        on: they do not describe re-keyed KV."""
        if self._events is not None:
            raise ValueError("context edits re-key cached KV, which KV events do not describe")
        res = edit_path(self.tree, old, new, dest, rotates, hint)
        if self.debug:
            self.check()
        return res

    def background_evictions(self) -> EvictResult:
        """Deletions the cache made on its own since the last call, then reset: HiCache's
        write-through backups delete host copies to make host room. Together with
        ``evict``/``make_room`` and ``load`` results this reports every deletion once."""
        result = self.tiering.take_background()
        if self._events is not None and result.freed:
            self._events.dropped(concat(result.freed))
        return result

    def backup_pending(self) -> int:
        """Blocks copied d2h since the last call, then reset: unified demotions, hicache
        write-through backups and write_back copies at eviction. This is the ONLY report of
        d2h traffic (h2d is reported only by ``LoadResult.loaded_blocks``)."""
        return self.tree.take_d2h()

    def check(self) -> None:
        """Recount everything by DFS; AssertionError with details on any mismatch."""
        recount(self.tree, holes_allowed=self._makes_holes, cpu_tier=self.tiering.has_cpu,
                host_copies=self.tiering.host_copies)

    def _require_attached(self, node: Node) -> None:
        if node.parent is None and node is not self.root:
            raise ValueError(f"{node!r} is no longer in the tree")

    def _check_hinted(self, ids: np.ndarray, stop: bool, hint: WalkHint | None, path, partial,
                      k: int, pos: int) -> None:
        """Debug: a hinted walk found what a walk from the root finds."""
        if hint is None:
            return
        fresh = self.tree.walk(ids, stop_at_holes=stop)
        assert ([id(x) for x in fresh[0]], id(fresh[1]), fresh[2], fresh[3]) == (
            [id(x) for x in path], id(partial), k, pos), "a walk hint led elsewhere"

    @staticmethod
    def _check_chained(path: list[Node], ids: np.ndarray) -> None:
        """Debug: the last-id shortcut was sound (the caller's ids are chained)."""
        for nd in path:
            seg = ids[nd.start : nd.start + len(nd.ids)]
            assert np.array_equal(nd.ids, seg), (
                f"ids are not chained: {nd!r} matched by its last id but differs inside")
