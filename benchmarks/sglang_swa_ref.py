"""SGLang 0.5.23's DEFAULT prefix cache with its SWA component, the `UnifiedRadixCache` of a
sliding-window hybrid (gpt-oss, Gemma 3: ``tree_components=(FULL, SWA)``), loaded as
benchmarks/sglang_unified_ref.py loads the full-attention one (the pure-Python tree core, the
real components in mem_cache/unified_cache/components/swa.py and full.py) and driven by block
ids.

What the stubs leave out is the SWA allocator (mem_cache/allocator/swa.py needs the device
pools): `_SwaAllocator` keeps its contract at page granularity: a full pool and an SWA pool of
pages, `full_to_swa_index_mapping` (full page -> SWA page, none once the SWA page is freed),
`free_swa_segment` (frees the SWA peers of full pages and clears the mapping),
`free_full_segment`, `free_segment` (both), `translate_swa_indices_for_transfer`, the
available sizes the eviction walk targets. Every request row gets fresh KV pages (a request
owns its pages until the tree adopts them), so a freed page names one (request, position) and
maps back to the block id there.

`SwaRef` drives the cache as the 0.5.23 scheduler does for an SWA model: match + lock at
admission (`match`, `admit`), the full and SWA shortfalls of an allocation evicted by one
`evict_for_alloc` (`evict`), `checkpoint` = `checkpoint_into_tree` (which, for an unfinished
request, first frees the SWA KV of the request's tokens older than the window:
common.free_swa_out_of_window_slots), the decode steps' own out-of-window frees before the
finish checkpoint (`decode_to`), and `release` = release_kv_cache's row free (full KV past the
protected prefix, SWA KV of what the request has not freed yet) and unlock.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from benchmarks.sglang_unified_ref import SglangUnifiedUnavailable, load_unified_modules


def _swa_allocator_base() -> type:
    """The class SWAComponent's isinstance check names (a stub placeholder here)."""
    import importlib

    return importlib.import_module("sglang.srt.mem_cache.allocator.swa").SWATokenToKVPoolAllocator


class _SwaAllocator:
    """Full and SWA pools of pages with the full -> SWA page mapping (see the module
    docstring). `page_block[p]` is the block id KV page `p` holds; frees are recorded as block
    ids (`take_freed`)."""

    device = "cpu"

    def __init__(self, block_size: int, full_blocks: int, swa_blocks: int,
                 has_swa: bool = True) -> None:
        import torch

        self._torch = torch
        self.has_swa = has_swa
        self.page_size = block_size
        self.full_capacity = full_blocks
        self.swa_capacity = swa_blocks
        self.full_used = 0
        self.swa_used = 0
        self.n_pages = 1  # page 0 is SGLang's padding page: never handed out
        self.page_block = np.zeros(1024, np.int64)
        self.swa_of = np.full(1024, -1, np.int64)  # full page -> SWA page (-1: none)
        self.full_live = np.zeros(1024, bool)
        self.freed_full: list[np.ndarray] = []
        self.freed_swa: list[np.ndarray] = []
        # FullComponent frees an evicted node's full KV through the full sub-allocator
        # (its SWA peers were freed by the SWA component first).
        self.full_attn_allocator = _FullSide(self)

    # -- the driver's side -------------------------------------------------------------------
    def alloc_pages(self, block_ids: np.ndarray) -> np.ndarray:
        """Fresh full pages (with SWA peers) for `block_ids`; their first token indices."""
        n = len(block_ids)
        need = self.n_pages + n
        if need > len(self.page_block):
            size = max(need, 2 * len(self.page_block))
            for name, fill in (("page_block", 0), ("swa_of", -1), ("full_live", False)):
                old = getattr(self, name)
                new = np.full(size, fill, old.dtype)
                new[: len(old)] = old
                setattr(self, name, new)
        pages = np.arange(self.n_pages, need, dtype=np.int64)
        self.n_pages = need
        self.page_block[pages] = block_ids
        self.full_live[pages] = True
        self.full_used += n
        if self.has_swa:
            self.swa_of[pages] = pages
            self.swa_used += n
        return pages * self.page_size

    def take_freed(self) -> tuple[np.ndarray, np.ndarray]:
        """(full, SWA) block ids freed since the last call, each sorted."""
        out = []
        for lst in (self.freed_full, self.freed_swa):
            ids = np.sort(np.concatenate(lst)) if lst else np.empty(0, np.int64)
            lst.clear()
            out.append(ids)
        return out[0], out[1]

    # -- what the cache calls ----------------------------------------------------------------
    def _pages(self, indices: Any) -> np.ndarray:
        arr = np.asarray(indices.numpy() if hasattr(indices, "numpy") else indices, np.int64)
        if arr.size % self.page_size or np.any(arr[:: self.page_size] % self.page_size):
            raise AssertionError("SGLang freed a partial page")
        return arr[:: self.page_size] // self.page_size

    def full_available_size(self) -> int:
        return (self.full_capacity - self.full_used) * self.page_size

    def swa_available_size(self) -> int:
        return (self.swa_capacity - self.swa_used) * self.page_size

    def available_size(self) -> int:
        if not self.has_swa:
            return self.full_available_size()
        return min(self.full_available_size(), self.swa_available_size())

    def mamba_full_cache_donor(self) -> None:
        return None

    def translate_swa_indices_for_transfer(self, indices: Any) -> Any:
        arr = np.asarray(indices.numpy(), np.int64)
        pages, offs = arr // self.page_size, arr % self.page_size
        swa = self.swa_of[pages]
        out = np.where(swa >= 0, swa * self.page_size + offs, 0)
        return self._torch.from_numpy(out)

    def set_full_to_swa_mapping(self, full: Any, swa: Any) -> None:
        f = np.asarray(full.numpy(), np.int64)[:: self.page_size] // self.page_size
        s = np.asarray(swa.numpy(), np.int64)[:: self.page_size] // self.page_size
        self.swa_of[f] = s

    def clear_full_to_swa_mapping(self, full: Any) -> None:
        f = np.asarray(full.numpy(), np.int64)[:: self.page_size] // self.page_size
        self.swa_of[f] = -1

    def free_swa_segment(self, indices: Any, start_pos: int = 0) -> None:
        pages = self._pages(indices)
        if pages.size == 0:
            return
        if np.any(self.swa_of[pages] < 0):
            raise AssertionError("SGLang freed the SWA peer of an unmapped full page")
        self.swa_of[pages] = -1
        self.swa_used -= pages.size
        self.freed_swa.append(self.page_block[pages])

    def free_full_segment(self, indices: Any, start_pos: int = 0, check: bool = True) -> None:
        pages = self._pages(indices)
        if pages.size == 0:
            return
        if np.any(~self.full_live[pages]):
            raise AssertionError("SGLang freed a full page twice")
        if check and np.any(self.swa_of[pages] >= 0):
            raise AssertionError("free_full_segment of a page whose SWA peer is live")
        self.full_live[pages] = False
        self.full_used -= pages.size
        self.freed_full.append(self.page_block[pages])

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        if self.has_swa:
            self.free_swa_segment(indices, start_pos)
        self.free_full_segment(indices, start_pos)

    def free_segments(self, segments: list[tuple[Any, int]]) -> None:
        for indices, start in segments:
            self.free_segment(indices, start)

    def free_full_segments(self, segments: list[tuple[Any, int]]) -> None:
        for indices, start in segments:
            self.free_full_segment(indices, start)


class _FullSide:
    """`full_attn_allocator`: the full pool alone."""

    def __init__(self, owner: _SwaAllocator) -> None:
        self.owner = owner

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        self.owner.free_full_segment(indices, start_pos, check=False)


class _Rows:
    """req_to_token[slot] and req_to_token[slot, a:b] over per-request rows."""

    def __init__(self, rows: dict[int, Any]) -> None:
        self.rows = rows

    def __getitem__(self, where: Any) -> Any:
        if isinstance(where, tuple):
            slot, sl = where
            return self.rows[slot][sl]
        return self.rows[where]


class _ReqToTokenPool:
    """req_to_token rows of KV indices (fresh pages per request: `SwaRef.set_row`)."""

    def __init__(self) -> None:
        self.rows: dict[int, Any] = {}
        self.req_to_token = _Rows(self.rows)

    def write(self, where: tuple[int, slice], values: Any) -> None:
        row, sl = where
        self.rows[row][sl] = values


class _Kv:
    """The request KV record fields the cache and common.py read (schedule_batch.ReqKV)."""

    def __init__(self, slot: int, protected: int) -> None:
        self.req_pool_idx: int | None = slot
        self.cache_protected_len = protected
        self.cache_inserted_len = protected
        self.swa_evict_floor = 0
        self.component_evicted_seqlens: dict[Any, int] = {}
        self.mamba_pool_idx: Any = None
        self.mamba_cow_src_index: Any = None
        self.mamba_needs_clear = False
        self.mamba_last_track_seqlen: int | None = None
        self.mamba_prev_track_seqlen: int | None = None
        self.mamba_ping_pong_track_buffer: Any = None

    @property
    def holds_kv(self) -> bool:
        return self.req_pool_idx is not None

    @property
    def holds_mamba(self) -> bool:
        return self.mamba_pool_idx is not None

    def get_evicted_seqlen(self, component_type: Any) -> int:
        return self.component_evicted_seqlens.get(component_type, 0)

    def set_evicted_seqlen(self, component_type: Any, length: int) -> None:
        self.component_evicted_seqlens[component_type] = length

    def swa_dead_lo(self, page_size: int) -> int:
        lo = max(self.cache_protected_len, self.swa_evict_floor)
        if page_size > 1 and lo > self.cache_protected_len:
            lo = -(-lo // page_size) * page_size
        return lo


class _Req:
    """The Req fields checkpoint_into_tree and the SWA component read."""

    def __init__(self, rid: int, protected: int, branching: int | None) -> None:
        self.rid = str(rid)
        self.kv = _Kv(rid, protected)
        self.origin_input_ids = array("q")
        self.full_untruncated_fill_ids = array("q")
        self.priority = None
        self.session_id = None
        self.session = None
        self.kv_rotation_base = None
        self.extra_key = None
        self.cache_salt = None
        self.swa_branching_seqlen = branching
        self.mamba_branching_seqlen: int | None = None
        self.lock: Any = None
        self.last_node: Any = None
        self.finished_reason = None
        self._finished = False
        self.owned = 0  # tokens of the row the request holds (allocated)
        self.fill = 0  # tokens of the current prefill chunk's end (get_fill_ids)

    def get_fill_ids(self) -> array:
        return self.full_untruncated_fill_ids[: self.fill]

    def finished(self) -> bool:
        return self._finished


class SwaRef:
    """One real UnifiedRadixCache with FULL and SWA components (page = block, LRU, the
    Python tree core), `window` tokens of sliding window, separate full and SWA pools."""

    def __init__(self, full_blocks: int, swa_blocks: int, window: int,
                 block_size: int = 64) -> None:
        mods = load_unified_modules()
        import torch

        base = _swa_allocator_base()
        if not isinstance(base, type):
            raise SglangUnifiedUnavailable("allocator.swa stub has no allocator class")
        alloc_cls = type("SwaAllocator", (_SwaAllocator, base), {})
        self._torch = torch
        self._mods = mods
        self.block_size = block_size
        self.window = window
        self.allocator = alloc_cls(block_size, full_blocks, swa_blocks)
        self.pool = _ReqToTokenPool()
        ct = mods["components"].ComponentType
        self._ct = ct
        params = mods["params"].CacheInitParams(
            disable=False,
            req_to_token_pool=self.pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=block_size,
            eviction_policy="lru",
            sliding_window_size=window,
            tree_components=(ct.FULL, ct.SWA),
            tree_core_backend="python",
        )
        self.cache = mods["urc"].UnifiedRadixCache(params)
        if type(self.cache.tree_core).__name__ != "UnifiedTreeCore":
            raise SglangUnifiedUnavailable("the pure-Python tree core was not selected")
        self._reqs: dict[int, _Req] = {}

    def _key(self, block_ids: np.ndarray) -> Any:
        from benchmarks.sglang_unified_ref import block_tokens

        return self._mods["radix"].RadixKey(array("q", block_tokens(block_ids, self.block_size)))

    def match(self, block_ids: np.ndarray) -> tuple[int, Any, int | None]:
        """match_prefix: (hit blocks, last device node id, swa_branching_seqlen)."""
        r = self.cache.match_prefix(self._mods["base"].MatchPrefixParams(key=self._key(block_ids)))
        return r.device_prefix_len // self.block_size, r.last_device_node, r.swa_branching_seqlen

    def admit(self, rid: int, node: Any, hit: int, branching: int | None) -> None:
        req = _Req(rid, hit * self.block_size, branching)
        req.lock = self.cache.lock(node)
        req.last_node = node
        self._reqs[rid] = req

    def set_row(self, rid: int, block_ids: np.ndarray, hit: int, n: int) -> None:
        """The request's row after its allocation: the matched prefix's tree KV indices, then
        `n` fresh pages (`block_ids` = its full blocks; a page past them holds block -1)."""
        torch = self._torch
        req = self._reqs[rid]
        bs = self.block_size
        prefix = self.cache.path_device_indices(req.last_node)
        assert len(prefix) == hit * bs, (len(prefix), hit)
        ids = np.full(n, -1, np.int64)
        tail = np.asarray(block_ids[hit: hit + n], np.int64)
        ids[: len(tail)] = tail
        starts = self.allocator.alloc_pages(ids)
        fresh = (starts[:, None] + np.arange(bs)).reshape(-1)
        row = torch.cat([prefix.to(torch.int64), torch.from_numpy(fresh)])
        self.pool.rows[rid] = row
        from benchmarks.sglang_unified_ref import block_tokens

        req.full_untruncated_fill_ids = array("q", block_tokens(block_ids, bs))
        req.owned = (hit + n) * bs

    def checkpoint(self, rid: int, blocks: int, finished: bool) -> None:
        """checkpoint_into_tree(req, up_to=blocks * block_size)."""
        req = self._reqs[rid]
        req._finished = finished
        req.fill = blocks * self.block_size
        self.cache.checkpoint_into_tree(req, up_to=blocks * self.block_size)

    def decode_to(self, rid: int, seq_tokens: int) -> None:
        """The decode steps' out-of-window SWA frees at a sequence of `seq_tokens` tokens
        (the scheduler: free_swa_out_of_window_slots(req, seq_len - 1) every step)."""
        req = self._reqs[rid]
        self.cache.components[self._ct.SWA]._free_out_of_window_slots(req, seq_tokens - 1)

    def release(self, rid: int) -> None:
        """release_kv_cache without the checkpoint: free the row past the protected prefix,
        unlock."""
        req = self._reqs.pop(rid)
        if req.owned > req.kv.cache_protected_len:
            self.cache.free_kv_row(req.kv, [(req.kv.cache_protected_len, req.owned)])
        self.cache.unlock(req.lock)

    def drop(self, rid: int) -> None:
        """An admission whose allocation failed: unlock only."""
        req = self._reqs.pop(rid)
        self.cache.unlock(req.lock)

    def evict(self, full_blocks: int, swa_blocks: int) -> None:
        bs = self.block_size
        self.cache.evict_for_alloc(self._mods["base"].EvictParams(
            num_tokens=full_blocks * bs, swa_num_tokens=swa_blocks * bs))

    def state(self) -> dict[str, Any]:
        """Sizes (blocks) and the resident full / SWA block ids of the tree."""
        c, bs = self.cache, self.block_size
        full, swa = [], []
        ct = self._ct
        stack = list(c.tree_core.root_node.children.values())
        while stack:
            node = stack.pop()
            fv = node.component(ct.FULL).value
            sv = node.component(ct.SWA).value
            if fv is not None:
                pages = np.asarray(fv.numpy(), np.int64)[::bs] // bs
                full.append(self.allocator.page_block[pages])
                if sv is not None:
                    swa.append(self.allocator.page_block[pages])
            stack.extend(node.children.values())
        return {
            "full_evictable": c.full_evictable_size() // bs,
            "full_protected": c.full_protected_size() // bs,
            "swa_evictable": c.swa_evictable_size() // bs,
            "swa_protected": c.swa_protected_size() // bs,
            "full_used": self.allocator.full_used,
            "swa_used": self.allocator.swa_used,
            "full": sorted_cat(full),
            "swa": sorted_cat(swa),
        }


def sorted_cat(parts: list[np.ndarray]) -> np.ndarray:
    """The sorted concatenation of id arrays (empty: an empty int64 array)."""
    return np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64)


class _Slots:
    """The Mamba state slot allocator (mamba_allocator): slot ids 1.., frees counted."""

    def __init__(self, capacity: int) -> None:
        import torch

        self._torch = torch
        self.capacity = capacity
        self.free_ids = list(range(capacity, 0, -1))
        self.freed = 0

    def alloc(self, n: int) -> Any:
        if n > len(self.free_ids):
            return None
        return self._torch.tensor([self.free_ids.pop() for _ in range(n)], dtype=self._torch.int64)

    def free(self, slots: Any) -> None:
        ids = [int(x) for x in slots.reshape(-1).tolist()]
        assert not set(ids) & set(self.free_ids), "a state slot freed twice"
        self.free_ids.extend(ids)
        self.freed += len(ids)

    def available_size(self) -> int:
        return len(self.free_ids)

    schedulable_available_size = available_size


class _MambaStore:
    """mamba_pool: the states themselves (not simulated: a copy is a no-op)."""

    replayssm_write_pos = None
    replayssm_spec_write_pos = None

    def copy_from(self, src: Any, dst: Any) -> None:
        return None


def _hybrid_pool_base() -> type:
    import importlib

    return importlib.import_module("sglang.srt.mem_cache.memory_pool").HybridReqToTokenPool


class _MambaRows(_ReqToTokenPool):
    """HybridReqToTokenPool's surface the Mamba component calls (no extra buffer)."""

    mamba_ping_pong_track_buffer_size = 0
    mamba_initial_tracking_slots = 0

    def __init__(self, slots: int) -> None:
        super().__init__()
        self.mamba_allocator = _Slots(slots)
        self.mamba_pool = _MambaStore()

    def translate_mamba_indices(self, indices: Any) -> Any:
        return indices

    def free_mamba_cache(self, req: Any, mamba_ping_pong_track_buffer_to_keep: Any = None
                         ) -> None:
        assert req.kv.mamba_pool_idx is not None, "double free? mamba_index is None"
        self.mamba_allocator.free(req.kv.mamba_pool_idx.reshape(1))
        req.kv.mamba_pool_idx = None


class _Exec:
    """get_exec().mamba: the server defaults (exec_.py) the component reads."""

    class mamba:  # the attribute name SGLang reads
        mamba_max_states_per_path = -1
        mamba_track_interval = 256
        enable_mamba_extra_buffer_lazy = False


class MambaRef:
    """One real UnifiedRadixCache with FULL and MAMBA components (a Gated DeltaNet hybrid,
    Qwen3-Next) without the extra buffer ("no_buffer": the state at each insert end), so the
    page is one token (SGLang requires it there): block = token. `slots` Mamba state slots;
    `chunk` SGLang's mamba_cache_chunk_size (FLA's 64), the grid of its branching point."""

    def __init__(self, full_tokens: int, slots: int, chunk: int = 64) -> None:
        mods = load_unified_modules()
        import importlib
        import math

        import torch

        mamba_mod = importlib.import_module(
            "sglang.srt.mem_cache.unified_cache.components.mamba")
        # runtime_context is a stub: give the component the server defaults it reads
        mamba_mod.get_exec = _Exec  # type: ignore[attr-defined]
        mamba_mod.mamba_cache_chunk_size = lambda: chunk  # type: ignore[attr-defined]
        mamba_mod.mamba_checkpoint_grid = (  # type: ignore[attr-defined]
            lambda page: math.lcm(chunk, page))
        base = _swa_allocator_base()
        pool_base = _hybrid_pool_base()
        if not isinstance(base, type) or not isinstance(pool_base, type):
            raise SglangUnifiedUnavailable("stubbed pools have no classes")
        self._torch = torch
        self._mods = mods
        self.block_size = 1
        self.allocator = type("FullAllocator", (_SwaAllocator, base), {})(1, full_tokens, 0,
                                                                         has_swa=False)
        self.pool = type("MambaPool", (_MambaRows, pool_base), {})(slots)
        ct = mods["components"].ComponentType
        self._ct = ct
        params = mods["params"].CacheInitParams(
            disable=False,
            req_to_token_pool=self.pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=1,
            eviction_policy="lru",
            tree_components=(ct.FULL, ct.MAMBA),
            enable_mamba_extra_buffer=False,
            tree_core_backend="python",
        )
        self.cache = mods["urc"].UnifiedRadixCache(params)
        if type(self.cache.tree_core).__name__ != "UnifiedTreeCore":
            raise SglangUnifiedUnavailable("the pure-Python tree core was not selected")
        self._reqs: dict[int, _Req] = {}

    def _key(self, ids: np.ndarray) -> Any:
        return self._mods["radix"].RadixKey(array("q", np.asarray(ids, np.int64)))

    def match(self, ids: np.ndarray, req: _Req | None = None
              ) -> tuple[int, Any, int | None]:
        """match_prefix (copy on write for `req`): (hit, node id, mamba_branching_seqlen)."""
        params = self._mods["base"].MatchPrefixParams(
            key=self._key(ids), req=req, cow_mamba=req is not None)
        r = self.cache.match_prefix(params)
        return r.device_prefix_len, r.last_device_node, r.mamba_branching_seqlen

    def admit(self, rid: int, ids: np.ndarray) -> tuple[int, int | None]:
        req = _Req(rid, 0, None)
        hit, node, branching = self.match(ids, req)
        req.kv.cache_protected_len = req.kv.cache_inserted_len = hit
        req.mamba_branching_seqlen = branching
        req.lock = self.cache.lock(node)
        req.last_node = node
        req.owns_state = req.kv.holds_mamba
        self._reqs[rid] = req
        return hit, branching

    def allocate(self, rid: int, ids: np.ndarray, n: int) -> bool:
        """The scheduler's order: the request's state slot (Mamba shortfall evicted), then
        `n` full pages (full shortfall evicted)."""
        req = self._reqs[rid]
        a, c, slots = self.allocator, self.cache, self.pool.mamba_allocator
        full_short = n - (a.full_capacity - a.full_used)
        need_state = 0 if req.kv.holds_mamba else 1
        if (full_short > c.full_evictable_size()
                or need_state - slots.available_size() > c.mamba_evictable_size()):
            return False
        base = self._mods["base"]
        if need_state:
            if slots.available_size() < 1:
                c.evict_for_alloc(base.EvictParams(num_tokens=0,
                                                   mamba_num=1 - slots.available_size()))
            if slots.available_size() < 1:
                return False
            req.kv.mamba_pool_idx = slots.alloc(1)[0]
            req.owns_state = True
        full_short = n - (a.full_capacity - a.full_used)  # the state's eviction freed some
        if full_short > 0:
            c.evict_for_alloc(base.EvictParams(num_tokens=full_short))
        if n > a.full_capacity - a.full_used:
            return False
        self._set_row(req, ids, n)
        return True

    def _set_row(self, req: _Req, ids: np.ndarray, n: int) -> None:
        torch = self._torch
        hit = req.kv.cache_protected_len
        prefix = self.cache.path_device_indices(req.last_node)
        assert len(prefix) == hit, (len(prefix), hit)
        pages = np.full(n, -1, np.int64)
        tail = np.asarray(ids[hit: hit + n], np.int64)
        pages[: len(tail)] = tail
        fresh = self.allocator.alloc_pages(pages)
        self.pool.rows[int(req.rid)] = torch.cat([prefix.to(torch.int64), torch.from_numpy(fresh)])
        req.full_untruncated_fill_ids = array("q", np.asarray(ids, np.int64))
        req.owned = hit + n

    def checkpoint(self, rid: int, upto: int, finished: bool) -> None:
        req = self._reqs[rid]
        req._finished = finished
        req.fill = upto
        self.cache.checkpoint_into_tree(req, up_to=upto)
        if finished:
            req.owns_state = False  # donated to the tree, or freed there

    def release(self, rid: int) -> None:
        req = self._reqs.pop(rid)
        if req.owned > req.kv.cache_protected_len:
            self.cache.free_kv_row(req.kv, [(req.kv.cache_protected_len, req.owned)])
        self._end(req)

    def drop(self, rid: int) -> None:
        self._end(self._reqs.pop(rid))

    def _end(self, req: _Req) -> None:
        if req.owns_state and req.kv.holds_mamba:
            self.pool.free_mamba_cache(req)
        self.cache.unlock(req.lock)

    def state(self) -> dict[str, Any]:
        c = self.cache
        ct = self._ct
        full, states = [], []
        stack = list(c.tree_core.root_node.children.values())
        while stack:
            node = stack.pop()
            pages = np.asarray(node.component(ct.FULL).value.numpy(), np.int64)
            blocks = self.allocator.page_block[pages]
            full.append(blocks)
            if node.component(ct.MAMBA).value is not None:
                states.append(blocks[-1:])
            stack.extend(node.children.values())
        return {
            "full_evictable": c.full_evictable_size(),
            "full_protected": c.full_protected_size(),
            "state_evictable": c.mamba_evictable_size(),
            "state_protected": c.mamba_protected_size(),
            "full_used": self.allocator.full_used,
            "state_used": self.pool.mamba_allocator.capacity
            - self.pool.mamba_allocator.available_size(),
            "full": sorted_cat(full),
            "states": sorted_cat(states),
        }
