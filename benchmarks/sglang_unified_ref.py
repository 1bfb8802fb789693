"""SGLang 0.5.23's DEFAULT prefix cache, `UnifiedRadixCache` with its pure-Python tree core,
loaded without SGLang's ~100 dependencies and driven by block ids.

0.5.23 builds `UnifiedRadixCache` (mem_cache/registry.py), not the legacy `RadixCache` that
benchmarks/sglang_ref.py loads. Its tree core defaults to a compiled Rust module; the same
logic ships in pure Python (mem_cache/unified_cache/unified_tree_core.py, policy components in
unified_cache/components/), selected per instance with `tree_core_backend="python"`
(docs/engine.md, the differential tests).

Loading: an import hook (a `sys.meta_path` finder) serves every `sglang.*` module that is not
on the real list below as an inert stub (distributed groups, HiCache controllers, memory pools,
metrics, kernels, the scheduler's Req); the real list is the cache, its tree core and
components, and the small pure modules they call. A few stubs carry real definitions compiled
from the installed source (`StorageMedium`, `page_interleave_shard_size`, `ceil_align`) or a
pass-through for the `rank_consensus` decorator (a multi-rank consistency check). It coexists
with benchmarks/sglang_ref.py in one process in either order: stubs that block a module this
loader needs real are dropped and the module is imported for real.

Time: the tree stamps nodes with its own logical counter (`get_and_increase_time_counter`), one
value per touched node, so no clock needs replacing. Block `b` is token ids (and KV indices)
`b*64 .. b*64+63`, as in sglang_ref, so freed indices map back to block ids.

`UnifiedRef` (full attention) and `HybridRef` (FULL + SWA, or FULL + MAMBA: a sliding-window
or a Gated DeltaNet hybrid, its own docstring) share the loader and the stand-ins of the
scheduler's request (`_Req`, `_Kv`) and row pool. `UnifiedRef` drives the cache the way the
0.5.23 scheduler does: `match` (match_prefix) and
`lock` at admission, `evict` of the allocation shortfall (evict_for_alloc), `checkpoint` =
`checkpoint_into_tree` for each finished prefill chunk (insert, free the request's duplicate
pages, move its lock to the new node) and at finish (prompt + output - 1 tokens, with the
extra insert that splits the leaf at the prompt boundary), then `unlock` (release_kv_cache).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.stubbing import StubModule, real_definitions

SGLANG_VERSION = "0.5.23"

# Loaded for real (a name or its submodules); every other sglang.* module is a stub.
_REAL = (
    "sglang.srt.environ",
    "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.unified_cache",
    "sglang.srt.mem_cache.base_prefix_cache",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.cache_init_params",
    "sglang.srt.mem_cache.events",
    "sglang.srt.mem_cache.utils",
    "sglang.srt.mem_cache.evict_policy",
    "sglang.srt.mem_cache.hicache_storage",
    "sglang.srt.mem_cache.common",
    "sglang.srt.session.streaming_session",
)
# Packages that must resolve to the installed directories without running their __init__.
_BARE = ("sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.session")
# What another reference loader needs on top (``require_real``; benchmarks/sglang_sched_ref.py
# adds the scheduler's prefill adder): real modules, bare packages, fillers of stubs.
_EXTRA_REAL: list[str] = []
_EXTRA_BARE: list[str] = []
_EXTRA_FILLERS: list[Callable[[types.ModuleType, Path], None]] = []


class SglangUnifiedUnavailable(RuntimeError):
    """sglang (or torch, msgspec) is missing, or sglang is not the pinned version."""


def _is_real(name: str) -> bool:
    if name in _BARE or name in _EXTRA_BARE:
        return True
    return any(name == p or name.startswith(p + ".") for p in (*_REAL, *_EXTRA_REAL))


def require_real(modules: Iterable[str], bare: Iterable[str] = (),
                 filler: Callable[[types.ModuleType, Path], None] | None = None) -> None:
    """Load ``modules`` for real too, ``bare`` packages without their __init__, and let
    ``filler`` give stubs the real pieces those modules use. Call before
    ``load_unified_modules``; stubs already registered are dropped or filled there."""
    global _MODULES
    _EXTRA_REAL.extend(m for m in modules if m not in _EXTRA_REAL)
    _EXTRA_BARE.extend(b for b in bare if b not in _EXTRA_BARE)
    if filler is not None and filler not in _EXTRA_FILLERS:
        _EXTRA_FILLERS.append(filler)
    _MODULES = None  # re-run the stub pass of load_unified_modules


class _StubLoader(importlib.abc.Loader):
    def __init__(self, root: Path) -> None:
        self.root = root

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []
        _fill_stub(module, self.root)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _StubFinder(importlib.abc.MetaPathFinder):
    """Serves stubs for sglang.* modules not on the real list."""

    def __init__(self, root: Path) -> None:
        self.loader = _StubLoader(root)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if not name.startswith("sglang.") or _is_real(name):
            return None
        return importlib.machinery.ModuleSpec(name, self.loader, is_package=True)


def _fill_stub(module: types.ModuleType, root: Path) -> None:
    """The real pieces some stubs must carry (compiled from the installed source)."""
    for filler in _EXTRA_FILLERS:
        filler(module, root)
    name = module.__name__
    src = root / "srt"
    if name == "sglang.srt.utils.rank_consensus_checker":
        module.rank_consensus = lambda *a, **k: lambda fn: fn  # type: ignore[attr-defined]
    elif name == "sglang.srt.utils.common":
        for k, v in real_definitions(
            src / "utils" / "common.py", ("ceil_div", "ceil_align"), SglangUnifiedUnavailable
        ).items():
            setattr(module, k, v)
    elif name == "sglang.srt.disaggregation.kv_events":
        for k, v in real_definitions(
            src / "disaggregation" / "kv_events.py", ("StorageMedium",), SglangUnifiedUnavailable
        ).items():
            setattr(module, k, v)
    elif name == "sglang.srt.mem_cache.allocator.page_interleave":
        scope = {"PageInterleavePoolAllocator": module.PageInterleavePoolAllocator}
        for k, v in real_definitions(
            src / "mem_cache" / "allocator" / "page_interleave.py",
            ("page_interleave_shard_size",),
            SglangUnifiedUnavailable,
            scope,
        ).items():
            setattr(module, k, v)


_MODULES: dict[str, types.ModuleType] | None = None


def load_unified_modules() -> dict[str, types.ModuleType]:
    """Import UnifiedRadixCache and what driving it needs, for real (once per process)."""
    global _MODULES
    if _MODULES is not None:
        return _MODULES
    from importlib import metadata

    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        version = None
    if version != SGLANG_VERSION:
        raise SglangUnifiedUnavailable(f"sglang=={SGLANG_VERSION} required, found {version}")
    for dep in ("torch", "msgspec"):
        if importlib.util.find_spec(dep) is None:
            raise SglangUnifiedUnavailable(f"{dep} is not installed")
    loaded = sys.modules.get("sglang")
    if loaded is not None:  # a bare package another loader registered (no __spec__)
        root = Path(next(iter(loaded.__path__)))
    else:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            raise SglangUnifiedUnavailable("sglang is not installed")
        root = Path(next(iter(spec.submodule_search_locations)))
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder(root))
    for name in (*_BARE, *_EXTRA_BARE):
        if type(sys.modules.get(name)).__name__ in ("StubModule", "_StubModule"):
            del sys.modules[name]  # a stub registered before this package had to be bare
        if name not in sys.modules:
            package = types.ModuleType(name)
            path = root.joinpath(*name.split(".")[1:])
            package.__path__ = [str(path)]
            package.__file__ = str(path / "__init__.py")
            # A spec, so importlib.util.find_spec (sglang_ref's loader) still resolves it.
            package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            package.__spec__.submodule_search_locations = [str(path)]
            sys.modules[name] = package
    # Stubs another loader registered: drop those of modules that must be real here, give
    # the others the real pieces this cache needs.
    for name, module in list(sys.modules.items()):
        if type(module).__name__ not in ("StubModule", "_StubModule"):
            continue
        if _is_real(name) and name not in _BARE and name not in _EXTRA_BARE:
            del sys.modules[name]
        else:
            _fill_stub(module, root)
    names = {
        "urc": "sglang.srt.mem_cache.unified_radix_cache",
        "params": "sglang.srt.mem_cache.cache_init_params",
        "components": "sglang.srt.mem_cache.unified_cache.component_type",
        "base": "sglang.srt.mem_cache.base_prefix_cache",
        "radix": "sglang.srt.mem_cache.radix_cache",
    }
    _MODULES = {k: importlib.import_module(v) for k, v in names.items()}
    # A real module another loader imported over its stubs (sglang_ref: base_prefix_cache)
    # keeps the stub's placeholder ComponentType: give it the real one, which SWA needs.
    real = _MODULES["components"].ComponentType
    for name, module in list(sys.modules.items()):
        if name.startswith("sglang.") and getattr(module, "ComponentType", real) is not real \
                and type(module).__name__ not in ("StubModule", "_StubModule"):
            module.ComponentType = real
    return _MODULES


class _Allocator:
    """The allocator the cache calls: device, page size, frees (recorded as block ids) and
    `available_size` (evict_for_alloc walks until it reaches available + shortfall). `used`
    (blocks) is kept by the driver: it adds a request's allocation, the cache's frees
    subtract from it."""

    device = "cpu"

    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        self.page_size = block_size
        self.capacity_blocks = capacity_blocks
        self.used = 0
        self.freed: list[np.ndarray] = []

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        arr = np.asarray(indices.numpy(), np.int64)
        if arr.size:
            if arr.size % self.page_size or np.any(arr[:: self.page_size] % self.page_size):
                raise AssertionError("SGLang freed a partial page")
            self.freed.append(arr[:: self.page_size] // self.page_size)
            self.used -= arr.size // self.page_size

    free_full_segment = free_segment

    def available_size(self) -> int:
        return (self.capacity_blocks - self.used) * self.page_size

    def mamba_full_cache_donor(self) -> None:
        return None

    def create_prefill_budget(self, tree_cache: Any, *, num_mixed_decode_tokens: int = 0) -> Any:
        """allocator/base.py's: the single-pool PrefillBudget (for the prefill adder of
        benchmarks/sglang_sched_ref.py, which loads prefill_budget for real)."""
        from sglang.srt.mem_cache.prefill_budget import PrefillBudget

        return PrefillBudget(self, tree_cache, num_mixed_decode_tokens=num_mixed_decode_tokens)

    def request_slot_reserve(self, *, has_req_pool_slot: bool, prefill_tokens: int = 0) -> int:
        return 0  # allocator/base.py: no request-owned workspace

    def take_freed(self) -> np.ndarray:
        """Block ids of every page freed since the last call (sorted multiset)."""
        if not self.freed:
            return np.empty(0, np.int64)
        ids = np.concatenate(self.freed)
        self.freed.clear()
        return np.sort(ids)


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
    """req_to_token rows of KV indices (full attention: token id = KV index, a row is the
    request's token ids; a hybrid: fresh pages per request, ``HybridRef._set_row``)."""

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
    """The Req fields checkpoint_into_tree and the SWA and Mamba components read (a
    non-session request; its row is slot ``rid``)."""

    def __init__(self, rid: int, protected: int = 0, prompt: array | None = None) -> None:
        self.rid = str(rid)
        self.kv = _Kv(rid, protected)
        self.origin_input_ids = array("q") if prompt is None else prompt
        self.full_untruncated_fill_ids = self.origin_input_ids
        self.priority = None
        self.session_id = None
        self.session = None
        self.kv_rotation_base = None
        self.extra_key = None
        self.cache_salt = None
        self.swa_branching_seqlen: int | None = None
        self.mamba_branching_seqlen: int | None = None
        self.lock: Any = None
        self.last_node: Any = None
        self.finished_reason = None
        self._finished = False
        self.owns_state = False  # a Mamba state slot the request must free
        self.owned = 0  # tokens of the row the request holds (allocated)
        self.fill = 0  # tokens of the current prefill chunk's end (get_fill_ids)

    def get_fill_ids(self) -> array:
        return self.full_untruncated_fill_ids[: self.fill]

    def finished(self) -> bool:
        return self._finished


def _unified_cache(mods: dict[str, types.ModuleType], pool: Any, allocator: Any,
                   page_size: int, components: tuple[str, ...], **params: Any) -> Any:
    """A UnifiedRadixCache (LRU, the pure-Python tree core) with the named components."""
    ct = mods["components"].ComponentType
    cache = mods["urc"].UnifiedRadixCache(mods["params"].CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        eviction_policy="lru",
        tree_components=tuple(getattr(ct, c) for c in components),
        tree_core_backend="python",
        **params,
    ))
    if type(cache.tree_core).__name__ != "UnifiedTreeCore":
        raise SglangUnifiedUnavailable("the pure-Python tree core was not selected")
    return cache


def block_tokens(block_ids: np.ndarray, block_size: int) -> np.ndarray:
    ids = np.asarray(block_ids, np.int64)
    return (ids[:, None] * block_size + np.arange(block_size, dtype=np.int64)).reshape(-1)


class UnifiedRef:
    """One real UnifiedRadixCache (full attention, page = block, LRU, Python tree core)."""

    def __init__(self, capacity_blocks: int, block_size: int = 64) -> None:
        mods = load_unified_modules()
        import torch

        self._torch = torch
        self._mods = mods
        self.block_size = block_size
        self.allocator = _Allocator(block_size, capacity_blocks)
        self.pool = _ReqToTokenPool()
        self.cache = _unified_cache(mods, self.pool, self.allocator, block_size, ("FULL",))
        self._reqs: dict[int, _Req] = {}

    def _key(self, block_ids: np.ndarray) -> Any:
        return self._mods["radix"].RadixKey(array("q", block_tokens(block_ids, self.block_size)))

    def match(self, block_ids: np.ndarray) -> tuple[int, Any]:
        """match_prefix: (hit blocks, last device node id)."""
        r = self.cache.match_prefix(self._mods["base"].MatchPrefixParams(key=self._key(block_ids)))
        return r.device_prefix_len // self.block_size, r.last_device_node

    def touch(self, block_ids: np.ndarray) -> None:
        self.cache.touch_prefix(self._key(block_ids))

    def admit(self, rid: int, prompt_ids: np.ndarray, node: Any, hit: int) -> None:
        """Lock the matched node and give the request a row (its prompt's full blocks)."""
        prompt = array("q", block_tokens(prompt_ids, self.block_size))
        req = _Req(rid, hit * self.block_size, prompt)
        req.lock = self.cache.lock(node)
        req.last_node = node
        self._reqs[rid] = req

    def checkpoint(self, rid: int, block_ids: np.ndarray, finished: bool) -> None:
        """checkpoint_into_tree(req, up_to) over the full blocks `block_ids`."""
        req = self._reqs[rid]
        tokens = self._torch.from_numpy(block_tokens(block_ids, self.block_size))
        self.pool.rows[req.kv.req_pool_idx] = tokens.clone()
        req.full_untruncated_fill_ids = array("q", tokens.numpy())
        req.fill = len(tokens)
        req._finished = finished
        self.cache.checkpoint_into_tree(req, up_to=len(tokens))

    def release(self, rid: int) -> None:
        """release_kv_cache's tree part: unlock the request's node."""
        req = self._reqs.pop(rid)
        self.cache.unlock(req.lock)

    def protected_len(self, rid: int) -> int:
        return self._reqs[rid].kv.cache_protected_len // self.block_size

    def evict(self, blocks: int) -> int:
        r = self.cache.evict_for_alloc(
            self._mods["base"].EvictParams(num_tokens=blocks * self.block_size)
        )
        return r.num_tokens_evicted // self.block_size

    @property
    def evictable_blocks(self) -> int:
        return self.cache.evictable_size() // self.block_size

    @property
    def protected_blocks(self) -> int:
        return self.cache.protected_size() // self.block_size

    @property
    def tree_blocks(self) -> int:
        return self.evictable_blocks + self.protected_blocks

    def resident_block_ids(self) -> np.ndarray:
        parts = []
        core = self.cache.tree_core
        stack = list(core.root_node.children.values())
        ct = self._mods["components"].ComponentType.FULL
        while stack:
            node = stack.pop()
            value = node.component(ct).value
            if value is not None:
                parts.append(np.asarray(value.numpy(), np.int64)[:: self.block_size])
            stack.extend(node.children.values())
        if not parts:
            return np.empty(0, np.int64)
        return np.sort(np.concatenate(parts) // self.block_size)


def _swa_allocator_base() -> type:
    """The class SWAComponent's isinstance check names (a stub placeholder here)."""
    return importlib.import_module("sglang.srt.mem_cache.allocator.swa").SWATokenToKVPoolAllocator


class _PagedAllocator:
    """Full and SWA pools of pages with the full -> SWA page mapping (``HybridRef``'s
    docstring; a Mamba model's: the full pool alone). `page_block[p]` is the block id KV page
    `p` holds; frees are recorded as block ids (`take_freed`)."""

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

    def __init__(self, owner: _PagedAllocator) -> None:
        self.owner = owner

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        self.owner.free_full_segment(indices, start_pos, check=False)


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


def _mamba_server_defaults(chunk: int) -> None:
    """runtime_context is a stub: give the Mamba component the server defaults it reads and
    SGLang's chunk grid (mamba_cache_chunk_size = `chunk`)."""
    import math

    mamba_mod = importlib.import_module("sglang.srt.mem_cache.unified_cache.components.mamba")
    mamba_mod.get_exec = _Exec  # type: ignore[attr-defined]
    mamba_mod.mamba_cache_chunk_size = lambda: chunk  # type: ignore[attr-defined]
    mamba_mod.mamba_checkpoint_grid = (  # type: ignore[attr-defined]
        lambda page: math.lcm(chunk, page))


class HybridRef:
    """One real UnifiedRadixCache of a hybrid model (page = block, LRU, the Python tree
    core): FULL + SWA (``window`` tokens of sliding window, a full pool of ``full_blocks``
    pages and an SWA pool of ``swa_blocks``: gpt-oss, Gemma 3) or, with ``mamba_slots``,
    FULL + MAMBA without the extra buffer ("no_buffer": the state at each insert end, so
    SGLang requires a page of one token: block_size 1; ``chunk`` is SGLang's
    mamba_cache_chunk_size, FLA's 64, the grid of its branching point: Qwen3-Next).

    What the stubs leave out is the allocators (mem_cache/allocator/swa.py and the memory
    pools need devices): ``_PagedAllocator`` keeps their contract at page granularity (a
    full pool and an SWA pool of pages, ``full_to_swa_index_mapping``, the segment frees,
    ``translate_swa_indices_for_transfer``, the available sizes the eviction walk targets),
    ``_MambaRows`` the state slots. Every request row gets fresh KV pages (a request owns its
    pages until the tree adopts them), so a freed page names one (request, position) and maps
    back to the block id there.

    It drives the cache as the 0.5.23 scheduler does: match + lock at admission (``admit``;
    a Mamba match copies the state on write), the allocation's shortfalls evicted by
    evict_for_alloc (``allocate``; a Mamba model takes its state slot first), ``checkpoint``
    = checkpoint_into_tree (an unfinished request first frees its SWA KV older than the
    window: common.free_swa_out_of_window_slots), the decode steps' out-of-window frees
    before the finish checkpoint (``decode_to``), and ``release`` = release_kv_cache's row
    free (full KV past the protected prefix, SWA KV not freed yet, the state slot) and unlock.
    """

    def __init__(self, full_blocks: int, block_size: int = 64, *, swa_blocks: int = 0,
                 window: int | None = None, mamba_slots: int | None = None,
                 chunk: int = 64) -> None:
        if (window is None) == (mamba_slots is None):
            raise ValueError("HybridRef: a window (SWA) or mamba_slots (Mamba), one of them")
        mods = load_unified_modules()
        import torch

        self._torch = torch
        self._mods = mods
        self.block_size = block_size
        self.window = window
        self.mamba = mamba_slots is not None
        base = _swa_allocator_base()
        if not isinstance(base, type):
            raise SglangUnifiedUnavailable("allocator.swa stub has no allocator class")
        self.allocator = type("PagedAllocator", (_PagedAllocator, base), {})(
            block_size, full_blocks, swa_blocks, has_swa=not self.mamba)
        self._ct = mods["components"].ComponentType
        if self.mamba:
            if block_size != 1:
                raise ValueError("HybridRef: Mamba without the extra buffer pages by token")
            pool_base = _hybrid_pool_base()
            if not isinstance(pool_base, type):
                raise SglangUnifiedUnavailable("stubbed pools have no classes")
            _mamba_server_defaults(chunk)
            self.pool: _ReqToTokenPool = type("MambaPool", (_MambaRows, pool_base), {})(
                mamba_slots)
            self.cache = _unified_cache(mods, self.pool, self.allocator, 1, ("FULL", "MAMBA"),
                                        enable_mamba_extra_buffer=False)
            self._second = self._ct.MAMBA
        else:
            self.pool = _ReqToTokenPool()
            self.cache = _unified_cache(mods, self.pool, self.allocator, block_size,
                                        ("FULL", "SWA"), sliding_window_size=window)
            self._second = self._ct.SWA
        self._reqs: dict[int, _Req] = {}

    def _key(self, block_ids: np.ndarray) -> Any:
        return self._mods["radix"].RadixKey(array("q", block_tokens(block_ids, self.block_size)))

    def match(self, block_ids: np.ndarray, req: _Req | None = None
              ) -> tuple[int, Any, int | None]:
        """match_prefix (a Mamba model copies the state on write for ``req``): (hit blocks,
        last device node id, the branching seqlen in tokens: SWA's or Mamba's)."""
        base = self._mods["base"]
        if not self.mamba:
            r = self.cache.match_prefix(base.MatchPrefixParams(key=self._key(block_ids)))
            return r.device_prefix_len // self.block_size, r.last_device_node, \
                r.swa_branching_seqlen
        r = self.cache.match_prefix(base.MatchPrefixParams(
            key=self._key(block_ids), req=req, cow_mamba=req is not None))
        return r.device_prefix_len, r.last_device_node, r.mamba_branching_seqlen

    def admit(self, rid: int, block_ids: np.ndarray) -> tuple[int, int | None]:
        """Match and lock (the scheduler's admission): (hit blocks, branching seqlen)."""
        req = _Req(rid)
        hit, node, branching = self.match(block_ids, req if self.mamba else None)
        req.kv.cache_protected_len = req.kv.cache_inserted_len = hit * self.block_size
        if self.mamba:
            req.mamba_branching_seqlen = branching
        else:
            req.swa_branching_seqlen = branching
        req.lock = self.cache.lock(node)
        req.last_node = node
        req.owns_state = req.kv.holds_mamba
        self._reqs[rid] = req
        return hit, branching

    def allocate(self, rid: int, block_ids: np.ndarray, n: int) -> bool:
        """The request's `n` pages past its hit (a Mamba model: its state slot first), the
        shortfalls evicted; False (nothing allocated) where the pools cannot hold them."""
        req = self._reqs[rid]
        if not (self._room_for_state(req, n) if self.mamba else self._room_swa(n)):
            return False
        self._set_row(req, block_ids, n)
        return True

    def _room_swa(self, n: int) -> bool:
        a, c, bs = self.allocator, self.cache, self.block_size
        full_short = n - (a.full_capacity - a.full_used)
        swa_short = n - (a.swa_capacity - a.swa_used)
        if full_short > c.full_evictable_size() // bs or swa_short > c.swa_evictable_size() // bs:
            return False
        if full_short > 0 or swa_short > 0:
            self.evict(max(0, full_short), max(0, swa_short))
        return n <= a.full_capacity - a.full_used and n <= a.swa_capacity - a.swa_used

    def _room_for_state(self, req: _Req, n: int) -> bool:
        a, c = self.allocator, self.cache
        slots = self.pool.mamba_allocator  # type: ignore[attr-defined]
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
        return n <= a.full_capacity - a.full_used

    def _set_row(self, req: _Req, block_ids: np.ndarray, n: int) -> None:
        """The request's row: the matched prefix's tree KV indices, then `n` fresh pages
        (`block_ids` = its full blocks; a page past them holds block -1)."""
        torch = self._torch
        bs = self.block_size
        hit = req.kv.cache_protected_len // bs
        prefix = self.cache.path_device_indices(req.last_node)
        assert len(prefix) == hit * bs, (len(prefix), hit)
        ids = np.full(n, -1, np.int64)
        tail = np.asarray(block_ids[hit: hit + n], np.int64)
        ids[: len(tail)] = tail
        starts = self.allocator.alloc_pages(ids)
        fresh = (starts[:, None] + np.arange(bs)).reshape(-1)
        self.pool.rows[int(req.rid)] = torch.cat([prefix.to(torch.int64),
                                                  torch.from_numpy(fresh)])
        req.full_untruncated_fill_ids = array("q", block_tokens(block_ids, bs))
        req.owned = (hit + n) * bs

    def checkpoint(self, rid: int, blocks: int, finished: bool) -> None:
        """checkpoint_into_tree(req, up_to=blocks * block_size)."""
        req = self._reqs[rid]
        req._finished = finished
        req.fill = blocks * self.block_size
        self.cache.checkpoint_into_tree(req, up_to=req.fill)
        if finished:
            req.owns_state = False  # donated to the tree, or freed there

    def decode_to(self, rid: int, seq_tokens: int) -> None:
        """The decode steps' out-of-window SWA frees at a sequence of `seq_tokens` tokens
        (the scheduler: free_swa_out_of_window_slots(req, seq_len - 1) every step; nothing
        for a Mamba model)."""
        if not self.mamba:
            req = self._reqs[rid]
            self.cache.components[self._ct.SWA]._free_out_of_window_slots(req, seq_tokens - 1)

    def release(self, rid: int) -> None:
        """release_kv_cache without the checkpoint: free the row past the protected prefix,
        the state slot still owned, unlock."""
        req = self._reqs.pop(rid)
        if req.owned > req.kv.cache_protected_len:
            self.cache.free_kv_row(req.kv, [(req.kv.cache_protected_len, req.owned)])
        self._end(req)

    def drop(self, rid: int) -> None:
        """An admission whose allocation failed: unlock only (and its state slot)."""
        self._end(self._reqs.pop(rid))

    def _end(self, req: _Req) -> None:
        if req.owns_state and req.kv.holds_mamba:
            self.pool.free_mamba_cache(req)  # type: ignore[attr-defined]
        self.cache.unlock(req.lock)

    def evict(self, full_blocks: int, swa_blocks: int) -> None:
        bs = self.block_size
        self.cache.evict_for_alloc(self._mods["base"].EvictParams(
            num_tokens=full_blocks * bs, swa_num_tokens=swa_blocks * bs))

    def states_freed(self) -> int:
        """Mamba state slots freed so far (0 for SWA)."""
        return self.pool.mamba_allocator.freed if self.mamba else 0  # type: ignore[attr-defined]

    def state(self) -> dict[str, Any]:
        """Sizes (blocks) and the resident full and SWA block ids of the tree (Mamba: the
        last block of each node holding a state)."""
        c, bs = self.cache, self.block_size
        full, second = [], []
        stack = list(c.tree_core.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            fv = node.component(self._ct.FULL).value
            if fv is None:
                continue
            blocks = self.allocator.page_block[np.asarray(fv.numpy(), np.int64)[::bs] // bs]
            full.append(blocks)
            if node.component(self._second).value is not None:
                second.append(blocks[-1:] if self.mamba else blocks)
        if self.mamba:
            slots = self.pool.mamba_allocator  # type: ignore[attr-defined]
            return {
                "full_evictable": c.full_evictable_size(),
                "full_protected": c.full_protected_size(),
                "state_evictable": c.mamba_evictable_size(),
                "state_protected": c.mamba_protected_size(),
                "full_used": self.allocator.full_used,
                "state_used": slots.capacity - slots.available_size(),
                "full": sorted_cat(full),
                "states": sorted_cat(second),
            }
        return {
            "full_evictable": c.full_evictable_size() // bs,
            "full_protected": c.full_protected_size() // bs,
            "swa_evictable": c.swa_evictable_size() // bs,
            "swa_protected": c.swa_protected_size() // bs,
            "full_used": self.allocator.full_used,
            "swa_used": self.allocator.swa_used,
            "full": sorted_cat(full),
            "swa": sorted_cat(second),
        }
