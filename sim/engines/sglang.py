"""The SGLang engine: SGLang's scheduler over a radix KV cache.

Data flow of one run::

    sessions (closed loop: reply + recorded gap)  --submit-->  waiting queue
    server loop:  [prefill pass]  scheduler orders waiting -> match (hit / hole / miss)
                                  -> admission test (free + evictable - reservations)
                                  -> make_room (eviction policy) -> one batch of chunks
                                     (real new tokens + phantom hole refills) priced once
                  [else decode]   all running requests advance k steps in ONE event, k = steps
                                  to the first finish, cut short by an arrival (the step in
                                  flight completes), by memory (evict, else retract)

Semantics follow reference/sglang-scheduler.md: prefill pre-empts decode; one chunked request at
a time, continued before the queue; the whole prompt plus a decode reservation must fit before
admission; the first refused request stops the pass (head-of-line); retraction victims are the
requests with the fewest generated tokens (ties: longest prompt) and go to the queue's tail.

Simplifications (documented in docs/engine.md): a scheduling pass runs at each event rather
than at every decode step; the memory of a decode run is taken for exactly the tokens it
generated, and the d2h copies that made room for it delay its completion; the overlap
scheduler's one-iteration delay in freeing KV is not modelled.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from costmodel.profile import Profile
from costmodel.specs import ModelSpec
from costmodel.units import Units
from policies.scheduling import SchedulePolicy
from sim.config import RunConfig
from sim.context import plan_ranges
from sim.kvcache import RadixKVCache, Tier
from sim.metrics import RunRecorder

from .base import EngineBase
from .request import Req
from .sglang_decode import DecodeRuns
from .sglang_queue import WaitingOrder

# Verdicts of a refused admission (schedule_policy.py AddReqResult): memory (NO_TOKEN) or a
# spent pass budget (OTHER). Only NO_TOKEN sets batch_is_full.
NO_TOKEN, OTHER = "no_token", "other"


class SGLangServer(DecodeRuns, EngineBase):
    """SGLang's scheduler and memory semantics over one ``RadixKVCache``."""

    def __init__(self, env: simpy.Environment, cfg: RunConfig, spec: ModelSpec,
                 profile: Profile, cache: RadixKVCache, scheduler: SchedulePolicy,
                 recorder: RunRecorder, finish_ids: Callable[[int], np.ndarray],
                 block_regions: Callable[[int], np.ndarray] | None = None) -> None:
        super().__init__(env, cfg, spec, profile, cache, cache.policy, recorder, finish_ids,
                         block_regions)
        self.scheduler = scheduler
        self.chunked: Req | None = None
        self.ratio = cfg.new_token_ratio
        self._decay = (cfg.new_token_ratio - cfg.new_token_ratio_min) / max(
            1, cfg.new_token_ratio_decay_steps)
        self.max_running = cfg.max_running or 1 << 30
        self._new_limit = min(spec.max_context - 1, cache.capacity_blocks * self.bs - 1)
        # SGLang's running_batch.batch_is_full: set when an admission is refused for memory
        # while requests run; no admission is tried again until the running batch shrinks.
        self.batch_is_full = False
        self.queue = WaitingOrder(scheduler, cache, self.bs, self._usable_blocks)
        self.process = self.start()

    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.chunked is not None)

    def _never_fits(self, req: Req) -> bool:
        need = self._blocks(req.kv_tokens) + self._blocks(self._decode_reserve(req)) + 1
        return need >= self.cache.capacity_blocks

    # --- helpers ------------------------------------------------------------------------

    def _max_new(self, req: Req) -> int:
        if self.cfg.max_new_tokens is not None:
            return self.cfg.max_new_tokens
        # Unset by the client: SGLang assumes everything up to the context / KV limit
        # (``_new_limit``: constant over a run, computed once).
        return max(1, self._new_limit - req.position_tokens - 1)

    def _decode_reserve(self, req: Req) -> int:
        return min(max(0, self._max_new(req) - req.generated), self.cfg.clip_max_new_tokens)

    def _running_offset_tokens(self) -> float:
        # Every pass reads it: one loop, no call per running request (= the sum of
        # _decode_reserve over the running batch).
        clip = self.cfg.clip_max_new_tokens
        fixed = self.cfg.max_new_tokens
        limit = self._new_limit
        total = 0
        for r in self.running:
            new = fixed if fixed is not None else max(1, limit - r.position_tokens - 1)
            total += min(max(0, new - r.generated), clip)
        return total * self.ratio

    def _usable_blocks(self, req: Req) -> int:
        # At least one token is always computed (SGLang caps the hit at len - 1).
        return (req.context_tokens - 1) // self.bs

    def _plan(self, req: Req, segments) -> tuple[list[tuple[int, int]], int, int, int]:
        """Token ranges to compute for ``req`` given match segments: holes (phantom) and the
        tail from the end of the usable match. CPU-resident segments are loaded, not computed.
        Returns (ranges, reused_tokens, hole_tokens, cpu_tokens)."""
        if req.view is not None:  # a context strategy: dropped blocks are skipped or restored
            return plan_ranges(req.view, segments, self._usable_blocks(req),
                               req.context_tokens, self.bs)
        usable = min(req.ids.size, self._usable_blocks(req))
        ranges: list[tuple[int, int]] = []
        reused = holes = cpu = 0
        end = 0
        for s, e, tier in segments:
            if s >= usable:
                break
            e = min(e, usable)
            if tier == Tier.GPU:
                reused += (e - s) * self.bs
            elif tier == Tier.CPU:
                cpu += (e - s) * self.bs
            else:
                holes += (e - s) * self.bs
                ranges.append((s * self.bs, e * self.bs))
            end = e
        ranges.append((end * self.bs, req.context_tokens))
        merged: list[tuple[int, int]] = []
        for a, b in ranges:
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            elif b > a:
                merged.append((a, b))
        return merged, reused, holes, cpu

    def _reserve_tokens(self, req: Req, tokens: int) -> bool:
        """Hold ``tokens`` more outside the tree; evict through the policy if needed."""
        need = self._blocks(req.own_tokens + tokens) - req.reserved
        if need > 0:
            if self.cache.free_blocks < need:
                res = self.cache.make_room(need)
                self.rec.evicted(res)
                if not res.ok:
                    return False
            self.cache.reserve(need)
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
        self.cache.release(req.reserved)
        ins = self.cache.insert(ids, hint=req.hint)
        if ids.size > req.known_blocks:
            self.ever.update(ids[req.known_blocks:].tolist())
            req.known_blocks = ids.size
        if final_ids is None:
            # A chunk checkpoint must keep the match's lock too: the kept segment behind a
            # hole lies below the inserted prefix until the last chunk reaches it.
            self.cache.lock(ins.node)
            if ids.size == req.ids.size:  # the whole prompt is in: its leaf covers the path
                self._unlock_all(req)
            req.locks.append(ins.node)
        req.own_tokens = 0 if final_ids is not None else max(0, computed_to - ids.size * self.bs)
        req.reserved = self._blocks(req.own_tokens)
        if req.reserved:
            self.cache.reserve(req.reserved)
        return ins.node

    def _unlock_all(self, req: Req) -> None:
        for node in req.locks:
            self.cache.unlock(node)
        req.locks = []

    # --- scheduling ---------------------------------------------------------------------
    def _headroom(self) -> float:
        """SGLang's remaining_total: free + evictable tokens minus the decode reservations
        of running requests and what this pass admitted so far."""
        return ((self.cache.free_blocks + self.cache.evictable_blocks) * self.bs
                - self._running_offset_tokens() - self._pass_offset)

    def _admit(self, req: Req, budget: int) -> tuple[int, bool] | str:
        """Try to admit ``req`` with ``budget`` prefill tokens left in this pass.
        Returns (tokens taken, became chunked), or the verdict of a refusal (head-of-line):
        NO_TOKEN (memory) or OTHER (no budget for even one page)."""
        m = self.cache.match(req.ids, touch=True, hint=req.hint)
        ranges, reused, holes, cpu = self._plan(req, m.segments)
        extend = sum(b - a for a, b in ranges)
        self.cache.lock(m.node)
        need = extend + cpu + self._decode_reserve(req) + self.bs
        if need >= self._headroom():
            self.cache.unlock(m.node)
            return NO_TOKEN
        loaded = 0
        segments = m.segments
        if cpu:  # bring the CPU-resident part of the prefix to the GPU before the prefill
            ld = self.cache.load(m.node, min(req.ids.size, self._usable_blocks(req)))
            if not ld.ok:
                self.cache.unlock(m.node)
                return NO_TOKEN
            loaded = ld.loaded_blocks * self.bs
            self.rec.loaded(ld, self.bs)
            self._pending_h2d_bytes += loaded * self.kv_bytes
            # What the load did not bring back (HiCache's threshold) is computed instead.
            segments = self.cache.match(req.ids, touch=False, hint=req.hint).segments
            ranges, _, holes, _ = self._plan(req, segments)
            extend = sum(b - a for a, b in ranges)
        chunked = extend > budget
        take = (budget // self.bs) * self.bs if chunked else extend
        if take <= 0:
            self.cache.unlock(m.node)
            return OTHER
        req.locks = [m.node]
        req.ranges = ranges
        first_admission = req.record is None
        if first_admission:
            req.known_blocks = self._ideal_blocks(req.ids, req.view)
            ideal = min(req.known_blocks, self._usable_blocks(req)) * self.bs
            req.record = self.rec.open(req, self.env.now, reused=reused, holes=holes,
                                       ideal=ideal, spec=self.spec, segments=segments,
                                       bs=self.bs, loaded=loaded)
        req.admitted_at = self.env.now
        self._pass_offset += self.bs + (0 if chunked else self._decode_reserve(req))
        return take, chunked

    def _run_chunk(self, req: Req, take: int) -> list[tuple[int, int]] | None:
        taken, rest = self._take(req.ranges, take)
        if not self._reserve_tokens(req, sum(b - a for a, b in taken)):
            return None
        req.ranges = rest
        return taken

    def _schedule(self) -> list[tuple[Req, list[tuple[int, int]]]]:
        """One prefill pass (SGLang get_new_batch_prefill): the batch of (request, token
        ranges) to compute now. While ``batch_is_full`` only a chunk in flight continues."""
        batch: list[tuple[Req, list[tuple[int, int]]]] = []
        if not self.running:
            self.batch_is_full = False  # an empty batch has no request left to clear it
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return batch
        self._pass_offset = 0.0
        budget = self.cfg.chunk_size
        # calc_priority runs before the chunk continues: lpm matches (and stamps) every
        # waiting request in each pass, chunk passes included.
        if self.waiting:
            self.waiting = self.queue.order(self.waiting)
        order = list(self.waiting)
        if self.chunked is not None:
            # add_chunked_req: the chunk is the budget cut to the headroom (when positive),
            # re-evaluated each pass, so it shrinks when memory is short; the final chunk
            # reserves the request's decode tokens for the candidates after it.
            req = self.chunked
            room = int(self._headroom())
            limit = min(budget, room) if room > 0 else budget
            ranges = self._run_chunk(req, min(limit, sum(b - a for a, b in req.ranges)))
            if ranges is None:
                return batch  # no memory even for the chunk: decode must free some first
            batch.append((req, ranges))
            budget -= sum(b - a for a, b in ranges)
            self._pass_offset += self.bs + (0 if req.ranges else self._decode_reserve(req))
            if req.ranges:
                return batch  # still chunked: it owns this pass
            self.chunked = None
        if budget <= 0 or not self.waiting:
            return batch
        admitted: set[int] = set()
        for req in order:
            if len(self.running) + len(batch) >= self.max_running:
                self.batch_is_full = True
            if self.batch_is_full:
                break
            got = self._admit(req, budget)
            if got == OTHER:
                break
            if got == NO_TOKEN:
                self.batch_is_full = bool(batch or self.running)
                if not self.running and not batch and self.chunked is None:
                    # Nothing holds memory but this request: it can never fit. Count a drop.
                    self.waiting.remove(req)
                    self.rec.drop(req, self.env.now, self._drop_reason(req))
                    req.done.succeed()
                break
            take, chunked = got
            ranges = self._run_chunk(req, take)
            if ranges is None:  # eviction could not cover it after all: a memory refusal
                self._unlock_all(req)
                self.batch_is_full = bool(batch or self.running)
                break
            admitted.add(id(req))
            batch.append((req, ranges))
            budget -= take
            if chunked:
                self.chunked = req
            # The verdict for the next candidate: memory first (NO_TOKEN), then budget.
            if self._headroom() <= 0:
                self.batch_is_full = True
                break
            if chunked or budget <= 0:
                break
        if admitted:
            self.waiting = [r for r in self.waiting if id(r) not in admitted]
        return batch

    # --- execution ----------------------------------------------------------------------

    def _finish_prefill(self, batch, per_req: list[Units]) -> None:
        now = self.env.now
        for (req, _ranges), units in zip(batch, per_req, strict=True):
            self.rec.prefill_units(req, units)
            if req.ranges:  # chunk of an unfinished prompt: checkpoint what is contiguous
                # SGLang leaves the chunked request out of the batch it merges into the
                # running batch: the batch shrank, which clears batch_is_full.
                self.batch_is_full = False
                if self.cfg.checkpoint_chunks:
                    done_to = req.ranges[0][0]
                    self._checkpoint(req, min(done_to // self.bs, req.ids.size), done_to)
                continue
            self._checkpoint(req, req.ids.size, req.context_tokens)
            if req.generated == 0:
                req.generated = 1
                req.first_token_at = now
                self.rec.first_token(req, now)
            if req.generated >= req.output_tokens:
                self._finish(req)
            else:
                self.running.append(req)

    def _finish(self, req: Req) -> None:
        self.batch_is_full = False  # the running batch shrank (a finish or an abort)
        final = self._final_ids(req) if req.generated >= req.output_tokens else req.ids
        if req.view is not None and req.view.edit_on_finish and final is not req.ids:
            self._unlock_all(req)  # its own locks would block the edit of its path
            if not self._context_edit(req):  # a drop takes effect after the prompt
                final = final[:0]  # its path did not all take the new keys: keep it as is
        leaf = None
        if final.size:
            leaf = self._checkpoint(req, 0, final_ids=final)
        else:
            self.cache.release(req.reserved)
            req.reserved = req.own_tokens = 0
        self._unlock_all(req)
        self.rec.close(req, self.env.now)
        self._reply(req, leaf)
        req.done.succeed()

    def _loop(self):
        env = self.env
        while True:
            if not self.waiting and not self.running and self.chunked is None:
                self.ratio = self.cfg.new_token_ratio  # fully idle: SGLang resets the ratio
                self._wake = env.event()
                yield self._wake
                continue
            batch = self._schedule()
            if batch:
                seconds, per_req = self._prefill_seconds(batch)
                if self.tiered:  # (without a CPU tier nothing is ever pending)
                    seconds += self._transfer_seconds()
                self.rec.batch(seconds, len(batch))
                yield env.timeout(seconds)
                self._finish_prefill(batch, per_req)
                continue
            if not self.running:
                # Waiting requests that cannot be admitted and nothing to decode: wait.
                self._wake = env.event()
                yield self._wake
                continue
            steps = self._decode_plan()
            retracted = steps == 0
            if retracted:
                self._retract()
                steps = self._decode_plan()
                if steps == 0:  # a lone request that cannot grow: abort it (SGLang aborts)
                    victim = self.running.pop()
                    self.rec.aborted(victim)
                    self._finish(victim)
                    continue
            batch_size = len(self.running)
            ctx = sum(r.kv_read_tokens for r in self.running)
            pause = self._transfer_seconds()  # copies pending from before the run
            if pause:
                yield env.timeout(pause)
            # With batch_is_full an arrival cannot be admitted before a finish: no cut.
            steps = yield from self._timed_decode(batch_size, ctx, steps,
                                                  not self.batch_is_full)
            self.rec.decode(self.profile.decode_run_seconds(batch_size, ctx, steps), steps)
            # Memory for exactly the tokens generated; the copies that made room for them
            # (demotions to the CPU tier) happened during the run: its tokens complete after
            # them, and the next batch does not pay for them again.
            self._reserve_decode(steps)
            pause = self._transfer_seconds()
            if pause:
                yield env.timeout(pause)
            self._apply_decode(steps, retracted)


