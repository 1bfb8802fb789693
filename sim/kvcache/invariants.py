"""DFS recount of every cache counter and structural invariant (SGLang's ``total_size()``
pattern). Runs after every public operation when the cache has ``debug=True``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .node import Tier

if TYPE_CHECKING:
    from .tree import RadixTree


def recount(cache: RadixTree, *, holes_allowed: bool, cpu_tier: bool, host_copies: bool
            ) -> None:
    """Raise AssertionError naming the first violated invariant. ``holes_allowed``: the
    policy makes holes; ``cpu_tier``: CPU nodes may exist; ``host_copies``: HiCache's host
    copies beside device copies."""
    root = cache.root
    gpu = evictable = protected = holes = cpu = dropped = 0
    hicache = host_copies
    leaves = set()
    serials = set()
    stack = [root]
    while stack:
        node = stack.pop()
        child_locks = 0
        for key, child in node.children.items():
            where = f"{child!r} under {node!r}"
            assert child.parent is node, f"parent link broken: {where}"
            assert len(child.ids) > 0, f"empty node: {where}"
            assert child.last == int(child.ids[-1]), f"cached last id stale: {where}"
            assert key == int(child.ids[0]), f"child key {key} != first id: {where}"
            assert child.start == node.start + len(node.ids), f"positions not contiguous: {where}"
            assert child.lock >= 0, f"negative lock: {where}"
            # A node is DROPPED exactly when its keys are dropped keys (never refilled).
            negative = child.ids < 0
            assert negative.all() if child.tier == Tier.DROPPED else not negative.any(), (
                f"dropped keys and DROPPED state disagree: {where}")
            assert child.serial not in serials, f"serial reused: {where}"
            serials.add(child.serial)
            child_locks += child.lock
            stack.append(child)
        if node is root:
            continue
        size = len(node.ids)
        assert node.lock >= child_locks, f"lock {node.lock} < children's {child_locks}: {node!r}"
        assert node.last_access <= cache.clock, f"stamp from the future: {node!r}"
        parent = node.parent
        if node.host:
            assert hicache, f"host copy outside hicache: {node!r}"
            assert node.tier != Tier.NONE, f"host flag on a hole: {node!r}"
            assert parent is root or parent.host, f"backed-up nodes not a prefix: {node!r}"
            cpu += size
        if node.tier == Tier.GPU:
            gpu += size
            if node.lock:
                protected += size
            else:
                evictable += size
                if not node.children:
                    leaves.add(node)
            if hicache:
                assert parent is root or parent.tier == Tier.GPU, (
                    f"device nodes not a prefix: {node!r} under {parent!r}"
                )
        elif node.tier == Tier.NONE:
            holes += size
            assert holes_allowed, f"hole under non-hole policy: {node!r}"
            assert node.children or node.lock, f"childless unlocked hole not removed: {node!r}"
        elif node.tier == Tier.DROPPED:
            dropped += size
            assert node.children or node.lock, f"childless unlocked DROPPED node: {node!r}"
            assert not node.host, f"host copy of a DROPPED node: {node!r}"
        else:
            assert cpu_tier, f"CPU node without a CPU tier: {node!r}"
            if hicache:
                assert node.host, f"host-only node without its host copy: {node!r}"
            else:
                cpu += size
            if not node.lock and not node.children:
                leaves.add(node)
    got = (
        cache.gpu_blocks,
        cache.evictable_blocks,
        cache.protected_blocks,
        cache.hole_blocks,
        cache.cpu_blocks,
        cache.dropped_blocks,
    )
    want = (gpu, evictable, protected, holes, cpu, dropped)
    assert got == want, (f"counters (gpu, evictable, protected, holes, cpu, dropped) {got} "
                         f"!= recount {want}")

    assert cpu <= cache.cpu_capacity_blocks, f"cpu {cpu} > capacity {cache.cpu_capacity_blocks}"
    extra, missing = cache.leaves() - leaves, leaves - cache.leaves()
    assert not extra and not missing, f"leaf set wrong: extra {extra}, missing {missing}"
    assert cache.reserved_blocks >= 0, f"negative reserved {cache.reserved_blocks}"
    assert gpu <= cache.capacity_blocks, f"gpu {gpu} > capacity {cache.capacity_blocks}"
