"""The SGLang engine: SGLang's scheduler over a radix KV cache.

Data flow of one run::

    sessions (closed loop: reply + recorded gap)  --submit-->  waiting queue
    server loop:  [prefill pass]  scheduler orders waiting -> for each candidate: match and
                                  lock (hit / hole / miss) -> admission test (free +
                                  evictable - reservations - what the pass took)
                                  -> after the last: make_room once (eviction policy) -> one
                                     batch of chunks (real new tokens + phantom hole
                                     refills) priced once
                  [else decode]   all running requests advance k steps in ONE event, k = steps
                                  to the first finish, cut short by an arrival (the step in
                                  flight completes), by memory (evict, else retract)

Semantics (SGLang 0.5.23, docs/engine.md): prefill pre-empts decode; one chunked request at
a time, continued before the queue; the whole prompt plus a decode reservation must fit before
admission; the first refused request stops the pass (head-of-line); retraction victims are the
requests with the fewest generated tokens (ties: longest prompt) and go to the queue's tail.
Nothing is allocated before every candidate of a pass is matched and locked, and the chunk
budget is charged page-ceiled extends (SGLang's adder loop, then prepare_for_extend).

Simplifications (documented in docs/engine.md): a scheduling pass runs at each event rather
than at every decode step; the memory of a decode run is taken for exactly the tokens it
generated, and the d2h copies that made room for it delay its completion; the overlap
scheduler's one-iteration delay in freeing KV is not modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import numpy as np
import simpy
from mypy_extensions import mypyc_attr

from costmodel.gpus import sglang_one_pool
from costmodel.profile import Profile
from costmodel.specs import ModelSpec
from costmodel.units import Units
from policies import EvictionPolicy
from policies.scheduling import SchedulePolicy, get_scheduler
from sim.config import RunConfig, SGLangKnobs
from sim.context import parse_context
from sim.engines.recorder import RunRecorder
from sim.kvcache import RadixKVCache, Tier
from sim.kvcache.hybridtree import STARTS

from .base import EngineBase, steps_fitting
from .request import Req
from .sglang_queue import WaitingOrder


def _is_swa(spec: ModelSpec) -> bool:
    """Full layers beside sliding-window layers of one window; or compressed layers beside
    every layer's window (DeepSeek-V4: SGLang's ``DeepSeekV4TokenToKVPool`` is a
    ``BaseSWAKVPool``, its full pool indexed by token holding the compressed entries,
    sglang/srt/mem_cache/deepseek_v4_memory_pool.py)."""
    kinds = {str(g.kind) for g in spec.groups}
    return kinds in ({"full", "sliding"}, {"compressed", "sliding"}) and len(
        {g.window for g in spec.groups if str(g.kind) == "sliding"}) == 1


def hybrid_tree_kind(spec: ModelSpec, knobs: SGLangKnobs | None = None) -> str | None:
    """``"swa"`` or ``"mamba"`` where SGLang keeps ``spec`` in a hybrid radix tree (full
    beside one sliding window, or full beside linear attention), else None: one pool of every
    layer (costmodel/gpus.py ``sglang_one_pool``; ``knobs``: the run's, None: the default
    flags)."""
    if _is_swa(spec):
        return None if sglang_one_pool(spec, knobs is None or knobs.hybrid_swa_memory) else "swa"
    if {str(g.kind) for g in spec.groups} == {"full", "linear"}:
        return "mamba"
    return None


def hybrid_unsupported(cfg: RunConfig, policy: EvictionPolicy) -> tuple[str, str] | None:
    """What the SGLang engine on a hybrid tree does not model (None for every other model)."""
    from costmodel.specs import get_spec
    from policies.eviction import EvictionPolicy as Base

    try:
        spec = get_spec(cfg.cache.model, cfg.cache.kv_dtype)
    except (KeyError, ValueError):
        return None  # the run reports the model itself
    knobs = cast(SGLangKnobs, cfg.engine)
    model = cfg.cache.model
    if hybrid_tree_kind(spec, knobs) is None:
        return None
    head = f"{model} runs on SGLang's hybrid radix tree (docs/hybrid.md)"
    why = None
    if type(policy).key is not Base.key or policy.order != "lru":
        why = "victim orders other than lru are not modelled on it"
    elif policy.pins:
        why = "pins are not modelled on it"
    elif policy.start.name not in STARTS or policy.granularity.name not in ("node", "block"):
        why = f"start {policy.start.name!r} / granularity {policy.granularity.name!r} are not"
    if why is not None:
        return (cfg.policy_field, f"{head}: {why}; use --preset sglang, vllm or penelope")
    if cfg.cache.cpu_cache:
        return ("cpu_cache", f"{head}: a CPU tier is not modelled on it; drop --cpu-cache")
    strategy = parse_context(cfg.context.strategy)
    if strategy.edits_kv:  # trim and summarize only change the tokens a turn sends
        off = " or --hybrid-swa-memory off (one pool)" if hybrid_tree_kind(spec) == "swa" else ""
        return ("context", f"{head}: {strategy.label} edits cached KV, which is not modelled "
                f"on it; use full, trim or summarize{off}")
    if cfg.pool.size:
        return ("pool", f"{head}: a fleet's shared KV pool is not modelled on it")
    return None


@dataclass(eq=False, kw_only=True)
class Admission:
    """A request the adder loop admitted: its locked match, the ranges it computes and the
    tokens it takes in this pass, and what its match found (for its record)."""

    req: Req
    node: Any  # the match's node to lock (a Node; the hybrid tree's own: sglang_hybrid.py)
    ranges: list[tuple[int, int]]
    take: int
    chunked: bool
    reused: int
    holes: int
    loaded: int
    segments: Sequence[tuple[int, int, Tier]]  # the match's runs after any CPU load (a tuple)
    found: Sequence[tuple[int, int, Tier]]  # the match's runs as found, before the load


# Verdicts of a refused admission (schedule_policy.py AddReqResult): memory (NO_TOKEN) or a
# spent pass budget (OTHER). Only NO_TOKEN sets batch_is_full.
NO_TOKEN: Final = "no_token"
OTHER: Final = "other"
# SGLANG_RETRACT_DECODE_STEPS: after releasing a retracted request, SGLang evicts the cache
# until this many tokens per remaining request are free; the new ratio assumes as many more
# tokens per survivor.
RETRACT_DECODE_STEPS: Final = 20
# --num-reserved-decode-tokens (sglang/srt/arg_groups/fields/disagg.py): decode tokens a
# disaggregated decode worker keeps free per active request when it pre-allocates.
NUM_RESERVED_DECODE_TOKENS: Final = 512


@mypyc_attr(allow_interpreted_subclasses=True)
class SGLangServer(EngineBase):
    """SGLang's scheduler and memory semantics over one ``RadixKVCache``."""

    lands_remote_kv = True
    # --disaggregation-decode-allocation-policy early (SGLang's default): the decode worker
    # pre-allocates at bootstrap, and the prefill worker waits for it (PrefillBootstrapQueue
    # admits a request once its decode side sent the KV indices: KVPoll.WaitingForInput).
    prealloc_before_prefill = True

    @classmethod
    def unsupported(cls, cfg: RunConfig, policy: EvictionPolicy) -> tuple[str, str] | None:
        return hybrid_unsupported(cfg, policy)

    @classmethod
    def build(cls, env: simpy.Environment, cfg: RunConfig, spec: ModelSpec, profile: Profile,
              policy: EvictionPolicy, recorder: RunRecorder) -> SGLangServer:
        tiers: dict[str, Any] = {}
        c = cfg.cache
        if c.cpu_cache:
            tiers = dict(cpu_capacity_blocks=c.cpu_cache // c.block_size, tiering=c.tiering,
                         swap_buffer_blocks=c.swap_buffer // c.block_size,
                         write_policy=c.hicache_write_policy,
                         load_threshold_tokens=c.hicache_load_threshold, block_size=c.block_size)
        cache = RadixKVCache(c.gpu_cache // c.block_size, policy, debug=cfg.debug_cache,
                             versioned=parse_context(cfg.context.strategy).drops, **tiers)
        return cls(env, cfg, spec, profile, cache, get_scheduler(cfg.policy.scheduler), recorder)

    def __init__(self, env: simpy.Environment, cfg: RunConfig, spec: ModelSpec,
                 profile: Profile, cache: Any, scheduler: SchedulePolicy,
                 recorder: RunRecorder) -> None:
        # The base holds ``cache`` untyped (vLLM's is a block pool; a hybrid model's is
        # SGLang's hybrid tree, whose engine overrides every method that reads it typed);
        # methods here read it into a local typed ``RadixKVCache``, so the compiled core
        # calls it directly.
        super().__init__(env, cfg, spec, profile, cache, cache.policy, recorder)
        # SGLang's default overlap schedule prepares batch n+1 on the CPU while n runs
        self.profile = profile.for_server(True)
        # Whether a step pays server CPU time (``Profile.step_seconds``; frozen, so fixed for
        # the run): without it a prefill batch's seconds are its kernels', with no call.
        self._step_cpu = self.profile.server.has_cpu
        self.scheduler = scheduler
        self.chunked: Req | None = None
        self.knobs: SGLangKnobs = cfg.engine  # type: ignore[assignment]  # engine_class's choice
        k = self.knobs
        self.ratio = k.new_token_ratio
        self._decay = (k.new_token_ratio - k.new_token_ratio_min) / max(
            1, k.new_token_ratio_decay_steps)
        self.max_running = k.max_running or 1 << 30
        self.max_new_tokens = cfg.traffic.max_new_tokens  # the clients' max_tokens
        self._new_limit = min(spec.max_context - 1, cache.capacity_blocks * self.bs - 1)
        # SGLang's running_batch.batch_is_full: set when an admission is refused for memory
        # while requests run; no admission is tried again until the running batch shrinks.
        self.batch_is_full = False
        self.queue = WaitingOrder(scheduler, cache, self.bs, self._usable_blocks)
        # A disaggregated decode worker: the prealloc queue (FIFO) and the transfer queue
        # (rid -> the locked prefix node and the blocks pre-allocated for the rest).
        self.prealloc: list[tuple[Req, Callable[[], None]]] = []
        self.receiving: dict[int, tuple[object, int]] = {}
        # A disaggregated decode worker (``expect_preallocations``): pre-allocations arrive.
        self.remote_kv = False
        self.process = self.start()

    def expect_preallocations(self) -> None:
        """This worker decodes for prefill workers (sim/fleet/pd.py): a pre-allocation may
        arrive at any step, so a full batch's decode run stays interruptible."""
        self.remote_kv = True

    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.chunked is not None)

    def _never_fits(self, req: Req) -> bool:
        """The admission test of an empty server: the whole plan over an empty cache
        (restores of dropped keys included) plus the decode reservation and one page."""
        cache: RadixKVCache = self.cache
        ranges = self._prefill_ranges(req, [])[0]
        need = sum(b - a for a, b in ranges) + self._decode_reserve(req) + self.bs
        return need >= cache.capacity_blocks * self.bs

    # --- helpers ------------------------------------------------------------------------

    def _max_new(self, req: Req) -> int:
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        # Unset by the client: SGLang assumes everything up to the context / KV limit
        # (``_new_limit``: constant over a run, computed once).
        return max(1, self._new_limit - req.position_tokens - 1)

    def _decode_reserve(self, req: Req) -> int:
        return min(max(0, self._max_new(req) - req.generated), self.knobs.clip_max_new_tokens)

    def _running_offset_tokens(self) -> float:
        # Every pass reads it: one loop, no call per running request (= the sum of
        # _decode_reserve over the running batch).
        clip = self.knobs.clip_max_new_tokens
        fixed = self.max_new_tokens
        limit = self._new_limit
        total = 0
        for r in self.running:
            new = fixed if fixed is not None else max(1, limit - r.position_tokens - 1)
            total += min(max(0, new - r.generated), clip)
        return total * self.ratio

    @staticmethod
    def _fill_tokens(req: Req) -> int:
        """Tokens a (re-)prefill covers: SGLang's fill_ids, the prompt plus every output token
        so far (a retracted request re-prefills them all and samples the next one)."""
        return req.prompt_tokens + req.generated

    def _ceil_page(self, tokens: int) -> int:
        return self._blocks(tokens) * self.bs

    def _usable_blocks(self, req: Req) -> int:
        # At least one token is always computed (SGLang caps the hit at len - 1).
        return (self._fill_tokens(req) - 1) // self.bs

    def _prefill_ranges(self, req: Req, segments) -> tuple[list[tuple[int, int]], int, int, int]:
        """Token ranges to compute for ``req`` given match segments: holes (phantom) and the
        tail from the end of the usable match. CPU-resident segments are loaded, not computed.
        Returns (ranges, reused_tokens, hole_tokens, cpu_tokens)."""
        return req.prompt.prefill_ranges(segments, self._usable_blocks(req), self._fill_tokens(req),
                               self.bs)

    def _reserve_tokens(self, req: Req, tokens: int) -> bool:
        """Hold ``tokens`` more outside the tree; evict through the policy if needed."""
        cache: RadixKVCache = self.cache
        need = self._blocks(req.own_tokens + tokens) - req.reserved
        if need > 0:
            if cache.free_blocks < need:
                res = cache.make_room(need)
                self._evicted(res)
                if not res.ok:
                    return False
            cache.reserve(need)
            req.reserved += need
        req.own_tokens += tokens
        return True

    def _checkpoint(self, req: Req, upto_blocks: int, computed_to: int = 0,
                    final_ids: np.ndarray | None = None):
        """Insert the request's full blocks ``[0, upto_blocks)`` into the tree and move its lock
        there; the tokens it computed in ``[upto_blocks * bs, computed_to)`` stay its own.
        With ``final_ids`` (the request finished) everything it holds goes to the tree."""
        ids = req.ids[:upto_blocks] if final_ids is None else final_ids
        if ids.size == 0:
            return None
        cache: RadixKVCache = self.cache
        cache.release(req.reserved)
        # A chunk checkpoint locks what it inserts, and must keep the match's lock too: the
        # kept segment behind a hole lies below the inserted prefix until the last chunk
        # reaches it.
        chunk = final_ids is None
        ins = cache.insert(ids, hint=req.hint, lock=chunk)
        size = ids.size
        if size > req.known_blocks:
            self.remember(ids[req.known_blocks:])
            req.known_blocks = size
        if chunk:
            if size == req.ids.size:  # the whole prompt is in: its leaf covers the path
                self._unlock_all(req)
            req.locks.append(ins.node)
        req.own_tokens = own = 0 if not chunk else max(0, computed_to - size * self.bs)
        req.reserved = reserved = self._blocks(own)
        if reserved:
            cache.reserve(reserved)
        return ins.node

    def insert_remote(self, ids: np.ndarray) -> bool:
        """Make the prefix ``ids`` GPU-resident where its KV was computed elsewhere (a fleet's
        shared pool, sim/fleet/pooltier.py, fetched the blocks this cache lacks): the matched
        path is locked while the policy makes room for the blocks not on the GPU (evictions
        recorded as this server's), then the blocks are inserted and join ``ever``, what an
        unlimited cache of this server holds. False when the room cannot be made (nothing
        inserted). The blocks are not pinned: admission locks them, as a CPU load's."""
        cache: RadixKVCache = self.cache
        m = cache.match(ids, touch=False)
        missing = int(ids.size) - m.blocks_in(Tier.GPU)
        cache.lock(m.node)
        ok = True
        if cache.free_blocks < missing:
            res = cache.make_room(missing)
            self._evicted(res)
            ok = res.ok
        if ok:
            cache.reserve(missing)
            cache.insert(ids)
            cache.release(missing)
            self.remember(ids)
        cache.unlock(m.node)
        return ok

    # --- a disaggregated decode worker: KV computed elsewhere lands where it pre-allocated ----
    def reserve_remote(self, req: Req, granted: Callable[[], None]) -> None:
        """``req``'s prompt KV is computed by a prefill worker (sim/fleet/pd.py): it waits in
        the prealloc queue (SGLang's DecodePreallocQueue, FIFO) until this server
        pre-allocates the prompt's blocks (``_preallocate``), then ``granted()`` is called
        (the prefill and the transfer may go on); ``land_remote`` when the KV arrived. A
        request that can never fit is dropped (SGLang aborts it). The queue is served by
        the server process before every decode step, as SGLang's loop polls it: an
        arrival cuts a decode run after the step in flight, a waiting head ends it at
        the step after which it fits (``_prealloc_steps``)."""
        if self._never_fits(req):
            self._drop(req)
            return
        self.prealloc.append((req, granted))
        self._ring()

    def _prealloc_margin(self, req: Req, held: int, used: Any = 0, grown: Any = 0) -> Any:
        """Room less need of ``_preallocate``'s test for ``req`` (``held``: its GPU prefix
        blocks) once the running batch used ``used`` more blocks and its requests grew by
        ``grown`` tokens in all (0 and 0: now; numpy arrays: after each step of a decode
        run). SGLang ``_allocatable_token_budgets`` and ``_required_admission_tokens``
        (disaggregation/decode.py): room = free + evictable tokens less max(R per active
        request, what the longest running request needs to finish alone beyond what
        retraction frees); need = max(the uncached pages + R, the uncached prompt + its
        decode tokens beyond what retraction frees); R = ``NUM_RESERVED_DECODE_TOKENS``,
        active = running + receiving + waiting."""
        bs, clip = self.bs, self.knobs.clip_max_new_tokens
        running = self.running
        cache: RadixKVCache = self.cache
        retractable = sum(r.prompt_tokens + r.generated for r in running) + grown
        single = max(min(self._max_new(r), clip) + r.prompt_tokens for r in running) \
            - retractable if running else 0
        active = len(running) + len(self.receiving) + len(self.waiting) \
            + (self.chunked is not None)
        room = (cache.free_blocks + cache.evictable_blocks - used) * bs \
            - np.maximum(NUM_RESERVED_DECODE_TOKENS * active, single)
        pages = (self._blocks(req.prompt_tokens) - held) * bs
        need = np.maximum(pages + NUM_RESERVED_DECODE_TOKENS, req.prompt_tokens - held * bs
                          + min(self._max_new(req), clip) - retractable)
        return room - need

    def _prealloc_steps(self, steps: int) -> int:
        """Steps of the decode run about to start after which the prealloc queue's head
        passes its test (SGLang polls the queue before every decode step:
        ``process_decode_queue``), ``steps`` if none does: the run's memory use grows
        by the blocks each step opens (from each request's next block step, as
        ``_steps_in``) and what retraction would free by a token per request and step.
        In closed form over the run's steps (numpy), the head matched once."""
        bs = self.bs
        req = self.prealloc[0][0]
        cache: RadixKVCache = self.cache
        m = cache.match(req.ids, touch=False)
        cache.lock(m.node)  # as ``_preallocate`` tests it: its prefix is not evictable
        held = m.blocks_in(Tier.GPU)
        k = np.arange(1, steps + 1)
        opens = np.bincount([r.reserved * bs - r.own_tokens + 1 for r in self.running],
                            minlength=bs + 1)  # requests opening a block at step t in [1, bs]
        used = np.cumsum(opens[(k - 1) % bs + 1])
        fits = np.flatnonzero(self._prealloc_margin(req, held, used, len(self.running) * k)
                              >= 0)
        cache.unlock(m.node)
        return int(k[fits[0]]) if fits.size else steps

    def _preallocate(self) -> None:
        """SGLang ``pop_preallocated`` (disaggregation/decode.py), head of line: the head
        locks its GPU prefix and pre-allocates the rest of its prompt when it passes
        ``_prealloc_margin``'s test. A head that does not fit a server holding nothing never
        will: it is dropped."""
        cache: RadixKVCache = self.cache
        while self.prealloc:
            req, granted = self.prealloc[0]
            m = cache.match(req.ids, touch=False)
            cache.lock(m.node)
            held = m.blocks_in(Tier.GPU)
            missing = int(req.ids.size) - held
            if self._prealloc_margin(req, held) < 0:
                cache.unlock(m.node)
                if self.running or self.waiting or self.receiving or self.chunked is not None:
                    return  # memory is freed when a request finishes or retracts
                self.prealloc.pop(0)
                self._drop(req)
                continue
            if cache.free_blocks < missing:
                res = cache.make_room(missing)
                self._evicted(res)
                assert res.ok, f"pre-allocation of request {req.rid}: eviction fell short"
            cache.reserve(missing)
            self.receiving[req.rid] = (m.node, missing)
            self.prealloc.pop(0)
            granted()

    def land_remote(self, req: Req) -> None:
        """``req``'s prompt KV arrived into the room ``reserve_remote`` pre-allocated: its
        full blocks join the tree GPU-resident, locked until its admission (SGLang's
        transfer queue hands it to the waiting queue holding its KV), and it is submitted:
        its first forward computes the last (partial) block and samples the first token."""
        node, blocks = self.receiving.pop(req.rid)
        if req.ids.size:
            ins = self.cache.insert(req.ids)
            self.cache.lock(ins.node)
            req.landed = ins.node
            self.remember(req.ids)
        self.cache.release(blocks)
        self.cache.unlock(node)
        self.submit(req)

    def cancel_remote(self, req: Req) -> None:
        """No KV comes for ``req`` (its prefill failed): the pre-allocated room is freed and
        it is submitted to compute its prompt here."""
        node, blocks = self.receiving.pop(req.rid)
        self.cache.release(blocks)
        self.cache.unlock(node)
        self.submit(req)

    def _release_landing(self, req: Req) -> None:
        if req.landed is not None:
            self.cache.unlock(req.landed)
            req.landed = None

    def forget_unused(self) -> None:
        """Evict every block no running request holds (a decode worker without a prefix
        cache: what a finished request leaves is freed, counted as this server's
        evictions)."""
        cache: RadixKVCache = self.cache
        n = cache.evictable_blocks
        if n:
            self._evicted(cache.evict(n))

    def _unlock_all(self, req: Req) -> None:
        cache: RadixKVCache = self.cache
        for node in req.locks:
            cache.unlock(node)
        req.locks = []

    # --- scheduling ---------------------------------------------------------------------
    def _headroom(self) -> float:
        """SGLang's remaining_total: free + evictable tokens minus the decode reservations
        of running requests and what this pass admitted so far (its page-ceiled extends, one
        page each and the decode tokens of each completed prompt: nothing is allocated
        before the pass ends)."""
        cache: RadixKVCache = self.cache
        return ((cache.free_blocks + cache.evictable_blocks) * self.bs
                - self._running_offset_tokens() - self._pass_offset)

    def _charge(self, tokens: int, final: bool, req: Req) -> None:
        """SGLang's _update_prefill_budget for ``tokens`` of ``req`` admitted in this pass:
        the headroom loses the page-ceiled extend, one page and, when the prompt completes,
        min(max_new, clip) decode tokens; the chunk budget loses the page-ceiled extend."""
        paged = self._ceil_page(tokens)
        reserve = min(self._max_new(req), self.knobs.clip_max_new_tokens) if final else 0
        self._pass_offset += paged + self.bs + reserve
        self._budget -= paged

    def _admit(self, req: Req) -> Admission | str:
        """Match, lock and test ``req`` against what is left of this pass (SGLang
        add_one_req). Nothing is allocated here: the pass allocates after every candidate
        is matched. Returns the admission, or the verdict of a refusal (head-of-line):
        NO_TOKEN (memory) or OTHER (no budget for even one page)."""
        cache: RadixKVCache = self.cache
        m = cache.match(req.ids, touch=True, hint=req.hint)
        ranges, reused, holes, cpu = self._prefill_ranges(req, m.segments)
        extend = sum(b - a for a, b in ranges)
        cache.lock(m.node)
        need = extend + cpu + self._decode_reserve(req) + self.bs
        # A request whose KV landed in pre-allocated room passed its admission test there:
        # SGLang's decode worker takes it into the running batch with no memory test
        # (get_new_prebuilt_batch), only the batch size.
        if need >= self._headroom() and req.landed is None:
            cache.unlock(m.node)
            return NO_TOKEN
        loaded = 0
        segments = m.segments
        if cpu:  # bring the CPU-resident part of the prefix to the GPU before the prefill
            ld = cache.load(m.node, min(req.ids.size, self._usable_blocks(req)))
            if not ld.ok:
                cache.unlock(m.node)
                return NO_TOKEN
            loaded = ld.loaded_blocks * self.bs
            self.rec.loaded(ld, self.bs)
            self._pending_h2d_bytes += loaded * self.kv_bytes
            # What the load did not bring back (HiCache's threshold) is computed instead.
            segments = cache.match(req.ids, touch=False, hint=req.hint).segments
            ranges, _, holes, _ = self._prefill_ranges(req, segments)
            extend = sum(b - a for a, b in ranges)
        # Chunked when the page-ceiled extend exceeds the chunk budget left; the chunk is
        # that budget floored to a page.
        chunked = self._ceil_page(extend) > self._budget
        take = (self._budget // self.bs) * self.bs if chunked else extend
        if take <= 0:
            cache.unlock(m.node)
            return OTHER
        self._charge(take, not chunked, req)
        return Admission(req=req, node=m.node, ranges=ranges, take=take, chunked=chunked,
                         reused=reused, holes=holes, loaded=loaded, segments=segments,
                         found=m.segments)

    def _allocate(self, plan: list[tuple[Req, int]]) -> int:
        """SGLang prepare_for_extend: after the adder loop, make room for the whole batch at
        once, then hold each request's new tokens. Returns how many of ``plan`` got their
        memory (all of them unless eviction could not cover the batch; then the first
        ones that fit, in order)."""
        cache: RadixKVCache = self.cache
        need = sum(max(0, self._blocks(r.own_tokens + t) - r.reserved) for r, t in plan)
        if cache.free_blocks < need:
            self._evicted(cache.make_room(need))
        for i, (req, take) in enumerate(plan):
            if not self._reserve_tokens(req, take):
                return i
        return len(plan)

    def _schedule(self) -> list[tuple[Req, list[tuple[int, int]]]]:
        """One prefill pass (SGLang get_new_batch_prefill): the batch of (request, token
        ranges) to compute now. While ``batch_is_full`` only a chunk in flight continues.
        Every candidate is matched and locked before anything is allocated (and so
        evicted), as SGLang's adder loop runs before prepare_for_extend."""
        if not self.running:
            self.batch_is_full = False  # an empty batch has no request left to clear it
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return []
        self._pass_offset = 0.0
        self._budget = self.knobs.chunk_size
        # calc_priority runs before the chunk continues: lpm matches (and stamps) every
        # waiting request in each pass, chunk passes included.
        if self.waiting:
            self.waiting = self.queue.order(self.waiting)
        plan: list[tuple[Req, int]] = []  # (request, tokens to compute), in batch order
        continued = self.chunked
        if continued is not None:
            # add_chunked_req: the chunk is the budget cut to the headroom (when positive),
            # re-evaluated each pass, so it shrinks when memory is short; the final chunk
            # reserves the request's decode tokens for the candidates after it.
            base = self._headroom()  # pass_offset is 0.0 here: the headroom before the pass
            room = int(base)
            limit = min(self._budget, room) if room > 0 else self._budget
            rest = 0
            for a, b in continued.ranges:
                rest += b - a
            take = min(limit, rest)
            plan.append((continued, take))
            self._charge(take, take == rest, continued)
            if take == rest:
                self.chunked = None
            alone = self._continue_alone(continued, take, base)
            if alone is not None:
                return alone
        admitted: list[Admission] = []
        for req in list(self.waiting):
            # budget_state at the top of the loop: a spent budget stops the pass (OTHER)
            # unless memory is spent too (NO_TOKEN: the head is still tried).
            if self._budget <= 0 and self._headroom() > 0:
                break
            if len(self.running) + len(plan) >= self.max_running:
                self.batch_is_full = True
            if self.batch_is_full:
                break
            got = self._admit(req)
            if got == OTHER:
                break
            if got == NO_TOKEN:
                self.batch_is_full = bool(plan or self.running)
                if not self.running and not plan and self.chunked is None \
                        and not self.receiving:
                    # Nothing holds memory but this request and it does not fit: it never
                    # will. Drop it and try the next one (the server must not sleep).
                    self.waiting.remove(req)
                    self._release_landing(req)
                    self._drop(req)
                    continue
                break
            got = cast(Admission, got)  # neither verdict: an admission
            admitted.append(got)
            plan.append((req, got.take))
            if got.chunked:
                self.chunked = req
            # The verdict for the next candidate: memory first (NO_TOKEN), then budget. A
            # new chunk leaves less than a page of budget: the next candidate is matched and
            # refused (OTHER), unless memory refuses it first.
            if self._headroom() <= 0:
                self.batch_is_full = True
                break
            if self._budget <= 0:
                break
        return self._commit(plan, admitted, continued)

    def _commit(self, plan: list[tuple[Req, int]], admitted: list[Admission],
                continued: Req | None) -> list[tuple[Req, list[tuple[int, int]]]]:
        """After the adder loop: allocate the batch (``prepare_for_extend``), then take each
        request's tokens and record the admissions. ``continued``: the chunk in flight that
        this pass continued (already admitted, still locked)."""
        for a in admitted:  # locked and charged: these are the batch
            a.req.locks = [a.node]
            a.req.ranges = a.ranges
        fitted = self._allocate(plan)
        for req, _take in plan[fitted:]:  # eviction could not cover them after all
            if req is continued:
                self.chunked = continued  # keeps its locks; decode must free memory first
            else:
                self._unlock_all(req)
                if req is self.chunked:
                    self.chunked = None
        if fitted < len(plan):
            self.batch_is_full = bool(fitted or self.running)
        committed = {id(req) for req, _take in plan[:fitted] if req is not continued}
        for a in admitted:  # the record sees the request's whole plan (before the take)
            if id(a.req) in committed:
                self._release_landing(a.req)  # its match holds the landed blocks now
                self._open(a)
        batch: list[tuple[Req, list[tuple[int, int]]]] = []
        for req, take in plan[:fitted]:
            taken, req.ranges = self._split_ranges(req.ranges, take)
            batch.append((req, taken))
        if committed:
            self.waiting = [r for r in self.waiting if id(r) not in committed]
        return batch

    def _continue_alone(self, req: Req, take: int, base: float
                        ) -> list[tuple[Req, list[tuple[int, int]]]] | None:
        """The pass's batch when it can only continue the chunk in flight ``req`` (most
        passes under pressure), else None (candidates may join: the adder loop runs). No
        candidate joins when the queue is empty, or when the budget is spent while memory
        is not (the loop's first test; the cache did not change since ``base``, the
        headroom before the pass, so the headroom now is ``base`` less what the chunk
        charged: the same float operations as ``_headroom``). The batch is ``_commit``'s:
        the same allocation (``_allocate`` then ``_reserve_tokens``, each making room when
        short), without the bookkeeping of admissions."""
        if self.waiting and (self._budget > 0 or base - self._pass_offset <= 0):
            return None
        need = self._blocks(req.own_tokens + take) - req.reserved
        if need > 0:
            cache: RadixKVCache = self.cache
            if cache.free_blocks < need:  # _allocate's room for the batch
                self._evicted(cache.make_room(need))
                if cache.free_blocks < need:  # _reserve_tokens tries once more, then fails
                    res = cache.make_room(need)
                    self._evicted(res)
                    if not res.ok:  # keeps its locks; decode must free memory first
                        self.chunked = req
                        self.batch_is_full = bool(self.running)
                        return []
            cache.reserve(need)
            req.reserved += need
        req.own_tokens += take
        taken, req.ranges = self._split_ranges(req.ranges, take)
        return [(req, taken)]

    def _open(self, a: Admission) -> None:
        """Record an admission (the first one opens the request's record)."""
        req = a.req
        if req.record is None:
            req.known_blocks = self._ideal_blocks(req)
            ideal = min(req.known_blocks, self._usable_blocks(req)) * self.bs
            req.record = self.open_record(req, self.env.now, reused=a.reused, holes=a.holes,
                                          ideal=ideal, segments=a.segments, loaded=a.loaded,
                                          found=a.found)
        req.admitted_at = self.env.now

    # --- decode runs: k steps of the running batch as one event ---------------------------
    # A run of k steps is one event: k is the number of steps to the first finish, cut to what
    # free + evictable memory holds for every running request (``_steps_in``, closed form).
    # Memory is reserved for exactly the tokens a run generated, after the run.
    def _decode_steps(self) -> int:
        """Steps the running batch can take now: to the first finish, limited by memory
        (free + evictable blocks)."""
        cache: RadixKVCache = self.cache
        steps = min(r.output_tokens - r.generated for r in self.running)
        return self._steps_in(cache.free_blocks + cache.evictable_blocks, steps)

    def _steps_in(self, room: int, cap: int) -> int:
        """Largest k <= cap such that k more tokens of every running request need at most
        ``room`` more blocks. Request i needs a new block at steps t_i, t_i + bs, ... where
        t_i = (its reserved blocks * bs - its tokens) + 1, so the (room+1)-th smallest of
        these is the first step that does not fit."""
        bs = self.bs
        # steps_fitting checks each t_i is in [1, bs]: the invariant reserved == ceil(own / bs)
        return steps_fitting([r.reserved * bs - r.own_tokens + 1 for r in self.running], bs,
                             room, cap)

    def _retract(self) -> None:
        """SGLang retract_decode: fewest generated first, ties longest prompt, then the last
        in the running batch; keep one. Each release (``release_req``) frees the victim's
        own tokens, unlocks its tree part, then evicts until 20 tokens per remaining request
        are free."""
        cache: RadixKVCache = self.cache
        order = {id(r): i for i, r in enumerate(self.running)}
        victims = sorted(self.running, key=lambda r: (r.generated, -r.prompt_tokens,
                                                      -order[id(r)]))
        gone = []
        while len(self.running) > 1 and self._decode_steps() == 0:
            v = victims.pop(0)
            gone.append(v)
            self.running.remove(v)
            v.redo_until = max(v.redo_until, v.context_tokens)
            cache.release(v.reserved)
            v.reserved = v.own_tokens = 0
            self._unlock_all(v)
            self.rec.retracted(v)
            self._seq += 1
            v.seq = self._seq
            self.waiting.append(v)
            short = self._blocks(RETRACT_DECODE_STEPS * len(self.running)) - cache.free_blocks
            if short > 0 and cache.evictable_blocks:
                self._evicted(cache.evict(min(short, cache.evictable_blocks)))
        self.batch_is_full = False  # the running batch shrank
        survivors = self.running
        out = sum(r.generated for r in survivors)
        self.ratio = min(1.0, (out + RETRACT_DECODE_STEPS * len(survivors)) / (
            sum(self._max_new(r) for r in survivors) + 1))
        for o in self.observers:
            o.retracted(self, gone)

    def _reserve_decode(self, steps: int) -> None:
        """Hold memory for the ``steps`` tokens every running request just generated (the
        plan made sure it exists: nothing else ran since)."""
        for r in self.running:
            ok = self._reserve_tokens(r, steps)
            assert ok, f"decode plan promised room for {steps} steps of request {r.rid}"

    def _apply_decode(self, steps: int, retracted: bool = False) -> None:
        """After a run of ``steps`` decode steps. SGLang decays the ratio once per decode
        iteration that did not retract: the first step of a run that began with a
        retraction (``retracted``; it SET the ratio, perhaps below the floor) does not."""
        for r in self.running:
            r.generated += steps
        decays = steps - 1 if retracted else steps
        if decays:
            self.ratio = max(self.ratio - decays * self._decay, self.knobs.new_token_ratio_min)
        finished = [r for r in self.running if r.generated >= r.output_tokens]
        if finished:
            self.running = [r for r in self.running if r.generated < r.output_tokens]
            for r in finished:
                self._finish(r)

    # --- execution ----------------------------------------------------------------------

    def _finish_prefill(self, batch: list[tuple[Req, list[tuple[int, int]]]],
                        per_req: list[Units]) -> None:
        now = self.env.now
        for i, (req, _ranges) in enumerate(batch):
            units = per_req[i]  # (``_prefill_seconds`` prices each request of the batch)
            # units.total's sum read in place (an interpreted property: one call per chunk)
            self.rec.prefill_units(req, units.linear + units.attention, units.attention)
            if req.ranges:  # chunk of an unfinished prompt: checkpoint what is contiguous
                # SGLang leaves the chunked request out of the batch it merges into the
                # running batch: the batch shrank, which clears batch_is_full.
                self.batch_is_full = False
                if self.knobs.checkpoint_chunks:
                    done_to = req.ranges[0][0]
                    self._checkpoint(req, min(done_to // self.bs, req.ids.size), done_to)
                continue
            # The prefill samples one token: the first, or the next after a retraction.
            if req.generated == 0:
                req.first_token_at = now
                self.rec.first_token(req, now)
            else:  # the next token after a retraction
                self.rec.tokens((req,), 1, now, now)
            req.generated += 1
            self._checkpoint(req, req.ids.size, req.context_tokens)
            if req.generated >= req.output_tokens:
                self._finish(req)
            else:
                self.running.append(req)

    def _finish(self, req: Req) -> None:
        cache: RadixKVCache = self.cache
        self.batch_is_full = False  # the running batch shrank (a finish or an abort)
        final = self._final_ids(req) if req.generated >= req.output_tokens else req.ids
        if req.prompt.edit_on_finish and final is not req.ids:
            self._unlock_all(req)  # its own locks would block the edit of its path
            if not self._context_edit(req):  # a drop takes effect after the prompt
                final = final[:0]  # its path did not all take the new keys: keep it as is
        leaf = None
        if final.size:
            leaf = self._checkpoint(req, 0, final_ids=final)
        else:
            cache.release(req.reserved)
            req.reserved = req.own_tokens = 0
        self._unlock_all(req)
        self.rec.close(req, self.env.now)
        self._reply(req, leaf)
        req.done.succeed()

    def _loop(self):
        env = self.env
        while True:
            if self.prealloc:  # SGLang pops the prealloc queue in every loop iteration
                self._preallocate()
            if not self.waiting and not self.running and self.chunked is None:
                self.ratio = self.knobs.new_token_ratio  # fully idle: SGLang resets the ratio
                yield self._sleep()
                continue
            batch = self._schedule()
            if batch:
                for o in self.observers:
                    o.scheduled(self, batch)
                seconds, per_req = self._prefill_seconds(batch)
                tokens = 0
                for _req, ranges in batch:
                    for a, b in ranges:
                        tokens += b - a
                # the server's CPU time for the batch (neutral: none; ServerCoeffs)
                if self._step_cpu:
                    seconds = self.profile.step_seconds(seconds, len(batch), tokens)
                if self.tiered:  # (without a CPU tier nothing is ever pending)
                    seconds += self._transfer_seconds()
                self.rec.batch(seconds, len(batch), tokens=tokens)
                if not self._advance(seconds):
                    yield env.timeout(seconds)
                self._finish_prefill(batch, per_req)
                for o in self.observers:
                    o.completed(self, batch)
                continue
            if not self.running:
                if self.receiving:  # KV in transfer holds the room: wait for its landing
                    yield self._doorbell()
                    continue
                # Nothing was admitted and nothing decodes: a waiting request that does not
                # fit an otherwise empty server was dropped, so this wait is for an arrival.
                yield self._sleep()
                continue
            steps = self._decode_steps()
            retracted = steps == 0
            if retracted:
                self._retract()
                steps = self._decode_steps()
                if steps == 0:  # a lone request that cannot grow: abort it (SGLang aborts)
                    victim = self.running.pop()
                    self.rec.aborted(victim)
                    self._finish(victim)
                    continue
            batch_size = len(self.running)
            ctx = sum(r.kv_read_tokens for r in self.running)
            pause = self._transfer_seconds()  # copies pending from before the run
            if pause and not self._advance(pause):
                yield env.timeout(pause)
            start = env.now
            # A decode worker polls its prealloc queue before every step: a waiting head
            # ends the run at the step after which it fits, and with none waiting a new one
            # cuts it like an arrival. With batch_is_full an arrival cannot be admitted
            # before a finish: no cut for it.
            waiting_head = bool(self.prealloc)
            if waiting_head and steps > 1:
                steps = self._prealloc_steps(steps)
            steps = yield from self._timed_decode(
                batch_size, ctx, steps,
                not self.batch_is_full or (self.remote_kv and not waiting_head))
            self.rec.decode(self.profile.decode_run_seconds(batch_size, ctx, steps), steps,
                            start, batch_size)
            self._record_tokens(start, batch_size, ctx, steps)
            # Memory for exactly the tokens generated; the copies that made room for them
            # (demotions to the CPU tier) happened during the run: its tokens complete after
            # them, and the next batch does not pay for them again.
            self._reserve_decode(steps)
            pause = self._transfer_seconds()
            if pause and not self._advance(pause):
                yield env.timeout(pause)
            self._apply_decode(steps, retracted)
            for o in self.observers:
                o.decoded(self, steps)


