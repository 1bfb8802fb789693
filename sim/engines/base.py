"""What every engine shares: submission, the policy's events, pricing of prefill batches and
decode runs, tier transfers, and the ids ever inserted (what an unlimited cache would hold:
``remember``, ``known_prefix_blocks``; stored compactly by sim/engines/known.py).

An engine (``sim.engines``) is the request protocol, the scheduler and the memory semantics
of one real server. Subclasses implement ``build`` (the engine and its cache for a run),
``_never_fits``/``_drop_reason`` and the server process ``_loop``; they call ``_reply`` when a
request finishes and ``_drop`` when one can never run. A request is read through its prompt
(``Req.prompt``, ``sim.context.prompt``): its keys, the edit its history asks, and the price
of a computed range (only the keys its tokens attend), whatever the context strategy.

Determinism: time comes only from the cost model; ties in queues break on a submission
sequence number; SimPy breaks event ties by schedule order. No wall clock is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Final, cast

import numpy as np
import simpy
from mypy_extensions import mypyc_attr

from costmodel.gpus import kv_bytes_through
from costmodel.profile import Profile
from costmodel.specs import ModelSpec
from costmodel.units import Units
from policies import Arrival, Drop, EvictionPolicy, Reply
from sim.config import RunConfig
from sim.context import apply_edit
from sim.context.prompt import FullPrompt
from sim.context.view import RequestView
from sim.engines.recorder import RequestRecord, RunRecorder
from sim.kvcache.results import EvictResult

from .clock import Clock
from .known import KnownBlocks
from .request import Req

_new_units: Final = tuple.__new__  # a Units from its three fields, without the Python-level __new__


def steps_fitting(starts: list[int], bs: int, room: int, cap: int) -> int:
    """Largest k <= cap such that k more tokens of every request need at most ``room`` new
    blocks, where request i needs one at steps t_i, t_i + bs, ... (``starts``: the t_i,
    each in [1, bs]): the (room+1)-th smallest of those steps is the first that does not
    fit. A decode run of either engine is cut here."""
    starts = sorted(starts)
    if starts[0] < 1 or starts[-1] > bs:  # a request's next block is more than bs away
        raise AssertionError(f"decode block steps out of [1, {bs}]: {starts}")
    q, i = divmod(room, len(starts))
    return max(0, min(cap, starts[i] + q * bs - 1))


@mypyc_attr(allow_interpreted_subclasses=True)
class StepObserver:
    """Told what each step of a server did: for tests and tools that follow an engine step by
    step through ``EngineBase.watch`` (``sim.run.run(..., steps=...)``); a run needs none.
    Subclass it and override what you follow; it observes and changes nothing. ``batch`` is
    ``[(request, token ranges it computes), ...]`` in schedule order."""

    def scheduled(self, engine: EngineBase, batch: list) -> None:
        """A batch (SGLang: a prefill batch; vLLM: a step) is about to run."""

    def completed(self, engine: EngineBase, batch: list) -> None:
        """It ran: tokens sampled, prefixes cached, finished requests replied."""

    def retracted(self, engine: EngineBase, victims: list[Req]) -> None:
        """Running requests went back to the waiting queue to free memory (SGLang's
        retraction, vLLM's preemption by recompute), with what their release freed."""

    def decoded(self, engine: EngineBase, steps: int) -> None:
        """A run of ``steps`` decode steps of the running batch was applied."""


@mypyc_attr(allow_interpreted_subclasses=True)
class EngineBase:
    """Shared state and helpers of the simulated servers."""

    # Presets ``kvsim run`` compares when no policy is given (the first is the baseline).
    default_presets: ClassVar[tuple[str, ...]] = ("sglang", "vllm", "penelope")
    # The record a request has on this engine (the replay builds it: sim/replay.py).
    request_class: ClassVar[type[Req]] = Req
    # KV computed elsewhere can land in this engine's cache: a disaggregated fleet's decode
    # worker (sim/fleet/pd.py) pre-allocates it (``reserve_remote``, then ``land_remote`` or
    # ``cancel_remote``); ``prealloc_before_prefill``: it does so before the prefill starts.
    lands_remote_kv: ClassVar[bool] = False
    prealloc_before_prefill: ClassVar[bool] = False

    @classmethod
    def summary_fields(cls, cfg: RunConfig) -> dict[str, Any]:
        """This engine's own options, reported in every run summary beside the metrics."""
        return {}

    @classmethod
    def unsupported(cls, cfg: RunConfig, policy: EvictionPolicy) -> tuple[str, str] | None:
        """(field, why) when this engine cannot run ``cfg`` with ``policy``; None if it can."""
        return None

    @classmethod
    def check(cls, cfg: RunConfig) -> tuple[str, str] | None:
        """(field, why) when this engine cannot run ``cfg`` (its policy included); None if it
        can. The run's check (sim/run/check.py) turns the answer into a ConfigError (exit
        status 2)."""
        return cls.unsupported(cfg, cfg.make_policy())

    @classmethod
    def build(cls, env: simpy.Environment, cfg: RunConfig, spec: ModelSpec, profile: Profile,
              policy: EvictionPolicy, recorder: RunRecorder) -> EngineBase:
        """The engine for one run, with its cache (``sim.run.build`` calls it by name from
        ``sim.engines.ENGINES``)."""
        raise NotImplementedError

    def __init__(self, env: simpy.Environment, cfg: RunConfig, spec: ModelSpec,
                 profile: Profile, cache, policy: EvictionPolicy,
                 recorder: RunRecorder) -> None:
        self.env, self.cfg, self.spec, self.profile = env, cfg, spec, profile
        self.cache, self.rec, self.policy = cache, recorder, policy
        self.bs = cfg.cache.block_size
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self._wake: simpy.Event = env.event()  # the doorbell: ``_ring`` / ``_doorbell``
        # A sim/engines/clock.py clock lets a pass end without an event when nothing else is due
        # (``_advance``); on a plain SimPy environment every pass is a timeout.
        self._clock: Clock | None = env if isinstance(env, Clock) else None
        self._seq = 0
        # each rank's share over its GPU's PCIe link (the profile's bandwidth is its GPUs')
        self.kv_bytes = kv_bytes_through(spec, cfg.cache.replica_tp(profile.gpus),
                                         profile.gpus)
        self.tiered = cfg.cache.cpu_cache > 0
        # Copies to the host are charged to the waiting batch when they sit on its critical
        # path (unified demotions, HiCache write-back); HiCache write-through backs up in the
        # background, so its copies are counted but not waited for.
        self.charge_d2h = (cfg.cache.tiering == "unified"
                           or cfg.cache.hicache_write_policy == "write_back")
        self._pending_h2d_bytes = 0
        self._rerotate_s = 0.0  # re-rotation passes (repos, splice) the next batch waits for
        self._ever = KnownBlocks()  # every block id ever inserted: what an infinite cache holds
        self._tell_arrival = "arrival" in policy.events
        self._tell_reply = "reply" in policy.events
        self._tell_drop = "drop" in policy.events
        self.observers: tuple[StepObserver, ...] = ()

    def watch(self, observer: StepObserver) -> None:
        """Tell ``observer`` what each step does from now on."""
        self.observers = (*self.observers, observer)

    def start(self) -> simpy.Process:
        """Start the server process."""
        return self.env.process(self._loop())

    def _loop(self):
        raise NotImplementedError

    def busy(self) -> bool:
        """Requests still in the server (waiting, running or mid-prefill)."""
        return bool(self.waiting or self.running)

    def capacity_run_blocks(self) -> int:
        """The cache's size in the run's blocks (``--block-size``): what a router's index
        of this replica holds (sim/fleet/fleet.py)."""
        return self.cache.capacity_blocks

    def _never_fits(self, req: Req) -> bool:
        raise NotImplementedError

    def _advance(self, seconds: float) -> bool:
        """Let ``seconds`` pass at once when nothing else is due before then (``Clock.advance``:
        the same run as ``yield env.timeout(seconds)``); False: the caller yields the
        timeout. Only the server process calls it: it waits on nothing but its own events."""
        clock = self._clock
        return clock is not None and clock.advance(seconds)

    def _sleep(self) -> simpy.Event:
        """The event the server process waits on until the next arrival, when it has nothing
        to run. Debug runs (``debug_cache``) check the invariant that makes the wait safe:
        the server holds no request (none waiting, running or mid-prefill). With nothing
        running no memory is freed, so a waiting request either fits now (it must be
        admitted) or never (it must be dropped); one left waiting would wait for an
        unrelated arrival, or forever."""
        if self.cfg.debug_cache and self.busy():
            raise AssertionError(
                f"{type(self).__name__} idles at t={self.env.now} with "
                f"{len(self.waiting)} waiting (first: request "
                f"{self.waiting[0].rid if self.waiting else None}) and "
                f"{len(self.running)} running")
        return self._doorbell()

    # --- the doorbell: how anything outside the server process wakes it -----------------
    # One event at a time: the server waits on it (alone, or beside a timeout it may cut
    # short); an arrival, a landing or a pre-allocation request rings it. Ringing a bell
    # already rung (nobody listened yet) does nothing: the server looks at all its queues
    # when it wakes.
    def _doorbell(self) -> simpy.Event:
        """A fresh wake-up event for the server process to wait on."""
        self._wake = self.env.event()
        return self._wake

    def _ring(self) -> None:
        """Wake the server process if it waits on the doorbell (something for it arrived)."""
        if not self._wake.triggered:
            self._wake.succeed()

    def _evicted(self, res: EvictResult) -> None:
        """Tell the recorder what a call that made room did (its numbers: the recorder does
        not read the cache's results)."""
        self.rec.evicted(res.freed_blocks, res.deleted_blocks, res.demoted_blocks,
                         res.holes_made)

    def _drop_reason(self, req: Req) -> str:
        """Why a request that can never fit is dropped (recorded with the drop)."""
        return "context" if req.position_tokens > self.spec.max_context else "cache"

    # --- submission and events ----------------------------------------------------------
    def submit(self, req: Req) -> None:
        self._seq += 1
        req.seq = self._seq
        if not req.prompt.edit_on_finish:  # a splice edits the cached path on arrival
            self._context_edit(req)
        if self._tell_arrival:
            self.policy.on_arrival(Arrival(self.env.now, req.session, req.rid,
                                           req.prompt_tokens, req.ids, req.prompt.regions))
        if self._never_fits(req):
            self._drop(req)
            return
        self.waiting.append(req)
        self._ring()

    def _reply(self, req: Req, leaf) -> None:
        """Tell the policy a request finished (``leaf``: its history's handle, or None)."""
        if self._tell_reply:
            gap_s = math.nan
            if self.policy.clairvoyant:  # the future of the replay actually running
                gap_s = (req.next_gap_s if math.isnan(req.next_send_s)
                         else req.next_send_s - self.env.now)
            # the queue wait of its first admission (learning policies: Continuum's T_q)
            queue_s = req.record.queue_wait_s if req.record is not None else math.nan
            self.policy.on_reply(Reply(self.env.now, req.session, req.rid, req.context_tokens,
                                       leaf, req.next_gap, gap_s, queue_s))

    def _drop(self, req: Req) -> None:
        """Refuse ``req`` for good (it can never fit): record it, tell the policy, and let
        its client go on."""
        reason = self._drop_reason(req)
        self.rec.drop(req, self.env.now, reason)
        if self._tell_drop:
            self.policy.on_drop(Drop(self.env.now, req.session, req.rid, reason))
        req.done.succeed()

    # --- helpers ------------------------------------------------------------------------
    def _final_ids(self, req: Req) -> np.ndarray:
        """What a finished request inserts: its prompt and output blocks."""
        return req.prompt.finish

    def _context_edit(self, req: Req) -> bool:
        """Apply the edit a context strategy asks of the request's cached path (sim.context:
        a splice on arrival, a drop when the request finishes, before its finish insert).
        False when the cached path could not all take its new keys (another running request
        holds it): the finish then inserts nothing more (the history misses there next time
        and computes again)."""
        if req.prompt.edit is None:
            return True
        # a prompt with an edit is a context strategy's view (sim/context/view.py)
        seconds, complete = apply_edit(self.cache, cast(RequestView, req.prompt), self.spec,
                                       self.profile, self.rec.counters, req.hint)
        self._rerotate_s += seconds
        return complete

    def _blocks(self, tokens: float) -> int:
        return -(-math.ceil(tokens) // self.bs)

    def remember(self, ids: np.ndarray) -> None:
        """``ids`` were inserted into this server's cache: an unlimited cache holds them from
        now on (``known_prefix_blocks``)."""
        self._ever.add(ids)

    def known_prefix_blocks(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` ever inserted into this server's cache: what an
        unlimited cache of this server would hold now (chained ids make the inserted ids
        prefix-closed: a binary search on membership). Read only."""
        return self._ever.known_prefix(ids)

    def knows_block(self, block_id: int) -> bool:
        """Whether block ``block_id`` was ever inserted into this server's cache. Read only."""
        return self._ever.has(block_id)

    def ever_blocks(self) -> np.ndarray:
        """Every block id ever inserted into this server's cache, sorted (int64)."""
        return self._ever.to_array()

    def _ideal_blocks(self, req: Req) -> int:
        """Longest prefix of ``req``'s blocks ever inserted (``known_prefix_blocks``); under a
        context strategy, at least the prefix the history cached before (an unlimited cache
        applies the same edits: ``Prompt.ideal_blocks``, zero for a plain prompt)."""
        return max(self.known_prefix_blocks(req.ids), req.prompt.ideal_blocks)

    @staticmethod
    def _split_ranges(ranges: list[tuple[int, int]], budget: int) -> tuple[list, list]:
        """Split ``ranges`` into the first ``budget`` tokens and the rest."""
        taken, rest = [], []
        for a, b in ranges:
            if budget <= 0:
                rest.append((a, b))
            elif b - a <= budget:
                taken.append((a, b))
                budget -= b - a
            else:
                taken.append((a, a + budget))
                rest.append((a + budget, b))
                budget = 0
        return taken, rest

    # --- pricing ------------------------------------------------------------------------
    def open_record(self, req: Req, now: float, *, reused: int, holes: int, ideal: int,
                    segments: Any, loaded: int = 0, found: Any = None) -> RequestRecord:
        """Open ``req``'s record at its first admission. ``segments``: the match after any
        CPU load; ``found``: the match before it (default: no load, the same). The positions
        inside the ideal prefix it computes again are priced as the prefill prices them: with
        the keys each token attends (a dropped key is not attended)."""
        prompt = req.prompt
        recomputed = prompt.recomputed_ranges(segments, req.ranges, ideal, self.bs)
        units = Units()
        for a, b in recomputed:
            units = units + prompt.units(self.spec, a, b)
        return self.rec.open(req, now, reused=reused, holes=holes, ideal=ideal,
                             recomputed=recomputed, recompute_units=units.total,
                             segments=segments, bs=self.bs, loaded=loaded, found=found)

    def _count_redone(self, req: Req, a: int, b: int) -> None:
        """Record the part of prefill range [a, b) below ``req.redo_until``: positions the
        request had computed before a preemption or retraction lost them."""
        end = min(b, req.redo_until)
        if end > a:
            self.rec.redone(req, end - a, req.prompt.units(self.spec, a, end).total)

    def _prefill_seconds(self, batch: Sequence[tuple[Req, list[tuple[int, int]]]]
                         ) -> tuple[float, list[Units]]:
        """Seconds of a prefill batch of (request, ranges) and each request's units. Units are
        summed as numbers, in the order ``Units.__add__`` would add them (the same floats),
        with one ``Units`` per request: a batch is priced at every prefill chunk."""
        per_req = []
        spec = self.spec
        linear, attention, tokens = 0.0, 0, 0
        for req, ranges in batch:
            lin, att, tok = 0.0, 0, 0
            prompt = req.prompt
            # The trace's own prompt (every request under ``full``) is priced through its
            # class's method directly, not the protocol's generic call.
            full: FullPrompt | None = prompt if isinstance(prompt, FullPrompt) else None
            redo = req.redo_until
            for a, b in ranges:
                l_, a_, t_ = full.units(spec, a, b) if full is not None \
                    else prompt.units(spec, a, b)
                lin += l_
                att += a_
                tok += t_
                if redo > a:  # _count_redone, without the call when nothing is redone
                    self._count_redone(req, a, b)
            per_req.append(_new_units(Units, (lin, att, tok)))
            linear += lin
            attention += att
            tokens += tok
        seconds = self.profile.prefill_seconds(_new_units(Units, (linear, attention, tokens)))
        if self._rerotate_s:  # repos / splice: the re-rotation pass runs before this batch
            seconds += self._rerotate_s
            self._rerotate_s = 0.0
        return seconds, per_req

    def _timed_decode(self, batch: int, ctx: int, steps: int, interruptible: bool):
        """Wait out ``steps`` decode steps of a ``batch`` reading ``ctx`` KV tokens per step, as
        one event. When ``interruptible``, an arrival (the doorbell) cuts the run after the
        step in flight. A sub-process: ``steps = yield from self._timed_decode(...)`` gives
        the steps taken."""
        env = self.env
        total = self.profile.decode_run_seconds(batch, ctx, steps)
        # With nothing due before the run ends, no arrival can ring the doorbell during it.
        if self._advance(total):
            return steps
        if not interruptible:
            yield env.timeout(total)
            return steps
        start = env.now
        # ``env.timeout(total) | self._doorbell()`` without the condition's bookkeeping: one
        # event the first of the two triggers when it is processed, as the condition would
        woken = env.event()
        wake = _first_of(woken)
        env.timeout(total).callbacks.append(wake)
        self._doorbell().callbacks.append(wake)
        yield woken
        elapsed = env.now - start
        if elapsed < total:  # an arrival: finish the step in flight, then reschedule
            steps = self.profile.decode_steps_within(batch, ctx, elapsed, steps)
            rest = self.profile.decode_run_seconds(batch, ctx, steps) - elapsed
            if rest > 0:
                yield env.timeout(rest)
        return steps

    def _record_tokens(self, start: float, batch: int, ctx: int, steps: int) -> None:
        """Tell the recorder the tokens of a decode run of ``steps`` that began at ``start``
        (every running request got one per step; step times in closed form)."""
        first, inc = self.profile.decode_step_series(batch, ctx)
        self.rec.tokens(self.running, steps, start + first, self.env.now, first + inc, inc)

    def _transfer_seconds(self) -> float:
        """PCIe time the next batch waits for: pending loads (h2d) and, where they are on the
        critical path, copies to the host (d2h). Counts every byte moved either way."""
        if not self.tiered:
            return 0.0
        h2d, self._pending_h2d_bytes = self._pending_h2d_bytes, 0
        self._evicted(self.cache.background_evictions())
        d2h = self.cache.backup_pending() * self.bs * self.kv_bytes
        self.rec.transferred(h2d, d2h)
        seconds = self.profile.transfer_seconds(h2d, "h2d")
        if self.charge_d2h:
            seconds += self.profile.transfer_seconds(d2h, "d2h")
        return seconds

    def close(self) -> None:
        """At the end of a run: record what the cache did after the last event (deletions
        and d2h copies made by the final inserts), so every block and byte is counted."""
        if self.tiered:
            self._evicted(self.cache.background_evictions())
            h2d, self._pending_h2d_bytes = self._pending_h2d_bytes, 0
            self.rec.transferred(h2d, self.cache.backup_pending() * self.bs * self.kv_bytes)


def _first_of(woken: simpy.Event) -> Callable[[simpy.Event], None]:
    """A callback for several events that triggers ``woken`` when the first of them is
    processed (``simpy.AnyOf`` of events that never fail, without its value)."""
    def wake(_event: simpy.Event) -> None:
        if not woken.triggered:
            woken.succeed()
    return wake
