"""The real SGLang RadixCache (sglang==0.5.23), loaded without its ~100 dependencies.

`sglang` is installed with `pip install --no-deps sglang==0.5.23` beside CPU torch. Importing it
the normal way runs `sglang/__init__.py`, which pulls in transformers, FlashInfer and the whole
server. We only need `sglang/srt/mem_cache/radix_cache.py` and the small pure-Python modules it
really uses (base_prefix_cache, cache_init_params, events, mem_cache/utils, evict_policy). So we
register, in `sys.modules`, a bare `sglang` package that points at the installed directory
(its `__init__` is not run) plus stub modules for the heavy imports those files make at import
time but never call on the simulated path (allocator, memory pools, metrics, runtime context,
KV events, env vars, the native hasher, Triton kernels). `sglang.srt.utils.common` is replaced
by a stub that carries the *real* `ceil_align` (and `ceil_div`) compiled from the installed
source, so no behaviour of the tree is re-implemented here.

The module's `time` is replaced by a logical clock: every `time.monotonic()` call returns the
next integer, so node stamps are deterministic and strictly increasing (a match stamps its
whole path with ONE tick; nodes created afterwards, e.g. by a split, get newer ticks), exactly
the order the wall clock would give, minus the ties and the nondeterminism.

`SglangRef` wraps one tree with a mock allocator that records exactly which KV indices are
freed. Block `b` is token ids `b*64 .. b*64+63` and its KV indices are the same numbers, so a
freed index maps back to its block id by `index // block_size`.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import sys
import types
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.stubbing import StubModule

SGLANG_VERSION = "0.5.23"

# Modules radix_cache.py (and the four real modules it needs) import at load time but whose
# contents are never called by a simulated tree. Each becomes an empty stub whose attributes are
# inert placeholder classes.
_STUBBED = (
    "sglang.srt.mem_cache.allocator",
    "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.unified_cache",
    "sglang.srt.mem_cache.unified_cache.component_type",
    "sglang.srt.observability",
    "sglang.srt.observability.metrics_collector",
    "sglang.srt.runtime_context",
    "sglang.srt.disaggregation",
    "sglang.srt.disaggregation.kv_events",
    "sglang.srt.environ",
    "sglang.srt.mem_cache.cpp_utils",
    "sglang.srt.mem_cache.cpp_utils.native_hash",
    "sglang.kernels",
    "sglang.kernels.ops",
    "sglang.kernels.ops.kvcache",
    "sglang.kernels.ops.kvcache.mla_buffer",
    "sglang.srt.utils",
)


class SglangUnavailable(RuntimeError):
    """sglang (or torch) is not installed, or is not the pinned version."""


class LogicalClock:
    """Stands in for the `time` module inside radix_cache.py.

    `monotonic()` returns 1.0, 2.0, ... (one tick per call). `perf_counter()` only feeds
    eviction-duration metrics (disabled here) and returns 0.0 so nothing reads the wall clock.
    """

    def __init__(self) -> None:
        self.ticks = 0

    def monotonic(self) -> float:
        self.ticks += 1
        return float(self.ticks)

    def perf_counter(self) -> float:
        return 0.0


_MODULES: dict[str, types.ModuleType] | None = None


def _sglang_dir() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SglangUnavailable("sglang is not installed (pip install --no-deps sglang==0.5.23)")
    return Path(next(iter(spec.submodule_search_locations)))


def _installed_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def _real_functions(source: Path, names: Iterable[str]) -> dict[str, Any]:
    """Compile only the named top-level functions of `source` (they are pure arithmetic)."""
    tree = ast.parse(source.read_text())
    wanted = set(names)
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    missing = wanted - {n.name for n in body}
    if missing:
        raise SglangUnavailable(f"{source}: functions {sorted(missing)} not found")
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(source), "exec"), namespace)
    return {name: namespace[name] for name in wanted}


def load_radix_cache_module() -> types.ModuleType:
    """Import sglang.srt.mem_cache.radix_cache for real, heavy imports stubbed (once per process).

    Raises SglangUnavailable when sglang or torch is missing or sglang is not 0.5.23.
    """
    global _MODULES
    if _MODULES is not None:
        return _MODULES["radix_cache"]
    version = _installed_version()
    if version != SGLANG_VERSION:
        raise SglangUnavailable(f"sglang=={SGLANG_VERSION} required, found {version}")
    if importlib.util.find_spec("torch") is None:
        raise SglangUnavailable("torch is not installed (CPU torch is enough)")
    root = _sglang_dir()
    real_sglang = sys.modules.get("sglang")
    if real_sglang is None:
        # A bare package object: submodules load from the installed files, __init__ never runs.
        package = types.ModuleType("sglang")
        package.__path__ = [str(root)]
        package.__file__ = str(root / "__init__.py")
        sys.modules["sglang"] = package
        for name in _STUBBED:
            if name not in sys.modules:
                stub = StubModule(name)
                stub.__path__ = []  # a package, so stubbed submodules resolve through it
                sys.modules[name] = stub
        common = StubModule("sglang.srt.utils.common")
        for name, fn in _real_functions(
            root / "srt" / "utils" / "common.py", ("ceil_div", "ceil_align")
        ).items():
            setattr(common, name, fn)
        sys.modules["sglang.srt.utils.common"] = common
    radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
    base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
    radix.time = LogicalClock()  # the module's `time`: deterministic stamps
    _MODULES = {"radix_cache": radix, "base_prefix_cache": base}
    return radix


def sglang_available() -> bool:
    try:
        load_radix_cache_module()
    except (SglangUnavailable, ImportError):
        return False
    return True


@contextlib.contextmanager
def torch_single_thread() -> Iterator[None]:
    """Run torch on one CPU thread inside the block (restored after).

    The tree clones KV-index tensors on insert and split. On CPU, torch's default intra-op
    thread pool makes each small clone ~100x slower on a busy 2-core machine (20 ms instead of
    0.1 ms, measured); one thread is SGLang's fastest CPU configuration, so speed comparisons
    and tests use it.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class RecordingAllocator:
    """The allocator RadixCache needs in simulation: a `device` and `free_segment`.

    It records every freed KV index; `take_freed()` returns them as block ids (index // 64) and
    clears the record. With `record=False` (speed runs) it does nothing at all.
    """

    device = "cpu"

    def __init__(self, block_size: int, record: bool = True) -> None:
        self.block_size = block_size
        self.record = record
        self._freed: list[np.ndarray] = []

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        if not self.record:
            return
        arr = np.asarray(indices.numpy() if hasattr(indices, "numpy") else indices, np.int64)
        if arr.size:
            self._freed.append(arr)

    def take_freed(self) -> np.ndarray:
        """Block ids of every full block freed since the last call (a multiset, sorted)."""
        if not self._freed:
            return np.empty(0, np.int64)
        idx = np.concatenate(self._freed)
        self._freed.clear()
        bs = self.block_size
        runs = idx.reshape(-1, bs) if idx.size % bs == 0 else None
        if runs is None or np.any(runs[:, 0] % bs) or np.any(np.diff(runs, axis=1) != 1):
            raise AssertionError("SGLang freed a partial block: page alignment broken")
        return np.sort(idx[::bs] // bs)


def block_tokens(block_ids: np.ndarray, block_size: int) -> np.ndarray:
    """Token ids (= KV indices) of whole blocks: token j of block b is b*block_size + j."""
    ids = np.asarray(block_ids, np.int64)
    return (ids[:, None] * block_size + np.arange(block_size, dtype=np.int64)).reshape(-1)


class SglangRef:
    """One real SGLang RadixCache (page size = block size, LRU) driven by block ids.

    Sizes are reported in blocks (SGLang counts tokens; every tree key is page aligned).
    """

    def __init__(
        self, block_size: int = 64, eviction_policy: str = "lru", record: bool = True
    ) -> None:
        radix = load_radix_cache_module()
        base = _MODULES["base_prefix_cache"]  # type: ignore[index]
        import torch

        self._torch = torch
        self._radix = radix
        self._base = base
        self.block_size = block_size
        self.allocator = RecordingAllocator(block_size, record)
        params = sys.modules["sglang.srt.mem_cache.cache_init_params"].CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=self.allocator,
            page_size=block_size,
            eviction_policy=eviction_policy,
        )
        self.tree = radix.RadixCache(params)

    # -- inputs -------------------------------------------------------------------------------
    def key(self, block_ids: np.ndarray) -> Any:
        """A RadixKey over the tokens of `block_ids`."""
        tokens = array("q")
        tokens.frombytes(block_tokens(block_ids, self.block_size).tobytes())
        return self._radix.RadixKey(tokens)

    def value(self, block_ids: np.ndarray) -> Any:
        """KV indices of `block_ids` (equal to their token ids, see module doc)."""
        return self._torch.from_numpy(block_tokens(block_ids, self.block_size))

    # -- operations ---------------------------------------------------------------------------
    def match(self, key: Any) -> tuple[int, Any]:
        """match_prefix: (hit blocks, last node). Splits and stamps as SGLang does."""
        r = self.tree.match_prefix(self._base.MatchPrefixParams(key=key))
        return r.device_prefix_len // self.block_size, r.last_device_node

    def touch(self, key: Any) -> None:
        self.tree.touch_prefix(key)

    def lock(self, node: Any) -> None:
        self.tree.inc_lock_ref(node)

    def unlock(self, node: Any) -> None:
        self.tree.dec_lock_ref(node)

    def evict(self, blocks: int) -> int:
        """evict_for_alloc(shortfall): returns blocks evicted (whole nodes: may overshoot)."""
        r = self.tree.evict_for_alloc(self._base.EvictParams(num_tokens=blocks * self.block_size))
        return r.num_tokens_evicted // self.block_size

    def insert(self, key: Any, value: Any) -> int:
        """insert: returns the blocks that were already in the tree (SGLang's prefix_len)."""
        r = self.tree.insert(self._base.InsertParams(key=key, value=value))
        return r.prefix_len // self.block_size

    def free_duplicates(self, value: Any, start_block: int, end_block: int) -> None:
        """What `_insert_cache` does after insert: free the request's own copies of blocks
        [start, end) that another request inserted first (start = the arrival hit)."""
        if end_block > start_block:
            bs = self.block_size
            self.allocator.free_segment(value[start_block * bs : end_block * bs])

    # -- observations -------------------------------------------------------------------------
    @property
    def tree_blocks(self) -> int:
        return (self.tree.evictable_size_ + self.tree.protected_size_) // self.block_size

    @property
    def evictable_blocks(self) -> int:
        return self.tree.evictable_size_ // self.block_size

    @property
    def protected_blocks(self) -> int:
        return self.tree.protected_size_ // self.block_size

    def resident_block_ids(self) -> np.ndarray:
        """Sorted block ids of every node's KV (DFS over the tree)."""
        parts = []
        stack = list(self.tree.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.value is not None:
                tokens = np.frombuffer(node.key.token_ids, np.int64)[: len(node.key)]
                parts.append(tokens[:: self.block_size])
            stack.extend(node.children.values())
        if not parts:
            return np.empty(0, np.int64)
        return np.sort(np.concatenate(parts) // self.block_size)
