"""The CPU tier: Penelope's unified two-tier cache and the SGLang HiCache baseline.

Both run only when ``RadixKVCache(cpu_capacity_blocks > 0)``; sizes are in blocks.

**unified** (Penelope): every block lives in exactly one tier -- a node is GPU, CPU or NONE
(hole) -- and the union of GPU (``capacity_blocks``) and CPU (``cpu_capacity_blocks``) is one
logical cache. Freeing ``need`` GPU blocks (``make_room``/``evict``)::

    1. delete   D = need - cpu_free blocks (the union is full only if D > 0) in the ONE
                deletion order: the cache's eviction policy run over every unlocked history
                whatever its tiers (victim leaves of both tiers, private-head walks through
                CPU nodes, ...). Deleting a GPU block frees GPU room directly.
    2. demote   the rest, need - (GPU blocks deleted), into the CPU room that now exists
                (cpu_free + CPU blocks deleted >= that rest: moves never cause deletions).

*Which GPU blocks are demoted*: the first GPU blocks of the deletion order, i.e. the GPU blocks
that the same policy would delete next (``_plan_demotions`` replays the order virtually, passing
over CPU blocks, without changing the tree). So under ``penelope`` the front of a private history
goes to the CPU first and its tail stays on the GPU; under ``sglang``/``vllm`` the tail goes.
At node granularity a whole node is demoted (overshoot, as SGLang frees whole nodes) unless
the CPU room left is smaller; then only the blocks that fit move (the node is split).

``load(node)`` makes every CPU node on root..node GPU-resident. It never deletes: the loaded
blocks leave the CPU, so the GPU blocks that must make way (``need = L - gpu_free``) always fit
there. Swap-buffer accounting, with g = gpu_free, c = cpu_free before the load::

    direct  = min(L, g)            loaded into free GPU room (their CPU room frees up)
    exch    = L - direct           loads that need a demotion first (= need)
    c1      = c + direct           CPU room a demotion can use directly (one pass)
    swap    = max(0, exch - c1)    loads that went through the swap buffer: both tiers full,
                                   outgoing GPU blocks are staged in the buffer, the freed GPU
                                   blocks take incoming CPU blocks, whose CPU blocks become the
                                   buffer for the next chunk
    chunks  = ceil(swap / swap_buffer_blocks)

With ``swap_buffer_blocks == 0`` a load that needs the buffer fails (ok=False, nothing changed).
The swap buffer is extra CPU memory, not part of ``cpu_capacity_blocks``.

**hicache** (SGLang HiCache 0.5.12, reference/sglang-radix.md): a node has a device copy
(tier GPU), a host copy (``Node.host``), or both; tier CPU means host only. Device nodes form a
prefix-closed set from the root (device eviction takes device leaves only) and so do backed-up
nodes (a backup first backs up the node's unbacked ancestors).

- write_through: a hit backs up every device node of the path whose hit count reached 1
  (``write_through_selective``: 2), top-down; ``write_back`` backs up only at device eviction.
  Hits are counted as SGLang's ``inc_hit_count`` does: on a ``match(touch=True)`` and on an
  ``insert`` (every path node and the new leaf, ``HiRadixCache._insert_helper``), so under
  write_through a newly inserted node is backed up at once. No host room: host eviction of
  ``size`` blocks first (as SGLang's ``evict_host(len(node.value))``), and the backup is
  skipped if still short (deeper nodes too).
- device eviction (``make_room``): SGLang LRU over device leaves (device nodes whose children
  are all host-only), whole nodes (block granularity splits the tail); a backed-up leaf is
  demoted (device copy dropped, no copy made), one not backed up is deleted; the parent is
  pushed once all its children left the device.
- host eviction: LRU over host-only childless unlocked nodes, deleted from the tree, cascading.
- ``match`` reports the device prefix (``hit_blocks``) and the host-only run below it (a CPU
  segment); ``load`` is all or nothing and skipped when that run is under
  ``load_threshold_tokens`` tokens; it frees exactly the GPU shortfall by device eviction
  (SGLang evicts the whole load size; the shortfall is the kinder, documented choice).
- Only the tail start position is meaningful (the device tier is SGLang/vLLM).

Reporting (nothing double counted): every d2h copy (unified demotion, hicache backup) is counted
once by ``RadixKVCache.backup_pending``; every h2d copy by ``LoadResult.loaded_blocks``.
``EvictResult.demoted_blocks`` / ``LoadResult.demoted_blocks`` only describe what happened.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from policies.eviction import EvictionPolicy, Granularity, PolicyError, StartPosition

from . import evictor
from .node import Node, Tier
from .results import EvictResult, LoadResult

if TYPE_CHECKING:
    from .cache import RadixKVCache

_GPU, _CPU, _NONE = Tier.GPU, Tier.CPU, Tier.NONE


def check_hicache_policy(policy: EvictionPolicy) -> None:
    if policy.start is not StartPosition.TAIL:
        raise PolicyError(
            f"tiering 'hicache' is the SGLang baseline: its device tier evicts from the tail "
            f"(sglang or vllm presets), not {policy.spec}"
        )


# ---------------------------------------------------------------------- tier moves (O(1) each)
def promote(cache: RadixKVCache, node: Node) -> None:
    """CPU -> GPU for a whole node (a load, or an insert that meets a CPU node). Hicache keeps
    the host copy."""
    size = len(node.ids)
    node.tier = _GPU
    if not cache._hicache:
        cache._cpu -= size
    cache._gpu += size
    if node.lock:
        cache._protected += size
    else:
        cache._evictable += size


def _demote(cache: RadixKVCache, node: Node, result: EvictResult) -> None:
    """GPU -> CPU for a whole unlocked node (hicache: it must be backed up already)."""
    size = len(node.ids)
    node.tier = _CPU
    if cache._hicache:
        assert node.host, f"demoting a node without a host copy: {node!r}"
    else:
        cache._cpu += size
        cache._d2h += size
    cache._gpu -= size
    cache._evictable -= size
    result.demoted.append(node.ids)
    result.demoted_blocks += size
    result.freed_blocks += size


# ---------------------------------------------------------------------- entry points
def free_gpu(cache: RadixKVCache, need: int) -> EvictResult:
    """Free ``need`` GPU blocks (need <= evictable GPU blocks) by demotion and deletion."""
    result = EvictResult(ok=need <= 0)
    if need <= 0:
        return result
    if cache._hicache:
        _hicache_evict_device(cache, need, result)
    else:
        _unified_free(cache, need, result)
    result.ok = result.freed_blocks >= need
    return result


def load(cache: RadixKVCache, node: Node) -> LoadResult:
    if cache._hicache:
        return _hicache_load(cache, node)
    return _unified_load(cache, node)


# ---------------------------------------------------------------------- unified
def _unified_free(cache: RadixKVCache, need: int, result: EvictResult) -> None:
    delete = need - cache.cpu_free_blocks
    if delete > 0:
        evictor.evict(cache, delete, result)
    rest = need - result.freed_blocks
    if rest > 0:
        room = cache.cpu_free_blocks
        assert rest <= room, f"demotion of {rest} blocks into {room} free CPU blocks"
        _apply_demotions(cache, _plan_demotions(cache, rest, room), result)


def _unified_load(cache: RadixKVCache, node: Node) -> LoadResult:
    path = []
    nd = node
    while nd is not cache.root:
        if nd.tier is _CPU:
            path.append(nd)
        nd = nd.parent  # type: ignore[assignment]
    total = sum(len(x.ids) for x in path)
    if total == 0:
        return LoadResult(ok=True)
    gpu_free = max(cache.free_blocks, 0)
    cpu_free = cache.cpu_free_blocks
    direct = min(total, gpu_free)
    need = total - direct
    swap = max(0, need - (cpu_free + direct))
    if need > cache._evictable or (swap and cache.swap_buffer_blocks <= 0):
        return LoadResult(ok=False)
    res = LoadResult(ok=True, swap_blocks=swap)
    if swap:
        res.swap_chunks = -(-swap // cache.swap_buffer_blocks)
    if need:
        ev = EvictResult(ok=True)
        _apply_demotions(cache, _plan_demotions(cache, need, cpu_free + total), ev)
        res.demoted_blocks = ev.demoted_blocks
        res.demoted = ev.demoted
    return _promote_path(cache, path, total, res)


def _plan_demotions(cache: RadixKVCache, need: int, room: int) -> list[tuple[Node, int, bool]]:
    """The first ``need`` GPU blocks of the deletion order, replayed virtually (the tree is not
    changed): ``(node, k, head)`` = demote the first (head) or last k blocks of node. Mirrors
    ``evictor.evict`` step for step, with 'freed' nodes tracked in ``gone`` and live child
    counts in ``kids``; CPU nodes are passed over (virtually deleted, not counted)."""
    policy = cache.policy
    key = policy.victim_order.key
    whole = policy.granularity is Granularity.NODE
    start = policy.start
    tail = start is StartPosition.TAIL or (whole and start is StartPosition.LEAF_HEAD)
    root = cache.root
    gone: set[Node] = set()
    kids: dict[Node, int] = {}

    def live(nd: Node) -> int:
        return kids.get(nd, len(nd.children))

    def is_hole(nd: Node) -> bool:
        return nd.tier is _NONE or nd in gone

    def head_start(leaf: Node) -> Node:  # policies.eviction.private_head_start, virtually
        nd = leaf
        while True:
            parent = nd.parent
            if (
                parent is None
                or parent is root
                or live(parent) > 1
                or parent.lock > 0
                or is_hole(parent)
            ):
                return nd
            nd = parent

    def vfree(nd: Node) -> Node | None:
        gone.add(nd)
        if live(nd):
            return None
        cur = nd
        while cur is not root and is_hole(cur) and live(cur) == 0 and cur.lock == 0:
            parent = cur.parent
            assert parent is not None
            kids[parent] = live(parent) - 1
            cur = parent
        if cur is not root and not is_hole(cur) and cur.lock == 0 and live(cur) == 0:
            return cur
        return None

    plan: list[tuple[Node, int, bool]] = []
    heap = [(key(leaf), leaf) for leaf in cache._leaves]
    heapq.heapify(heap)
    while need > 0 and heap:
        _, leaf = heapq.heappop(heap)
        chain = ([leaf] if tail or start is StartPosition.LEAF_HEAD
                 else evictor.chain_from(head_start(leaf), leaf))
        survivor = None
        for nd in chain:
            if need <= 0:
                break
            size = len(nd.ids)
            if nd.tier is _GPU:
                k = size if whole else min(size, need)
                k = min(k, room)
                plan.append((nd, k, not tail))
                need -= k
                room -= k
                if k < size:
                    break  # the order stops inside this node: need is met
            survivor = vfree(nd)
        if survivor is not None and need > 0:
            heapq.heappush(heap, (key(survivor), survivor))
    assert need <= 0, f"demotion plan short by {need} blocks"
    return plan


def _apply_demotions(
    cache: RadixKVCache, plan: list[tuple[Node, int, bool]], result: EvictResult
) -> None:
    for nd, k, head in plan:
        size = len(nd.ids)
        if k == size:
            target = nd
        elif head:
            target = cache._split(nd, k)  # the prefix moves, nd keeps its identity
        else:
            cache._split(nd, size - k)  # nd keeps its identity as the moving suffix
            target = nd
        _demote(cache, target, result)


# ---------------------------------------------------------------------- hicache
def hicache_on_hit(cache: RadixKVCache, path: list[Node]) -> None:
    """Write-through backups after a touching match (path already counted its hits)."""
    policy = cache.write_policy
    if policy == "write_back":
        return
    threshold = 2 if policy == "write_through_selective" else 1
    for nd in path:
        if (
            nd.tier is _GPU
            and not nd.host
            and nd.hit_count >= threshold
            and not _backup(cache, nd)
        ):
            return  # no host room: deeper nodes cannot be backed up either


def hicache_on_insert(cache: RadixKVCache, path: list[Node]) -> None:
    """An insert counts a hit on every node of its path (all device-resident now)."""
    if cache.write_policy == "write_back":
        return
    for nd in path:
        nd.hit_count += 1
    hicache_on_hit(cache, path)


def _backup(cache: RadixKVCache, node: Node, result: EvictResult | None = None) -> bool:
    """Copy ``node`` (and first its unbacked ancestors) to host; False if host room ran out.
    Host-only nodes deleted to make host room are counted in ``result`` when given."""
    chain = []
    nd = node
    while nd is not cache.root and not nd.host:
        chain.append(nd)
        nd = nd.parent  # type: ignore[assignment]
    for nd in reversed(chain):
        size = len(nd.ids)
        if cache.cpu_free_blocks < size:
            _hicache_evict_host(cache, size, result)
            if cache.cpu_free_blocks < size:
                return False
        nd.host = True
        cache._cpu += size
        cache._d2h += size
    return True


def _hicache_evict_host(cache: RadixKVCache, n: int, result: EvictResult | None = None) -> int:
    """Delete at least n host blocks: LRU over host-only childless unlocked nodes."""
    key = cache.policy.victim_order.key
    heap = [(key(x), x) for x in cache._leaves if x.tier is _CPU]
    heapq.heapify(heap)
    scratch = result if result is not None else EvictResult(ok=True)
    before = scratch.deleted_blocks
    while scratch.deleted_blocks - before < n and heap:
        _, x = heapq.heappop(heap)
        parent = x.parent
        cache._free(x, scratch)  # CPU -> NONE, childless: leaves the tree
        if (
            parent is not None
            and parent is not cache.root
            and parent.tier is _CPU
            and parent.lock == 0
            and not parent.children
        ):
            heapq.heappush(heap, (key(parent), parent))
    return scratch.deleted_blocks - before


def _device_leaf(cache: RadixKVCache, nd: Node) -> bool:
    return (
        nd is not cache.root
        and nd.tier is _GPU
        and nd.lock == 0
        and all(c.tier is not _GPU for c in nd.children.values())
    )


def _hicache_evict_device(cache: RadixKVCache, need: int, result: EvictResult) -> None:
    """SGLang ``HiRadixCache.evict``: LRU over device leaves; demote backed-up, delete others."""
    key = cache.policy.victim_order.key
    whole = cache.policy.granularity is Granularity.NODE
    heap = []
    stack = [cache.root]
    while stack:  # device nodes are prefix-closed: walk the device part only
        nd = stack.pop()
        device_children = False
        for c in nd.children.values():
            if c.tier is _GPU:
                device_children = True
                stack.append(c)
        if nd is not cache.root and nd.lock == 0 and not device_children:
            heap.append((key(nd), nd))
    heapq.heapify(heap)
    target_freed = result.freed_blocks + need
    while result.freed_blocks < target_freed and heap:
        _, x = heapq.heappop(heap)
        size = len(x.ids)
        want = target_freed - result.freed_blocks
        if not whole and want < size:
            cache._split(x, size - want)  # x keeps its identity as the evicted tail
        parent = x.parent
        assert parent is not None
        if not x.host and cache.write_policy == "write_back":
            _backup(cache, x, result)  # host eviction may delete blocks demoted just before
        if x.host:
            _demote(cache, x, result)
        else:
            assert not x.children, f"a device node with host children is not backed up: {x!r}"
            cache._free(x, result)
        if _device_leaf(cache, parent):
            heapq.heappush(heap, (key(parent), parent))


def _promote_path(cache: RadixKVCache, path: list[Node], total: int,
                  res: LoadResult) -> LoadResult:
    """Bring the CPU nodes of ``path`` (deepest first) to the GPU, root side first."""
    for x in reversed(path):
        promote(cache, x)
        res.loaded.append(x.ids)
    res.loaded_blocks = total
    return res


def _hicache_load(cache: RadixKVCache, node: Node) -> LoadResult:
    path = []
    nd = node
    while nd is not cache.root and nd.tier is _CPU:
        path.append(nd)
        nd = nd.parent  # type: ignore[assignment]
    total = sum(len(x.ids) for x in path)
    if total == 0:
        return LoadResult(ok=True)
    if total * cache.block_size < cache.load_threshold_tokens:
        return LoadResult(ok=True, skipped=True)
    need = total - cache.free_blocks
    res = LoadResult(ok=True)
    if need > 0:
        if need > cache._evictable:
            return LoadResult(ok=False)
        ev = EvictResult(ok=True)
        _hicache_evict_device(cache, need, ev)
        res.demoted_blocks, res.deleted_blocks = ev.demoted_blocks, ev.deleted_blocks
        res.demoted = ev.demoted
    return _promote_path(cache, path, total, res)
