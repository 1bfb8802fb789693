"""What lies beyond the GPU: one strategy object per cache (``GpuOnly``, ``Unified``,
``HiCache``), chosen at construction. Each turns "free n GPU blocks" and "load this path" into
plans (``planner``) carried out by the tree's appliers (``tree``). Sizes are in blocks.

**GpuOnly**: freeing deletes, in the policy's order (``apply_delete``).

**Unified** (Penelope): every block lives in exactly one tier -- a node is GPU, CPU or NONE
(hole) -- and GPU (``capacity_blocks``) + CPU (``cpu_capacity_blocks``) is one logical cache.
Freeing ``need`` GPU blocks::

    1. delete   D = need - cpu_free blocks (the union is full only if D > 0) in the ONE
                deletion order: the policy run over every unlocked history whatever its tiers
                (victims of both tiers, private-head walks through CPU nodes, ...).
    2. demote   the rest, need - (GPU blocks deleted), into the CPU room that now exists: the
                first GPU blocks of the same order (the planner passes over CPU nodes), so
                under ``penelope`` the front of a private history goes to the CPU first and
                its tail stays on the GPU; under ``sglang``/``vllm`` the tail goes. At node
                granularity a whole node moves unless the CPU room is smaller (then a part).

``load(node)`` makes every CPU node on root..node GPU-resident. It never deletes: the loaded
blocks leave the CPU, so the GPU blocks that make way (``need = L - gpu_free``) fit there.
Swap-buffer accounting, with g = gpu_free, c = cpu_free before the load::

    direct  = min(L, g)            loaded into free GPU room
    exch    = L - direct           loads that need a demotion first (= need)
    swap    = max(0, exch - (c + direct))   through the swap buffer: both tiers full
    chunks  = ceil(swap / swap_buffer_blocks)

With ``swap_buffer_blocks == 0`` a load that needs the buffer fails (nothing changed). The swap
buffer is extra CPU memory, not part of ``cpu_capacity_blocks``.

**HiCache** (SGLang HiCache 0.5.12; docs/engine.md, Two tiers): a node has a device copy (tier
GPU), a host copy (``Node.host``), or both; tier CPU means host only. Device nodes and backed-up
nodes each form a prefix-closed set from the root.

- write_through: a hit backs up every device node of the path whose hit count reached 1
  (``write_through_selective``: 2), top-down; ``write_back`` backs up only at device eviction.
  Hits are counted as SGLang's ``inc_hit_count`` does: on a touching match and on an insert
  (every path node, ``HiRadixCache._insert_helper``). No host room: host eviction of the
  node's size first; the backup (and deeper ones) is skipped if still short.
- device eviction: the policy's order over device leaves (``planner.DeviceView``); a backed-up
  leaf is demoted (device copy dropped), one not backed up is deleted.
- host eviction: the policy's order over host-only childless unlocked nodes, whole nodes.
- ``load`` is all or nothing over the host-only run below the device prefix, skipped under
  ``load_threshold_tokens``; it frees exactly the GPU shortfall by device eviction.
- Only the tail start position is meaningful (the device tier is SGLang/vLLM).

Reporting (nothing double counted): every d2h copy is counted once by ``RadixTree.take_d2h``;
every h2d copy by ``LoadResult.loaded_blocks``.
"""

from __future__ import annotations

from typing import Final

from policies import NODE, TAIL, EvictionPolicy, PolicyError

from . import planner
from .node import Node, Tier
from .results import EvictResult, LoadResult
from .tree import RadixTree

_GPU: Final = Tier.GPU
_CPU: Final = Tier.CPU
WRITE_POLICIES: Final = ("write_through", "write_through_selective", "write_back")


def _is_gpu(node: Node) -> bool:
    return node.tier is _GPU


def _is_cpu(node: Node) -> bool:
    return node.tier is _CPU


class GpuOnly:
    """No CPU tier: freeing GPU blocks deletes them."""

    name = "gpu"
    has_cpu = False
    host_copies = False

    def __init__(self, tree: RadixTree, policy: EvictionPolicy, debug: bool = False) -> None:
        self.tree, self.policy, self.debug = tree, policy, debug

    def delete(self, need: int, result: EvictResult) -> None:
        """Delete ``need`` blocks (either tier) in the policy's order."""
        tree = self.tree
        steps = planner.plan(self.policy, planner.HistoryView(tree.root), tree.leaves(), need,
                             debug=self.debug)
        tree.apply_delete(steps, result)

    def free_gpu(self, need: int) -> EvictResult:
        """Free ``need`` GPU blocks (fewer if less is evictable: ok=False)."""
        result = EvictResult(ok=need <= 0)
        if need > 0:
            tree = self.tree  # self.delete(need, result), inlined: every prefill chunk evicts
            steps = planner.plan(self.policy, planner.HistoryView(tree.root), tree.leaves(),
                                 need, debug=self.debug)
            tree.apply_delete(steps, result)
            result.ok = result.freed_blocks >= need
        return result

    def load(self, node: Node, limit: int) -> LoadResult:
        return LoadResult(ok=True)

    def _cpu_path(self, node: Node, limit: int, contiguous: bool) -> list[Node]:
        """CPU nodes on root..node that start before block ``limit``, deepest first; a node
        straddling ``limit`` is split there (only its front is wanted). ``contiguous``: stop at
        the first non-CPU node (HiCache's host-only run below the device prefix)."""
        tree = self.tree
        path: list[Node] = []
        nd = node
        while nd is not tree.root:
            if nd.tier is _CPU:
                if nd.start < limit:
                    if nd.end > limit:
                        nd = tree.split(nd, limit - nd.start)  # continue from the front part
                    path.append(nd)
            elif contiguous:
                break
            nd = nd.parent  # type: ignore[assignment]
        return path

    def take_background(self) -> EvictResult:
        """Deletions made outside ``free_gpu``/``load`` since the last call (HiCache's
        write-through backups make host room), then reset."""
        return EvictResult(ok=True)

    def promote(self, node: Node) -> None:
        raise AssertionError(f"CPU node without a CPU tier: {node!r}")

    def on_hit(self, path: list[Node]) -> None:
        """A touching match covered ``path``."""

    def on_insert(self, path: list[Node]) -> None:
        """An insert covered ``path`` (all device-resident now)."""


class Unified(GpuOnly):
    """Penelope's unified two-tier cache (module docstring)."""

    name = "unified"
    has_cpu = True

    def __init__(self, tree: RadixTree, policy: EvictionPolicy, swap_buffer_blocks: int = 16,
                 debug: bool = False) -> None:
        super().__init__(tree, policy, debug)
        self.swap_buffer_blocks = swap_buffer_blocks

    def _demote(self, need: int, room: int, result: EvictResult) -> None:
        tree = self.tree
        steps = planner.plan(self.policy, planner.HistoryView(tree.root), tree.leaves(), need,
                             counts=_is_gpu, room=room, debug=self.debug)
        assert sum(s.blocks for s in steps) >= need, f"demotion plan short of {need} blocks"
        tree.apply_demote(steps, result)

    def free_gpu(self, need: int) -> EvictResult:
        result = EvictResult(ok=need <= 0)
        if need <= 0:
            return result
        delete = need - self.tree.cpu_free_blocks
        if delete > 0:
            self.delete(delete, result)
        rest = need - result.freed_blocks
        if rest > 0:
            room = self.tree.cpu_free_blocks
            assert rest <= room, f"demotion of {rest} blocks into {room} free CPU blocks"
            self._demote(rest, room, result)
        result.ok = result.freed_blocks >= need
        return result

    def load(self, node: Node, limit: int) -> LoadResult:
        tree = self.tree
        path = self._cpu_path(node, limit, contiguous=False)
        total = sum(len(x.ids) for x in path)
        if total == 0:
            return LoadResult(ok=True)
        gpu_free = max(tree.free_blocks, 0)
        cpu_free = tree.cpu_free_blocks
        direct = min(total, gpu_free)
        need = total - direct
        swap = max(0, need - (cpu_free + direct))
        if need > tree.evictable_blocks or (swap and self.swap_buffer_blocks <= 0):
            return LoadResult(ok=False)
        res = LoadResult(ok=True, swap_blocks=swap)
        if swap:
            res.swap_chunks = -(-swap // self.swap_buffer_blocks)
        if need:
            ev = EvictResult(ok=True)
            self._demote(need, cpu_free + total, ev)
            res.demoted_blocks = ev.demoted_blocks
            res.demoted = ev.demoted
        for x in reversed(path):
            tree.move_to_device(x)
            res.loaded.append(x.ids)
        res.loaded_blocks = total
        return res

    def promote(self, node: Node) -> None:
        self.tree.move_to_device(node)


class HiCache(GpuOnly):
    """SGLang HiCache: device and host copies (module docstring)."""

    name = "hicache"
    has_cpu = True
    host_copies = True

    def __init__(self, tree: RadixTree, policy: EvictionPolicy, block_size: int = 64,
                 write_policy: str = "write_through", load_threshold_tokens: int = 10,
                 debug: bool = False) -> None:
        super().__init__(tree, policy, debug)
        if policy.start.makes_holes:  # (its device tier frees whole leaves, never a front)
            raise PolicyError(
                f"tiering 'hicache' is the SGLang baseline: its device tier evicts from the "
                f"tail (sglang or vllm presets), not {policy.spec}")
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {WRITE_POLICIES}, got {write_policy!r}")
        self.block_size = block_size
        self.write_policy = write_policy
        self.load_threshold_tokens = load_threshold_tokens
        self._background = EvictResult(ok=True)

    # --- host tier ------------------------------------------------------------------------
    def _evict_host(self, n: int, result: EvictResult | None) -> None:
        """Delete at least n host blocks: host-only childless unlocked nodes, whole."""
        tree = self.tree
        victims = [x for x in tree.leaves() if x.tier is _CPU]
        steps = planner.plan(self.policy, planner.HistoryView(tree.root), victims, n,
                             eligible=_is_cpu, start=TAIL, granularity=NODE, debug=self.debug)
        tree.apply_delete(steps, result if result is not None else EvictResult(ok=True))

    def backup(self, node: Node, result: EvictResult | None = None) -> bool:
        """Copy ``node`` (and first its unbacked ancestors) to host; False if host room ran
        out. Host nodes deleted to make room are counted in ``result`` when given."""
        tree = self.tree
        chain = []
        nd = node
        while nd is not tree.root and not nd.host:
            chain.append(nd)
            nd = nd.parent  # type: ignore[assignment]
        for nd in reversed(chain):
            size = len(nd.ids)
            if tree.cpu_free_blocks < size:
                self._evict_host(size, result)
                if tree.cpu_free_blocks < size:
                    return False
            tree.copy_to_host(nd)
        return True

    def on_hit(self, path: list[Node]) -> None:
        if self.write_policy == "write_back":
            return
        threshold = 2 if self.write_policy == "write_through_selective" else 1
        for nd in path:
            if nd.tier is _GPU and not nd.host and nd.hit_count >= threshold \
                    and not self.backup(nd, self._background):
                return  # no host room: deeper nodes cannot be backed up either

    def on_insert(self, path: list[Node]) -> None:
        if self.write_policy == "write_back":
            return
        for nd in path:
            nd.hit_count += 1
        self.on_hit(path)

    def take_background(self) -> EvictResult:
        out, self._background = self._background, EvictResult(ok=True)
        return out

    # --- device tier ----------------------------------------------------------------------
    def free_gpu(self, need: int) -> EvictResult:
        result = EvictResult(ok=need <= 0)
        if need <= 0:
            return result
        view = planner.DeviceView(self.tree.root)
        steps = planner.plan(self.policy, view, view.leaves(), need, debug=self.debug)
        backup = self.backup if self.write_policy == "write_back" else None
        self.tree.apply_device_evict(steps, result, backup)
        result.ok = result.freed_blocks >= need
        return result

    def load(self, node: Node, limit: int) -> LoadResult:
        tree = self.tree
        path = self._cpu_path(node, limit, contiguous=True)
        total = sum(len(x.ids) for x in path)
        if total == 0:
            return LoadResult(ok=True)
        if total * self.block_size < self.load_threshold_tokens:
            return LoadResult(ok=True, skipped=True)
        need = total - tree.free_blocks
        res = LoadResult(ok=True)
        if need > 0:
            if need > tree.evictable_blocks:
                return LoadResult(ok=False)
            ev = self.free_gpu(need)
            res.demoted_blocks, res.deleted_blocks = ev.demoted_blocks, ev.deleted_blocks
            res.demoted, res.deleted = ev.demoted, ev.freed
        for x in reversed(path):
            tree.copy_to_device(x)
            res.loaded.append(x.ids)
        res.loaded_blocks = total
        return res

    def promote(self, node: Node) -> None:
        self.tree.copy_to_device(node)
