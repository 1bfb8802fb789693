"""The real vLLM KVCacheManager (vllm==0.33.0 or 0.34.0), loaded on a CPU without its ~25
dependencies.

Two pinned installs (the Makefile's test stamp): `pip install --no-deps vllm==0.33.0` into the
venv beside CPU torch and `cbor2` (imported at top level by `vllm/utils/hashing.py`), and
`pip install --no-deps --target .venv/vllm-0.34.0 vllm==0.34.0` (never on `sys.path`: its
directory is only the root the bare packages below point at). `use_vllm(version)` picks the
one `load_vllm_core` loads (default the newest); both can be loaded in one process, one at a
time in `sys.modules` (switching swaps their `vllm.*` modules). Importing it the normal way runs
`vllm/__init__.py`, which pulls in the whole engine. We only need `vllm/v1/core/` (the
manager, coordinator, single-type managers, block pool, kv_cache_utils), `vllm/v1/request.py`
and `vllm/v1/kv_cache_interface.py`. So we register, in `sys.modules`, bare `vllm`, `vllm.v1`
and `vllm.v1.structured_output` packages that point at the installed directories (their
`__init__` is not run) plus 13 inert stub modules for what those files import at load time but
never call on this path (config, logging, KV events, multimodal, sampling and pooling params,
engine types, metrics, utils). Four real definitions are needed on the stubs (0.34: five);
they are compiled from the installed source with `ast` (`MEDIUM_GPU`/`MEDIUM_CPU`,
`ConstantList`, `FinishReason` + `FINISH_REASON_STRINGS`, `get_dtype_size`; 0.34's scheduler
always hands `strip_covered_mm_data` a new request's multimodal features, since its V1 model
runner is gone), so nothing of vLLM is re-implemented here. The full-attention manager is
registered by hand, so `register_all_kvcache_specs` (which needs `vllm.config` and
`vllm.platforms`) never runs.
docs/engine.md (the differential tests) says what the harness covers and how it is checked.

`VllmRef` drives one manager (one full-attention group, `capacity_blocks` usable blocks; block 0
is vLLM's null block) the way vLLM's V1 scheduler does, by block ids: block `b` is token ids
`b*bs .. b*bs+bs-1`, so two requests share a hashed block exactly when their kvsim ids agree
(ids are chained). Tokens after a request's last full block are filler that never fills a
block. Every block hash vLLM computes is mapped back to its kvsim id, so the state can be
observed in kvsim's terms (`observe`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.stubbing import StubModule, real_definitions

# The pinned installs, oldest first (Makefile test stamp); the newest is the default.
VLLM_VERSIONS = ("0.33.0", "0.34.0")

# Loaded at import time by the real modules we use, never called on the simulated path.
_STUBBED = (
    "vllm.config",
    "vllm.logger",
    "vllm.distributed.kv_events",
    "vllm.multimodal.utils",
    "vllm.multimodal.inputs",
    "vllm.pooling_params",
    "vllm.sampling_params",
    "vllm.v1.engine",
    "vllm.v1.kv_hints",
    "vllm.v1.metrics.stats",
    "vllm.v1.utils",
    "vllm.utils.torch_utils",
    "vllm.utils.import_utils",
)
# Packages whose __init__ must not run (it imports the engine).
_BARE = ("vllm", "vllm.v1", "vllm.v1.structured_output")
# Real definitions the stubs must carry: (stub module, source file, names).
_REAL = (
    ("vllm.distributed.kv_events", "distributed/kv_events.py", ("MEDIUM_GPU", "MEDIUM_CPU")),
    ("vllm.v1.utils", "v1/utils.py", ("T", "ConstantList")),
    ("vllm.v1.engine", "v1/engine/__init__.py", ("FINISH_REASON_STRINGS", "FinishReason")),
    ("vllm.utils.torch_utils", "utils/torch_utils.py", ("get_dtype_size",)),
)
# ... and since 0.34 (its annotations name stubbed classes: resolved on their stubs)
_REAL_034 = (
    ("vllm.multimodal.utils", "multimodal/utils.py", ("strip_covered_mm_data",)),
)


class VllmUnavailable(RuntimeError):
    """vllm (or torch, cbor2) is not installed, or is not the pinned version."""


_ACTIVE = VLLM_VERSIONS[-1]  # what load_vllm_core loads when not told (use_vllm)
_MODULES: dict[str, dict[str, types.ModuleType]] = {}  # loaded versions' modules by short name
_SAVED: dict[str, dict[str, types.ModuleType]] = {}  # a loaded version's sys.modules entries
_IN_SYS: str | None = None  # the version whose vllm.* modules sys.modules holds


def pinned(version: str) -> str:
    """The pinned install ``version`` names (``0.34`` or ``0.34.0``); VllmUnavailable when
    none does."""
    for v in VLLM_VERSIONS:
        if version in (v, v.rsplit(".", 1)[0]):
            return v
    raise VllmUnavailable(f"vllm {version} is not one of the pinned installs {VLLM_VERSIONS}")


def use_vllm(version: str) -> str:
    """Make ``version`` the one ``load_vllm_core()`` loads from now on; returns it pinned."""
    global _ACTIVE
    _ACTIVE = pinned(version)
    return _ACTIVE


def active_version() -> str:
    return _ACTIVE


def vllm_root(version: str) -> Path:
    """The ``vllm`` package directory of the pinned install ``version``: ``vllm-<version>``
    beside the venv's ``bin`` (a ``pip install --target``), else the venv's own install."""
    from importlib import metadata

    version = pinned(version)
    target = Path(sys.prefix) / f"vllm-{version}"
    found = []
    for path in ([str(target)], None):
        for dist in metadata.distributions(name="vllm", **({"path": path} if path else {})):
            if dist.version == version:
                return Path(str(dist.locate_file("vllm")))
            found.append(dist.version)
    raise VllmUnavailable(
        f"vllm=={version} required, found {', '.join(found) or 'none'} (make test installs "
        f"it: pip install --no-deps --target {target} vllm=={version})")


def _is_vllm(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm.")


def _switch(version: str) -> None:
    """Put ``version``'s vllm.* modules in sys.modules (none yet: an empty slate), keeping
    the other version's aside: a module imported at call time resolves to its own version."""
    global _IN_SYS
    if _IN_SYS == version:
        return
    if _IN_SYS is None and "vllm" in sys.modules and not isinstance(
            sys.modules.get("vllm.config"), StubModule):
        raise VllmUnavailable("a real vllm is already imported in this process")
    names = [n for n in sys.modules if _is_vllm(n)]
    if _IN_SYS is not None:
        _SAVED[_IN_SYS] = {n: sys.modules[n] for n in names}
    for n in names:
        del sys.modules[n]
    sys.modules.update(_SAVED.get(version, {}))
    _IN_SYS = version


def load_vllm_core(version: str | None = None) -> dict[str, types.ModuleType]:
    """Import vLLM's v1 KV-cache modules for real, heavy imports stubbed (once per process and
    version; ``version``: a pinned install, default ``use_vllm``'s).

    Returns the modules by short name. Raises VllmUnavailable when torch or cbor2 is missing
    or that vllm is not installed.
    """
    version = pinned(version or _ACTIVE)
    if version in _MODULES:
        _switch(version)
        return _MODULES[version]
    for dep in ("torch", "cbor2"):
        if importlib.util.find_spec(dep) is None:
            raise VllmUnavailable(f"{dep} is not installed (needed by vllm's KV-cache core)")
    root = vllm_root(version)
    _switch(version)
    # an import hook serving stubs for the scheduler's imports (vllm_sched_ref) would stub
    # modules the core imports for real: off while the core loads
    hooks = [f for f in sys.meta_path if getattr(f, "serves_vllm_stubs", False)]
    sys.meta_path[:] = [f for f in sys.meta_path if f not in hooks]
    try:
        mods = _load_core(root, version)
    finally:
        sys.meta_path[:0] = hooks
    _MODULES[version] = mods
    return mods


def _load_core(root: Path, version: str) -> dict[str, types.ModuleType]:
    for name in _BARE:
        path = root.joinpath(*name.split(".")[1:])
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        package.__file__ = str(path / "__init__.py")
        sys.modules[name] = package
    for name in _STUBBED:
        stub = StubModule(name)
        stub.__path__ = []  # a package, so stubbed submodules resolve through it
        sys.modules[name] = stub
    sys.modules["vllm.logger"].init_logger = logging.getLogger  # type: ignore[attr-defined]
    inputs = sys.modules["vllm.multimodal.inputs"]
    stubs = {n: getattr(inputs, n) for n in ("MultiModalFeatureSpec", "MultiModalKwargsItem")}
    for module, rel, names in _REAL + (_REAL_034 if since(version, "0.34") else ()):
        for name, value in real_definitions(root / rel, names, VllmUnavailable,
                                            stubs).items():
            setattr(sys.modules[module], name, value)
    mods = {
        short: importlib.import_module(f"vllm.{path}")
        for short, path in (
            ("manager", "v1.core.kv_cache_manager"),
            ("single", "v1.core.single_type_kv_cache_manager"),
            ("utils", "v1.core.kv_cache_utils"),
            ("interface", "v1.kv_cache_interface"),
            ("request", "v1.request"),
            ("hashing", "utils.hashing"),
            ("registry", "v1.kv_cache_spec_registry"),
        )
    }
    iface, single = mods["interface"], mods["single"]
    mods["registry"].KVCacheSpecRegistry.register(
        iface.FullAttentionSpec,
        single.FullAttentionManager,
        uniform_type_base_spec=iface.FullAttentionSpec,
    )
    return mods


def since(version: str, release: str) -> bool:
    """Whether pinned ``version`` is ``release`` (``0.34``) or newer."""
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v)[:2])

    return key(pinned(version)) >= key(release)


def vllm_available() -> bool:
    try:
        load_vllm_core()
    except (VllmUnavailable, ImportError):
        return False
    return True


class _SamplingParams:
    """The attributes `Request.__init__` reads from a SamplingParams (the real class is
    stubbed: it would import the whole sampling stack)."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.extra_args = None
        self.structured_outputs = None
        self.skip_reading_prefix_cache = None

    # read since 0.34 (Request.get_prefix_cache_hit_limit): no prompt logprobs
    prompt_logprobs = None
    prompt_logprob_token_ids = None


def request_tokens(ids: np.ndarray, n_tokens: int, block_size: int, rid: int) -> list[int]:
    """The first `n_tokens` token ids of a request: token j of block b is b*bs + j for every
    block `ids` covers (a prompt's partial last block included, so it hashes like kvsim's id
    once decode fills it), then filler (negative, unique per request) past the last id.
    Since 0.34 a Request keeps its tokens as int32 (``v1/token_buffer.py``): ids must stay
    below 2**31 / block_size (OverflowError otherwise)."""
    ids = np.asarray(ids, np.int64)
    covered = min(len(ids), -(-n_tokens // block_size))
    toks = (ids[:covered, None] * block_size + np.arange(block_size, dtype=np.int64)).reshape(-1)
    filler = np.full(max(0, n_tokens - covered * block_size), -(rid + 1), np.int64)
    return np.concatenate([toks[:n_tokens], filler]).tolist()


class VllmRef:
    """One real vLLM KVCacheManager with prefix caching (``version``: a pinned install,
    default ``use_vllm``'s), driven by kvsim block ids.

    Per request: `lookup` (get_computed_blocks, read-only), `admit` (get_computed_blocks then
    allocate_slots with the hit, as the V1 scheduler schedules a waiting request), `extend`
    (allocate_slots for k more tokens of a running request: the next prefill chunk, or k
    decode tokens appended first), `free` (finish or preemption). Hits are in blocks.
    """

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int = 64,
        full_sequence_must_fit: bool = True,
        version: str | None = None,
        max_in_flight_tokens: int | None = None,
    ) -> None:
        mods = load_vllm_core(version)
        import torch

        iface, hashing, utils = mods["interface"], mods["hashing"], mods["utils"]
        self._mods = mods
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.full_sequence_must_fit = full_sequence_must_fit
        config = iface.KVCacheConfig(
            num_blocks=capacity_blocks + 1,
            kv_cache_tensors=[],
            kv_cache_groups=self._group_specs(iface, torch),
        )
        self.manager = mods["manager"].KVCacheManager(
            config,
            max_model_len=1 << 40,
            scheduler_block_size=block_size,
            hash_block_size=block_size,
            max_in_flight_tokens=max_in_flight_tokens,  # None: vLLM's default, max_model_len
            enable_caching=True,
        )
        self.pool = self.manager.block_pool
        utils.init_none_hash(hashing.sha256)
        self._hasher = utils.get_request_block_hasher(block_size, hashing.sha256)
        self._status = mods["request"].RequestStatus
        self._reqs: dict[int, Any] = {}
        self._ids: dict[int, np.ndarray] = {}
        self._mapped: dict[int, int] = {}  # rid -> block hashes already mapped to ids
        self._hash_to_id: dict[Any, int] = {}

    def _group_specs(self, iface: types.ModuleType, torch: Any) -> list[Any]:
        """The KV cache groups: one full-attention group of one layer."""
        spec = iface.FullAttentionSpec(
            block_size=self.block_size, num_kv_heads=1, head_size=1, dtype=torch.float16
        )
        return [iface.KVCacheGroupSpec(["layers.0"], spec)]

    # -- requests -----------------------------------------------------------------------------
    def _map_hashes(self, rid: int) -> None:
        req, ids = self._reqs[rid], self._ids[rid]
        hashes = req.block_hashes
        for i in range(self._mapped.get(rid, 0), min(len(hashes), len(ids))):
            key, bid = hashes[i], int(ids[i])
            old = self._hash_to_id.setdefault(key, bid)
            if old != bid:
                raise AssertionError(f"hash collision: ids {old} and {bid}")
        self._mapped[rid] = min(len(hashes), len(ids))

    def new_request(self, rid: int, ids: np.ndarray, num_tokens: int) -> None:
        """Create request `rid` with `num_tokens` tokens (a prompt, or for a request resumed
        after preemption the prompt plus its outputs so far); `ids` are the ids of every full
        block the request will ever have (prompt and decode)."""
        tokens = request_tokens(ids, num_tokens, self.block_size, rid)
        req = self._mods["request"].Request(
            str(rid), tokens, _SamplingParams(1 << 30), None, block_hasher=self._hasher
        )
        self._reqs[rid] = req
        self._ids[rid] = np.asarray(ids, np.int64)
        self._mapped[rid] = 0
        self._map_hashes(rid)

    def lookup(self, rid: int) -> int:
        """get_computed_blocks: hit blocks (capped at num_tokens - 1), nothing touched."""
        hit_tokens = self.manager.get_computed_blocks(self._reqs[rid])[1]
        return hit_tokens // self.block_size

    def admit(self, rid: int, num_new_tokens: int) -> tuple[bool, int]:
        """Schedule waiting request `rid`: lookup, then allocate_slots for `num_new_tokens`
        tokens after the hit (capped at what remains). Returns (admitted, hit blocks)."""
        req = self._reqs[rid]
        blocks, hit_tokens = self.manager.get_computed_blocks(req)[:2]
        new = min(num_new_tokens, req.num_tokens - hit_tokens)
        out = self.manager.allocate_slots(
            req,
            new,
            num_new_computed_tokens=hit_tokens,
            new_computed_blocks=blocks,
            full_sequence_must_fit=self.full_sequence_must_fit,
        )
        if out is None:
            return False, hit_tokens // self.block_size
        req.status = self._status.RUNNING
        req.num_computed_tokens = hit_tokens + new
        return True, hit_tokens // self.block_size

    def _append(self, rid: int, n: int) -> None:
        req = self._reqs[rid]
        n0 = req.num_tokens
        req.append_output_token_ids(
            request_tokens(self._ids[rid], n0 + n, self.block_size, rid)[n0:]
        )
        self._map_hashes(rid)

    def extend(self, rid: int, num_new_tokens: int, known: int | None = None) -> bool:
        """allocate_slots for the next `num_new_tokens` tokens of running request `rid`. Tokens
        past the request's current ones (k decode steps at once) are appended first, as the
        scheduler appends sampled tokens before scheduling them; they stay appended when the
        allocation is refused. `known`: only the first `known` tokens exist yet (async
        scheduling allocates for placeholders; vLLM caches no block past num_tokens)."""
        req = self._reqs[rid]
        upto = req.num_computed_tokens + num_new_tokens if known is None else known
        append = upto - req.num_tokens
        if append > 0:
            self._append(rid, append)
        if self.manager.allocate_slots(req, num_new_tokens) is None:
            return False
        req.num_computed_tokens += num_new_tokens
        return True

    def cache_known(self, rid: int, tokens: int) -> None:
        """A step's output was processed (async scheduling): the request's first `tokens`
        tokens exist, and cache_blocks caches the blocks they fill."""
        req = self._reqs[rid]
        if tokens > req.num_tokens:
            self._append(rid, tokens - req.num_tokens)
        self.manager.cache_blocks(req, tokens)
        self._map_hashes(rid)

    def num_tokens(self, rid: int) -> int:
        """Tokens of request ``rid`` so far (prompt + output tokens appended)."""
        return self._reqs[rid].num_tokens

    def sample(self, rid: int) -> None:
        """The step that computed the sequence's last token sampled the next one."""
        self._append(rid, 1)

    def free(self, rid: int) -> None:
        """Finish or preempt: free the request's blocks (vLLM frees them tail first)."""
        req = self._reqs.pop(rid)
        self._ids.pop(rid)
        self._mapped.pop(rid)
        req.status = self._status.FINISHED_STOPPED
        self.manager.free(req)

    def preempt(self, rid: int) -> None:
        """What the scheduler's _preempt_request does to the cache and the request: free its
        blocks, keep its outputs, reset its computed tokens (it is admitted again later)."""
        req = self._reqs[rid]
        self.manager.free(req)
        req.status = self._status.PREEMPTED
        req.num_computed_tokens = 0

    def running(self) -> list[int]:
        """Requests holding blocks (admitted, not freed or preempted)."""
        return [rid for rid, r in self._reqs.items() if r.status == self._status.RUNNING]

    # -- observations -------------------------------------------------------------------------
    def _id_of(self, block: Any) -> int:
        h = block.block_hash
        return -1 if h is None else self._hash_to_id[self._mods["utils"].get_block_hash(h)]

    def free_queue(self) -> list[tuple[int, int]]:
        """The free queue front (evicted first) to back: (physical block, kvsim id or -1)."""
        queue = self.pool.free_block_queue.get_all_free_blocks()
        return [(b.block_id, self._id_of(b)) for b in queue]

    def blocks(self) -> np.ndarray:
        """Per physical block 1..capacity: (kvsim id or -1, ref count), shape (capacity, 2)."""
        return np.array([(self._id_of(b), b.ref_cnt) for b in self.pool.blocks[1:]], np.int64)

    def table(self, rid: int) -> list[int]:
        """Physical blocks held by request `rid`, in position order."""
        return [b.block_id for b in self.manager.coordinator.get_blocks(str(rid))[0]]

    def tables(self, rid: int) -> list[np.ndarray]:
        """Per KV cache group: the physical blocks request ``rid`` holds by position (a
        hybrid's null blocks: 0)."""
        return [np.array([b.block_id for b in blocks], np.int64)
                for blocks in self.manager.coordinator.get_blocks(str(rid))]

    @property
    def free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()
