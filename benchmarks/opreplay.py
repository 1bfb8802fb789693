"""Replayers of cache op streams (benchmarks/opstream.py): the same stream through SGLang's
RadixCache (``SglangSide``) or kvsim's cache (``OursSide``), op by op with the state after
each op (``replay``, for differential tests) or timing only the cache calls (``timed_replay``,
for benchmarks). ``replay`` also runs the CHUNK ops of the UnifiedRadixCache sides and the
hybrid sides of benchmarks/sglang_unified_ops.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from benchmarks.opstream import ALLOC, ARRIVE, CHUNK, FINISH, OpStream, Request


class CacheSide(Protocol):
    """One cache under test, driven op by op (all sizes in blocks)."""

    name: str

    def prepare(self, req: Request) -> Any: ...
    def arrive(self, rid: int, inp: Any) -> int: ...
    def alloc(self, rid: int, need: int) -> tuple[bool, np.ndarray]: ...
    def finish(self, rid: int, inp: Any) -> np.ndarray: ...
    def touch(self, inp: Any) -> None: ...
    def observe(self) -> dict[str, Any]: ...
    # Sides of SGLang 0.5.23 (benchmarks/sglang_unified_ops.py) also take CHUNK ops
    # (``chunk(rid)``, its freed ids), and a hybrid side's ``arrive`` returns (hit, branching
    # point) and its ``take()`` the (full, SWA) ids an op freed (freed states as -1s).


@dataclass
class Observation:
    """What one op did, and (when observed) the cache state after it. ``branching`` and
    ``swa``: a hybrid tree's branching point (blocks) and what its second pool freed."""

    index: int
    op: int
    rid: int
    hit: int = -1
    ok: bool = True
    freed: np.ndarray | None = None
    state: dict[str, Any] | None = None
    branching: int | None = None
    swa: np.ndarray | None = None


_EMPTY = np.empty(0, np.int64)


def kvsim_state(c: Any) -> dict[str, Any]:
    """What a differential test compares of kvsim's cache after an op (a ``RadixKVCache``)."""
    return {
        "tree_blocks": c.gpu_blocks,
        "evictable": c.evictable_blocks,
        "protected": c.protected_blocks,
        "reserved": c.reserved_blocks,
        "resident": np.sort(np.asarray(c.resident_block_ids(), np.int64)),
    }


def sglang_state(ref: Any, reserved: int) -> dict[str, Any]:
    """``kvsim_state``'s fields of an SGLang tree (benchmarks/sglang_ref.py ``SglangRef`` or
    benchmarks/sglang_unified_ref.py ``UnifiedRef``) whose requests hold ``reserved`` blocks
    outside it."""
    return {
        "tree_blocks": ref.tree_blocks,
        "evictable": ref.evictable_blocks,
        "protected": ref.protected_blocks,
        "reserved": reserved,
        "resident": ref.resident_block_ids(),
    }


def evict_and_reserve(cache: Any, n: int) -> tuple[bool, list[np.ndarray]]:
    """The stream's ALLOC on kvsim's cache: evict the shortfall if free < n (SGLang's
    evict_to_free_tokens), then reserve n blocks if they are free. (ok, freed id parts)."""
    freed: list[np.ndarray] = []
    if n > cache.free_blocks:
        freed = cache.make_room(n).freed
    ok = cache.free_blocks >= n
    if ok:
        cache.reserve(n)
    return ok, freed


def sorted_ids(parts: list[np.ndarray]) -> np.ndarray:
    """The block ids of ``parts`` as one sorted int64 array (a multiset of freed ids)."""
    if not parts:
        return np.empty(0, np.int64)
    return np.sort(np.concatenate(parts).astype(np.int64, copy=False))


class SglangSide:
    """SGLang's RadixCache with the stream's capacity accounting around it.

    `record=False` (speed runs): freed ids are not collected; alloc/finish return empty arrays.
    """

    def __init__(self, capacity_blocks: int, block_size: int = 64, record: bool = True) -> None:
        from benchmarks.sglang_ref import SglangRef

        self.name = "SGLang RadixCache"
        self.ref = SglangRef(block_size, record=record)
        self.capacity = capacity_blocks
        self.reserved = 0
        self._running: dict[int, list[Any]] = {}  # rid -> [node, hit, granted]

    def prepare(self, req: Request) -> Any:
        ref = self.ref
        value = ref.value(req.finish_ids)
        return ref.key(req.match_ids), ref.key(req.finish_ids), value

    @property
    def free_blocks(self) -> int:
        return self.capacity - self.ref.tree_blocks - self.reserved

    def arrive(self, rid: int, inp: Any) -> int:
        hit, node = self.ref.match(inp[0])
        self.ref.lock(node)
        self._running[rid] = [node, hit, 0]
        return hit

    def alloc(self, rid: int, need: int) -> tuple[bool, np.ndarray]:
        st = self._running[rid]
        n = need - st[1]
        shortfall = n - self.free_blocks
        if shortfall > self.ref.evictable_blocks:
            # SGLang's admission check (free + evictable) turns the request away before any
            # eviction; here it is aborted.
            st[2] = -1
            return False, np.empty(0, np.int64)
        if shortfall > 0:
            self.ref.evict(shortfall)
        freed = self.ref.allocator.take_freed()
        self.reserved += n
        st[2] = n
        return True, freed

    def finish(self, rid: int, inp: Any) -> np.ndarray:
        node, hit, granted = self._running.pop(rid)
        if granted >= 0:
            present = self.ref.insert(inp[1], inp[2])
            self.ref.free_duplicates(inp[2], hit, present)
            self.reserved -= granted
        self.ref.unlock(node)
        return self.ref.allocator.take_freed()

    def touch(self, inp: Any) -> None:
        self.ref.touch(inp[0])

    def observe(self) -> dict[str, Any]:
        return sglang_state(self.ref, self.reserved)


class OursSide:
    """Our RadixKVCache under one eviction preset, driven by block ids.

    `record=False` (speed runs): freed ids are not collected; alloc/finish return empty arrays.
    """

    def __init__(
        self,
        capacity_blocks: int,
        preset: str = "sglang",
        debug: bool = False,
        record: bool = True,
    ) -> None:
        from policies import get_policy
        from sim.kvcache import RadixKVCache, Tier

        self._gpu = Tier.GPU
        self.record = record
        self.name = f"kvsim {preset}"
        self.cache = RadixKVCache(capacity_blocks, get_policy(preset), debug=debug)
        self._running: dict[int, list[Any]] = {}  # rid -> [node, reuse, granted, no_holes]

    def prepare(self, req: Request) -> Any:
        return req

    def arrive(self, rid: int, inp: Any) -> int:
        """Match + lock. Returns the GPU blocks the request reuses: SGLang's hit length for
        presets without holes; with holes, also the GPU runs after a hole (the request
        recomputes only the holes, as a phantom prefill, and its new blocks)."""
        m = self.cache.match(inp.match_ids, touch=True)
        self.cache.lock(m.node)
        reuse = m.hit_blocks if m.hit_blocks == m.matched_blocks else m.blocks_in(self._gpu)
        self._running[rid] = [m.node, reuse, 0, reuse == m.hit_blocks]
        return reuse

    def alloc(self, rid: int, need: int) -> tuple[bool, np.ndarray]:
        st = self._running[rid]
        n = need - st[1]
        ok, freed = evict_and_reserve(self.cache, n)
        st[2] = n if ok else -1
        return ok, sorted_ids(freed) if self.record else _EMPTY

    def finish(self, rid: int, inp: Any) -> np.ndarray:
        """Insert, release, unlock. Returns the ids of the request's own copies of blocks that
        were already GPU-resident at insert (duplicates); after a match through holes only
        their count is known, so then it returns nothing (only `sglang` is compared)."""
        node, reuse, granted, no_holes = self._running.pop(rid)
        freed = np.empty(0, np.int64)
        cache = self.cache
        if granted >= 0:
            ins = cache.insert(inp.finish_ids)
            present = ins.existing_blocks
            if self.record and no_holes and present > reuse:
                freed = np.sort(inp.finish_ids[reuse:present])
            cache.release(granted)
        cache.unlock(node)
        return freed

    def touch(self, inp: Any) -> None:
        self.cache.match(inp.match_ids, touch=True)

    def observe(self) -> dict[str, Any]:
        return kvsim_state(self.cache)


def replay(stream: OpStream, side: CacheSide, observe: bool = True) -> Iterator[Observation]:
    """Run `stream` through `side`, yielding one Observation per op (state only if `observe`)."""
    live: dict[int, tuple[Request, Any]] = {}  # running requests and their prepared inputs
    take = getattr(side, "take", None)
    for i, (op, rid) in enumerate(stream.ops):
        ob = Observation(i, op, rid)
        if op == ARRIVE:
            req = stream.request(rid)
            inp = side.prepare(req)
            live[rid] = (req, inp)
            hit = side.arrive(rid, inp)
            ob.hit, ob.branching = hit if isinstance(hit, tuple) else (hit, None)
        elif op == ALLOC:
            ob.ok, ob.freed = side.alloc(rid, live[rid][0].need_blocks)
        elif op == CHUNK:
            ob.freed = side.chunk(rid)
        elif op == FINISH:
            ob.freed = side.finish(rid, live.pop(rid)[1])
        else:
            side.touch(live[rid][1] if rid in live else side.prepare(stream.request(rid)))
        if take is not None:
            ob.freed, ob.swa = take()
        if observe:
            ob.state = side.observe()
        yield ob


@dataclass
class Timing:
    """Replay speed of one side: seconds spent inside cache operations only."""

    name: str
    requests: int
    ops: int
    seconds: float
    aborted: int
    hit_blocks: int

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else float("inf")


def timed_replay(stream: OpStream, side: CacheSide) -> Timing:
    """Replay without observations, timing only the cache calls (input conversion excluded:
    SGLang needs token arrays and KV tensors, we pass the stream's id arrays)."""
    perf = time.perf_counter
    live: dict[int, tuple[Request, Any]] = {}
    spent = 0.0
    aborted = hits = 0
    for op, rid in stream.ops:
        if op == ARRIVE:
            req = stream.request(rid)
            inp = side.prepare(req)
            live[rid] = (req, inp)
            t0 = perf()
            hits += side.arrive(rid, inp)
        elif op == ALLOC:
            need = live[rid][0].need_blocks
            t0 = perf()
            ok, _ = side.alloc(rid, need)
            aborted += not ok
        elif op == FINISH:
            inp = live.pop(rid)[1]
            t0 = perf()
            side.finish(rid, inp)
        else:
            inp = live[rid][1] if rid in live else side.prepare(stream.request(rid))
            t0 = perf()
            side.touch(inp)
        spent += perf() - t0
    return Timing(side.name, stream.n_requests, len(stream.ops), spent, aborted, hits)
