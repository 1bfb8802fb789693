"""SGLang 0.5.23's cache protocol with chunk checkpoints: the op streams of
benchmarks/opstream.py plus CHUNK ops, replayed through the real UnifiedRadixCache
(benchmarks/sglang_unified_ref.py) or kvsim's RadixKVCache (``sglang`` preset, public API).

CHUNK r   the next prefill chunk of r finished (chunked prefill of `chunk` tokens): its
          computed prefix is written into the tree (checkpoint_into_tree): insert the full
          blocks of the first hit*bs + j*chunk tokens (j = the request's j-th CHUNK op), free
          the request's own copies of blocks someone else inserted since (duplicates), move
          its lock to the node the insert ended on. A boundary at or past the prompt's end is
          no chunk (the prefill ended earlier): the op does nothing.
FINISH r  checkpoint at finish: insert the full blocks of prompt + output - 1 tokens, free
          duplicates, then insert the prompt's blocks again (SGLang splits the leaf at the
          prompt boundary so eviction can drop the output without the prompt), release.

ARRIVE, ALLOC and TOUCH are as in opstream. Capacity, in blocks: free = capacity - blocks in
the tree - blocks requests hold outside it. A request's allocation (ALLOC) moves into the tree
as it is checkpointed; its duplicates return to the free pool; the rest returns at FINISH.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from benchmarks.opreplay import Observation, evict_and_reserve, kvsim_state, sorted_ids
from benchmarks.opstream import ALLOC, ARRIVE, FINISH, OpStream, Request

CHUNK = 4
CHUNK_OP_NAMES = ("ARRIVE", "ALLOC", "FINISH", "TOUCH", "CHUNK")


def with_chunks(stream: OpStream, chunk_tokens: int, seed: int = 0) -> OpStream:
    """`stream` with CHUNK ops for every request: as many as its prompt could need (hit 0),
    each placed at a random point after its ALLOC and before its FINISH, in order."""
    if chunk_tokens < 1:
        raise ValueError("chunk_tokens must be >= 1")
    rng = np.random.default_rng(seed)
    alloc_at: dict[int, int] = {}
    finish_at: dict[int, int] = {}
    for i, (op, rid) in enumerate(stream.ops):
        if op == ALLOC:
            alloc_at[rid] = i
        elif op == FINISH:
            finish_at[rid] = i
    inserts: dict[int, list[tuple[int, int]]] = {}  # op index -> CHUNK ops placed after it
    for rid, a in alloc_at.items():
        n = -(-stream.request(rid).in_tokens // chunk_tokens) - 1
        if n <= 0:
            continue
        spots = np.sort(rng.integers(a, finish_at[rid], size=n))
        for s in spots.tolist():
            inserts.setdefault(s, []).append((CHUNK, rid))
    ops: list[tuple[int, int]] = []
    for i, op in enumerate(stream.ops):
        ops.append(op)
        ops.extend(inserts.get(i, ()))
    return replace(stream, name=f"{stream.name}-chunk{chunk_tokens}", ops=ops)


class UnifiedSide:
    """SGLang 0.5.23's UnifiedRadixCache (pure-Python tree core), block ids in and out."""

    def __init__(self, capacity_blocks: int, block_size: int, chunk_tokens: int) -> None:
        from benchmarks.sglang_unified_ref import UnifiedRef

        self.name = "SGLang UnifiedRadixCache"
        self.ref = UnifiedRef(capacity_blocks, block_size)
        self.alloc_ = self.ref.allocator
        self.bs, self.chunk_tokens = block_size, chunk_tokens
        self._st: dict[int, list[Any]] = {}  # rid -> [request, hit, granted, chunks seen]

    def arrive(self, rid: int, req: Request) -> int:
        hit, node = self.ref.match(req.match_ids)
        self.ref.admit(rid, req.finish_ids[: req.in_tokens // self.bs], node, hit)
        self._st[rid] = [req, hit, 0, 0]
        return hit

    def held(self, rid: int) -> int:
        _, hit, granted, _ = self._st[rid]
        return granted - (self.ref.protected_len(rid) - hit) if granted > 0 else 0

    def alloc(self, rid: int, need: int) -> tuple[bool, np.ndarray]:
        st = self._st[rid]
        n = need - st[1]
        free = self.alloc_.capacity_blocks - self.alloc_.used
        shortfall = n - free
        if shortfall > self.ref.evictable_blocks:
            st[2] = -1
            return False, np.empty(0, np.int64)
        if shortfall > 0:
            self.ref.evict(shortfall)
        freed = self.alloc_.take_freed()
        self.alloc_.used += n
        st[2] = n
        return True, freed

    def chunk(self, rid: int) -> np.ndarray:
        st = self._st[rid]
        req, hit, granted, j = st
        st[3] = j + 1
        boundary = hit * self.bs + (j + 1) * self.chunk_tokens
        if granted < 0 or boundary >= req.in_tokens or boundary < self.bs:
            return np.empty(0, np.int64)
        self.ref.checkpoint(rid, req.finish_ids[: boundary // self.bs], finished=False)
        return self.alloc_.take_freed()

    def finish(self, rid: int) -> np.ndarray:
        req, _, granted, _ = self._st[rid]
        if granted >= 0 and len(req.finish_ids):
            self.ref.checkpoint(rid, req.finish_ids, finished=True)
        held = self.held(rid)
        self.ref.release(rid)
        del self._st[rid]
        self.alloc_.used -= held
        return self.alloc_.take_freed()

    def touch(self, req: Request) -> None:
        self.ref.touch(req.match_ids)

    def observe(self) -> dict[str, Any]:
        ref = self.ref
        return {
            "tree_blocks": ref.tree_blocks,
            "evictable": ref.evictable_blocks,
            "protected": ref.protected_blocks,
            "reserved": sum(self.held(r) for r in self._st),
            "resident": ref.resident_block_ids(),
        }


class KvsimChunkSide:
    """kvsim's RadixKVCache (a preset) driven through the same protocol, public API only."""

    def __init__(
        self, capacity_blocks: int, block_size: int, chunk_tokens: int, preset: str = "sglang"
    ) -> None:
        from sim.kvcache import RadixKVCache

        self.name = f"kvsim {preset}"
        self.cache = RadixKVCache(capacity_blocks, preset, block_size=block_size, debug=True)
        self.bs, self.chunk_tokens = block_size, chunk_tokens
        # rid -> [request, node, hit, granted, protected, chunks seen]
        self._st: dict[int, list[Any]] = {}

    def arrive(self, rid: int, req: Request) -> int:
        m = self.cache.match(req.match_ids, touch=True)
        self.cache.lock(m.node)
        self._st[rid] = [req, m.node, m.hit_blocks, 0, m.hit_blocks, 0]
        return m.hit_blocks

    def alloc(self, rid: int, need: int) -> tuple[bool, np.ndarray]:
        st = self._st[rid]
        n = need - st[2]
        ok, freed = evict_and_reserve(self.cache, n)
        st[3] = n if ok else -1
        return ok, sorted_ids(freed)

    def _checkpoint(self, st: list[Any], ids: np.ndarray) -> np.ndarray:
        """Insert ``ids``, hand the request's blocks to the tree, move its lock."""
        cache = self.cache
        ins = cache.insert(ids)
        protected = st[4]
        dups = ids[protected : ins.existing_blocks]
        cache.release(len(ids) - protected)
        cache.unlock(st[1])
        cache.lock(ins.node)
        st[1], st[4] = ins.node, len(ids)
        return np.sort(dups)

    def chunk(self, rid: int) -> np.ndarray:
        st = self._st[rid]
        req, _, hit, granted, _, j = st
        st[5] = j + 1
        boundary = hit * self.bs + (j + 1) * self.chunk_tokens
        if granted < 0 or boundary >= req.in_tokens or boundary < self.bs:
            return np.empty(0, np.int64)
        return self._checkpoint(st, req.finish_ids[: boundary // self.bs])

    def finish(self, rid: int) -> np.ndarray:
        st = self._st.pop(rid)
        req, _, hit, granted, _, _ = st
        freed = np.empty(0, np.int64)
        if granted >= 0:
            if len(req.finish_ids):
                freed = self._checkpoint(st, req.finish_ids)
                prompt = req.in_tokens // self.bs
                if 0 < prompt < len(req.finish_ids):  # SGLang's split at the prompt boundary
                    self.cache.insert(req.finish_ids[:prompt])
            self.cache.release(granted - (st[4] - hit))
        self.cache.unlock(st[1])
        return freed

    def touch(self, req: Request) -> None:
        self.cache.match(req.match_ids, touch=True)

    def observe(self) -> dict[str, Any]:
        return kvsim_state(self.cache)


def replay_chunked(stream: OpStream, side: Any, observe: bool = True) -> Iterator[Observation]:
    """Run `stream` (with CHUNK ops) through `side`, one Observation per op."""
    live: dict[int, Request] = {}
    for i, (op, rid) in enumerate(stream.ops):
        ob = Observation(i, op, rid)
        if op == ARRIVE:
            req = stream.request(rid)
            live[rid] = req
            ob.hit = side.arrive(rid, req)
        elif op == ALLOC:
            ob.ok, ob.freed = side.alloc(rid, live[rid].need_blocks)
        elif op == CHUNK:
            ob.freed = side.chunk(rid)
        elif op == FINISH:
            live.pop(rid)
            ob.freed = side.finish(rid)
        else:
            side.touch(live.get(rid) or stream.request(rid))
        if observe:
            ob.state = side.observe()
        yield ob
