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

`UnifiedRef` drives the cache the way the 0.5.23 scheduler does: `match` (match_prefix) and
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
    """req_to_token[slot, :n] over per-request rows (the cache indexes it only that way)."""

    def __init__(self, rows: dict[int, Any]) -> None:
        self.rows = rows

    def __getitem__(self, where: tuple[int, slice]) -> Any:
        slot, sl = where
        return self.rows[slot][sl]


class _ReqToTokenPool:
    """req_to_token rows (token id = KV index: a row is the request's token ids)."""

    def __init__(self) -> None:
        self.rows: dict[int, Any] = {}
        self.req_to_token = _Rows(self.rows)

    def write(self, where: tuple[int, slice], values: Any) -> None:
        row, sl = where
        self.rows[row][sl] = values


class _Kv:
    def __init__(self, slot: int, protected: int) -> None:
        self.req_pool_idx = slot
        self.cache_protected_len = protected
        self.cache_inserted_len = protected


class _Req:
    """The Req fields checkpoint_into_tree reads (a full-attention, non-session request)."""

    def __init__(self, rid: int, slot: int, prompt: array, protected: int) -> None:
        self.rid = str(rid)
        self.kv = _Kv(slot, protected)
        self.origin_input_ids = prompt
        self.full_untruncated_fill_ids = prompt
        self.priority = None
        self.session_id = None
        self.kv_rotation_base = None
        self.extra_key = None
        self.cache_salt = None
        self.lock: Any = None
        self.last_node: Any = None
        self.finished_reason = None
        self._finished = False

    def finished(self) -> bool:
        return self._finished


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
        params = mods["params"].CacheInitParams(
            disable=False,
            req_to_token_pool=self.pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=block_size,
            eviction_policy="lru",
            tree_components=(mods["components"].ComponentType.FULL,),
            tree_core_backend="python",
        )
        self.cache = mods["urc"].UnifiedRadixCache(params)
        if type(self.cache.tree_core).__name__ != "UnifiedTreeCore":
            raise SglangUnifiedUnavailable("the pure-Python tree core was not selected")
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
        req = _Req(rid, rid, prompt, hit * self.block_size)
        req.lock = self.cache.lock(node)
        req.last_node = node
        self._reqs[rid] = req

    def checkpoint(self, rid: int, block_ids: np.ndarray, finished: bool) -> None:
        """checkpoint_into_tree(req, up_to) over the full blocks `block_ids`."""
        req = self._reqs[rid]
        tokens = self._torch.from_numpy(block_tokens(block_ids, self.block_size))
        self.pool.rows[req.kv.req_pool_idx] = tokens.clone()
        req.full_untruncated_fill_ids = array("q", tokens.numpy())
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

