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
position p costs W + p units) and its memory time (the decode step of its decode rows).

Defaults for an online server on one H100 (vllm/engine/arg_utils.py ``get_batch_defaults``,
``UsageContext.OPENAI_API_SERVER`` on a >= 70 GiB non-A100 GPU): max_num_batched_tokens 8192
(``RunConfig.chunk_size``), max_num_seqs 1024 (``RunConfig.max_running`` unset).
"""

from __future__ import annotations

from typing import Any

import simpy

from costmodel.profile import Profile
from costmodel.specs import ModelSpec
from costmodel.units import Units, range_units
from policies import Blocks, EvictionPolicy, PolicyError, PrivateHead, Tail
from sim.config import RunConfig
from sim.kvcache import EvictResult, Tier
from sim.kvcache.blockpool import BlockPool
from sim.metrics import RunRecorder

from .base import EngineBase, steps_fitting
from .request import Req

# vllm/engine/arg_utils.py get_batch_defaults: OPENAI_API_SERVER, H100/H200 tier.
VLLM_MAX_NUM_SEQS = 1024
VLLM_MAX_NUM_BATCHED_TOKENS = 8192


def free_order_name(policy: EvictionPolicy) -> str:
    """The ``BlockPool`` free order that is ``policy`` on vLLM, or PolicyError.

    vLLM's only eviction freedom is the order in which a finished request's blocks join the
    free queue (least recently freed is reused first, a hit takes a block back out). ``tail``
    start is vLLM's own reversed release (``vllm``); ``private-head`` releases the front of
    the private history first (``penelope``). Victim keys other than LRU, pins, node
    granularity and other start positions have no counterpart in a block pool."""
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
    elif type(policy.start) is Tail:
        return "vllm"
    elif type(policy.start) is PrivateHead:
        return "penelope"
    else:
        why = (f"its start position is {policy.start.name!r} (vLLM has no tree nodes: "
               "tail and private-head are the release orders it can express)")
    pins = "; Continuum's TTL pins on vLLM: --vllm-patch continuum" if policy.pins else ""
    raise PolicyError(f"policy {policy.label!r} cannot run on the vllm engine: {why}; "
                      "use vllm (tail first) or penelope (front of the private history "
                      f"first), or --engine sglang{pins}")


class VllmServer(EngineBase):
    """vLLM 0.33's V1 scheduling and memory semantics over one ``BlockPool``."""

    default_presets = ("vllm", "penelope")
    # False: every V1 step is its own event (slow; tests prove runs change nothing)
    decode_runs: bool = True

    @classmethod
    def unsupported(cls, cfg: RunConfig, policy: EvictionPolicy) -> tuple[str, str] | None:
        try:
            free_order_name(policy)
        except PolicyError as e:
            return cfg.policy_field, str(e)
        if cfg.cpu_cache:
            return ("cpu_cache", "the vllm engine models one GPU tier (vLLM 0.33's prefix "
                    "cache; KV offloading connectors are not modelled): use --engine sglang "
                    "for two tiers")
        if cfg.scheduler != "fcfs":
            return ("scheduler", f"vLLM 0.33's V1 scheduler serves the waiting queue fcfs "
                    f"(its priority policy needs request priorities); {cfg.scheduler!r} is "
                    "SGLang's: use --engine sglang")
        if not cfg.checkpoint_chunks:
            return ("checkpoint_chunks", "--prompt-nodes shapes SGLang's radix tree; vLLM "
                    "caches blocks, not nodes")
        return None

    pool_class: type[BlockPool] | None = None  # a patch's own pool; None: BlockPool

    @classmethod
    def build(cls, env: simpy.Environment, cfg: RunConfig, spec: ModelSpec, profile: Profile,
              policy: EvictionPolicy, recorder: RunRecorder) -> VllmServer:
        if cls is VllmServer and cfg.vllm_patch != "none":  # a named patch of vLLM
            from .vllm_patch import VLLM_PATCHES

            return VLLM_PATCHES[cfg.vllm_patch].build(env, cfg, spec, profile, policy,
                                                      recorder)
        pool = (cls.pool_class or BlockPool)(cfg.gpu_cache // cfg.block_size, cfg.block_size,
                         free_order_name(policy), debug=cfg.debug_cache)
        return cls(env, cfg, spec, profile, pool, policy, recorder)

    def __init__(self, env: simpy.Environment, cfg: RunConfig, spec: ModelSpec,
                 profile: Profile, pool: BlockPool, policy: EvictionPolicy,
                 recorder: RunRecorder) -> None:
        super().__init__(env, cfg, spec, profile, pool, policy, recorder)
        self.pool = pool
        self.token_budget = cfg.chunk_size  # max_num_batched_tokens
        self.max_seqs = cfg.max_running or VLLM_MAX_NUM_SEQS
        self._seen_evicted = (0, 0)  # the pool's (evicted, lost) blocks already recorded
        self.process = self.start()

    def _never_fits(self, req: Req) -> bool:
        # A sequence holds KV for prompt + output - 1 tokens at its end; more blocks than the
        # pool has can never run to completion (vLLM refuses to start such a model length).
        kv = req.prompt_tokens + req.output_tokens - 1
        return -(-kv // self.bs) > self.pool.capacity_blocks

    # --- scheduling ---------------------------------------------------------------------
    def _schedule(self) -> tuple[list[tuple[Req, int, int]], bool, bool]:
        """One V1 step's scheduling. Returns (rows, preempted, blocked): rows are (request,
        first position, tokens) in schedule order; ``blocked``: requests wait that this
        step could not admit (refused, max_num_seqs, or no budget left)."""
        budget = self.token_budget
        rows: list[tuple[Req, int, int]] = []
        running = self.running
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n, cost = self._chunk(r, r.computed, r.prompt_tokens + r.generated, budget)
            ok = self.pool.extend(r.rid, n)
            while not ok:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
                ok = self.pool.extend(r.rid, n)
            if not ok:
                break
            rows.append((r, r.computed, n))
            r.computed += n
            budget -= cost
            self._note_cached(r)
            i += 1
        if preempted:
            self._record_evictions()
            return rows, True, True
        while self.waiting and budget > 0 and len(running) < self.max_seqs:
            r = self.waiting[0]
            if r.seq_ids is None:
                r.seq_ids = r.prompt.finish
            num_tokens = r.prompt_tokens + r.generated
            h = self.pool.admit(r.rid, r.seq_ids, num_tokens, budget)
            if h is None:
                break
            self.waiting.pop(0)
            running.append(r)
            start = h * self.bs
            n, cost = self._chunk(r, start, num_tokens, budget)
            r.computed, r.decoding = start + n, False
            rows.append((r, start, n))
            budget -= cost
            self._admitted(r, h)
            self._note_cached(r)
        self._record_evictions()
        return rows, False, bool(self.waiting)

    # --- where a patch of vLLM changes the step (sim/engines/vllm_patch.py) ---------------
    def _chunk(self, req: Req, start: int, end: int, budget: int) -> tuple[int, int]:
        """(n, cost): the request's row this step is positions ``[start, start + n)`` of its
        sequence (which ends at ``end``), costing ``cost`` tokens of the budget. Stock vLLM
        computes every position: the next ``min(end - start, budget)``."""
        n = min(end - start, budget)
        return n, n

    def _row_units(self, req: Req, start: int, n: int) -> Units:
        """Prefill units of a row: its tokens at their positions."""
        return range_units(self.spec, start, start + n)

    def _release(self, req: Req) -> None:
        """A finished request gives its blocks back (a patch may keep them: pins)."""
        self.pool.free(req.rid)

    def patch_summary(self) -> dict[str, Any]:
        """A patch's own counters for the run summary (none in stock vLLM)."""
        return {}

    def _admitted(self, req: Req, hit_blocks: int) -> None:
        """Open the request's record at its first admission (hits are counted once)."""
        now = self.env.now
        req.admitted_at = now
        if req.record is not None:
            return
        req.known_blocks = self._ideal_blocks(req.ids)
        ideal = min(req.known_blocks, (req.prompt_tokens - 1) // self.bs) * self.bs
        req.record = self.rec.open(req, now, reused=hit_blocks * self.bs, holes=0,
                                   ideal=ideal, spec=self.spec,
                                   segments=((0, hit_blocks, Tier.GPU),), bs=self.bs)

    def _note_cached(self, req: Req) -> None:
        """Blocks the pool just cached join ``ever`` (what an unlimited cache holds)."""
        cached = min(req.computed // self.bs, req.seq_ids.size)
        if cached > req.known_blocks:
            self.ever.update(req.seq_ids[req.known_blocks:cached].tolist())
            req.known_blocks = cached

    def _record_evictions(self) -> None:
        """What the allocations since the last call evicted (lazily, at pop): counted once
        per step or decode run that evicted (``evictions``), last copies as
        ``evicted_tokens``."""
        evicted = self.pool.evicted_blocks
        seen, lost = self._seen_evicted
        if evicted != seen:
            now_lost = self.pool.lost_blocks
            self._seen_evicted = (evicted, now_lost)
            self.rec.evicted(EvictResult(ok=True, freed_blocks=evicted - seen,
                                         deleted_blocks=now_lost - lost))

    def _preempt(self, req: Req) -> None:
        """Preemption by recompute: free its blocks (in the policy's order; freed cached
        blocks stay hittable until reused), keep its outputs, front of the queue."""
        self.pool.free(req.rid)
        req.computed, req.decoding = 0, False
        self.rec.retracted(req)
        self.waiting.insert(0, req)

    # --- execution ----------------------------------------------------------------------
    def _step_seconds(self, rows: list[tuple[Req, int, int]]) -> float:
        """Seconds of one step (module doc); records the prefill units of prefill rows."""
        n_dec = ctx = 0
        for r, start, _n in rows:
            if r.decoding:
                n_dec += 1
                ctx += start
        if n_dec == len(rows):
            return self.profile.decode_step_seconds(n_dec, ctx)
        units = Units()
        for r, start, n in rows:
            u = self._row_units(r, start, n)
            units = units + u
            if not r.decoding:
                self.rec.prefill_units(r, u)
        seconds = self.profile.prefill_seconds(units)
        if n_dec:
            seconds = max(seconds, self.profile.decode_step_seconds(n_dec, ctx))
        return seconds

    def _sample(self, rows: list[tuple[Req, int, int]], steps: int = 1) -> None:
        """After ``steps`` steps: rows at the end of their sequence sampled a token each
        step; finished requests free their blocks, in schedule order."""
        now = self.env.now
        finished = []
        for r, _start, _n in rows:
            if r.computed < r.prompt_tokens + r.generated:
                continue  # a prefill chunk: no token yet
            r.generated += steps
            if not r.decoding:  # a prefill ended (steps == 1)
                r.decoding = True
                if r.generated == 1:  # the first token (a resumed request has more)
                    r.first_token_at = now
                    self.rec.first_token(r, now)
            if r.generated >= r.output_tokens:
                finished.append(r)
        for r in finished:
            self.running.remove(r)
            self._release(r)
            self.rec.close(r, now)
            self._reply(r, None)
            r.done.succeed()

    def _decode_run(self, rows: list[tuple[Req, int, int]], blocked: bool):
        """The decode-only step just scheduled, repeated while nothing changes (module doc)."""
        bs = self.bs
        running = self.running
        batch = len(rows)
        ctx = sum(start for _r, start, _n in rows)
        cap = min(r.output_tokens - r.generated for r in running)
        if cap > 1:
            starts = [-(-r.computed // bs) * bs - r.computed + 1 for r in running]
            cap = 1 + steps_fitting(starts, bs, self.pool.free_blocks, cap - 1)
        steps = yield from self._timed_decode(batch, ctx, cap, not blocked and cap > 1)
        self.rec.decode(self.profile.decode_run_seconds(batch, ctx, steps), steps)
        if steps > 1:
            for r in running:
                ok = self.pool.extend(r.rid, steps - 1)
                assert ok, f"decode run promised {steps} steps to request {r.rid}"
                r.computed += steps - 1
                self._note_cached(r)
            self._record_evictions()
        self._sample(rows, steps)

    def _loop(self):
        env = self.env
        while True:
            if not self.waiting and not self.running:
                yield self._sleep()
                continue
            rows, preempted, blocked = self._schedule()
            if not rows:
                # Only a lone request preempting itself schedules nothing: it is the head
                # of the queue now and is admitted at the next step (it always fits alone).
                assert preempted, "a V1 step scheduled nothing and preempted nobody"
                continue
            if self.decode_runs and not preempted and len(rows) == len(self.running) and all(
                    r.decoding for r, _s, _n in rows):
                yield from self._decode_run(rows, blocked)
                continue
            seconds = self._step_seconds(rows)
            if all(r.decoding for r, _s, _n in rows):
                self.rec.decode(seconds, 1)
            else:
                self.rec.batch(seconds, len(rows))
            yield env.timeout(seconds)
            self._sample(rows)
