"""SGLang 0.5.23's cache protocol with chunk checkpoints: the op streams of
benchmarks/opstream.py (ARRIVE, ALLOC, CHUNK, FINISH, TOUCH; ``with_chunks`` adds the CHUNK
ops), replayed by benchmarks/opreplay.py ``replay`` through the real UnifiedRadixCache
(benchmarks/sglang_unified_ref.py) or kvsim's cache, one side each:

- full attention: ``UnifiedSide`` (``UnifiedRef``) and ``KvsimChunkSide`` (RadixKVCache, the
  ``sglang`` preset, public API);
- a hybrid (``tree``: ``swa_blocks`` + ``window`` for a sliding-window model such as gpt-oss,
  or ``mamba_slots`` for a Gated DeltaNet one such as Qwen3-Next, page = token):
  ``RealHybridSide`` (``HybridRef``) and ``KvsimHybridSide`` (sim/kvcache/hybridtree.py).

CHUNK r   the next prefill chunk of r finished (chunked prefill of `chunk` tokens): its
          computed prefix is written into the tree (checkpoint_into_tree): the full blocks of
          the first hit*bs + j*chunk tokens (j = the request's j-th CHUNK op) inserted, the
          request's own copies of blocks someone else inserted since freed (duplicates), its
          lock moved to the node the insert ended on; a hybrid first frees the request's SWA
          KV older than the window. A boundary at or past the prompt's end is no chunk.
FINISH r  checkpoint at finish: insert the full blocks of prompt + output - 1 tokens, free
          duplicates, then insert the prompt's blocks again (SGLang splits the leaf at the
          prompt boundary so eviction can drop the output without the prompt), release. A
          hybrid first frees the decode steps' out-of-window SWA KV, and release_kv_cache
          frees its row (full KV past the protected prefix, SWA KV not freed yet).
ALLOC r   full attention: as in opstream. A hybrid: the request's pages past its hit in both
          pools (a Mamba model: its state slot first), the shortfalls evicted by one
          evict_for_alloc; refused (nothing allocated) when the evictable KV of a pool cannot
          cover its shortfall or the pools still lack room after eviction.
ARRIVE, TOUCH: as in opstream (a hybrid's ARRIVE also returns the match's branching point).

Capacity, in blocks: free = capacity - blocks in the tree - blocks requests hold outside it. A
request's allocation (ALLOC) moves into the tree as it is checkpointed; its duplicates return
to the free pool; the rest returns at FINISH. A hybrid side's ``take`` gives the full and SWA
block ids an op freed (freed Mamba states as one -1 each) and its state the pools' used pages,
the evictable/protected sizes of both components and the resident full and SWA (or state)
block ids.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.opreplay import evict_and_reserve, kvsim_state, sglang_state, sorted_ids
from benchmarks.opstream import Request


class UnifiedSide:
    """SGLang 0.5.23's UnifiedRadixCache (pure-Python tree core), block ids in and out."""

    def __init__(self, capacity_blocks: int, block_size: int, chunk_tokens: int) -> None:
        from benchmarks.sglang_unified_ref import UnifiedRef

        self.name = "SGLang UnifiedRadixCache"
        self.ref = UnifiedRef(capacity_blocks, block_size)
        self.alloc_ = self.ref.allocator
        self.bs, self.chunk_tokens = block_size, chunk_tokens
        self._st: dict[int, list[Any]] = {}  # rid -> [request, hit, granted, chunks seen]

    def prepare(self, req: Request) -> Request:
        return req

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

    def finish(self, rid: int, inp: Any = None) -> np.ndarray:
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
        return sglang_state(self.ref, sum(self.held(r) for r in self._st))


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

    def prepare(self, req: Request) -> Request:
        return req

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

    def finish(self, rid: int, inp: Any = None) -> np.ndarray:
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


class _HybridProtocol:
    """The hybrid protocol (module doc) over one tree: the chunk boundaries, the order of a
    finish; a side supplies the tree's calls on a request handle."""

    bs: int
    chunk_tokens: int

    def __init__(self) -> None:
        # rid -> [request, handle, hit, granted (-1: refused), chunks seen]
        self._st: dict[int, list[Any]] = {}

    def prepare(self, req: Request) -> Request:
        return req

    def arrive(self, rid: int, req: Request) -> tuple[int, int | None]:
        handle, hit, branching = self._admit(rid, req)
        self._st[rid] = [req, handle, hit, 0, 0]
        return hit, branching

    def alloc(self, rid: int, need: int) -> tuple[bool, None]:
        st = self._st[rid]
        n = need - st[2]
        ok = self._allocate(st[1], st[0], n)
        st[3] = n if ok else -1
        return ok, None

    def chunk(self, rid: int) -> None:
        st = self._st[rid]
        req, handle, hit, granted, j = st
        st[4] = j + 1
        boundary = hit * self.bs + (j + 1) * self.chunk_tokens
        if granted <= 0 or boundary >= req.in_tokens or boundary < self.bs:
            return
        self._checkpoint(handle, boundary // self.bs, False)

    def finish(self, rid: int, inp: Any = None) -> None:
        req, handle, _, granted, _ = self._st.pop(rid)
        if granted <= 0:
            self._drop(handle)
            return
        self._decode_to(handle, req.in_tokens + req.out_tokens - 1)
        if len(req.finish_ids):
            self._checkpoint(handle, len(req.finish_ids), True)
        self._release(handle)

    # a side's calls on its tree
    def _admit(self, rid: int, req: Request) -> tuple[Any, int, int | None]: ...
    def _allocate(self, handle: Any, req: Request, n: int) -> bool: ...
    def _checkpoint(self, handle: Any, blocks: int, finished: bool) -> None: ...
    def _decode_to(self, handle: Any, seq_tokens: int) -> None: ...
    def _release(self, handle: Any) -> None: ...
    def _drop(self, handle: Any) -> None: ...


def _with_states(full: np.ndarray, swa: np.ndarray, states: int) -> tuple[np.ndarray, np.ndarray]:
    """(full, SWA) freed ids with ``states`` freed Mamba states as one -1 each (compared as a
    count: a state has no block id of its own)."""
    return full, np.concatenate([np.full(states, -1, np.int64), swa]) if states else swa


class RealHybridSide(_HybridProtocol):
    """The real UnifiedRadixCache with FULL + SWA or FULL + MAMBA components (``tree``: the
    options of ``HybridRef``), block ids in and out."""

    def __init__(self, full_blocks: int, block_size: int, chunk_tokens: int,
                 **tree: Any) -> None:
        from benchmarks.sglang_unified_ref import HybridRef

        super().__init__()
        self.name = "SGLang UnifiedRadixCache (hybrid)"
        self.ref = HybridRef(full_blocks, block_size, **tree)
        self.bs, self.chunk_tokens = block_size, chunk_tokens
        self._states_seen = 0

    def _admit(self, rid: int, req: Request) -> tuple[int, int, int | None]:
        hit, branching = self.ref.admit(rid, req.match_ids)
        return rid, hit, None if branching is None else branching // self.bs

    def _allocate(self, rid: int, req: Request, n: int) -> bool:
        return self.ref.allocate(rid, req.finish_ids, n)

    def _checkpoint(self, rid: int, blocks: int, finished: bool) -> None:
        self.ref.checkpoint(rid, blocks, finished)

    def _decode_to(self, rid: int, seq_tokens: int) -> None:
        self.ref.decode_to(rid, seq_tokens)

    def _release(self, rid: int) -> None:
        self.ref.release(rid)

    def _drop(self, rid: int) -> None:
        self.ref.drop(rid)

    def touch(self, req: Request) -> None:
        self.ref.match(req.match_ids)

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        full, swa = self.ref.allocator.take_freed()
        freed = self.ref.states_freed()
        states, self._states_seen = freed - self._states_seen, freed
        return _with_states(full, swa, states)

    def observe(self) -> dict[str, Any]:
        return self.ref.state()


class KvsimHybridSide(_HybridProtocol):
    """kvsim's HybridRadixCache through the same protocol (``tree``: ``swa_blocks`` and
    ``window``, or ``mamba_slots``, as ``RealHybridSide``)."""

    def __init__(self, full_blocks: int, block_size: int, chunk_tokens: int, *,
                 swa_blocks: int = 0, window: int | None = None,
                 mamba_slots: int | None = None) -> None:
        from sim.kvcache.hybridtree import Freed, HybridRadixCache

        super().__init__()
        self.name = "kvsim HybridRadixCache"
        # SGLang's Mamba branching point is on FLA's 64-token chunk grid
        self.cache = HybridRadixCache(full_blocks, swa_blocks, window, block_size,
                                      state_slots=mamba_slots, grid=64 if mamba_slots else 1)
        self.mamba = mamba_slots is not None
        self._freed_cls = Freed
        self.freed = Freed()
        self.bs, self.chunk_tokens = block_size, chunk_tokens

    def _admit(self, rid: int, req: Request) -> tuple[Any, int, int | None]:
        r = self.cache.admit(req.match_ids, req.finish_ids, self.freed)
        return r, r.hit, r.mamba_branching if self.mamba else r.branching

    def _allocate(self, r: Any, req: Request, n: int) -> bool:
        return self.cache.allocate(r, n, self.freed)

    def _checkpoint(self, r: Any, blocks: int, finished: bool) -> None:
        self.cache.checkpoint(r, blocks, finished, self.freed)

    def _decode_to(self, r: Any, seq_tokens: int) -> None:
        if self.cache.has_swa:
            self.cache.decode_to(r, seq_tokens, self.freed)

    def _release(self, r: Any) -> None:
        self.cache.release(r, self.freed)

    def _drop(self, r: Any) -> None:
        self.cache.drop(r, self.freed)

    def touch(self, req: Request) -> None:
        self.cache.match(req.match_ids)

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        full, swa = self.freed.ids()
        states = self.freed.states
        self.freed = self._freed_cls()
        return _with_states(full, swa, states)

    def observe(self) -> dict[str, Any]:
        c = self.cache
        full, swa, states = c.resident()
        if self.mamba:
            return {"full_evictable": c.full_evictable, "full_protected": c.full_protected,
                    "state_evictable": c.state_evictable, "state_protected": c.state_protected,
                    "full_used": c.full_used, "state_used": c.state_used,
                    "full": full, "states": states}
        return {"full_evictable": c.full_evictable, "full_protected": c.full_protected,
                "swa_evictable": c.swa_evictable, "swa_protected": c.swa_protected,
                "full_used": c.full_used, "swa_used": c.swa_used, "full": full, "swa": swa}
