"""The SGLang engine on a hybrid model: SGLang's scheduler over its hybrid radix tree (issue 54).

A model with sliding-window layers beside full ones (one window: gpt-oss, Gemma 3) or linear
attention / Gated DeltaNet beside full ones (Qwen3-Next) runs on
``sim.kvcache.hybridtree.HybridRadixCache``: SGLang 0.5.23's UnifiedRadixCache with its SWA or
Mamba component, proven op by op against the real code (tests/test_sglang_hybrid_diff.py).
``SGLangHybridServer`` is ``SGLangServer`` (sim/engines/sglang.py: the scheduler, the adder
loop, decode runs, retraction, PD) with every method that touches the cache on that tree's
request protocol (docs/hybrid.md, "The SGLang engine on hybrid models"):

- admission matches and locks (a hit is valid only where every group can serve it: the window
  before it has SWA KV, or a state sits at it; a state hit takes a slot of its own);
- memory is taken in both pools (full and SWA pages, and a state slot), each shortfall evicted
  by the tree; the headroom is the smaller pool's;
- each chunk checkpoint and decode run frees the request's SWA KV out of its window; the
  finish checkpoint inserts prompt and output, then the row is released.

Eviction policies: SGLang's own (lru, tail, node), and lru with ``tail``, ``leaf-head`` or
``private-head`` at node or block granularity (the tree's ``start``/``block``). Penelope's
private-head leaves holes; the phantom request recomputes what ``sim.kvcache.refill`` plans
(each hole from its latest restart point), and the tree starts its holes at restart points.
Context strategies that only change the tokens a turn sends (trim, summarize) run here; not
modelled on a hybrid (refused in one line: ``sglang.hybrid_unsupported``): two tiers, context
strategies that edit cached KV (drop, splice, budget), other victim orders or pins, a fleet's
shared pool. ``--hybrid-swa-memory off`` keeps an SWA hybrid in one pool instead (SGLang's
``--disable-hybrid-swa-memory``); ``sim.engines.engine_class`` picks this class.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import simpy

from costmodel.profile import Profile
from costmodel.specs import ModelSpec
from policies import EvictionPolicy
from policies.scheduling import SchedulePolicy, get_scheduler
from sim.config import RunConfig
from sim.kvcache import Tier
from sim.kvcache.hybridtree import Freed, HybridNode, HybridRadixCache, HybridRequest
from sim.kvcache.results import Match

from .recorder import RunRecorder
from .request import Req
from .sglang import (
    NO_TOKEN,
    OTHER,
    RETRACT_DECODE_STEPS,
    Admission,
    SGLangServer,
    hybrid_tree_kind,
)
from .sglang_queue import WaitingOrder


def sglang_tree(cfg: RunConfig, spec: ModelSpec, policy: EvictionPolicy) -> HybridRadixCache:
    """The hybrid tree of one server in SGLang's pools (costmodel.gpus.kv_capacity): from the
    KV bytes per GPU where the run gives them, else from its full-pool tokens (``gpu_cache``):
    the SWA pool ``--swa-full-tokens-ratio`` of it, the mamba pool the state slots that
    ``--mamba-full-memory-ratio`` of the bytes those tokens take holds."""
    from costmodel.gpus import (
        MAMBA_FULL_MEMORY_RATIO,
        SWA_FULL_TOKENS_RATIO,
        TOKEN_KINDS,
        group_bytes,
        kv_capacity,
    )

    c = cfg.cache
    bs, tp = c.block_size, c.tp or 1
    if c.gpu_cache_bytes is not None:
        cap = kv_capacity(spec, c.gpu_cache_bytes, tp, "sglang", bs)
        full, swa, slots = cap.full_tokens, cap.swa_tokens, cap.mamba_slots
    else:
        full = c.gpu_cache // bs * bs
        swa = int(full * SWA_FULL_TOKENS_RATIO) // bs * bs
        groups = group_bytes(spec, tp, "sglang")
        state = sum(g.state_bytes for g in groups)
        rest = full * sum(g.token_bytes for g in groups if g.kind in TOKEN_KINDS)
        slots = max(1, int((rest * MAMBA_FULL_MEMORY_RATIO - state) // state)) if state else 0
    kw = dict(start=policy.start.name, block=policy.granularity.name == "block",
              policy=policy)
    if hybrid_tree_kind(spec) == "swa":
        window = next(g.window for g in spec.groups if str(g.kind) == "sliding")
        return HybridRadixCache(full // bs, swa // bs, window, bs, **kw)  # type: ignore[arg-type]
    return HybridRadixCache(full // bs, block_size=bs, state_slots=slots,
                            **kw)  # type: ignore[arg-type]


class _QueueView:
    """The tree as the waiting queue's order reads it (``WaitingOrder``: lpm's matches)."""

    def __init__(self, tree: HybridRadixCache) -> None:
        self.tree = tree

    def match(self, ids: np.ndarray, touch: bool = True, hint: Any = None) -> Match:
        t = self.tree
        if not touch:
            hit = t.gpu_prefix_blocks(ids)
            return Match(None, hit, hit, ((0, hit, Tier.GPU),) if hit else ())  # type: ignore
        hit = t.match(ids)[0]
        segs = _segments(hit, t.last_refill)
        return Match(None, hit, hit, segs)  # type: ignore[arg-type]


def _segments(hit: int, refill: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int, Tier], ...]:
    """A hit of ``hit`` blocks as match segments: the phantom's ranges NONE, the rest GPU."""
    out: list[tuple[int, int, Tier]] = []
    pos = 0
    for a, b in refill:
        if a > pos:
            out.append((pos, a, Tier.GPU))
        out.append((a, b, Tier.NONE))
        pos = b
    if hit > pos:
        out.append((pos, hit, Tier.GPU))
    return tuple(out)


class SGLangHybridServer(SGLangServer):
    """SGLang's scheduler over its hybrid radix tree (module docstring)."""

    @classmethod
    def build(cls, env: simpy.Environment, cfg: RunConfig, spec: ModelSpec, profile: Profile,
              policy: EvictionPolicy, recorder: RunRecorder) -> SGLangHybridServer:
        return cls(env, cfg, spec, profile, sglang_tree(cfg, spec, policy),
                   get_scheduler(cfg.policy.scheduler), recorder)

    def __init__(self, env: simpy.Environment, cfg: RunConfig, spec: ModelSpec,
                 profile: Profile, cache: Any, scheduler: SchedulePolicy,
                 recorder: RunRecorder) -> None:
        self.tree: HybridRadixCache = cache
        self._h: dict[int, HybridRequest] = {}  # rid -> its row in the tree
        self._front: dict[int, int] = {}  # rid -> tokens it has pages for (from position 0)
        self._seen = (0, 0)  # the tree's deleted and hole blocks already recorded
        super().__init__(env, cfg, spec, profile, cache, scheduler, recorder)
        self.queue = WaitingOrder(scheduler, _QueueView(cache), self.bs, self._usable_blocks)
        self.debug = cfg.debug_cache
        if self.tree.has_mamba:
            # A running request pins two states (its own, and its hit's or last checkpoint's)
            # and a checkpoint copies into a free one: SGLang sizes its running requests by
            # the mamba pool; here at most (slots - 1) // 2 run at once.
            self.max_running = min(self.max_running, max(1, (self.tree.state_capacity - 1) // 2))

    # --- the tree's bookkeeping ---------------------------------------------------------
    def _sync(self) -> None:
        """Record what the tree's evictions did since the last call (full blocks deleted,
        of them left as holes); with --debug-cache recount the tree."""
        t = self.tree
        deleted, holes = t.deleted_blocks - self._seen[0], t.hole_blocks - self._seen[1]
        if deleted:
            self.rec.evicted(deleted, deleted, 0, holes)
            self._seen = (t.deleted_blocks, t.hole_blocks)
        if self.debug:
            t.check()

    def _room(self) -> int:
        """Free + evictable pages of the tighter pool (a decode run grows both)."""
        t = self.tree
        room = t.full_free + t.full_evictable
        if t.has_swa:
            room = min(room, t.swa_free + t.swa_evictable)
        return room

    def _swa_tokens(self, extend: int, req: Req, limit: int | None) -> int:
        """SGLang's ``estimate_swa_kv_tokens`` (mem_cache/prefill_budget.py): the SWA pages
        one admission may hold at its peak: what a chunk of at most ``limit`` tokens
        allocates beyond the window, plus a window (or less) and a page."""
        w = self.tree.window
        allocated = extend if limit is None else min(extend, limit)
        return (max(allocated - w, 0) + min(extend + self._decode_reserve(req), w)
                + self.bs)

    def _never_fits(self, req: Req) -> bool:
        need = self._fill_tokens(req) + self._decode_reserve(req) + self.bs
        t = self.tree
        if need >= t.full_capacity * self.bs or (t.has_mamba and t.state_capacity < 1):
            return True
        return t.has_swa and self._swa_tokens(
            self._fill_tokens(req), req, self.knobs.chunk_size) >= t.swa_capacity * self.bs

    def _headroom(self) -> float:
        """SGLang's remaining_total: the full pool's (SWAPrefillBudget); the SWA pool is
        tested apart (``_admit``)."""
        t = self.tree
        return ((t.full_free + t.full_evictable) * self.bs - self._running_offset_tokens()
                - self._pass_offset)

    def _schedule(self) -> list[tuple[Req, list[tuple[int, int]]]]:
        self._swa_offset = 0  # SWA tokens the pass's admissions reserved
        return super()._schedule()

    def _frontier_after(self, req: Req, take: int) -> int:
        """Tokens ``req`` has pages for once it computed ``take`` more: the phantom's ranges
        lie before its hit (their pages are the holes', taken by ``fill``), its own ranges
        and decode tokens extend its row."""
        front = self._front[req.rid]
        if not req.ranges:
            return front + take
        left = take
        for a, b in req.ranges:
            if left <= 0:
                break
            n = min(b - a, left)
            left -= n
            front = max(front, a + n)
        return front

    def _pages_needed(self, req: Req, take: int) -> int:
        h = self._h[req.rid]
        return max(0, self._blocks(self._frontier_after(req, take)) - h.owned)

    def _own(self, req: Req, h: HybridRequest) -> None:
        """The parent's per-request view (decode runs, reservations) of ``h``'s row."""
        req.own_tokens = self._front[req.rid] - h.protected * self.bs
        req.reserved = h.owned - h.protected

    def _reserve_tokens(self, req: Req, tokens: int) -> bool:
        h = self._h[req.rid]
        t = self.tree
        freed = Freed()
        front = self._frontier_after(req, tokens)
        if not req.ranges:  # a decode run: the steps' out-of-window SWA frees come first
            t.decode_to(h, front, freed)
        ok = not h.fill or t.fill(h, freed)
        need = self._blocks(front) - h.owned
        if ok and (need > 0 or (t.has_mamba and not h.state)):
            ok = t.allocate(h, max(0, need), freed)
        self._sync()
        if not ok:
            return False
        self._front[req.rid] = front
        self._own(req, h)
        return True

    def _allocate(self, plan: list[tuple[Req, int]]) -> int:
        """prepare_for_extend: one eviction for the batch's pages in both pools, then each
        request's (holes to refill first)."""
        t = self.tree
        need = swa = 0
        for r, take in plan:
            pages = self._pages_needed(r, take)
            need += pages + t.fill_blocks(self._h[r.rid])
            swa += pages
        full_short = max(0, need - t.full_free)
        swa_short = max(0, swa - t.swa_free) if t.has_swa else 0
        if full_short or swa_short:
            t.evict(full_short, swa_short, Freed())
            self._sync()
        for i, (req, take) in enumerate(plan):
            if not self._reserve_tokens(req, take):
                return i
        return len(plan)

    def _continue_alone(self, req: Req, take: int, base: float
                        ) -> list[tuple[Req, list[tuple[int, int]]]] | None:
        if self.waiting and (self._budget > 0 or base - self._pass_offset <= 0):
            return None
        if not self._reserve_tokens(req, take):  # keeps its row; decode must free memory
            self.chunked = req
            self.batch_is_full = bool(self.running)
            return []
        taken, req.ranges = self._split_ranges(req.ranges, take)
        return [(req, taken)]

    def _admit(self, req: Req) -> Admission | str:
        t = self.tree
        freed = Freed()
        usable = self._usable_blocks(req)
        h = t.admit(req.ids[:usable], req.ids, freed)  # match + lock (a state hit: a slot)
        self._sync()
        bs = self.bs
        segments = _segments(h.hit, h.refill)
        # the phantom's ranges, then the tail (a context strategy's view counts its re-prefill)
        ranges, reused, phantom, _ = self._prefill_ranges(req, segments)
        extend = sum(b - a for a, b in ranges)
        need = extend + self._decode_reserve(req) + bs
        short = t.has_mamba and not h.state and t.state_free + t.state_evictable < 1
        if t.has_swa:  # SWAPrefillBudget.check_prefill: the request's peak SWA pages
            swa = self._swa_tokens(self._ceil_page(extend), req, self._budget)
            short = swa >= (t.swa_free + t.swa_evictable) * bs - self._swa_offset
        if (need >= self._headroom() or short) and req.landed is None:
            t.drop(h, freed)
            return NO_TOKEN
        chunked = self._ceil_page(extend) > self._budget
        take = (self._budget // bs) * bs if chunked else extend
        if take <= 0:
            t.drop(h, freed)
            return OTHER
        self._charge(take, not chunked, req)
        if t.has_swa:
            self._swa_offset += self._swa_tokens(self._ceil_page(take), req, None)
        self._h[req.rid] = h
        self._front[req.rid] = h.hit * bs
        return Admission(req=req, node=h.node, ranges=ranges, take=take, chunked=chunked,
                         reused=reused, holes=phantom, loaded=0,
                         segments=segments, found=segments)

    def _unlock_all(self, req: Req) -> None:
        """The request lets go of its row: its pages past the tree's, its state, its lock."""
        h = self._h.pop(req.rid, None)
        self._front.pop(req.rid, None)
        if h is not None:
            self.tree.release(h, Freed())
        req.locks = []
        req.reserved = req.own_tokens = 0

    def _checkpoint(self, req: Req, upto_blocks: int, computed_to: int = 0,
                    final_ids: np.ndarray | None = None):
        t = self.tree
        h = self._h.get(req.rid)
        if h is None:
            return None
        freed = Freed()
        if final_ids is None:
            if upto_blocks <= h.protected:  # still in the phantom's ranges or the hit
                return None
            t.checkpoint(h, upto_blocks, False, freed)
            size = upto_blocks
        else:  # the finish: the last decode step's window free, the insert, the release
            size = max(int(final_ids.size), h.protected)
            h.ids = np.asarray(final_ids, np.int64)
            t.decode_to(h, self._front[req.rid], freed)
            t.checkpoint(h, size, True, freed)
        ids = h.ids[:size]
        if size > req.known_blocks:
            self.remember(ids[req.known_blocks:])
            req.known_blocks = size
        node = h.node
        if final_ids is None:
            self._own(req, h)
        else:
            self._unlock_all(req)
        self._sync()
        return node

    def _finish(self, req: Req) -> None:
        self.batch_is_full = False
        final = self._final_ids(req) if req.generated >= req.output_tokens else req.ids
        if final.size and req.rid in self._h:
            self._checkpoint(req, 0, final_ids=final)
        else:
            self._unlock_all(req)
        self._sync()
        self.rec.close(req, self.env.now)
        self._reply(req, None)
        req.done.succeed()

    # --- decode ---------------------------------------------------------------------------
    def _decode_steps(self) -> int:
        steps = min(r.output_tokens - r.generated for r in self.running)
        return self._steps_in(self._room(), steps)

    def _retract(self) -> None:
        """SGLang retract_decode (``SGLangServer._retract``) on the tree's rows."""
        t = self.tree
        order = {id(r): i for i, r in enumerate(self.running)}
        victims = sorted(self.running, key=lambda r: (r.generated, -r.prompt_tokens,
                                                      -order[id(r)]))
        gone = []
        while len(self.running) > 1 and self._decode_steps() == 0:
            v = victims.pop(0)
            gone.append(v)
            self.running.remove(v)
            v.redo_until = max(v.redo_until, v.context_tokens)
            self._unlock_all(v)
            self.rec.retracted(v)
            self._seq += 1
            v.seq = self._seq
            self.waiting.append(v)
            short = self._blocks(RETRACT_DECODE_STEPS * len(self.running)) - t.full_free
            if short > 0 and t.full_evictable:
                t.evict(min(short, t.full_evictable), 0, Freed())
                self._sync()
        self.batch_is_full = False
        survivors = self.running
        out = sum(r.generated for r in survivors)
        self.ratio = min(1.0, (out + RETRACT_DECODE_STEPS * len(survivors)) / (
            sum(self._max_new(r) for r in survivors) + 1))
        for o in self.observers:
            o.retracted(self, gone)

    # --- disaggregation and a fleet's landings ---------------------------------------------
    def _prealloc_margin(self, req: Req, held: int, used: Any = 0, grown: Any = 0) -> Any:
        """``SGLangServer._prealloc_margin`` with the tighter pool's room."""
        bs, clip = self.bs, self.knobs.clip_max_new_tokens
        running = self.running
        retractable = sum(r.prompt_tokens + r.generated for r in running) + grown
        single = max(min(self._max_new(r), clip) + r.prompt_tokens for r in running) \
            - retractable if running else 0
        active = len(running) + len(self.receiving) + len(self.waiting) \
            + (self.chunked is not None)
        from .sglang import NUM_RESERVED_DECODE_TOKENS as reserve

        room = (self._room() - used) * bs - np.maximum(reserve * active, single)
        pages = (self._blocks(req.prompt_tokens) - held) * bs
        need = np.maximum(pages + reserve, req.prompt_tokens - held * bs
                          + min(self._max_new(req), clip) - retractable)
        return room - need

    def _prealloc_steps(self, steps: int) -> int:
        bs = self.bs
        req = self.prealloc[0][0]
        held = self.tree.gpu_prefix_blocks(req.ids)
        k = np.arange(1, steps + 1)
        opens = np.bincount([r.reserved * bs - r.own_tokens + 1 for r in self.running],
                            minlength=bs + 1)
        used = np.cumsum(opens[(k - 1) % bs + 1])
        fits = np.flatnonzero(self._prealloc_margin(req, held, used, len(self.running) * k)
                              >= 0)
        return int(k[fits[0]]) if fits.size else steps

    def _preallocate(self) -> None:
        t = self.tree
        while self.prealloc:
            req, granted = self.prealloc[0]
            if t.has_mamba and t.state_free + t.state_evictable < 3:
                return  # its own state and its hit's pinned, one for a checkpoint: wait
            freed = Freed()
            h = t.admit(req.ids, req.ids, freed)
            held = h.hit - t.fill_blocks(h)
            if self._prealloc_margin(req, held) < 0:
                t.drop(h, freed)
                self._sync()
                if self.running or self.waiting or self.receiving or self.chunked is not None:
                    return
                self.prealloc.pop(0)
                self._drop(req)
                continue
            ok = t.fill(h, freed) and t.allocate(h, int(req.ids.size) - h.hit, freed)
            self._sync()
            assert ok, f"pre-allocation of request {req.rid}: eviction fell short"
            self.receiving[req.rid] = (h, int(req.ids.size) - held)
            self.prealloc.pop(0)
            granted()

    def _land(self, h: HybridRequest, size: int) -> None:
        """KV computed elsewhere fills ``h``'s pages: inserted as a finished request's (its
        SWA KV out of the window freed), the row released. Where the insert stops at the SWA
        branching point (a computed request's insert does), the rest follows: every block
        landed, so the tree holds all of it."""
        t = self.tree
        freed = Freed()
        if size:
            t.decode_to(h, size * self.bs, freed)
            t.checkpoint(h, size, True, freed)
            if h.protected < size:
                t.checkpoint(h, size, True, freed)
        t.release(h, freed)
        self._sync()

    def land_remote(self, req: Req) -> None:
        h, _blocks = self.receiving.pop(req.rid)
        assert isinstance(h, HybridRequest)
        # The landing enters the tree up to where the admission's match ends (a token short
        # of the prompt): its window's SWA KV and its state sit there, so the decode side
        # hits all it received and recomputes none of it.
        size = min(int(req.ids.size), self._usable_blocks(req))
        self._land(h, size)
        if size:  # locked until its admission, as the transfer queue hands it over
            node = h.node
            req.landed = (node, self.tree.lock(node))
            self.remember(req.ids)
        self.submit(req)

    def cancel_remote(self, req: Req) -> None:
        h, _blocks = self.receiving.pop(req.rid)
        assert isinstance(h, HybridRequest)
        self.tree.release(h, Freed())
        self.submit(req)

    def _release_landing(self, req: Req) -> None:
        if req.landed is not None:
            node, receipt = cast(tuple[HybridNode, int | None], req.landed)
            self.tree.unlock(node, receipt)
            req.landed = None

    def insert_remote(self, ids: np.ndarray) -> bool:
        t = self.tree
        freed = Freed()
        h = t.admit(ids, ids, freed)
        ok = t.fill(h, freed) and t.allocate(h, int(ids.size) - h.hit, freed)
        if ok:
            self._land(h, int(ids.size))
            self.remember(ids)
        else:
            t.release(h, freed)
            self._sync()
        return ok

    def forget_unused(self) -> None:
        t = self.tree
        if t.full_evictable:
            t.evict(t.full_evictable, 0, Freed())
            self._sync()


__all__ = ["SGLangHybridServer", "sglang_tree"]
