"""The vLLM engine: vLLM 0.33's V1 scheduler over its prefix-caching block pool.

Data flow of one run::

    sessions (closed loop)  --submit-->  waiting queue (FCFS; preempted requests at the front)
    server loop, one V1 step (vllm/v1/core/sched/scheduler.py ``schedule``):
      1. running requests in order, each its next tokens within ONE token budget per step
         (``max_num_batched_tokens``): one decode token, or the next prefill chunk;
         ``BlockPool.extend`` allocates (caching every block that becomes full); when the
         free queue is short, the LAST running request (the most recently admitted) is
         preempted by recompute (its blocks freed, back to the front of the queue)
      2. if nobody was preempted: waiting requests FCFS while the budget and
         ``max_num_seqs`` allow; ``BlockPool.admit`` looks up (read-only), checks that the
         WHOLE sequence fits, pins the hit and caches the scheduled prompt blocks; the first
         refusal ends admission (a refused request touched nothing)
      3. the step runs (priced below); rows that reached the end of their sequence sample a
         token; finished requests free their blocks in the policy's free order
    The step seam: ``schedule()`` is 1-2 (plus ``_update_after_schedule``), ``update(step)``
    is 3's output processing (``update_from_output``); the server loop composes them with
    time, and tests/test_vllm_sched_diff.py drives them beside vLLM's real scheduler.

Async scheduling (``VllmKnobs.vllm_async``, vLLM 0.33's default for an online server:
``AsyncScheduler`` + ``EngineCore.step_with_batch_queue``, a batch queue of 2): step n+1 is
scheduled while step n runs, before its output is processed, and runs right after it. A token
step n samples is a placeholder for step n+1 (the request decodes on; one whose last token is
in flight is skipped); step n's finishes free their blocks once its output is processed, so
step n+2 is the first to see them, and an arrival during step n joins step n+2. A block is
cached once its tokens are known (``BlockPool.extend(known=)``, ``cache_known``): a decode
block one output later than under the synchronous scheduler. A decode run is the pipeline of
identical decode steps (``_async_decode_run``).

Events: a step that carries prefill tokens, a preemption or an admission is one SimPy event.
A step of decode rows only (every running request decoding, nobody admitted, nobody
preempted) starts a decode RUN: the next k steps are the same step again, so they are taken
in one event, k = steps to the first finish, cut by memory (the first step whose allocations
the free queue cannot serve runs alone, with its preemption) and, when the waiting queue is
empty, by an arrival (the step in flight completes; the arrival is admitted at the next step).
With a request waiting, an arrival changes nothing: the head was refused and stays refused
while requests only decode (decode pops only shrink the free queue and the head's hit; see
docs/engine.md for the one exception), and FCFS admits nobody behind it. Within a run the k
allocations of each request are made at once (``extend(rid, k)``): the blocks popped from
the free queue are the same first ones as with k interleaved single steps, so the cached set
after the run is identical.

Pricing (the same cost model as the SGLang engine): a step of prefill rows only costs
``profile.prefill_seconds`` of its token ranges at their positions; a step of decode rows only
costs ``profile.decode_step_seconds(rows, context)`` (a run of k: ``decode_run_seconds``, closed
form); a MIXED step (decode rows riding along prefill chunks, vLLM's chunked prefill) costs the
larger of its compute time (every row's tokens priced as prefill ranges: a decode token at
position p costs W + p units) and its memory time (the decode step of its decode rows). Every
step then pays the profile's server terms (costmodel/profile.py ``ServerCoeffs``, neutral by
default): a mixed step adds ``mixed_interference`` of the smaller part, and the step's CPU time
follows it (synchronous) or overlaps it (async scheduling: the larger of the two).

Defaults for an online server on one H100 (vllm/engine/arg_utils.py ``get_batch_defaults``,
``UsageContext.OPENAI_API_SERVER`` on a >= 70 GiB non-A100 GPU): max_num_batched_tokens 8192
(``VllmKnobs.chunk_size``), max_num_seqs 1024 (``VllmKnobs.max_running`` unset).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import simpy
from mypy_extensions import mypyc_attr

from costmodel.profile import Profile
from costmodel.specs import ModelSpec
from costmodel.units import Units, range_units
from policies import Blocks, EvictionPolicy, PolicyError
from policies.eviction import ReleaseOrder
from sim.config import RunConfig, VllmKnobs
from sim.engines.recorder import RunRecorder
from sim.kvcache import Tier
from sim.kvcache.blockpool import BlockPool
from sim.kvcache.hybridpool import FULL, MAMBA, SLIDING, HybridGroup, HybridPool, WideBlocks

from .base import EngineBase, _new_units, steps_fitting
from .request import Req


class VllmReq(Req):
    """A request on the vLLM engine (``VllmServer.request_class``): the sequence state its
    block pool and V1 scheduler keep per request. Made as a ``Req`` is (its keyword
    ``__init__``, native in the compiled core: setup.py ``native_init``); the state below
    starts at its class defaults."""

    # ids of every full block the sequence will have (prompt + output - 1 tokens), tokens
    # with KV since the last (re)admission, and whether its prefill is done
    seq_ids: np.ndarray | None = None
    computed: int = 0
    decoding: bool = False
    # async scheduling: tokens sampled by steps whose output is not processed yet (vLLM's
    # num_output_placeholders), tokens of its rows in such steps, and of those the ones
    # scheduled before it was preempted (their output arrives stale)
    placeholders: int = 0
    in_flight: int = 0
    stale: int = 0
    # A decode worker's request whose prompt KV a prefill worker computes: called when its
    # blocks are allocated (``VllmServer.reserve_remote``); None once they are.
    remote_granted: Callable[[], None] | None = None


def vllm_kv_groups(spec: ModelSpec) -> list[HybridGroup] | None:
    """vLLM's KV cache groups of ``spec`` (``kv_cache_planning.py``: a bucket of layers per
    spec, split into groups of ``group_size`` layers; ``costmodel.gpus.kv_capacity``) when it
    has several, each full attention (MLA too: vLLM's full-attention manager), a sliding
    window or linear attention / Gated DeltaNet (vLLM's ``MambaManager``, in the
    ``mamba_cache_mode="align"`` prefix caching sets: vllm/model_executor/models/config.py
    ``MambaModelConfig``): the hybrid pool's groups (sim/kvcache/hybridpool.py). None for one
    group, and for kinds the hybrid pool does not model yet (chunked local, DSA, compressed):
    those run on ``BlockPool`` as one full-attention group (docs/hybrid.md)."""
    from costmodel.gpus import kv_capacity
    from costmodel.specs import AttentionKind

    kinds = {AttentionKind.FULL: FULL, AttentionKind.MLA: FULL, AttentionKind.SLIDING: SLIDING,
             AttentionKind.LINEAR: MAMBA}
    if len(spec.groups) < 2 or any(g.kind not in kinds for g in spec.groups):
        return None
    counts = kv_capacity(spec, 0, engine="vllm").vllm_groups
    return [HybridGroup(kinds[g.kind], g.window or 0)
            for g, n in zip(spec.groups, counts, strict=True) for _ in range(n)]


def vllm_block_size(spec: ModelSpec, tp: int, block_size: int) -> int:
    """vLLM's block in tokens for ``spec`` on ``tp`` ranks at ``--block-size block_size``: the
    run's block, raised for a Mamba hybrid until an attention page holds a state page
    (``Platform._align_hybrid_block_size``, vllm/platforms/interface.py; a multiple of the
    run's block: ``costmodel.gpus._vllm_capacity``)."""
    from costmodel.gpus import kv_capacity

    return kv_capacity(spec, 0, tp, "vllm", block_size).block_size


def mamba_aligned_chunk(block: int, token_budget: int, prompt_tokens: int, generated: int,
                        start: int, n: int) -> int:
    """vLLM's ``Scheduler._mamba_block_aligned_split`` (vllm/v1/core/sched/scheduler.py)
    for a prefill row of ``n`` tokens from ``start`` of a request with ``prompt_tokens`` and
    ``generated`` tokens, on a pool of ``block``-token blocks with a ``token_budget`` step:
    align mode keeps a Mamba state only at the pool's block edges, so a chunk that does not
    reach the prefill's end (the prompt, or a resumed request's tokens but the last) ends at a
    block edge, or schedules nothing when the budget holds none past ``start``; no chunk runs
    past the last block edge before the sequence's last token, or, starting inside a block,
    past that block's end. Decode rows are untouched. As the scheduler runs it without EAGLE,
    partial hash hits or a backend exporting prefill checkpoints (FlashInfer's GDN prefill on
    Hopper adds one checkpoint block per request: not modelled)."""
    num_tokens = prompt_tokens + generated
    prefill_end = max(prompt_tokens, num_tokens - 1)
    if start >= prefill_end:
        return n
    end = start + n
    if end < prefill_end:
        aligned = end // block * block
        if aligned > start or block <= token_budget:
            end = aligned
    last_cache = (num_tokens - 1) // block * block
    for stop in ((start // block + 1) * block if start % block else end, last_cache):
        if start < stop < end:
            end = stop
    return max(end - start, 0)


# vllm/engine/arg_utils.py get_batch_defaults: OPENAI_API_SERVER, H100/H200 tier.
VLLM_MAX_NUM_SEQS = 1024
VLLM_MAX_NUM_BATCHED_TOKENS = 8192


def _ranges_of(rows) -> list:
    """A step's rows as ``StepObserver`` batches: (request, its token ranges)."""
    return [(r, [(start, start + n)]) for r, start, n in rows]


def free_order_name(policy: EvictionPolicy) -> str:
    """The name of the ``BlockPool`` free order that is ``policy`` on vLLM, or PolicyError
    (``release_order``)."""
    return release_order(policy).name


def release_order(policy: EvictionPolicy) -> ReleaseOrder:
    """The release order that is ``policy`` on vLLM's block pool, or PolicyError.

    vLLM's only eviction freedom is the order in which a finished request's blocks join the
    free queue (least recently freed is reused first, a hit takes a block back out): the
    policy's start position says it (``StartPosition.release_order``): ``tail`` is vLLM's own
    reversed release (``vllm``), ``private-head`` releases the front of the private history
    first (``penelope``). Victim keys other than LRU, pins, node granularity and other start
    positions have no counterpart in a block pool."""
    why = None
    if type(policy).key is not EvictionPolicy.key:
        why = "it has its own victim key (vLLM's free queue is least recently freed first)"
    elif policy.order != "lru":
        why = (f"its victim order is {policy.order!r} (vLLM's free queue is least recently "
               "freed first: lru)")
    elif policy.pins:
        why = "it pins histories (vLLM's free queue has no pins)"
    elif type(policy.granularity) is not Blocks:
        why = (f"its granularity is {policy.granularity.name!r} (vLLM pops exactly the "
               "blocks an allocation needs: block)")
    elif policy.start.release_order is not None:
        return policy.start.release_order
    else:
        why = (f"its start position is {policy.start.name!r} (vLLM has no tree nodes: "
               "tail and private-head are the release orders it can express)")
    pins = "; Continuum's TTL pins on vLLM: --vllm-patch continuum" if policy.pins else ""
    raise PolicyError(f"policy {policy.label!r} cannot run on the vllm engine: {why}; "
                      "use vllm (tail first) or penelope (front of the private history "
                      f"first), or --engine sglang{pins}")


@dataclass(eq=False, kw_only=True)  # keyword-only: native __init__ in the core (setup.py)
class Step:
    """One V1 step as scheduled: ``rows`` (request, first position, tokens) in schedule
    order; per row whether it is a decode row (its request had finished its prefill) and
    whether it samples a token (its tokens reach the end of the sequence); the requests
    preempted while scheduling it; ``blocked``: requests wait that it could not admit
    (refused, max_num_seqs, or no budget left). ``end``: when its execution ends (async)."""

    rows: list[tuple[VllmReq, int, int]]
    decode: list[bool]
    samples: list[bool]
    preempted: list[VllmReq]
    blocked: bool
    end: float = math.nan


@mypyc_attr(allow_interpreted_subclasses=True)
class VllmServer(EngineBase):
    """vLLM 0.33's V1 scheduling and memory semantics over one ``BlockPool``."""

    default_presets: ClassVar[tuple[str, ...]] = ("vllm", "penelope")
    request_class: ClassVar[type[Req]] = VllmReq
    # A disaggregated decode worker (sim/fleet/pd.py) allocates the prompt's blocks when the
    # prefill has ended (vLLM's proxy sends the request to decode with the prefill's
    # kv_transfer_params), then its KV connector loads them (WAITING_FOR_REMOTE_KVS).
    lands_remote_kv: ClassVar[bool] = True
    # False: every V1 step is its own event (slow; tests prove runs change nothing)
    decode_runs: ClassVar[bool] = True

    @classmethod
    def summary_fields(cls, cfg: RunConfig) -> dict[str, bool]:
        knobs: Any = cfg.engine
        return {"vllm_async": knobs.vllm_async}

    @classmethod
    def unsupported(cls, cfg: RunConfig, policy: EvictionPolicy) -> tuple[str, str] | None:
        try:
            release_order(policy)
        except PolicyError as e:
            return cfg.policy_field, str(e)
        if cfg.cache.cpu_cache:
            return ("cpu_cache", "the vllm engine models one GPU tier (vLLM 0.33's prefix "
                    "cache; KV offloading connectors are not modelled): use --engine sglang "
                    "for two tiers")
        if cfg.policy.scheduler != "fcfs":
            return ("scheduler", f"vLLM's V1 scheduler serves the waiting queue fcfs "
                    f"(its priority policy needs request priorities); {cfg.policy.scheduler!r} is "
                    "SGLang's: use --engine sglang (vLLM 0.34's own reordering: "
                    "--vllm-cache-aware-window)")
        knobs: Any = cfg.engine
        if knobs.vllm_cache_aware_window and knobs.vllm_patch != "none":
            return ("vllm_cache_aware_window", "cache-aware admission is modelled on stock vLLM "
                    f"0.34 only: --vllm-patch {knobs.vllm_patch} changes the lookup or the "
                    "queue order it reads; use --vllm-patch none")
        hybrid = cls._hybrid_unsupported(cfg, policy)
        if hybrid is not None:
            return hybrid
        return cls._pd_unsupported(cfg) if cfg.is_pd else None

    @staticmethod
    def _hybrid_unsupported(cfg: RunConfig, policy: EvictionPolicy) -> tuple[str, str] | None:
        """What vLLM's hybrid KV cache (several groups: ``vllm_kv_groups``) is not modelled
        with yet: a patch's pool. Every release order is (``HybridPool.free``: by position,
        every group's block of one together), and so are a KV connector's loads."""
        from costmodel.specs import get_spec

        try:
            groups = vllm_kv_groups(get_spec(cfg.cache.model, cfg.cache.kv_dtype))
        except (KeyError, ValueError):
            return None  # the run reports the model itself
        if groups is None:
            return None
        model = cfg.cache.model
        knobs: Any = cfg.engine
        if knobs.vllm_patch != "none":
            return ("vllm_patch", f"{model} has {len(groups)} KV cache groups (vLLM's hybrid "
                    f"KV cache): --vllm-patch {knobs.vllm_patch} is modelled on one "
                    "full-attention group only; use --vllm-patch none")
        return None

    @staticmethod
    def _pd_unsupported(cfg: RunConfig) -> tuple[str, str] | None:
        """What vLLM's KV connector path (NixlConnector) cannot do in a disaggregated fleet."""
        if cfg.pd.pd_prealloc == "off":
            return ("pd_prealloc", "vLLM's decode worker always allocates the prompt's blocks "
                    "before its KV connector loads them (WAITING_FOR_REMOTE_KVS): there is "
                    "no unreserved landing; use --pd-prealloc on, or --engine sglang")
        if cfg.pd.pd_streaming != "off":
            return ("pd_streaming", "vLLM's decode worker allocates, and its connector "
                    "starts loading, only once the prefill has ended: nothing streams during "
                    "the prefill; use --pd-streaming off, or --engine sglang")
        if cfg.pd.pd_return != "none":
            return ("pd_return", "vLLM's block pool caches blocks only through a request's "
                    "allocation: no connector pushes a finished output's KV into an idle "
                    "prefill worker's prefix cache; use --pd-return none, or --engine sglang")
        knobs: Any = cfg.engine
        if knobs.vllm_patch not in ("none", "penelope"):
            return ("vllm_patch", f"--vllm-patch {knobs.vllm_patch} pins and orders requests "
                    "by session on one server; on a decode worker its pins would hold a "
                    "session whose next turn the prefill pool serves: not modelled for "
                    "disaggregated pools (use none or penelope)")
        return None

    pool_class: ClassVar[type[BlockPool] | None] = None  # a patch's own pool; None: BlockPool
    # a hybrid model's pool (None: HybridPool); tests/diffkit.py puts its shadow here
    hybrid_pool_class: ClassVar[type[HybridPool] | None] = None

    @classmethod
    def build(cls, env: simpy.Environment, cfg: RunConfig, spec: ModelSpec, profile: Profile,
              policy: EvictionPolicy, recorder: RunRecorder) -> VllmServer:
        bs = cfg.cache.block_size
        groups = vllm_kv_groups(spec) if cls.pool_class is None else None
        if groups is not None:  # one pool of gpu_cache // block blocks shared by every group
            # recycling-aware admission cap: VllmConfig.max_in_flight_tokens, one batch per
            # concurrent step (2 under async scheduling)
            knobs: Any = cfg.engine
            in_flight = (2 if knobs.vllm_async else 1) * knobs.chunk_size
            block = bs
            if any(g.kind == MAMBA for g in groups):  # a state page per block
                # the replica's TP ranks, as sim/deploy.py replica_tp (which imports engines)
                tp = int(cfg.cache.tp) if cfg.cache.tp is not None else int(profile.gpus)
                block = vllm_block_size(spec, tp, bs)
            hybrid: Any = (cls.hybrid_pool_class or HybridPool)(
                cfg.cache.gpu_cache // block, block, groups, max_in_flight_tokens=in_flight,
                free_order=free_order_name(policy), debug=cfg.debug_cache)
            if block != bs:
                hybrid = WideBlocks(hybrid, block // bs)
            return cls(env, cfg, spec, profile, hybrid, policy, recorder)
        pool = (cls.pool_class or BlockPool)(cfg.cache.gpu_cache // bs, bs,
                                             free_order_name(policy), debug=cfg.debug_cache)
        return cls(env, cfg, spec, profile, pool, policy, recorder)

    def __init__(self, env: simpy.Environment, cfg: RunConfig, spec: ModelSpec,
                 profile: Profile, pool: BlockPool | HybridPool | WideBlocks,
                 policy: EvictionPolicy,
                 recorder: RunRecorder) -> None:
        super().__init__(env, cfg, spec, profile, pool, policy, recorder)
        # a BlockPool, or vLLM's hybrid KV cache (several groups): the same protocol
        self.pool: Any = pool
        # vLLM's hybrid KV cache (several groups): window frees read the in-flight tokens,
        # decode runs are applied block edge by block edge
        self._hybrid = isinstance(pool, HybridPool | WideBlocks)
        # stock vLLM's block pool, typed (None for a patch's pool or a hybrid one): the
        # compiled core calls its methods natively, without a Python attribute lookup and
        # argument parsing per call; the others are called as Python objects (their methods
        # may take other arguments)
        self._stock_pool: BlockPool | None = pool if type(pool) is BlockPool else None
        # a Mamba group in align mode: prefill chunks end at the pool's block edges (the
        # state is kept only there: ``mamba_aligned_chunk``); 0: no Mamba group
        state_block = 0
        if isinstance(pool, HybridPool | WideBlocks) and any(g.kind == MAMBA
                                                             for g in pool.groups):
            state_block = pool.block_size
        self._state_block = state_block
        self.knobs: VllmKnobs = cast(VllmKnobs, cfg.engine)  # engine_class's choice
        self.token_budget = self.knobs.chunk_size  # max_num_batched_tokens
        self.max_seqs = self.knobs.max_running or VLLM_MAX_NUM_SEQS
        # vLLM 0.33's default for an online server (AsyncScheduler, batch queue of 2)
        self.async_scheduling = self.knobs.vllm_async
        # async scheduling prepares step n+1 on the CPU while step n runs: max, not sum
        self.profile = profile.for_server(self.async_scheduling)
        # vLLM 0.34's opt-in cache-aware admission (``_reorder_waiting``); 0: off
        self.cache_aware_window = self.knobs.vllm_cache_aware_window
        self.cache_aware_threshold = self.knobs.vllm_cache_aware_threshold
        self._seen_evicted = (0, 0)  # the pool's (evicted, lost) blocks already recorded
        # A disaggregated decode worker: requests whose KV is loading (allocated;
        # WAITING_FOR_REMOTE_KVS), and those it landed for, waiting and holding it
        # (vLLM's kv_holding_waiting, drained before the waiting queue).
        self.receiving: dict[int, VllmReq] = {}
        self.holding: list[VllmReq] = []
        self.process = self.start()

    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.holding)

    def _never_fits(self, req: Req) -> bool:
        # A sequence holds KV for prompt + output - 1 tokens at its end; more blocks than the
        # pool has can never run to completion (vLLM refuses to start such a model length).
        kv = req.prompt_tokens + req.output_tokens - 1
        if self._hybrid:
            return self.pool.blocks_for(kv) > self.pool.capacity_blocks
        return -(-kv // self.bs) > self.pool.capacity_blocks

    # --- the V1 step: schedule() then update(step) -----------------------------------------
    def schedule(self) -> Step:
        """One V1 ``Scheduler.schedule``: running requests first (preempting the last running
        request by recompute while an allocation fails), then, unless someone was
        preempted, waiting requests FCFS; then ``_update_after_schedule``."""
        budget = self.token_budget
        rows: list[tuple[VllmReq, int, int]] = []
        decode: list[bool] = []
        preempted: list[VllmReq] = []
        running = cast("list[VllmReq]", self.running)
        waiting = cast("list[VllmReq]", self.waiting)
        blocks = self._stock_pool
        if self._state_block:  # new_step_starts: states cached last step may be hit now
            self.pool.new_step()
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            end = r.prompt_tokens + r.generated  # vLLM's num_tokens: the tokens it knows
            if r.placeholders and r.computed + 2 - r.placeholders >= (
                    r.prompt_tokens + r.output_tokens):
                i += 1  # async: its last token is in flight, nothing more to schedule
                continue
            n, cost = self._chunk(r, r.computed, end + r.placeholders, budget)
            if self._state_block:
                n = cost = mamba_aligned_chunk(self._state_block, self.token_budget,
                                                   r.prompt_tokens, r.generated, r.computed, n)
                if not n:  # no budget for a block-aligned chunk: the next request
                    i += 1
                    continue
            ok = self._extend(r, n, end)
            while not ok:
                victim = running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is r:
                    break
                ok = self._extend(r, n, end)
            if not ok:
                break
            rows.append((r, r.computed, n))
            decode.append(r.decoding)
            r.computed += n
            budget -= cost
            self._note_cached(r)
            i += 1
        if preempted:
            self._record_evictions()
            return self._scheduled(rows, decode, preempted, True)
        if self.cache_aware_window:
            self._reorder_waiting()
        while self.holding and budget > 0 and len(running) < self.max_seqs:
            r = self.holding.pop(0)  # landed: its blocks are allocated, all but one computed
            running.append(r)
            start = r.computed
            n, cost = self._chunk(r, start, r.prompt_tokens + r.generated, budget)
            r.computed, r.decoding = start + n, False
            rows.append((r, start, n))
            decode.append(False)
            budget -= cost
            # its record: the landed prompt is reused up to its last full block
            VllmServer._admitted(self, r, (r.prompt_tokens - 1) // self.bs)
        while waiting and budget > 0 and len(running) < self.max_seqs:
            r = waiting[0]
            if r.seq_ids is None:
                r.seq_ids = r.prompt.finish
            if r.remote_granted is not None:  # its KV comes from a prefill worker
                if not self._allocate_remote(r):
                    break
                continue
            num_tokens = r.prompt_tokens + r.generated
            chunk = budget
            if self._state_block:  # the chunk past the hit ends at a block edge
                hit = self.pool.lookup(r.seq_ids, num_tokens) * self.bs
                chunk = mamba_aligned_chunk(self._state_block, self.token_budget,
                                            r.prompt_tokens, r.generated, hit,
                                            min(budget, num_tokens - hit))
                if not chunk:
                    break
            h = (blocks.admit(r.rid, r.seq_ids, num_tokens, chunk) if blocks is not None
                 else self.pool.admit(r.rid, r.seq_ids, num_tokens, chunk))
            if h is None:
                break
            waiting.pop(0)
            running.append(r)
            start = h * self.bs
            n, cost = self._chunk(r, start, num_tokens, chunk)
            r.computed, r.decoding = start + n, False
            rows.append((r, start, n))
            decode.append(False)
            budget -= cost
            self._admitted(r, h)
            self._note_cached(r)
        self._record_evictions()
        return self._scheduled(rows, decode, preempted, bool(self.waiting or self.holding))

    def capacity_run_blocks(self) -> int:
        """On vLLM's wider block of a Mamba hybrid (``WideBlocks``) each of the pool's
        blocks is ``ratio`` of the run's."""
        pool = self.pool
        if isinstance(pool, WideBlocks):
            return pool.capacity_blocks * pool.ratio
        return pool.capacity_blocks

    def _reorder_waiting(self) -> None:
        """vLLM 0.34's cache-aware admission (``Scheduler._reorder_waiting_by_cached_prefix``,
        called before the waiting loop of a step that preempted nobody): once KV usage
        (``BlockPool.get_usage``: 1 - free / total blocks) reaches the threshold, the
        requests among the first ``window`` waiting ones that are WAITING with nothing
        computed (never admitted: a preempted request keeps its slot) are put in their slots
        deepest cached prefix first (the read-only lookup, ``get_num_cached_tokens``),
        arrival order breaking ties."""
        waiting = cast("list[VllmReq]", self.waiting)
        pool = self.pool
        if len(waiting) < 2 or 1 - pool.free_blocks / pool.capacity_blocks < (
                self.cache_aware_threshold):
            return
        head = waiting[:self.cache_aware_window]
        slots = [i for i, r in enumerate(head) if r.record is None]
        if len(slots) < 2:
            return
        cached = {}
        for i in slots:
            r = head[i]
            if r.seq_ids is None:
                r.seq_ids = r.prompt.finish
            cached[i] = pool.lookup(r.seq_ids, r.prompt_tokens + r.generated)
        order = sorted(slots, key=lambda i: (-cached[i], i))
        for slot, source in zip(slots, order, strict=True):
            waiting[slot] = head[source]

    # --- a disaggregated decode worker: the KV connector path (NixlConnector) -----------
    def reserve_remote(self, req: VllmReq, granted: Callable[[], None]) -> None:
        """``req``'s prompt KV is computed by a prefill worker (sim/fleet/pd.py): it joins
        the waiting queue; when the scheduler reaches it, the connector reports every
        prompt token past the local hit as external (``get_num_new_matched_tokens``), the
        blocks are allocated without caching them (``allocate_slots(...,
        num_external_computed_tokens, delay_cache_blocks=True)``), the request waits in
        WAITING_FOR_REMOTE_KVS and ``granted()`` is called (the transfer may start);
        ``land_remote`` when it arrived."""
        req.remote_granted = granted
        self.submit(req)

    def _allocate_remote(self, req: VllmReq) -> bool:
        """The head of the waiting queue allocates for its remote KV (``reserve_remote``);
        False (nothing changed) when the whole prompt does not fit beside what in-flight
        prefills still need (``_inflight_prefill_blocks``): FCFS stops there."""
        if self.pool.admit_remote(req.rid, req.seq_ids, req.prompt_tokens,
                                  self._inflight_prefill_blocks()) is None:
            return False
        self.waiting.pop(0)
        granted, req.remote_granted = req.remote_granted, None
        self.receiving[req.rid] = req
        self._record_evictions()
        if granted is not None:  # the scheduler reaches only requests that wait for it
            granted()
        return True

    def _inflight_prefill_blocks(self) -> int:
        """vLLM's ``reserved_blocks`` for an async KV load (``_inflight_prefill_reserved_
        blocks``, scheduler.py; 0.33 and 0.34 alike): the blocks the running requests still
        prefilling (a decode worker's local prefills: conditional disaggregation) must yet
        allocate to hold their prompt; a parked load (``receiving``) already holds its whole
        prompt, so it reserves nothing more (no speculative decoding)."""
        pool = self.pool
        return sum(pool.blocks_to_grow(r.rid, r.prompt_tokens + r.generated)
                   for r in cast("list[VllmReq]", self.running) if not r.decoding)

    def land_remote(self, req: VllmReq) -> None:
        """The connector finished receiving (``_update_waiting_for_remote_kv``): the
        prompt's full blocks are cached, every prompt token but the last counts as computed
        (the last is computed again to sample the first token), and the request waits,
        holding its blocks, for the next step."""
        del self.receiving[req.rid]
        self.pool.cache_known(req.rid, req.prompt_tokens)
        req.computed = req.prompt_tokens - 1
        self._note_cached(req)
        self.holding.append(req)
        self._ring()

    def _awaits_landing(self) -> bool:
        """Nothing runs, and what waits cannot be allocated while KV in transfer holds its
        room: the next step is after a landing (or an arrival)."""
        return bool(self.receiving) and not self.running

    def _wait_landing(self) -> simpy.Event:
        return self._doorbell()

    def cancel_remote(self, req: VllmReq) -> None:
        """No KV comes for ``req``: its blocks are freed and it computes its prompt here."""
        del self.receiving[req.rid]
        self.pool.free(req.rid)
        req.computed = 0
        self.waiting.insert(0, req)
        self._ring()

    def forget_unused(self) -> None:
        """Drop the hash of every cached block no request holds (a decode worker without a
        prefix cache), counted as this server's evictions."""
        self.pool.forget_free()
        self._record_evictions()

    def _scheduled(self, rows: list[tuple[VllmReq, int, int]], decode: list[bool],
                   preempted: list[VllmReq], blocked: bool) -> Step:
        """vLLM's ``_update_after_schedule``: a row whose tokens reach the end of its
        sequence samples a token; under async scheduling that token is a placeholder until
        the step's output is processed (``AsyncScheduler``)."""
        samples = []
        for r, _start, n in rows:
            r.in_flight += n
            sampled = r.computed >= r.prompt_tokens + r.generated + r.placeholders
            samples.append(sampled)
            if sampled:
                r.decoding = True
                if self.async_scheduling:
                    r.placeholders += 1
        if self.observers:
            if preempted:
                for o in self.observers:
                    o.retracted(self, cast("list[Req]", preempted))
            batch = _ranges_of(rows)
            for o in self.observers:
                o.scheduled(self, batch)
        return Step(rows=rows, decode=decode, samples=samples, preempted=preempted,
                    blocked=blocked)

    def update(self, step: Step, steps: int = 1,
               run: tuple[float, float, float] | None = None) -> bool:
        """vLLM's ``update_from_output`` for ``step`` (a decode run: ``steps`` identical
        steps at once): each sampling row appends its token(s); a request that reached its
        output length finishes and frees its blocks, in schedule order. Output of a step
        scheduled before its request was preempted (async) is still delivered. True when
        a request finished."""
        now = self.env.now
        finished = False
        for (r, _start, n), sampled in zip(step.rows, step.samples, strict=True):
            r.in_flight -= n
            stale = r.stale > 0
            if stale:
                r.stale -= n
            if r.done.triggered or not sampled:
                continue  # finished meanwhile, or a prefill chunk (no token yet)
            placeholder = r.placeholders > 0
            first = r.generated == 0
            r.generated += steps
            if first:
                r.first_token_at = now
                self.rec.first_token(r, now)
            elif run is None:
                self.rec.tokens((r,), steps, now, now)
            else:  # a decode run: (first token's time, next step's seconds, increment)
                self.rec.tokens((r,), steps, run[0], now, run[1], run[2])
            if placeholder and not stale:
                r.placeholders -= 1
                # the blocks its now-known tokens filled are cached (vLLM: cache_blocks)
                blocks = self._stock_pool
                if blocks is not None:
                    blocks.cache_known(r.rid, r.computed - r.in_flight)
                else:
                    self.pool.cache_known(r.rid, r.computed - r.in_flight)
                self._note_cached(r)
            if r.generated >= r.output_tokens:
                self._finish(r)
                finished = True
        if self.observers:
            batch = _ranges_of(step.rows)
            for o in self.observers:
                o.completed(self, batch)
                if steps > 1:
                    o.decoded(self, steps)
        return finished

    def _finish(self, req: VllmReq) -> None:
        if req.computed:  # running (an admitted request has computed at least one token)
            self.running.remove(req)
            self._release(req)
        else:  # preempted while its last token was in flight (async): it waits, holding none
            self.waiting.remove(req)
        self.rec.close(req, self.env.now)
        self._reply(req, None)
        req.done.succeed()

    # --- where a patch of vLLM changes the step (sim/engines/vllm_patch.py) ---------------
    def _chunk(self, req: VllmReq, start: int, end: int, budget: int) -> tuple[int, int]:
        """(n, cost): the request's row this step is positions ``[start, start + n)`` of its
        sequence (which ends at ``end``), costing ``cost`` tokens of the budget. Stock vLLM
        computes every position: the next ``min(end - start, budget)``."""
        n = min(end - start, budget)
        return n, n

    def _row_units(self, req: VllmReq, start: int, n: int) -> Units:
        """Prefill units of a row: its tokens at their positions."""
        return range_units(self.spec, start, start + n)

    def _release(self, req: VllmReq) -> None:
        """A finished request gives its blocks back (a patch may keep them: pins)."""
        self.pool.free(req.rid)

    def patch_summary(self) -> dict[str, Any]:
        """A patch's own counters for the run summary (none in stock vLLM)."""
        return {}

    def _admitted(self, req: VllmReq, hit_blocks: int) -> None:
        """Open the request's record at its first admission (hits are counted once)."""
        now = self.env.now
        req.admitted_at = now
        if req.record is not None:
            return
        req.known_blocks = self._ideal_blocks(req)
        ideal = min(req.known_blocks, (req.prompt_tokens - 1) // self.bs) * self.bs
        req.record = self.open_record(req, now, reused=hit_blocks * self.bs, holes=0,
                                      ideal=ideal, segments=((0, hit_blocks, Tier.GPU),))

    def _extend(self, req: VllmReq, n: int, known: int) -> bool:
        """``pool.extend`` for ``n`` more tokens of running ``req`` (``known``: its tokens
        whose ids are final); a hybrid pool also reads the tokens in flight."""
        blocks = self._stock_pool
        if blocks is not None:
            return blocks.extend(req.rid, n, known)
        if self._hybrid:
            return self.pool.extend(req.rid, n, known=known, in_flight=req.in_flight)
        return self.pool.extend(req.rid, n, known=known)

    def _note_cached(self, req: VllmReq) -> None:
        """Blocks the pool just cached join ``ever`` (what an unlimited cache holds)."""
        blocks = self._stock_pool
        cached = (blocks.cached_of(req.rid) if blocks is not None
                  else self.pool.cached_of(req.rid))
        if cached > req.known_blocks:
            self.remember(cast(np.ndarray, req.seq_ids)[req.known_blocks:cached])
            req.known_blocks = cached

    def _record_evictions(self) -> None:
        """What the allocations since the last call evicted (lazily, at pop): counted once
        per step or decode run that evicted (``evictions``), last copies as
        ``evicted_tokens``."""
        blocks = self._stock_pool
        evicted = blocks.evicted_blocks if blocks is not None else self.pool.evicted_blocks
        seen, lost = self._seen_evicted
        if evicted != seen:
            now_lost = self.pool.lost_blocks
            self._seen_evicted = (evicted, now_lost)
            self.rec.evicted(evicted - seen, now_lost - lost)

    def _preempt(self, req: VllmReq) -> None:
        """Preemption by recompute: free its blocks (in the policy's order; freed cached
        blocks stay hittable until reused), keep its outputs, front of the queue. Tokens
        of its steps still in flight (async) arrive later as stale output."""
        self.pool.free(req.rid)
        req.redo_until = max(req.redo_until, req.computed)
        req.computed, req.decoding = 0, False
        req.stale, req.placeholders = req.in_flight, 0
        self.rec.retracted(req)
        self.waiting.insert(0, req)

    # --- execution ----------------------------------------------------------------------
    def _step_seconds(self, step: Step) -> float:
        """Seconds of one step (module doc); records the prefill units of prefill rows."""
        rows = step.rows
        n_dec = ctx = 0
        for (_r, start, _n), dec in zip(rows, step.decode, strict=True):
            if dec:
                n_dec += 1
                ctx += start
        if n_dec == len(rows):
            return self.profile.decode_step_seconds(n_dec, ctx)
        # the rows' units summed field by field in Units.__add__'s order (the same numbers),
        # without a Units per partial sum
        lin: Any = 0.0
        att: Any = 0
        tok: Any = 0
        for (r, start, n), dec in zip(rows, step.decode, strict=True):
            u: Any = self._row_units(r, start, n)  # as Python numbers, whatever their type
            l_, a_, t_ = u
            lin, att, tok = lin + l_, att + a_, tok + t_
            if not dec:
                self.rec.prefill_units(r, l_ + a_, a_)  # Units.total, Units.attention
                self._count_redone(r, start, start + n)
        units = _new_units(Units, (lin, att, tok))
        prof = self.profile
        seconds = prof.prefill_seconds(units)
        if n_dec:  # a mixed step (ServerCoeffs.mixed_interference; neutral: the max)
            seconds = prof.mixed_seconds(seconds, prof.decode_kernel_seconds(n_dec, ctx), n_dec)
        # the server's CPU time for the step (neutral: none; costmodel/profile.py ServerCoeffs)
        return prof.step_seconds(seconds, len(rows), units.tokens)

    def _price(self, step: Step, start: float | None = None) -> float:
        """Seconds of ``step``, recorded as a decode step or a batch with prefill tokens
        (running from ``start``: now when not given)."""
        seconds = self._step_seconds(step)
        start = self.env.now if start is None else start
        if all(step.decode):
            self.rec.decode(seconds, 1, start, len(step.rows))
        else:
            self.rec.batch(seconds, len(step.rows), start,
                           sum(n for _r, _s, n in step.rows))
        return seconds

    def _decode_run(self, step: Step) -> Generator[Any, Any, None]:
        """The decode-only step just scheduled, repeated while nothing changes (module doc)."""
        running = cast("list[VllmReq]", self.running)
        rows = step.rows
        batch = len(rows)
        ctx = sum(start for _r, start, _n in rows)
        cap = self.decode_run_steps()
        start = self.env.now
        # a landing (``land_remote``) is admitted at the next step, like an arrival
        steps = yield from self._timed_decode(batch, ctx, cap, (not step.blocked or bool(
            self.receiving)) and cap > 1)
        self.rec.decode(self.profile.decode_run_seconds(batch, ctx, steps), steps, start,
                        batch)
        first, inc = self.profile.decode_step_series(batch, ctx)
        if steps > 1 and self._hybrid:  # steps - 1 more V1 steps, in schedule order
            self.pool.decode_run([r.rid for r in running], steps - 1)
            for r in running:
                r.computed += steps - 1
                self._note_cached(r)
            self._record_evictions()
        elif steps > 1:
            blocks = self._stock_pool
            for r in running:
                ok = (blocks.extend(r.rid, steps - 1) if blocks is not None
                      else self.pool.extend(r.rid, steps - 1))
                assert ok, f"decode run promised {steps} steps to request {r.rid}"
                r.computed += steps - 1
                self._note_cached(r)
            self._record_evictions()
        self.update(step, steps, (start + first, first + inc, inc))

    def decode_run_steps(self) -> int:
        """The most V1 steps a decode run from the decode-only step just scheduled may take
        (it included): until a request's last token, while every allocation fits, and, with
        requests waiting, before more blocks are free than their refusal saw
        (``_refused_at``)."""
        bs = self.bs
        running = cast("list[VllmReq]", self.running)
        cap = min(r.output_tokens - r.generated for r in running)
        if cap > 1 and self._hybrid:
            cap = 1 + self.pool.decode_fit([r.rid for r in running], cap - 1,
                                           ceiling=self._refused_at())
        elif cap > 1:
            starts = [-(-r.computed // bs) * bs - r.computed + 1 for r in running]
            cap = 1 + steps_fitting(starts, bs, self.pool.free_blocks, cap - 1)
        return cap

    def _loop(self) -> Generator[Any, Any, None]:
        if self.async_scheduling:
            yield from self._loop_async()
            return
        env = self.env
        while True:
            if not self.busy():
                yield self._sleep()
                continue
            step = self.schedule()
            if not step.rows:
                if self._awaits_landing():
                    yield self._wait_landing()
                    continue
                # Only a lone request preempting itself schedules nothing: it is the head
                # of the queue now and is admitted at the next step (it always fits alone).
                assert step.preempted, "a V1 step scheduled nothing and preempted nobody"
                continue
            if self._runs() and not step.preempted and len(step.rows) == len(
                    self.running) and all(step.decode):
                yield from self._decode_run(step)
                continue
            seconds = self._price(step)
            if not self._advance(seconds):
                yield env.timeout(seconds)
            self.update(step)

    def _loop_async(self) -> Generator[Any, Any, None]:
        """``EngineCore.step_with_batch_queue`` with a batch queue of 2: the next step is
        scheduled while the one in flight executes, before its output is processed, and
        runs on the GPU right after it."""
        env = self.env
        inflight: Step | None = None
        while True:
            if inflight is None and not self.busy():
                yield self._sleep()
                continue
            step = self.schedule() if self.busy() else None
            if step is not None and step.rows:
                start = env.now if inflight is None else inflight.end
                step.end = start + self._price(step, start)
            else:
                step = None  # an empty step: vLLM queues it and processes nothing
            if inflight is None:
                if step is None and self._awaits_landing():
                    yield self._wait_landing()
                    continue
                inflight = step  # the queue is not full: schedule the next one at once
                continue
            if inflight.end > env.now and not self._advance(inflight.end - env.now):
                yield env.timeout(inflight.end - env.now)
            finished = self.update(inflight)
            inflight = step
            if (self._runs() and step is not None and not step.preempted
                    and len(step.rows) == len(self.running) and all(step.decode)
                    and (not self.waiting or (step.blocked and not finished))):
                inflight = yield from self._async_decode_run(step)

    def _runs(self) -> bool:
        """Whether a decode-only step may start a decode run. Not while cache-aware admission
        may reorder a waiting queue: as decode steps fill the pool, usage can reach the
        threshold and the reordered head may fit where the refused one did not."""
        return self.decode_runs and not (self.cache_aware_window and self.waiting)

    def _async_decode_run(self, step: Step) -> Generator[Any, Any, Step]:
        """The pipeline of decode-only steps while nothing changes, in one event: ``step``
        (every running request decoding) is in flight, its predecessor processed. Each next
        iteration would schedule the same step one position further and process the one in
        flight; x such iterations are taken at once, x cut at the first step that samples
        a request's last token (the one after it would skip that request), by memory (the
        first step whose allocations the free queue cannot serve is scheduled alone) and,
        when nobody waits, by an arrival (it joins the step scheduled after the step in
        flight completes). Returns the step left in flight."""
        env = self.env
        bs = self.bs
        running = cast("list[VllmReq]", self.running)
        batch = len(step.rows)
        ctx = sum(start for _r, start, _n in step.rows) + batch  # the first extra step's
        x = min(r.output_tokens - r.generated - r.placeholders for r in running)
        if x > 0 and self._hybrid:  # each step scheduled while the one before is in flight
            x = self.pool.decode_fit([r.rid for r, _s, _n in step.rows], x, in_flight=1,
                                     ceiling=self._refused_at())
        elif x > 0:
            starts = [-(-r.computed // bs) * bs - r.computed + 1 for r in running]
            x = steps_fitting(starts, bs, self.pool.free_blocks, x)
        if x <= 0:
            return step
        waiting = len(self.waiting)
        interruptible = not waiting or bool(self.receiving)  # an arrival, or a landing
        if interruptible:  # an arrival during the step in flight: one iteration only
            yield env.timeout(step.end - env.now) | self._doorbell()
            if len(self.waiting) > waiting or self.holding:
                x = 1
                if step.end > env.now:
                    yield env.timeout(step.end - env.now)
        else:
            yield env.timeout(step.end - env.now)
        if x > 1:
            x = 1 + (yield from self._timed_decode(batch, ctx, x - 1, interruptible))
        return self._apply_async_run(step, x, ctx)

    def _refused_at(self) -> int | None:
        """A hybrid's decode run with requests waiting (refused, or cut off by
        ``max_num_seqs``): the free blocks their last refusal saw. Running requests free
        blocks inside a run (a sliding group's blocks leaving the window, a Mamba group's
        previous state), and vLLM retries the waiting head after every step's running rows,
        so the run ends before a step after which more blocks are free
        (``HybridPool.decode_fit``'s ceiling). None when nobody waits."""
        return self.pool.free_blocks if self._hybrid and self.waiting else None

    def _apply_async_run(self, step: Step, x: int, ctx: int) -> Step:
        """State after x pipeline iterations of a decode run (``_async_decode_run``): x more
        steps scheduled (x tokens allocated per request), ``step`` and the x - 1 after it
        processed (x tokens known and cached); the last one scheduled is in flight."""
        step_s, inc = self.profile.decode_step_series(len(step.rows), ctx)
        last_at = self.env.now if x > 1 else step.end
        self.rec.tokens([r for r, _s, _n in step.rows], x, step.end, last_at, step_s, inc)
        rows = []
        if self._hybrid:  # x steps, each scheduled with one in flight, known a step later
            self.pool.decode_run([r.rid for r, _s, _n in step.rows], x, in_flight=1, lag=1)
        blocks = self._stock_pool
        for r, start, _n in step.rows:
            # known when the last one was scheduled: x - 1 outputs processed since
            known = r.prompt_tokens + r.generated + x - 1
            ok = (blocks.extend(r.rid, x, known) if blocks is not None
                  else self._hybrid or self.pool.extend(r.rid, x, known=known))
            assert ok, f"decode run promised {x} steps to request {r.rid}"
            r.computed += x
            r.generated += x
            if blocks is not None:
                blocks.cache_known(r.rid, r.computed - r.in_flight)
            else:
                self.pool.cache_known(r.rid, r.computed - r.in_flight)
            self._note_cached(r)
            rows.append((r, start + x, 1))
        self._record_evictions()
        batch = len(rows)
        seconds = self.profile.decode_run_seconds(batch, ctx, x)
        self.rec.decode(seconds, x, step.end, batch)
        for o in self.observers:
            o.decoded(self, x)
        return Step(rows=rows, decode=[True] * batch, samples=[True] * batch, preempted=[],
                    blocked=step.blocked, end=step.end + seconds)
