"""The radix KV cache over block ids: a GPU tier and an optional CPU tier.

Capacity accounting, in blocks::

    capacity_blocks = gpu_blocks + reserved_blocks + free_blocks
    gpu_blocks      = evictable_blocks (GPU KV in unlocked nodes)
                    + protected_blocks (GPU KV in locked nodes)

``reserved_blocks`` are owned by running requests, outside the tree (new tokens being computed,
hole refills, decode tokens). Invariant: ``gpu_blocks + reserved_blocks <= capacity_blocks`` at
all times, except between an ``insert`` and the caller's matching ``release`` (the caller
reserved the blocks it then hands to the tree; see ``insert``).

Matching follows SGLang's RadixCache (reference/sglang-radix.md): walk down while the ids
agree; if the match ends inside a node, split it there; stamp the path with one tick of a
logical clock (the cache's own counter; never wall time). Ids are chained (DESIGN.md), so each
node on the path costs one scalar comparison of its last id; only the node where the match
ends needs a vectorized comparison. No per-block Python loop.

Two node semantics, chosen by the policy (``EvictionPolicy.block_exact``)::

    node semantics (sglang, any node granularity, leaf-head)   block exact (vllm, penelope)
    - the node a match ends in is stamped WHOLE, then split     - only matched blocks stamped
      (its unmatched suffix becomes recent: SGLang exactly)     - a new leaf shares the tick
    - a new leaf gets a newer tick                              - insert merges path runs of
    - nodes are never merged                                      only children with equal
                                                                  tier, lock and stamp

Under node semantics the split history decides what a whole-node eviction frees, so it is kept
exactly as SGLang keeps it. Block-exact policies free block by block from the tail or the
private head, so boundaries carry no meaning there; merging keeps their paths short (holes and
refills would otherwise fragment a history into one node per eviction).

With ``cpu_capacity_blocks > 0`` a CPU tier joins the GPU tier, managed as ``tiering="unified"``
(Penelope: one tier per block, one deletion order) or ``"hicache"`` (SGLang HiCache: device and
host copies); the semantics live in ``sim.kvcache.tiers``. Without a CPU tier none of that code
runs and the GPU-only behaviour is the one described above.

Counters are kept incrementally; ``debug=True`` recounts everything by DFS after every public
operation (``sim.kvcache.invariants``).
"""

from __future__ import annotations

import numpy as np

from policies.eviction import EvictionPolicy, get_policy

from . import evictor, tiers
from .invariants import recount
from .node import Node, Tier
from .results import EvictResult, InsertResult, LoadResult, Match

# Enum members are singletons: ``is`` against module constants is ~4x faster than ``==``.
_GPU, _NONE, _CPU = Tier.GPU, Tier.NONE, Tier.CPU
TIERINGS = ("unified", "hicache")
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")


class CapacityError(RuntimeError):
    """An operation would exceed the cache's capacity (a caller bug, not bad user input)."""


def as_block_ids(ids: np.ndarray | list[int]) -> np.ndarray:
    """A 1-D int64 array (no copy when it already is one)."""
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


def _agree(node_ids: np.ndarray, ids: np.ndarray, pos: int, m: int) -> int:
    """Length of the common prefix of node_ids[:m] and ids[pos:pos+m] (first ids known equal).

    Ids are chained (DESIGN.md: an id implies the whole prefix before it), so equal ids at the
    last compared position mean the whole run agrees: one scalar comparison on the common
    path. Otherwise one vectorized comparison finds the first difference."""
    if m == 1 or node_ids.item(m - 1) == ids.item(pos + m - 1):
        return m
    diff = node_ids[:m] != ids[pos : pos + m]
    i = int(diff.argmax())
    return i if diff[i] else m


class RadixKVCache:
    """Radix tree of block-id runs with GPU KV, holes (NONE) and lock counts.

    ``policy`` decides eviction (``policies.eviction``); everything else is mechanism.
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
    ) -> None:
        if capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        if cpu_capacity_blocks < 0 or swap_buffer_blocks < 0 or block_size <= 0:
            raise ValueError(
                f"bad tier sizes: cpu {cpu_capacity_blocks}, swap buffer {swap_buffer_blocks}, "
                f"block size {block_size}"
            )
        if tiering not in TIERINGS:
            raise ValueError(f"tiering must be one of {TIERINGS}, got {tiering!r}")
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
        self.capacity_blocks = int(capacity_blocks)
        self.cpu_capacity_blocks = int(cpu_capacity_blocks)
        self.tiering = tiering
        self.swap_buffer_blocks = int(swap_buffer_blocks)
        self.write_policy = write_policy
        self.load_threshold_tokens = int(load_threshold_tokens)
        self.block_size = int(block_size)
        self.policy = get_policy(policy)
        # Mode flags: the GPU-only paths test one bool and run exactly as before.
        self._tiered = self.cpu_capacity_blocks > 0
        self._hicache = self._tiered and tiering == "hicache"
        if self._hicache:
            tiers.check_hicache_policy(self.policy)
        self._makes_holes = self.policy.makes_holes
        self._block_exact = self.policy.block_exact
        self.debug = debug
        self._serial = 0
        self._clock = 0
        self.root = Node(np.empty(0, dtype=np.int64), 0, None, Tier.GPU, self._next_serial())
        self._gpu = 0
        self._evictable = 0
        self._protected = 0
        self._reserved = 0
        self._holes = 0
        self._cpu = 0  # unified: blocks in CPU nodes; hicache: host copies (CPU + backed GPU)
        self._d2h = 0  # d2h copies not yet reported by backup_pending
        # Evictable leaves: attached, not root, holding KV (GPU, or CPU under a CPU tier),
        # lock 0, no children. Without a CPU tier: exactly the unlocked childless GPU nodes.
        self._leaves: set[Node] = set()

    # ------------------------------------------------------------------ counters
    @property
    def gpu_blocks(self) -> int:
        """GPU blocks owned by the tree."""
        return self._gpu

    @property
    def reserved_blocks(self) -> int:
        """GPU blocks owned by running requests outside the tree."""
        return self._reserved

    @property
    def free_blocks(self) -> int:
        return self.capacity_blocks - self._gpu - self._reserved

    @property
    def evictable_blocks(self) -> int:
        """GPU blocks in unlocked nodes (all of them can be freed by repeated eviction)."""
        return self._evictable

    @property
    def protected_blocks(self) -> int:
        """GPU blocks in locked nodes."""
        return self._protected

    @property
    def cpu_blocks(self) -> int:
        """Blocks resident on CPU: unified = blocks of CPU-only nodes; hicache = host copies
        (host-only nodes and backed-up device nodes)."""
        return self._cpu

    @property
    def cpu_free_blocks(self) -> int:
        return self.cpu_capacity_blocks - self._cpu

    @property
    def hole_blocks(self) -> int:
        """Blocks in NONE nodes (ids known, KV freed)."""
        return self._holes

    @property
    def clock(self) -> int:
        """The logical clock: the tick of the latest stamping operation."""
        return self._clock

    def evictable_leaves(self) -> list[Node]:
        """Current eviction candidates, in ascending serial order (deterministic)."""
        return sorted(self._leaves, key=lambda n: n.serial)

    # ------------------------------------------------------------------ public operations
    def match(self, ids: np.ndarray, *, touch: bool = True) -> Match:
        """Longest cached prefix of ``ids`` (block ids).

        Walks through NONE nodes (only hole-making policies have them). Splits the node the
        match ends in, so ``Match.node.end == matched_blocks``. ``touch`` stamps the path
        with one tick and counts a hit on each path node; under node semantics the node the
        match ends in is stamped whole before the split, as SGLang does (its unmatched suffix
        becomes recent too); block-exact policies stamp exactly the matched blocks.
        ``touch=False`` stamps nothing but still splits.
        """
        ids = as_block_ids(ids)
        path, partial, k, pos = self._walk(ids, stop_at_holes=not self._makes_holes)
        if partial is not None:
            if touch and not self._block_exact:
                partial.last_access = self._clock + 1  # SGLang: the whole node, then split
            path.append(self._split(partial, k))
        if touch:
            tick = self._tick()
            for nd in path:
                nd.last_access = tick
                nd.hit_count += 1
            if self._hicache and path:
                tiers.hicache_on_hit(self, path)
        if not path:
            node, hit, segments = self.root, 0, ()
        elif self._holes == 0 and not self._tiered:  # no holes, no CPU tier: one GPU run
            node, hit, segments = path[-1], pos, ((0, pos, _GPU),)
        else:
            node = path[-1]
            hit, segments = _segments(path)
        if self.debug:
            self.check()
        return Match(node, pos, hit, segments)

    def insert(self, ids: np.ndarray) -> InsertResult:
        """Make every block of ``ids`` GPU-resident in the tree.

        Blocks beyond the tree become one new leaf (splitting where the ids diverge or end
        inside a node); NONE nodes on the path are refilled (the phantom request recomputed
        them; a partial hole is split first); GPU blocks already there are left alone.
        CPU-resident path nodes (a CPU tier; the caller computed or loaded those blocks) are
        promoted to GPU and counted as filled (hicache keeps their host copy). Stamps
        the path like ``match`` (under node semantics the new leaf gets the next tick, as in
        SGLang). Block-exact policies then merge each run of path nodes that are only
        children with equal tier, lock and stamp into its deepest node (which keeps its
        identity, so lock handles stay valid: a handle's node always has a larger lock count
        than its only child).

        Capacity: the tree gains ``new_blocks + filled_blocks`` GPU blocks. Insert does not
        touch ``reserved_blocks``: the caller reserved those blocks before computing them and
        calls ``release`` right after. Raises ``CapacityError`` (tree unchanged) if the tree
        alone would exceed capacity.
        """
        ids = as_block_ids(ids)
        n = len(ids)
        # Walk first (no mutation), so a capacity failure leaves the tree untouched.
        path, partial, k, pos = self._walk(ids, stop_at_holes=False)
        fill = 0
        if self._holes or self._tiered:
            fill = sum(len(nd.ids) for nd in path if nd.tier is not _GPU)
            if partial is not None and partial.tier is not _GPU:
                fill += k
        new = n - pos
        if self._gpu + fill + new > self.capacity_blocks:
            raise CapacityError(
                f"insert of {fill + new} blocks exceeds capacity: gpu {self._gpu} "
                f"+ {fill + new} > {self.capacity_blocks}"
            )
        tick = self._tick()
        exact = self._block_exact
        if partial is not None:
            if not exact:
                partial.last_access = tick  # SGLang: the whole node, then split
            path.append(self._split(partial, k))
        for nd in path:
            nd.last_access = tick
        if fill:
            for nd in path:
                if nd.tier is _NONE:
                    self._fill(nd)
                elif nd.tier is _CPU:
                    tiers.promote(self, nd)
        existing = pos - fill
        node = path[-1] if path else self.root
        if new:
            leaf_tick = tick if exact else self._tick()  # SGLang: a new node, a newer tick
            leaf = Node(ids[pos:], pos, node, _GPU, self._next_serial(), leaf_tick)
            node.children[ids.item(pos)] = leaf
            self._gpu += new
            self._evictable += new
            self._leaves.discard(node)
            self._leaves.add(leaf)
            node = leaf
            path.append(leaf)
        if self._hicache and path:
            tiers.hicache_on_insert(self, path)
        if exact and len(path) > 1:
            self._merge_runs(path)
        if self.debug:
            added = fill + new
            assert self._gpu + max(0, self._reserved - added) <= self.capacity_blocks, (
                f"insert exceeded capacity: gpu {self._gpu} + reserved {self._reserved} "
                f"(of which {added} just inserted) > {self.capacity_blocks}"
            )
            self.check()
        return InsertResult(node, new, fill, existing)

    def lock(self, node: Node) -> None:
        """A running request pins ``node`` and its ancestors (their GPU KV: evictable ->
        protected). Lock the ``Match.node`` right after the match."""
        self._require_attached(node)
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
        if self.debug:
            self.check()

    def unlock(self, node: Node) -> None:
        """Undo one ``lock(node)``. A NONE node left childless and unlocked is removed."""
        self._require_attached(node)
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
                elif node.tier is _NONE:
                    if not node.children:
                        self._detach(node)
                elif not node.children:  # CPU
                    self._leaves.add(node)
            node = parent  # type: ignore[assignment]
        if self.debug:
            self.check()

    def reserve(self, n: int) -> None:
        """Request-owned blocks outside the tree; raises CapacityError if free_blocks < n."""
        if n < 0:
            raise ValueError(f"reserve({n})")
        if n > self.free_blocks:
            raise CapacityError(f"reserve({n}) with only {self.free_blocks} free blocks")
        self._reserved += n
        if self.debug:
            self.check()

    def release(self, n: int) -> None:
        """Return request-owned blocks."""
        if n < 0 or n > self._reserved:
            raise ValueError(f"release({n}) with {self._reserved} reserved")
        self._reserved -= n
        if self.debug:
            self.check()

    def evict(self, n: int) -> EvictResult:
        """Free at least ``n`` GPU blocks of the tree through the policy (node granularity may
        overshoot). If less is evictable, frees all of it and returns ok=False (as SGLang).
        Under a CPU tier GPU blocks are freed by demotion or deletion (``tiers``)."""
        if self._tiered:
            result = tiers.free_gpu(self, min(n, self._evictable))
            result.ok = result.freed_blocks >= n
        else:
            result = evictor.evict(self, n)
        if self.debug:
            self.check()
        return result

    def make_room(self, n: int) -> EvictResult:
        """Evict until ``free_blocks >= n``. If that is impossible (too much is locked or
        reserved) nothing is evicted and ok is False. Under a CPU tier GPU blocks are demoted
        when the CPU tier has (or can make) room and deleted per the tiering rules."""
        need = n - self.free_blocks
        if need <= 0:
            return EvictResult(ok=True)
        if need > self._evictable:
            return EvictResult(ok=False)
        result = self.evict(need)
        result.ok = self.free_blocks >= n
        return result

    def load(self, node: Node) -> LoadResult:
        """Make the CPU-resident blocks on the path root..``node`` GPU-resident (the caller
        locked ``node`` first, so nothing on the path moves while room is made). Unified: every
        CPU node on the path; hicache: the host-only run below the device prefix, all or
        nothing, skipped under ``load_threshold_tokens``. ok=False (nothing changed) when GPU
        room cannot be made. Semantics and swap-buffer accounting: ``sim.kvcache.tiers``."""
        self._require_attached(node)
        if node is not self.root and node.lock <= 0:
            raise ValueError(f"load of an unlocked node {node!r}: lock the match first")
        if not self._tiered:
            return LoadResult(ok=True)
        result = tiers.load(self, node)
        if self.debug:
            self.check()
        return result

    def backup_pending(self) -> int:
        """Blocks copied d2h since the last call, then reset: unified demotions, hicache
        write-through backups and write_back copies at eviction. This is the ONLY report of
        d2h traffic (h2d is reported only by ``LoadResult.loaded_blocks``)."""
        n, self._d2h = self._d2h, 0
        return n

    def cpu_resident_block_ids(self) -> np.ndarray:
        """Block ids with a CPU copy (unified: CPU nodes; hicache: host copies), sorted."""
        runs = [nd.ids for nd in self.iter_nodes() if nd.tier is _CPU or nd.host]
        if not runs:
            return np.empty(0, dtype=np.int64)
        return np.sort(np.concatenate(runs))

    def resident_block_ids(self) -> np.ndarray:
        """All GPU-resident block ids in the tree, sorted."""
        runs = [nd.ids for nd in self.iter_nodes() if nd.tier is _GPU]
        if not runs:
            return np.empty(0, dtype=np.int64)
        return np.sort(np.concatenate(runs))

    def iter_nodes(self):
        """All nodes except the root, depth first (children in key order)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node is not self.root:
                yield node
            stack.extend(node.children[k] for k in sorted(node.children, reverse=True))

    def check(self) -> None:
        """Recount everything by DFS; AssertionError with details on any mismatch."""
        recount(self)

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

    # ------------------------------------------------------------------ the walk
    def _walk(
        self, ids: np.ndarray, stop_at_holes: bool
    ) -> tuple[list[Node], Node | None, int, int]:
        """Follow ``ids`` down the tree without changing it.

        Returns (nodes matched whole, the node the match ends inside or None, blocks of it
        matched, total matched blocks). Ids are chained (DESIGN.md: an id implies the whole
        prefix before it), so a node whose last id equals the prompt's id at that position
        matches whole: one scalar comparison per node; only the node where the match ends
        needs a vectorized comparison.
        """
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
            if end <= n and (length == 1 or child.last == item(end - 1)):
                path.append(child)
                node = child
                pos = end
                continue
            # The match ends inside this node: where the ids diverge or the prompt ends.
            k = _agree(child.ids, ids, pos, min(length, n - pos))
            if self.debug:
                self._check_chained(path, ids)
            return path, child, k, pos + k
        if self.debug:
            self._check_chained(path, ids)
        return path, None, 0, pos

    @staticmethod
    def _check_chained(path: list[Node], ids: np.ndarray) -> None:
        """Debug: the last-id shortcut was sound (the caller's ids are chained)."""
        for nd in path:
            seg = ids[nd.start : nd.start + len(nd.ids)]
            assert np.array_equal(nd.ids, seg), (
                f"ids are not chained: {nd!r} matched by its last id but differs inside"
            )

    # ------------------------------------------------------------------ mutation primitives
    # (used by evictor.py; each keeps the counters and the leaf set exact)
    def _next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _require_attached(self, node: Node) -> None:
        if node.parent is None and node is not self.root:
            raise ValueError(f"{node!r} is no longer in the tree")

    def _split(self, node: Node, k: int) -> Node:
        """Split ``node`` after its first k blocks; return the new PREFIX node. ``node`` keeps
        its identity as the suffix (handles held by requests stay valid, as in SGLang)::

            parent -- node[s, e)   =>   parent -- prefix[s, s+k) -- node[s+k, e)
        """
        prefix = Node(
            node.ids[:k], node.start, node.parent, node.tier, self._next_serial(), node.last_access
        )
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

    def _merge_runs(self, chain: list[Node]) -> None:
        """Merge runs of ``chain`` (root-ward to leaf-ward, each node the parent of the next)
        whose upper nodes have one child and equal tier, lock and stamp, into the run's
        deepest node. Counters and the leaf set are unchanged (same tier and lock)."""
        i = len(chain) - 1
        while i > 0:
            child = chain[i]
            j = i
            while j > 0:
                up = chain[j - 1]
                if (
                    len(up.children) == 1
                    and up.lock == child.lock
                    and up.tier is child.tier
                    and up.last_access == child.last_access
                    and up.host == child.host
                ):
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

    def _fill(self, node: Node) -> None:
        """NONE -> GPU (a hole recomputed)."""
        size = len(node.ids)
        node.tier = Tier.GPU
        self._holes -= size
        self._gpu += size
        if node.lock:
            self._protected += size
        else:
            self._evictable += size
            if not node.children:
                self._leaves.add(node)

    def _free(self, node: Node, result: EvictResult) -> Node | None:
        """GPU (or CPU) -> NONE for a whole unlocked node; a childless one leaves the tree
        (cascading upward). Returns the surviving ancestor when it just became an evictable
        leaf."""
        size = len(node.ids)
        if node.tier is _GPU:
            self._gpu -= size
            self._evictable -= size
            result.freed_blocks += size
        else:  # CPU: unified deletion, hicache host eviction
            self._cpu -= size
        if node.host:
            if node.tier is _GPU:  # hicache: a backed-up node deleted from both tiers
                self._cpu -= size
            node.host = False
        self._holes += size
        node.tier = Tier.NONE
        self._leaves.discard(node)
        result.freed.append(node.ids)
        result.deleted_blocks += size
        if node.children:
            return None
        survivor = self._prune(node)
        return survivor if survivor in self._leaves else None

    def _truncate_tail(self, leaf: Node, k: int, result: EvictResult) -> None:
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
        else:
            self._cpu -= k
        if leaf.host:  # hicache never truncates a backed-up node (it demotes it); defensive
            self._cpu -= k

    def _detach(self, node: Node) -> None:
        """Remove a childless NONE node from its parent."""
        parent = node.parent
        assert parent is not None and not node.children and node.tier == Tier.NONE
        del parent.children[int(node.ids[0])]
        node.parent = None
        self._holes -= len(node.ids)
        if (
            parent is not self.root
            and parent.tier is not _NONE
            and parent.lock == 0
            and not parent.children
        ):
            self._leaves.add(parent)

    def _prune(self, node: Node) -> Node:
        """Remove ``node`` and its NONE ancestors while they are childless and unlocked;
        return the first ancestor that stays."""
        while node is not self.root and node.tier is _NONE and not node.children:
            if node.lock:
                return node
            parent = node.parent
            self._detach(node)
            node = parent  # type: ignore[assignment]
        return node
