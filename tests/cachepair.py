"""Two radix caches driven by one random op stream, compared step by step.

The differential tests of the cache's fast paths (tests/test_speed_paths.py,
tests/test_server_fast_paths.py) feed a fast cache and its reference the same prompts, request
ends and evictions; every result, counter and node must stay identical. Each test gives only
its variant: the two caches and whether the first inserts and locks in one call.
"""

from __future__ import annotations

from hypothesis import strategies as st

from sim.kvcache import CapacityError, RadixKVCache
from tests.chained import Universe

# (kind, new choices, which earlier prompt, lock it?, a size): kind 0 a prompt, 1 an end,
# 2 an eviction of ``size`` blocks
OPS = st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 2), min_size=1,
                                                      max_size=12),
                         st.integers(0, 3), st.booleans(), st.integers(1, 20)),
               min_size=1, max_size=40)


def structure(cache: RadixKVCache) -> list[tuple]:
    """Every node, depth first in key order: position, ids, tier, lock, stamp, hits, serial,
    host copy."""
    out = []
    stack = [cache.root]
    while stack:
        nd = stack.pop()
        out.append((nd.start, tuple(nd.ids.tolist()), int(nd.tier), nd.lock, nd.last_access,
                    nd.hit_count, nd.serial, nd.host))
        stack.extend(nd.children[k] for k in sorted(nd.children, reverse=True))
    return out


def counters(cache: RadixKVCache) -> tuple[int, ...]:
    return (cache.gpu_blocks, cache.free_blocks, cache.evictable_blocks,
            cache.protected_blocks, cache.hole_blocks, cache.reserved_blocks)


def drive_pair(a: RadixKVCache, b: RadixKVCache, ops, fused: bool = False) -> None:
    """The same prompts, ends and evictions on ``a`` and ``b``; identical step by step.
    ``fused``: ``a`` inserts and locks in one call, ``b`` inserts, then locks."""
    universe = Universe()
    history: list[list[int]] = []
    locked: list[tuple] = []
    for kind, more, base, lock, n in ops:
        if kind == 0:  # a prompt: maybe an earlier one cut, plus new blocks; room, insert
            choices = (history[base % len(history)][: n % 8] if history else []) + more
            history.append(choices)
            ids = universe.prompt(choices)
            results, handles = [], []
            for i, cache in enumerate((a, b)):
                in_one_call = fused and lock and i == 0
                room = cache.make_room(len(ids))
                try:
                    ins = cache.insert(ids, lock=in_one_call)
                except CapacityError:
                    results.append((room.freed_blocks, None))
                    continue
                results.append((room.freed_blocks, room.holes_made,
                                room.freed_ids().tolist(), ins.new_blocks, ins.filled_blocks))
                if lock:
                    if not in_one_call:
                        cache.lock(ins.node)
                    handles.append(ins.node)
            assert results[0] == results[1]
            if len(handles) == 2:
                locked.append(tuple(handles))
        elif kind == 1 and locked:  # a request ends
            x, y = locked.pop(base % len(locked))
            a.unlock(x)
            b.unlock(y)
        else:
            got = [(r.ok, r.freed_blocks, r.holes_made, r.freed_ids().tolist())
                   for r in (a.evict(n), b.evict(n))]
            assert got[0] == got[1]
        assert counters(a) == counters(b)
        assert structure(a) == structure(b)
        assert sorted(x.serial for x in a.tree.leaves()) == \
            sorted(x.serial for x in b.tree.leaves())
