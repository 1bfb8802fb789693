"""SGLang 0.5.23's cache protocol for a sliding-window hybrid, replayed through the real
UnifiedRadixCache with its SWA component (benchmarks/sglang_swa_ref.py) or kvsim's
HybridRadixCache (sim/kvcache/hybridtree.py): the op streams of benchmarks/sglang_unified_ops.py
(ARRIVE, ALLOC, CHUNK, FINISH, TOUCH) with two pools.

ARRIVE r  match + lock (the scheduler also keeps the match's swa_branching_seqlen).
ALLOC r   the request's pages past its hit, in both pools: the full and SWA shortfalls evicted
          by one evict_for_alloc; refused (nothing allocated) when the evictable KV of either
          pool cannot cover its shortfall or the pools still lack room after eviction.
CHUNK r   the next prefill chunk's checkpoint (as in sglang_unified_ops): checkpoint_into_tree
          of an unfinished request, which first frees its out-of-window SWA KV.
FINISH r  the decode steps' out-of-window SWA free at the last decode step, the finish
          checkpoint, release_kv_cache (row free and unlock).
TOUCH r   a match of r's prompt without a lock.

Each op yields (hit, branching, ok, freed full ids, freed SWA ids, state): the state is the
pools' used pages, the evictable/protected sizes of both components and the resident full and
SWA block ids.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.opstream import ALLOC, ARRIVE, FINISH, OpStream, Request
from benchmarks.sglang_unified_ops import CHUNK

_EMPTY = np.empty(0, np.int64)


@dataclass
class SwaObservation:
    index: int
    op: int
    rid: int
    hit: int = -1
    branching: int | None = None
    ok: bool = True
    full: np.ndarray = field(default_factory=lambda: _EMPTY)
    swa: np.ndarray = field(default_factory=lambda: _EMPTY)
    state: dict[str, Any] | None = None


class RealSwaSide:
    """The real UnifiedRadixCache (FULL + SWA), block ids in and out."""

    def __init__(self, full_blocks: int, swa_blocks: int, window: int, block_size: int,
                 chunk_tokens: int) -> None:
        from benchmarks.sglang_swa_ref import SwaRef

        self.ref = SwaRef(full_blocks, swa_blocks, window, block_size)
        self.alloc_ = self.ref.allocator
        self.bs, self.chunk_tokens = block_size, chunk_tokens
        self._st: dict[int, list[Any]] = {}  # rid -> [request, hit, granted, chunks seen]

    def arrive(self, rid: int, req: Request) -> tuple[int, int | None]:
        hit, node, branching = self.ref.match(req.match_ids)
        self.ref.admit(rid, node, hit, branching)
        self._st[rid] = [req, hit, 0, 0]
        return hit, None if branching is None else branching // self.bs

    def alloc(self, rid: int, need: int) -> bool:
        st = self._st[rid]
        n = need - st[1]
        a, c = self.alloc_, self.ref.cache
        bs = self.bs
        full_short = n - (a.full_capacity - a.full_used)
        swa_short = n - (a.swa_capacity - a.swa_used)
        if (full_short > c.full_evictable_size() // bs
                or swa_short > c.swa_evictable_size() // bs):
            st[2] = -1
            return False
        if full_short > 0 or swa_short > 0:
            self.ref.evict(max(0, full_short), max(0, swa_short))
        if n > a.full_capacity - a.full_used or n > a.swa_capacity - a.swa_used:
            st[2] = -1
            return False
        self.ref.set_row(rid, st[0].finish_ids, st[1], n)
        st[2] = n
        return True

    def chunk(self, rid: int) -> None:
        st = self._st[rid]
        req, hit, granted, j = st
        st[3] = j + 1
        boundary = hit * self.bs + (j + 1) * self.chunk_tokens
        if granted <= 0 or boundary >= req.in_tokens or boundary < self.bs:
            return
        self.ref.checkpoint(rid, boundary // self.bs, finished=False)

    def finish(self, rid: int) -> None:
        req, _, granted, _ = self._st.pop(rid)
        if granted <= 0:
            self.ref.drop(rid)
            return
        self.ref.decode_to(rid, req.in_tokens + req.out_tokens - 1)
        if len(req.finish_ids):
            self.ref.checkpoint(rid, len(req.finish_ids), finished=True)
        self.ref.release(rid)

    def touch(self, req: Request) -> None:
        self.ref.match(req.match_ids)

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        return self.alloc_.take_freed()

    def observe(self) -> dict[str, Any]:
        return self.ref.state()


class KvsimSwaSide:
    """kvsim's HybridRadixCache through the same protocol."""

    def __init__(self, full_blocks: int, swa_blocks: int, window: int, block_size: int,
                 chunk_tokens: int) -> None:
        from sim.kvcache.hybridtree import Freed, HybridRadixCache

        self.cache = HybridRadixCache(full_blocks, swa_blocks, window, block_size)
        self._freed_cls = Freed
        self.freed = Freed()
        self.bs, self.chunk_tokens = block_size, chunk_tokens
        self._st: dict[int, list[Any]] = {}  # rid -> [request, SwaRequest, granted, chunks]

    def arrive(self, rid: int, req: Request) -> tuple[int, int | None]:
        r = self.cache.admit(req.match_ids, req.finish_ids)
        self._st[rid] = [req, r, 0, 0]
        return r.hit, r.branching

    def alloc(self, rid: int, need: int) -> bool:
        st = self._st[rid]
        n = need - st[1].hit
        ok = self.cache.allocate(st[1], n, self.freed)
        st[2] = n if ok else -1
        return ok

    def chunk(self, rid: int) -> None:
        st = self._st[rid]
        req, r, granted, j = st
        st[3] = j + 1
        boundary = r.hit * self.bs + (j + 1) * self.chunk_tokens
        if granted <= 0 or boundary >= req.in_tokens or boundary < self.bs:
            return
        self.cache.checkpoint(r, boundary // self.bs, False, self.freed)

    def finish(self, rid: int) -> None:
        req, r, granted, _ = self._st.pop(rid)
        if granted <= 0:
            self.cache.drop(r, self.freed)
            return
        self.cache.decode_to(r, req.in_tokens + req.out_tokens - 1, self.freed)
        if len(req.finish_ids):
            self.cache.checkpoint(r, len(req.finish_ids), True, self.freed)
        self.cache.release(r, self.freed)

    def touch(self, req: Request) -> None:
        self.cache.match(req.match_ids)

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        out = self.freed.ids()
        self.freed = self._freed_cls()
        return out

    def observe(self) -> dict[str, Any]:
        c = self.cache
        full, swa, _ = c.resident()
        return {
            "full_evictable": c.full_evictable,
            "full_protected": c.full_protected,
            "swa_evictable": c.swa_evictable,
            "swa_protected": c.swa_protected,
            "full_used": c.full_used,
            "swa_used": c.swa_used,
            "full": full,
            "swa": swa,
        }


class RealMambaSide:
    """The real UnifiedRadixCache (FULL + MAMBA, no extra buffer: page = token), token ids in
    and out (block_size 1)."""

    def __init__(self, full_tokens: int, slots: int, chunk_tokens: int) -> None:
        from benchmarks.sglang_swa_ref import MambaRef

        self.ref = MambaRef(full_tokens, slots)
        self.chunk_tokens = chunk_tokens
        self._st: dict[int, list[Any]] = {}  # rid -> [request, hit, granted, chunks seen]
        self._seen = 0

    def arrive(self, rid: int, req: Request) -> tuple[int, int | None]:
        hit, branching = self.ref.admit(rid, req.match_ids)
        self._st[rid] = [req, hit, 0, 0]
        return hit, branching

    def alloc(self, rid: int, need: int) -> bool:
        st = self._st[rid]
        n = need - st[1]
        ok = self.ref.allocate(rid, st[0].finish_ids, n)
        st[2] = n if ok else -1
        return ok

    def chunk(self, rid: int) -> None:
        st = self._st[rid]
        req, hit, granted, j = st
        st[3] = j + 1
        boundary = hit + (j + 1) * self.chunk_tokens
        if granted <= 0 or boundary >= req.in_tokens:
            return
        self.ref.checkpoint(rid, boundary, finished=False)

    def finish(self, rid: int) -> None:
        req, _, granted, _ = self._st.pop(rid)
        if granted <= 0:
            self.ref.drop(rid)
            return
        if len(req.finish_ids):
            self.ref.checkpoint(rid, len(req.finish_ids), finished=True)
        self.ref.release(rid)

    def touch(self, req: Request) -> None:
        self.ref.match(req.match_ids)

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        full, _ = self.ref.allocator.take_freed()
        slots = self.ref.pool.mamba_allocator
        n, self._seen = slots.freed - self._seen, slots.freed
        return full, np.full(n, -1, np.int64)  # freed states: a count

    def observe(self) -> dict[str, Any]:
        return self.ref.state()


class KvsimMambaSide:
    """kvsim's HybridRadixCache (FULL + MAMBA) through the same protocol."""

    def __init__(self, full_tokens: int, slots: int, chunk_tokens: int) -> None:
        from sim.kvcache.hybridtree import Freed, HybridRadixCache

        self.cache = HybridRadixCache(full_tokens, block_size=1, state_slots=slots, grid=64)
        self._freed_cls = Freed
        self.freed = Freed()
        self.chunk_tokens = chunk_tokens
        self._st: dict[int, list[Any]] = {}

    def arrive(self, rid: int, req: Request) -> tuple[int, int | None]:
        r = self.cache.admit(req.match_ids, req.finish_ids, self.freed)
        self._st[rid] = [req, r, 0, 0]
        return r.hit, r.mamba_branching

    def alloc(self, rid: int, need: int) -> bool:
        st = self._st[rid]
        n = need - st[1].hit
        ok = self.cache.allocate(st[1], n, self.freed)
        st[2] = n if ok else -1
        return ok

    def chunk(self, rid: int) -> None:
        st = self._st[rid]
        req, r, granted, j = st
        st[3] = j + 1
        boundary = r.hit + (j + 1) * self.chunk_tokens
        if granted <= 0 or boundary >= req.in_tokens:
            return
        self.cache.checkpoint(r, boundary, False, self.freed)

    def finish(self, rid: int) -> None:
        req, r, granted, _ = self._st.pop(rid)
        if granted <= 0:
            self.cache.drop(r, self.freed)
            return
        if len(req.finish_ids):
            self.cache.checkpoint(r, len(req.finish_ids), True, self.freed)
        self.cache.release(r, self.freed)

    def touch(self, req: Request) -> None:
        self.cache.match(req.match_ids)

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        full, _ = self.freed.ids()
        n = self.freed.states
        self.freed = self._freed_cls()
        return full, np.full(n, -1, np.int64)

    def observe(self) -> dict[str, Any]:
        c = self.cache
        full, _, states = c.resident()
        return {
            "full_evictable": c.full_evictable,
            "full_protected": c.full_protected,
            "state_evictable": c.state_evictable,
            "state_protected": c.state_protected,
            "full_used": c.full_used,
            "state_used": c.state_used,
            "full": full,
            "states": states,
        }


def replay_swa(stream: OpStream, side: Any) -> Iterator[SwaObservation]:
    """Run `stream` (with CHUNK ops) through `side`, one observation per op."""
    live: dict[int, Request] = {}
    for i, (op, rid) in enumerate(stream.ops):
        ob = SwaObservation(i, op, rid)
        if op == ARRIVE:
            req = stream.request(rid)
            live[rid] = req
            ob.hit, ob.branching = side.arrive(rid, req)
        elif op == ALLOC:
            ob.ok = side.alloc(rid, live[rid].need_blocks)
        elif op == CHUNK:
            side.chunk(rid)
        elif op == FINISH:
            live.pop(rid)
            side.finish(rid)
        else:
            side.touch(live.get(rid) or stream.request(rid))
        ob.full, ob.swa = side.take()
        ob.state = side.observe()
        yield ob
