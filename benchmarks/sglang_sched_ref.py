"""One prefill pass of SGLang 0.5.23's scheduler, for real: `PrefillAdder` and `PrefillBudget`
(managers/schedule_policy.py, mem_cache/prefill_budget.py) and the `SchedulePolicy` over the
real `UnifiedRadixCache` (benchmarks/sglang_unified_ref.py), loaded without SGLang's
dependencies.

Real: the adder (`add_chunked_req`, `add_one_req`, `budget_state`), the budget, the policy's
`calc_priority` (fcfs: the periodic prefix refresh; lpm: match, in-batch prefix caching,
sort), `match_kv_cache` (what a request's `init_next_round_input` calls) and the cache.
Stand-ins: `SchedReq`, the fields of schedule_batch.Req those read (a text-only request with
no host, storage, LoRA, Mamba or SWA state); the reference allocator, whose
`create_prefill_budget` builds the real `PrefillBudget` as the base allocator does; the
runtime-context getters at their defaults (no disaggregation, no DCP, lru, no encoder replay;
a namespace raises on any other field, so a stub cannot answer a scheduling question);
`is_hip`/`is_gfx95_supported` False (CUDA). The pass loop is
`Scheduler._get_new_batch_prefill_raw` for a dense model (fcfs or lpm; no LoRA, HiCache,
priority or mixed chunk): the gate, the chunk continuation, then the waiting queue until a
verdict other than CONTINUE. Nothing is allocated: SGLang allocates after the loop
(`prepare_for_extend`).
"""

from __future__ import annotations

import importlib
import sys
import types
from array import array
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from benchmarks import sglang_unified_ref as uref
from benchmarks.stubbing import real_definitions

_REAL = ("sglang.srt.managers.schedule_policy", "sglang.srt.mem_cache.prefill_budget")
_BARE = ("sglang.srt.managers",)


class _Context:
    """runtime_context.get_context(): no config namespace is published."""

    @staticmethod
    def is_config_namespace_published(name: str) -> bool:
        return False


_RUNTIME = {
    "get_context": lambda: _Context(),
    "get_exec": lambda: SimpleNamespace(
        features=SimpleNamespace(enable_encoder_swa_bounded_replay=False),
        mamba=SimpleNamespace(enable_mamba_extra_buffer=False)),
    "get_parallel": lambda: SimpleNamespace(dcp_enabled=False),
    "get_schedule": lambda: SimpleNamespace(schedule_policy="fcfs", prefill_max_requests=None),
    "get_disagg": lambda: SimpleNamespace(disaggregation_mode="null"),
    "get_memory": lambda: SimpleNamespace(radix_eviction_policy="lru"),
}


def _fill(module: types.ModuleType, root: Path) -> None:
    """The real pieces (or defaults) the adder's stubs must carry."""
    name = module.__name__
    src = root / "srt"
    if name == "sglang.srt.runtime_context":
        for k, v in _RUNTIME.items():
            setattr(module, k, v)
    elif name == "sglang.srt.utils":
        for k, v in real_definitions(src / "utils" / "common.py", ("get_bool_env_var",),
                                     uref.SglangUnifiedUnavailable,
                                     {"os": __import__("os")}).items():
            setattr(module, k, v)
        module.is_hip = lambda: False  # type: ignore[attr-defined]
        module.is_gfx95_supported = lambda: False  # type: ignore[attr-defined]
    elif name == "sglang.srt.managers.schedule_batch":
        for k, v in real_definitions(src / "managers" / "schedule_batch.py",
                                     ("split_cached_prefix_by_tier",),
                                     uref.SglangUnifiedUnavailable).items():
            setattr(module, k, v)
    elif name == "sglang.srt.mem_cache.allocator.swa":
        scope = {"SWATokenToKVPoolAllocator": module.SWATokenToKVPoolAllocator}
        for k, v in real_definitions(src / "mem_cache" / "allocator" / "swa.py",
                                     ("is_swa_req_ring",), uref.SglangUnifiedUnavailable,
                                     scope).items():
            setattr(module, k, v)


_MODS: dict[str, types.ModuleType] | None = None


def load_sched_modules() -> dict[str, types.ModuleType]:
    """The real schedule_policy, prefill_budget and mem_cache.common (once per process)."""
    global _MODS
    if _MODS is None:
        uref.require_real(_REAL, _BARE, _fill)
        uref.load_unified_modules()
        _MODS = {
            "policy": importlib.import_module("sglang.srt.managers.schedule_policy"),
            "budget": importlib.import_module("sglang.srt.mem_cache.prefill_budget"),
            "common": importlib.import_module("sglang.srt.mem_cache.common"),
        }
        utils = sys.modules["sglang.srt.utils"]
        if _MODS["policy"]._IS_HIP or utils.is_hip():
            raise uref.SglangUnifiedUnavailable("the adder was loaded as a HIP build")
    return _MODS


class _Kv:
    def __init__(self) -> None:
        self.req_pool_idx = None
        self.cache_protected_len = 0
        self.holds_mamba = False
        self.holds_kv = False


class SchedReq:
    """The fields of schedule_batch.Req that the adder, the policy and match_kv_cache read,
    for a text request of `prompt` tokens that generated `output` tokens so far."""

    def __init__(self, rid: int, prompt: np.ndarray, output: np.ndarray, max_new: int) -> None:
        self.rid = str(rid)
        self.origin_input_ids = array("q", prompt.tolist())
        self.output_ids = array("q", output.tolist())
        self.full_untruncated_fill_ids = self.origin_input_ids + self.output_ids
        self.sampling_params = SimpleNamespace(max_new_tokens=max_new, ignore_eos=False)
        self.retracted_stain = len(output) > 0
        self.kv = _Kv()
        self.prefix_len = 0
        self.extend_end = 0
        self.last_node: Any = None
        self.best_match_node: Any = None
        self.lock: Any = None
        self.extra_key = None
        self.cache_salt = None
        self.session = None
        self.priority = None
        self.return_logprob = False
        self.logprob_start_len = -1
        self.dllm_config = None
        self.host_hit_length = 0
        self.swa_host_hit_length = 0
        self.mamba_host_hit_length = 0
        self.auxiliary_swa_host_hit_length = 0
        self.host_loaded_length = 0
        self.storage_hit_length = 0
        self.storage_hit_start = None
        self.host_hit_is_storage = False
        self.cache_request_handle = self.rid
        self.num_matched_prefix_tokens = 0
        self.swa_branching_seqlen = None
        self.mamba_branching_seqlen = None
        self.inflight_middle_chunks = 0

    @property
    def extend_len(self) -> int:
        return self.extend_end - self.prefix_len

    def is_dllm(self) -> bool:
        return False

    def needs_host_load_back(self) -> bool:
        return False  # no host tier here

    def materialized_host_hit_len(self) -> int:
        return min(self.host_hit_length, self.host_loaded_length)

    def fulfilled_storage_hit_len(self, prefix_len: int) -> int:
        return min(prefix_len, self.storage_hit_length)

    def _compute_max_prefix_len(self, input_len: int) -> int:
        return input_len - 1  # schedule_batch.py: at least one token is computed

    def init_next_round_input(self, tree_cache: Any = None) -> None:
        """schedule_batch.Req.init_next_round_input for a text request: match the fill ids
        (capped at input - 1) and adopt the hit (the real match_kv_cache)."""
        if tree_cache is None:
            return
        ids = self.full_untruncated_fill_ids
        load_sched_modules()["common"].match_kv_cache(
            self, tree_cache, ids, cow_mamba=False, max_prefix_len=len(ids) - 1)


class _RunningBatch:
    def __init__(self, reqs: list[SchedReq]) -> None:
        self.reqs = reqs
        self.batch_is_full = False

    def batch_size(self) -> int:
        return len(self.reqs)

    def is_empty(self) -> bool:
        return not self.reqs


@dataclass
class PassResult:
    """One pass: (rid, prefix tokens, tokens taken) in batch order, the chunked request after
    the pass (rid or None) and batch_is_full."""

    rows: list[tuple[str, int, int]]
    chunked: str | None
    batch_is_full: bool


class SglangScheduler:
    """SGLang's prefill scheduling over one real UnifiedRadixCache (page = block)."""

    def __init__(self, capacity_blocks: int, block_size: int, chunk_size: int,
                 scheduler: str = "fcfs", max_prefill_tokens: int = 16384) -> None:
        mods = load_sched_modules()
        self.ref = uref.UnifiedRef(capacity_blocks, block_size)
        self.allocator = self.ref.allocator
        self.cache = self.ref.cache
        self.bs, self.chunk_size, self.max_prefill_tokens = block_size, chunk_size, \
            max_prefill_tokens
        self.policy = mods["policy"].SchedulePolicy(scheduler, self.cache, False, False, False)
        self.running = _RunningBatch([])
        self.chunked_req: SchedReq | None = None

    def prefill_pass(self, waiting: list[SchedReq], ratio: float) -> PassResult:
        """Scheduler._get_new_batch_prefill_raw (dense), up to the new batch."""
        p = load_sched_modules()["policy"]
        run = self.running
        if run.is_empty():
            run.batch_is_full = False
        if (run.batch_is_full or not waiting) and self.chunked_req is None:
            return PassResult([], None, run.batch_is_full)
        self.policy.calc_priority(waiting, run)
        adder = p.PrefillAdder(self.bs, self.cache, self.allocator, run, ratio,
                               self.max_prefill_tokens, self.chunk_size, 0, 0,
                               max_prefill_bs=0, max_running_requests=1 << 30,
                               prefill_max_requests=None, prefill_delayer_single_pass=None,
                               dllm_config=None, waiting_queue_len=len(waiting))
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            adder.chunked_req_limit = self.policy.shortest_prefill_chunk_limit(
                self.chunked_req, waiting, adder.rem_chunk_tokens or 0, self.bs)
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in waiting:
            if adder.budget_state() == p.AddReqResult.OTHER:
                break
            if run.batch_is_full:
                break
            req.init_next_round_input(self.cache)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None,
                                    truncation_align_size=None)
            if res != p.AddReqResult.CONTINUE:
                if res == p.AddReqResult.NO_TOKEN:
                    run.batch_is_full = len(adder.can_run_list) > 0 or not run.is_empty()
                break
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        rows = [(r.rid, r.prefix_len, r.extend_len) for r in adder.can_run_list]
        chunked = self.chunked_req.rid if self.chunked_req is not None else None
        return PassResult(rows, chunked, run.batch_is_full)

    # --- building a state (the protocol of benchmarks/sglang_unified_ops.py) ---------------
    def _admit(self, rid: int, ids: np.ndarray, extra_blocks: int) -> None:
        hit, node = self.ref.match(ids)
        self.ref.admit(rid, ids, node, hit)
        self.allocator.used += len(ids) - hit + extra_blocks

    def history(self, rid: int, ids: np.ndarray) -> None:
        """A finished request whose prompt and output are the full blocks ``ids``."""
        self._admit(rid, ids, 0)
        self.ref.checkpoint(rid, ids, finished=True)
        self.ref.release(rid)

    def run(self, rid: int, ids: np.ndarray, own_blocks: int, req: SchedReq) -> None:
        """A decoding request: its prompt's full blocks ``ids`` in the tree, locked, and
        ``own_blocks`` of its own (the prompt's partial block and its outputs)."""
        self._admit(rid, ids, own_blocks)
        self.ref.checkpoint(rid, ids, finished=False)
        self.running.reqs.append(req)

    def chunk(self, rid: int, done_ids: np.ndarray, req: SchedReq) -> None:
        """The chunked request in flight: its prefilled blocks ``done_ids`` checkpointed into
        the tree and locked (checkpoint_kv_cache: prefix_len = what it computed)."""
        self._admit(rid, done_ids, 0)
        self.ref.checkpoint(rid, done_ids, finished=False)
        req.prefix_len = req.extend_end = len(done_ids) * self.bs
        self.chunked_req = req


class KvsimScheduler:
    """kvsim's ``sglang`` engine (``SGLangServer``) over its own cache, in the same states,
    built through the cache's public API with the protocol of ``SglangScheduler``."""

    def __init__(self, capacity_blocks: int, block_size: int, chunk_size: int,
                 max_new: int, scheduler: str = "fcfs") -> None:
        import simpy

        from costmodel.profile import load_profile
        from costmodel.specs import get_spec
        from policies.scheduling import get_scheduler
        from sim.config import RunConfig
        from sim.engines import SGLangServer
        from sim.engines.recorder import RunRecorder
        from sim.kvcache import RadixKVCache

        cfg = RunConfig.from_flat(gpu_cache=capacity_blocks * block_size, block_size=block_size,
                        chunk_size=chunk_size, max_new_tokens=max_new, scheduler=scheduler,
                                  profile="derived-h100-qwen3-8b").with_preset("sglang")
        self.env = simpy.Environment()
        self.cache = RadixKVCache(capacity_blocks, cfg.make_policy(), debug=True,
                                  block_size=block_size)
        self.rec = RunRecorder(["s"], [0], [False], [0])
        spec = get_spec(cfg.cache.model)
        self.server = SGLangServer(self.env, cfg, spec, load_profile(cfg.cache.profile,
                                                                     cfg.cache.model),
                                   self.cache, get_scheduler(scheduler), self.rec)
        self.bs = block_size

    def request(self, rid: int, ids: np.ndarray, prompt_tokens: int, generated: int,
                output_tokens: int) -> Any:
        from sim.context import FullPrompt
        from sim.engines import Req

        # One prefill pass never finishes a request: its prompt needs no trace behind it.
        prompt = FullPrompt(None, rid, ids, prompt_tokens, output_tokens)
        req = Req(rid=rid, session=0, arrival=0.0, seq=rid, prompt_tokens=prompt_tokens,
                  output_tokens=output_tokens, ids=ids, done=self.env.event(), prompt=prompt)
        req.generated = generated
        return req

    def _admit(self, ids: np.ndarray, extra_blocks: int) -> Any:
        cache = self.cache
        m = cache.match(ids, touch=True)
        cache.lock(m.node)
        n = len(ids) - m.hit_blocks
        cache.reserve(n + extra_blocks)
        ins = cache.insert(ids)
        cache.release(n)
        cache.unlock(m.node)
        cache.lock(ins.node)
        return ins.node

    def history(self, ids: np.ndarray) -> None:
        self.cache.unlock(self._admit(ids, 0))

    def run(self, ids: np.ndarray, own_tokens: int, req: Any) -> None:
        req.locks = [self._admit(ids, -(-own_tokens // self.bs))]
        req.own_tokens = own_tokens
        req.reserved = -(-own_tokens // self.bs)
        self.server.running.append(req)

    def chunk(self, done_ids: np.ndarray, req: Any) -> None:
        req.locks = [self._admit(done_ids, 0)]
        req.ranges = [(len(done_ids) * self.bs, req.prompt_tokens)]
        self.server.chunked = req

    def prefill_pass(self, waiting: list[Any], ratio: float) -> PassResult:
        server = self.server
        server.waiting = list(waiting)
        server.ratio = ratio
        batch = server._schedule()
        rows = [(str(r.rid), ranges[0][0], sum(b - a for a, b in ranges))
                for r, ranges in batch]
        chunked = str(server.chunked.rid) if server.chunked is not None else None
        return PassResult(rows, chunked, server.batch_is_full)
