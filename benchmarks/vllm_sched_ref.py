"""vLLM's real V1 ``Scheduler`` and ``AsyncScheduler`` (0.33.0 or 0.34.0: the pinned installs
of ``benchmarks.vllm_ref``) on a CPU, driven step by step beside kvsim's vLLM engine
(``sim/engines/vllm.py``) on the same request stream.

Loading: on top of ``benchmarks.vllm_ref.load_vllm_core`` (the KV-cache core, real), the
scheduler package ``vllm/v1/core/sched`` and what it needs to decide are imported for real:
the encoder cache manager, ``v1/outputs.py``, ``v1/structured_output/request.py``,
``utils/math_utils.py``. Every other ``vllm.*`` module it imports is a stub served by an
import hook (``StubModule``: a placeholder class per name, whose attributes raise), so a stub
cannot answer a scheduling question. Four stand-ins are given by hand: the ``VllmConfig``
namespace with vLLM's online-server defaults (``max_num_batched_tokens`` 8192 unless
given, ``max_num_seqs`` 1024, chunked prefill, fcfs, ``scheduler_reserve_full_isl``, no
watermark, no long-prefill threshold, no speculative decoding, LoRA, multimodal inputs or
connectors; 0.34's new scheduler fields at their defaults, cache-aware admission as asked),
sampling parameters with ``max_tokens`` = the output length and no stop
tokens, a structured-output manager that accepts every token, a no-op KV-event publisher;
``current_platform.is_xpu()`` is False (the async scheduler's PP cadence, unused at PP 1).

The model runner (``RealScheduler.step``): after ``schedule()``, one sampled token for every
scheduled request whose computed tokens reach its length (a partial prefill chunk samples
nothing), handed to the real ``update_from_output``. Token ids are ``vllm_ref.request_tokens``
of the request's kvsim block ids, so vLLM's chained block hashes and kvsim's ids name the
same blocks and both pools hold the same physical blocks.

``drive`` runs one workload on both sides in lock step, the way ``EngineCore.step`` (sync) or
``EngineCore.step_with_batch_queue`` (async, batch queue of 2) calls the scheduler, and
compares after every ``schedule()``: the ordered scheduled rows (request, first position,
tokens) and the preempted set; after every output processed: the finished set, the free
block count, every running request's block table, the waiting and running orders.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from benchmarks.stubbing import StubModule, real_definitions
from benchmarks.vllm_ref import (
    VLLM_VERSIONS,
    active_version,
    load_vllm_core,
    pinned,
    request_tokens,
    since,
)
from sim.kvcache.hybridpool import FULL, HybridGroup, HybridPool

# vllm.* modules imported for real by the scheduler (with the KV-cache core of vllm_ref).
_REAL_PREFIXES = ("vllm.v1.core", "vllm.v1.request", "vllm.v1.kv_cache_interface",
                  "vllm.v1.kv_cache_spec_registry", "vllm.v1.outputs",
                  "vllm.v1.structured_output.request", "vllm.utils.math_utils",
                  "vllm.utils.hashing", "vllm.utils")

# Real definitions the scheduler takes from a stubbed module: the names of KV-fetch stages
# and the per-request prefill metrics (a plain dataclass; it feeds no decision).
_STATS_NAMES = ("KV_FETCH_WAITING_TO_START", "KV_FETCH_IN_PROGRESS",
                "KV_FETCH_COMPLETED_WAITING", "KV_FETCH_STAGES", "PrefillStats")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve every vllm.* module outside ``_REAL_PREFIXES`` as a ``StubModule`` (set aside
    by ``vllm_ref.load_vllm_core`` while it loads another version's core)."""

    serves_vllm_stubs = True

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("vllm.") or any(
                name == p or name.startswith(p + ".") for p in _REAL_PREFIXES):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


class _Publisher:
    def publish(self, batch: Any) -> None:
        return None


class _PublisherFactory:
    @staticmethod
    def create(*args: Any, **kwargs: Any) -> _Publisher:
        return _Publisher()


class _Platform:
    @staticmethod
    def is_xpu() -> bool:
        return False


class _StructuredOutputManager:
    """Every token is accepted (no request uses structured output)."""

    def accept_tokens(self, request: Any, tokens: list[int]) -> bool:
        return True


class _SamplingParams:
    """What the Request, check_stop and update_from_output read: ``max_tokens`` and no stop
    condition but the length."""

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self.extra_args = None
        self.structured_outputs = None
        self.skip_reading_prefix_cache = None
        self.eos_token_id = None
        self.stop_token_ids = None
        self.min_tokens = 0
        self.repetition_detection = None
        self.num_logprobs = None

    # read since 0.34 (Request.get_prefix_cache_hit_limit): no prompt logprobs
    prompt_logprobs = None
    prompt_logprob_token_ids = None


_SCHED: dict[str, dict[str, Any]] = {}


def load_vllm_scheduler(version: str | None = None) -> dict[str, Any]:
    """The real Scheduler and AsyncScheduler classes of pinned ``version`` (default
    ``vllm_ref.use_vllm``'s; loaded once per process and version)."""
    version = pinned(version or active_version())
    core = load_vllm_core(version)  # its modules in sys.modules
    if version in _SCHED:
        return _SCHED[version]
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())
    for name in ("vllm.platforms", "vllm.envs", "vllm.distributed.kv_events"):
        importlib.import_module(name)
    sys.modules["vllm.platforms"].current_platform = _Platform()  # type: ignore[attr-defined]
    sys.modules["vllm.distributed.kv_events"].EventPublisherFactory = (  # type: ignore
        _PublisherFactory)
    sys.modules["vllm.v1.structured_output"].StructuredOutputManager = (  # type: ignore
        _StructuredOutputManager)
    root = Path(sys.modules["vllm"].__path__[0])
    stats = sys.modules["vllm.v1.metrics.stats"]
    # __name__: a dataclass resolves its string annotations through its module
    for name, value in real_definitions(root / "v1/metrics/stats.py", _STATS_NAMES,
                                        scope={"__name__": stats.__name__}).items():
        setattr(stats, name, value)
    # the request module was loaded (by vllm_ref) against the stub: give it the real class
    sys.modules["vllm.v1.request"].PrefillStats = stats.PrefillStats  # type: ignore
    # profiler scopes (vllm.v1.utils reads vllm.envs to pick one): none
    sys.modules["vllm.v1.utils"].record_function_or_nullcontext = (  # type: ignore
        lambda name: contextlib.nullcontext())
    sched = importlib.import_module("vllm.v1.core.sched.scheduler")
    async_sched = importlib.import_module("vllm.v1.core.sched.async_scheduler")
    outputs = importlib.import_module("vllm.v1.outputs")
    _SCHED[version] = {"Scheduler": sched.Scheduler,
                       "AsyncScheduler": async_sched.AsyncScheduler,
                       "ModelRunnerOutput": outputs.ModelRunnerOutput, "version": version,
                       **core}
    return _SCHED[version]


def vllm_config(num_blocks: int, max_num_batched_tokens: int, max_num_seqs: int,
                max_model_len: int, version: str = VLLM_VERSIONS[-1],
                cache_aware: tuple[int, float] = (0, 0.5),
                max_in_flight_tokens: int | None = None) -> types.SimpleNamespace:
    """A VllmConfig namespace: vLLM's online-server defaults (module doc) as pinned
    ``version`` reads them; ``cache_aware``: 0.34's (window, threshold);
    ``max_in_flight_tokens``: ``VllmConfig.max_in_flight_tokens`` (a batch per concurrent
    step; it caps a sliding-window group's admission)."""
    ns = types.SimpleNamespace
    v034 = since(version, "0.34")
    if cache_aware[0] and not v034:
        raise ValueError(f"cache-aware admission is new in vLLM 0.34, not in {version}")
    # 0.34: P/D in-flight loads uncapped (None), cache-aware admission, no watermark; its V1
    # model runner is gone (0.33's use_v2_model_runner=False drove the V1 path)
    since_034 = (dict(max_num_inflight_kv_loads=None, cache_aware_admission_window=cache_aware[0],
                      cache_aware_admission_threshold=cache_aware[1]) if v034 else {})
    runner = dict(watermark_config=None) if v034 else dict(use_v2_model_runner=False)
    return ns(
        scheduler_config=ns(
            max_num_seqs=max_num_seqs, max_num_active_seqs=None,
            max_num_scheduled_tokens=None, max_num_batched_tokens=max_num_batched_tokens,
            long_prefill_token_threshold=0, long_prefill_token_threshold_adaptive=False,
            policy="fcfs", enable_chunked_prefill=True, scheduler_reserve_full_isl=True,
            watermark=0.0, prefill_schedule_interval=1, **since_034),
        cache_config=ns(num_gpu_blocks=num_blocks, enable_prefix_caching=True,
                        enable_mamba_shared_prefix_checkpoint=False, mamba_cache_mode="none"),
        lora_config=None,
        model_config=ns(uses_mrope=False, max_model_len=max_model_len,
                        runner_type="generate", is_diffusion=False,
                        is_encoder_decoder=False, supports_multimodal_inputs=False,
                        return_sampling_mask=False),
        kv_events_config=None,
        parallel_config=ns(data_parallel_index=0, decode_context_parallel_size=1,
                           prefill_context_parallel_size=1, pipeline_parallel_size=1,
                           data_parallel_size=1),
        observability_config=ns(per_request_spec_decode_metrics="none", kv_cache_metrics=False,
                                kv_cache_metrics_sample=0.0,
                                enable_logging_iteration_details=False,
                                enable_mfu_metrics=False),
        is_mm_encoder_only=False, kv_transfer_config=None, ec_transfer_config=None,
        max_concurrent_batches=1,
        ec_manager_config=ns(get_encoder_cache_manager_obj=lambda: None),
        speculative_config=None, num_speculative_tokens=0, num_lookahead_tokens=0,
        num_prefill_lookahead_tokens=0,
        num_hash_lookahead_tokens=0, max_in_flight_tokens=max_in_flight_tokens,
        aux_output_config=ns(enabled=False), **runner,
    )


@dataclass
class Request:
    """One request of a workload: kvsim block ids of every full block of its prompt and
    output, and the scheduler call before which it arrives."""

    rid: int
    prompt_tokens: int
    output_tokens: int
    ids: np.ndarray
    arrive: int


class RealScheduler:
    """vLLM's real Scheduler (``asynchronous``: AsyncScheduler) with a stub model runner;
    ``groups``: a hybrid KV cache of one group per ``HybridGroup`` (full or sliding window,
    one layer each: vLLM's ``HybridKVCacheCoordinator``), else one full-attention group."""

    def __init__(self, capacity_blocks: int, block_size: int, budget: int, max_seqs: int,
                 asynchronous: bool, version: str | None = None,
                 cache_aware: tuple[int, float] = (0, 0.5),
                 groups: Sequence[HybridGroup] | None = None) -> None:
        m = load_vllm_scheduler(version)
        import torch

        iface, utils, hashing = m["interface"], m["utils"], m["hashing"]
        kw = dict(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float16)
        if groups is None:
            specs = [iface.FullAttentionSpec(**kw)]
        else:  # as register_all_kvcache_specs registers the sliding manager
            m["registry"].KVCacheSpecRegistry.register(
                iface.SlidingWindowSpec, m["single"].SlidingWindowManager,
                uniform_type_base_spec=iface.SlidingWindowSpec)
            specs = [iface.FullAttentionSpec(**kw) if g.kind == FULL
                     else iface.SlidingWindowSpec(sliding_window=g.window, **kw)
                     for g in groups]
        kv = iface.KVCacheConfig(num_blocks=capacity_blocks + 1, kv_cache_tensors=[],
                                 kv_cache_groups=[iface.KVCacheGroupSpec([f"layers.{i}"], spec)
                                                  for i, spec in enumerate(specs)])
        cls = m["AsyncScheduler"] if asynchronous else m["Scheduler"]
        in_flight = (2 if asynchronous else 1) * budget if groups is not None else None
        self.sched = cls(vllm_config(capacity_blocks + 1, budget, max_seqs, 1 << 30,
                                     m["version"], cache_aware, in_flight), kv,
                         _StructuredOutputManager(), block_size)
        self.hybrid = groups is not None
        self.version = m["version"]
        utils.init_none_hash(hashing.sha256)
        self._hasher = utils.get_request_block_hasher(block_size, hashing.sha256)
        self._mods = m
        self.bs = block_size
        self._ids: dict[str, np.ndarray] = {}
        self._rid: dict[str, int] = {}

    def add(self, req: Request) -> None:
        tokens = request_tokens(req.ids, req.prompt_tokens, self.bs, req.rid)
        r = self._mods["request"].Request(str(req.rid), tokens,
                                          _SamplingParams(req.output_tokens), None,
                                          arrival_time=float(req.rid),
                                          block_hasher=self._hasher)
        self._ids[str(req.rid)] = req.ids
        self._rid[str(req.rid)] = req.rid
        self.sched.add_request(r)

    def has_requests(self) -> bool:
        return self.sched.has_requests()

    def unfinished(self) -> bool:
        return self.sched.has_unfinished_requests()

    def schedule(self) -> tuple[Any, list[tuple[int, int, int]], list[int], list[str]]:
        """(scheduler output, rows (rid, first position, tokens), preempted rids, ids of
        the requests that sample a token)."""
        s = self.sched
        before = {r.request_id: r.num_computed_tokens for r in s.running}
        out = s.schedule()
        rows = []
        sampling = []
        for rid, n in out.num_scheduled_tokens.items():
            req = s.requests[rid]
            start = before.get(rid, req.num_computed_tokens - n)
            rows.append((self._rid[rid], start, n))
            if not req.is_prefill_chunk:
                sampling.append(rid)
        preempted = sorted(self._rid[r] for r in out.preempted_req_ids)
        return out, rows, preempted, sampling

    def update(self, out: Any, sampling: list[str]) -> list[int]:
        """The stub model runner's output for ``out``, processed; returns finished rids."""
        s = self.sched
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = s.requests.get(rid)
            if rid in sampling and req is not None:
                # the token at the next position, so its block hashes to kvsim's id
                pos = req.num_tokens
                sampled.append(request_tokens(self._ids[rid], pos + 1, self.bs,
                                              self._rid[rid])[pos:])
            else:
                sampled.append([])
        # 0.34 indexes req_ids itself (no req_id_to_index field)
        index = {} if since(self.version, "0.34") else {
            "req_id_to_index": {r: i for i, r in enumerate(ids)}}
        mro = self._mods["ModelRunnerOutput"](req_ids=ids, sampled_token_ids=sampled, **index)
        done_before = set(self._finished())
        s.update_from_output(out, mro)
        return sorted(set(self._finished()) - done_before)

    def _finished(self) -> list[int]:
        live = set(self.sched.requests)
        return [self._rid[r] for r in self._rid if r not in live]

    def state(self) -> dict[str, Any]:
        s = self.sched
        mgr = s.kv_cache_manager
        return {
            "free": mgr.block_pool.get_num_free_blocks(),
            "running": [self._rid[r.request_id] for r in s.running],
            "waiting": [self._rid[r.request_id] for r in s.waiting],
            "tables": {self._rid[r.request_id]: self._tables(mgr, r.request_id)
                       for r in s.running},
        }


    def _tables(self, mgr: Any, rid: str) -> list:
        """A request's block table (hybrid: one per group, null blocks as 0)."""
        tables = [[b.block_id for b in blocks] for blocks in mgr.coordinator.get_blocks(rid)]
        return tables if self.hybrid else tables[0]


class KvsimScheduler:
    """kvsim's vLLM engine driven through its step seam (``schedule`` / ``update``)."""

    def __init__(self, capacity_blocks: int, block_size: int, budget: int, max_seqs: int,
                 asynchronous: bool, finish_ids: dict[int, np.ndarray],
                 version: str = VLLM_VERSIONS[-1],
                 cache_aware: tuple[int, float] = (0, 0.5),
                 groups: Sequence[HybridGroup] | None = None) -> None:
        from costmodel.profile import load_profile
        from costmodel.specs import get_spec
        from sim.config import RunConfig
        from sim.engines.recorder import RunRecorder
        from sim.engines.vllm import VllmServer
        from sim.kvcache.blockpool import BlockPool

        self.env = simpy.Environment()
        cfg = RunConfig.from_flat(engine="vllm", gpu_cache=capacity_blocks * block_size,
                                  block_size=block_size, chunk_size=budget, max_running=max_seqs,
                                  vllm_async=asynchronous, profile="derived-h100-qwen3-8b",
                                  vllm_version=pinned(version).rsplit(".", 1)[0],
                                  vllm_cache_aware_window=cache_aware[0],
                                  vllm_cache_aware_threshold=cache_aware[1],
                                  debug_cache=True).with_preset("vllm")
        policy = cfg.make_policy()
        self.rec = RunRecorder(["s"], [0], [False], [0])
        # the engine's pool for the groups (VllmServer.build; the spec only prices)
        pool: Any = BlockPool(capacity_blocks, block_size, "vllm", debug=True)
        if groups is not None:
            pool = HybridPool(capacity_blocks, block_size, groups,
                              max_in_flight_tokens=(2 if asynchronous else 1) * budget,
                              debug=True)
        self.hybrid = groups is not None
        self.server = VllmServer(self.env, cfg, get_spec("qwen3-8b"),
                                 load_profile("derived-h100-qwen3-8b"), pool, policy, self.rec)
        self._finish = finish_ids
        self._reqs: dict[int, Any] = {}

    def finish_block_ids(self, rid: int) -> np.ndarray:
        """What a request's prompt reads of its trace: every full block id it will have."""
        return self._finish[rid]

    def block_regions(self, rid: int) -> None:
        return None

    def add(self, req: Request) -> None:
        from sim.context import FullPrompt
        from sim.engines.vllm import VllmReq

        ids = req.ids[: req.prompt_tokens // self.server.bs]
        r = VllmReq(rid=req.rid, session=0, arrival=0.0, seq=0, prompt_tokens=req.prompt_tokens,
                output_tokens=req.output_tokens, ids=ids, done=self.env.event(),
                prompt=FullPrompt(self, req.rid, ids, req.prompt_tokens, req.output_tokens))
        self._reqs[req.rid] = r
        self.server.submit(r)

    def has_requests(self) -> bool:
        return self.server.busy()

    def schedule(self) -> tuple[Any, list[tuple[int, int, int]], list[int]]:
        step = self.server.schedule()
        rows = [(r.rid, start, n) for r, start, n in step.rows]
        return step, rows, sorted(r.rid for r in step.preempted)

    def run_promise(self, step: Any) -> tuple[int, list[int]] | None:
        """The steps (``step`` included) a decode run taken from ``step`` covers while
        requests wait (``VllmServer.decode_run_steps``: they cannot cut it, an arrival queues
        behind the refused head) and the requests each of them decodes; None where the
        engine takes no such run (the step preempted, prefills, or nobody waits)."""
        s = self.server
        if (step.preempted or not all(step.decode) or len(step.rows) != len(s.running)
                or not s.waiting):
            return None
        return s.decode_run_steps(), [r.rid for r, _start, _n in step.rows]

    def update(self, step: Any) -> list[int]:
        before = {rid for rid, r in self._reqs.items() if r.done.triggered}
        self.server.update(step)
        return sorted({rid for rid, r in self._reqs.items() if r.done.triggered} - before)

    def state(self) -> dict[str, Any]:
        s = self.server
        return {
            "free": s.pool.free_blocks,
            "running": [r.rid for r in s.running],
            "waiting": [r.rid for r in s.waiting],
            "tables": {r.rid: ([t.tolist() for t in s.pool.tables(r.rid)] if self.hybrid
                               else s.pool.table(r.rid).tolist()) for r in s.running},
        }


@dataclass
class DiffResult:
    steps: int = 0
    updates: int = 0
    preemptions: int = 0
    run_steps: int = 0  # steps inside decode runs checked (``drive``'s ``runs``)
    divergences: list[str] = field(default_factory=list)


def drive(requests: list[Request], capacity_blocks: int, block_size: int, budget: int,
          asynchronous: bool, max_seqs: int = 1024, stop_after: int = 1,
          version: str | None = None, cache_aware: tuple[int, float] = (0, 0.5),
          groups: Sequence[HybridGroup] | None = None, runs: bool = False) -> DiffResult:
    """Run ``requests`` through both schedulers in lock step; collect divergences (stop
    after ``stop_after`` of them). ``version``: vLLM's pinned install (default
    ``vllm_ref.use_vllm``'s), modelled by kvsim as ``vllm_version``; ``cache_aware``: 0.34's
    cache-aware admission (window, threshold) on both sides; ``groups``: a hybrid KV cache
    (``RealScheduler``) on both sides; ``runs`` (sync): where kvsim's engine would take a
    decode run while requests wait, every step of it must be vLLM's too (the same requests,
    one token each, nobody admitted or preempted)."""
    version = pinned(version or active_version())
    # vLLM refuses to start with a max_model_len its cache cannot hold; kvsim drops such a
    # request at submission: neither side sees it
    blocks_for = (HybridPool(capacity_blocks, block_size, groups).blocks_for
                  if groups is not None else lambda n: -(-n // block_size))
    requests = [r for r in requests
                if blocks_for(r.prompt_tokens + r.output_tokens - 1) <= capacity_blocks]
    finish_ids = {r.rid: r.ids for r in requests}
    real = RealScheduler(capacity_blocks, block_size, budget, max_seqs, asynchronous, version,
                         cache_aware, groups)
    sim = KvsimScheduler(capacity_blocks, block_size, budget, max_seqs, asynchronous,
                         finish_ids, version, cache_aware, groups)
    res = DiffResult()
    pending = sorted(requests, key=lambda r: (r.arrive, r.rid))
    queue: deque = deque()  # (real output, sampling, kvsim step), newest first
    calls = 0

    def check(what: str, a: Any, b: Any) -> bool:
        if a != b:
            res.divergences.append(f"call {calls} {what}: vllm {a} kvsim {b}")
            return False
        return True

    def process() -> bool:
        out, sampling, step = queue.pop()
        fa = real.update(out, sampling)
        fb = sim.update(step) if step is not None else []
        res.updates += 1
        return check("finished", fa, fb) and check("state", real.state(), sim.state())

    size = 2 if asynchronous else 1
    promised: tuple[int, list[int]] | None = None  # (steps left, rids) of a decode run
    while pending or queue or real.has_requests():
        while pending and pending[0].arrive <= calls:
            r = pending.pop(0)
            real.add(r)
            sim.add(r)
        calls += 1
        if not check("unfinished", real.unfinished(), sim.has_requests()):
            break
        # vLLM also schedules (an empty step) to announce the requests finished last step
        if real.has_requests():
            out, rows, pre, sampling = real.schedule()
            step, rows_b, pre_b = sim.schedule()
            res.steps += 1
            res.preemptions += len(pre)
            if not (check("rows", rows, rows_b) and check("preempted", pre, pre_b)):
                break
            if runs and not asynchronous:
                if promised is not None:  # inside a run: vLLM's step must be the run's
                    left, rids = promised
                    res.run_steps += 1
                    if not check(f"decode run step ({left} left): rows, preempted",
                                 ([(r, n) for r, _s, n in rows], pre),
                                 ([(r, 1) for r in rids], [])):
                        break
                    promised = (left - 1, rids) if left > 1 else None
                if promised is None:
                    p = sim.run_promise(step)
                    promised = (p[0] - 1, p[1]) if p is not None and p[0] > 1 else None
            queue.appendleft((out, sampling, step if rows_b else None))
            if len(queue) < size and (rows or real.has_requests()):
                continue
        elif not queue:
            continue  # idle until the next arrival
        if not process():
            break
        if len(res.divergences) >= stop_after:
            break
    return res


def workload(seed: int, sessions: int, turns: int, block_size: int, *, prompt: int = 300,
             output: int = 60, shared_blocks: int = 4, spread: int = 40) -> list[Request]:
    """Multi-turn sessions: turn k + 1's prompt is turn k's prompt and output plus new
    tokens (its ids extend turn k's), every session opens with the same ``shared_blocks``
    blocks; arrivals (scheduler calls) are random, a follow-up after its predecessor's
    arrival (possibly before it finishes). Sizes are random up to the given scales."""
    rng = np.random.default_rng(seed)
    bs = block_size
    fresh = shared_blocks  # dense ids: the pool indexes arrays by id
    out: list[Request] = []
    rid = 0
    for _ in range(sessions):
        ids = np.arange(shared_blocks, dtype=np.int64)
        p_prev = 0
        t = int(rng.integers(0, spread))
        for _k in range(turns):
            p = p_prev + int(rng.integers(1, prompt))
            o = int(rng.integers(1, output))
            nb = (p + o - 1) // bs
            keep = min(len(ids), p_prev // bs if p_prev else len(ids), nb)
            new = np.arange(fresh, fresh + max(0, nb - keep), dtype=np.int64)
            fresh += len(new)
            ids = np.concatenate([ids[:keep], new])
            out.append(Request(rid, p, o, ids, t))
            rid += 1
            p_prev = p + o
            t += int(rng.integers(1, spread))
    return out
