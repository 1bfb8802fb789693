"""A disaggregated fleet: a prefill pool and a decode pool of the run's engine, the links
between them, and the PD rule that pairs them (docs/pd.md). To the replay it looks like one
server (``submit``, ``busy``, ``close``, ``rec``), like ``Fleet``::

    request --> PD rule (policies/pd_rules.py) picks the decode worker d, and whether the
       |        request is prefilled on d (local: conditional disaggregation)
       |-- local --> decode worker d: prefill + decode as an aggregated server
       +-- remote -> [sglang] d pre-allocates the prompt's KV (``reserve_remote``) before
                     the prefill starts
                  -> prefill pool (a ``Fleet`` over P engines behind --router): a prefill-only
                     copy of the request (``PrefillOnlyPrompt``: one token sampled, the prompt
                     inserted into that worker's cache under its eviction policy), then
                  -> [vllm] d allocates the prompt's blocks (``reserve_remote``) once the
                     prefill has ended
                  -> link (FIFO): prompt tokens x KV bytes per token, whole prompt (cached
                     prefix included, as real systems ship it), and a linear-attention
                     (Gated DeltaNet) model's state at the prompt's end once: its bytes, not
                     per token (``costmodel.gpus.group_bytes`` as the engine stores it)
                  -> decode worker d: the prompt lands in the room it pre-allocated
                     (``land_remote``) and the request joins d's queue holding it: its first
                     forward computes what is left (SGLang: the last, partial block; vLLM:
                     the last token) and samples the first token; then it decodes, and under
                     memory pressure is retracted (SGLang) or preempted (vLLM) as its engine
                     does (the redone prefill is counted as ``preempted_recompute_tokens``)

Pre-allocation (``--pd-prealloc on``, the default) is what the engines do, each its own way,
behind one seam (``reserve_remote(req, granted)``, then ``land_remote`` or ``cancel_remote``):
SGLang's decode worker holds the request in its prealloc queue (DecodePreallocQueue, FIFO)
until free + evictable memory, less what active requests keep for decoding, covers the
prompt, and its prefill worker waits for that (allocation policy ``early``); vLLM's decode
scheduler allocates the blocks when FCFS reaches the request (``allocate_slots`` with
external tokens, caching delayed) and parks it in WAITING_FOR_REMOTE_KVS. The transfer starts
only once the room exists, so nothing that lands is evicted before its admission
(``landed_lost_tokens`` is 0); the wait is ``prealloc_wait_s``. ``off`` (sglang only): the
blocks land unreserved after the transfer (``SGLangServer.insert_remote``), as a pool fetch's,
and a decode worker short of memory may evict them first (``landed_lost_tokens``).

TTFT = the pre-allocation wait + prefill (queue + compute on the prefill worker) + transfer
(queue on the link + time) + the first forward on the decode worker (queue + at most one
block computed); each part is a column of the request table (``PDRecord``).

Links (``costmodel/links.py``): one FIFO queue per prefill worker's NIC (``--pd-link-scope
nic``, as Mooncake's transfer engine and Dynamo's NIXL ship from each GPU's NIC) or per
(prefill, decode) pair (``pair``). A transfer occupies its queue for bytes / bandwidth (with
TP t, a rank's share of the bytes: each rank ships its KV heads over its own NIC) and
arrives latency later; it overlaps the prefill worker's next work. ``--pd-streaming layer``:
the transfer may start when the prefill starts (layer by layer) and ends no earlier than the
prefill's end plus one layer's share, nor than its start plus bytes / bandwidth. The queue is
booked when the prefill ends (transfers take the link in the order their prefills end).

``--decode-cache off``: a decode worker frees what a finished request leaves
(``forget_unused``); ``on`` (default) keeps it in its cache under its eviction policy, so a
later turn may hit there (local prefill, or the decode worker's own hit on the landed
prompt). ``--pd-return output`` (sglang only): a remote request's output KV (its full blocks
past the prompt) goes back to the prefill worker that served the turn over the link (the
reverse direction, its own FIFO) and lands there when the prompt is still cached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import simpy

from costmodel.gpus import group_bytes, shipped_kv_bytes
from costmodel.links import Link
from costmodel.specs import ModelSpec
from policies.pd_rules import DecodeWorker, PDRequest, PDRule
from sim.context import PrefillOnlyPrompt
from sim.engines.recorder import RunRecorder
from sim.kvcache.paths import WalkHint

from .fleet import Fleet


@dataclass
class PDRecord:
    """A request's way through the fleet (times are simulated seconds; NaN: not that way)."""

    rid: int
    decode_worker: int
    prefill_worker: int = -1  # -1: not prefilled on the prefill pool
    local: bool = False  # prefilled on its decode worker (conditional disaggregation)
    prealloc_wait_s: float = math.nan  # asked -> the decode worker pre-allocated its KV
    prefill_s: float = math.nan  # arrival -> first token on the prefill worker
    transfer_queue_s: float = math.nan  # prefill end -> transfer start (booked on the link)
    transfer_s: float = math.nan  # transfer start -> landed (busy + latency)
    transfer_bytes: int = 0
    landed_at: float = math.nan  # when the request went to its decode worker
    landing_failed: bool = False  # no room on the decode worker: it computes the prompt
    landed_blocks: int = 0  # prompt blocks that landed on the decode worker
    overloaded: bool = False  # the PD rule found no pair meeting its SLOs
    returned_bytes: int = 0  # --pd-return output


@dataclass
class LinkQueue:
    """One FIFO link: when it is next free, and every transfer it carried."""

    free_at: float = 0.0
    busy_s: float = 0.0
    transfers: list[tuple[float, float, int]] = field(default_factory=list)  # start, end, bytes

    def book(self, earliest: float, busy: float, not_before_end: float = 0.0) -> tuple[float,
                                                                                     float]:
        """Occupy the link for ``busy`` seconds from ``earliest`` or when it is free; the
        occupation ends no earlier than ``not_before_end``. Returns (start, end)."""
        start = max(earliest, self.free_at)
        end = max(start + busy, not_before_end)
        self.free_at = end
        self.busy_s += end - start
        return start, end


class PDFleet:
    """``prefill``: a ``Fleet`` over the prefill engines (its router picks the worker);
    ``decode``: the decode engines; ``rule``: a bound ``PDRule``; ``rec``: the recorder the
    replay reports sessions to; ``spec``: the model as the run prices it (its KV groups' bytes
    go on the link; its layers give streaming's last-layer share)."""

    def __init__(self, env: simpy.Environment, cfg, trace, prefill: Fleet, decode: list,
                 rule: PDRule, link: Link, rec: RunRecorder, spec: ModelSpec, profile,
                 gpus_per_replica: int) -> None:
        self.env, self.cfg, self.trace = env, cfg, trace
        self.prefill, self.decode, self.rule, self.link = prefill, decode, rule, link
        self.rec = rec
        self.spec, self.layers, self.profile = spec, spec.layers, profile
        self.gpus_per_replica = gpus_per_replica  # (sim/deploy.py's one definition)
        # With TP t each rank holds its share of the KV heads and ships it through its own
        # NIC (links.yaml: one NIC per GPU), all t at once: a worker's link moves its
        # rank's share of the bytes in the time (1/t when every group's KV heads divide by
        # t; a group with fewer heads than t replicates them, MLA's latent is whole), and
        # of each group what a request holds there (a window's last tokens only).
        # A linear group's request state (its heads split over the ranks) goes once, at the
        # prompt's end: one rank's bytes as its engine stores them, and all ranks' in total.
        self.state_rank_bytes = sum(g.state_bytes for g in group_bytes(
            spec, gpus_per_replica, cfg.engine.name))
        self.bs = cfg.cache.block_size
        self.threshold = cfg.pd.pd_local_threshold
        self.decode_cache = cfg.pd.decode_cache == "on"
        self.streaming = cfg.pd.pd_streaming == "layer"
        self.prealloc = cfg.pd.pd_prealloc == "on"
        self.records: dict[int, PDRecord] = {}
        self.queues: dict[object, LinkQueue] = {}
        n = len(decode)
        self.in_flight = [0] * n
        self.in_flight_tokens = [0] * n
        self._hints: dict[tuple[str, int, int], WalkHint] = {}
        if self.prealloc:
            for e in decode:
                if e.prealloc_before_prefill:  # SGLang: its runs end for a pre-allocation
                    e.expect_preallocations()

    # --- the server interface the replay uses ----------------------------------------------
    @property
    def request_class(self) -> type:
        return self.decode[0].request_class

    def submit(self, req) -> None:
        now = self.env.now
        workers = tuple(self._worker(i, req) for i in range(len(self.decode)))
        choice = self.rule.decide(PDRequest(req.rid, req.session, now, req.prompt_tokens,
                                            self.threshold, self.decode_cache), workers)
        d = choice.decode
        if isinstance(d, bool) or not isinstance(d, int | np.integer) \
                or not 0 <= d < len(self.decode):
            raise RuntimeError(f"PD rule {self.rule.name!r} returned decode worker {d!r} "
                               f"for request {req.rid}")
        d = int(d)
        rec = PDRecord(req.rid, d, overloaded=choice.overloaded)
        self.records[req.rid] = rec
        self.in_flight[d] += 1
        self.in_flight_tokens[d] += req.prompt_tokens
        req.done.callbacks.append(lambda _ev, req=req: self._finished(req))
        if choice.local:
            rec.local = True
            rec.landed_at = now
            self._to_decode(req, d)
            return
        if self.prealloc and self.decode[d].prealloc_before_prefill:
            req.walk_from(self._hint("d", d, req.session))
            self.decode[d].reserve_remote(req, lambda: self._granted(req, now, self._prefill))
            return
        self._prefill(req)

    def _granted(self, req, asked: float, then) -> None:
        """The decode worker pre-allocated ``req``'s KV (asked at ``asked``): go on."""
        self.records[req.rid].prealloc_wait_s = self.env.now - asked
        then(req)

    def _prefill(self, req) -> None:
        """Send the prefill-only copy of ``req`` to the prefill pool (its router picks)."""
        now = self.env.now
        rec = self.records[req.rid]
        copy = self.prefill.request_class(
            rid=req.rid, session=req.session, arrival=now, seq=0,
            prompt_tokens=req.prompt_tokens, output_tokens=1, ids=req.ids,
            done=self.env.event(),
            prompt=PrefillOnlyPrompt(self.trace, req.rid, req.ids, req.prompt_tokens),
            shared_blocks=req.shared_blocks, next_gap=req.next_gap)
        self.prefill.submit(copy)
        p = self.prefill.decisions.replica[-1]  # the prefill router's choice, just made
        copy.walk_from(self._hint("p", p, req.session))
        rec.prefill_worker = p
        copy.done.callbacks.append(lambda _ev, req=req, copy=copy: self._prefilled(req, copy))

    def busy(self) -> bool:
        return self.prefill.busy() or any(e.busy() for e in self.decode)

    def close(self) -> None:
        self.prefill.close()
        for e in self.decode:
            e.close()

    # --- internals --------------------------------------------------------------------------
    def _hint(self, pool: str, worker: int, session: int) -> WalkHint:
        """A walk hint per (pool, worker, session): a hint points into one cache's tree."""
        return self._hints.setdefault((pool, worker, session), WalkHint())

    def _worker(self, i: int, req) -> DecodeWorker:
        e = self.decode[i]
        cached = e.cache.gpu_prefix_blocks(req.ids) * self.bs if self.decode_cache else 0
        batch = len(e.running) + 1
        ctx = sum(r.kv_read_tokens for r in e.running) + req.prompt_tokens
        return DecodeWorker(i, self.in_flight[i], self.in_flight_tokens[i],
                            min(cached, req.prompt_tokens),
                            self.profile.decode_step_seconds(batch, ctx))

    def _queue(self, key) -> LinkQueue:
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = LinkQueue()
        return q

    def _link_key(self, p: int, d: int, back: bool = False):
        key = ("nic", p) if self.cfg.pd.pd_link_scope == "nic" else ("pair", p, d)
        return ("back", *key) if back else key

    def _prefilled(self, req, copy) -> None:
        """The prefill-only copy is done (or was dropped): ship the prompt's KV."""
        now = self.env.now
        rec = self.records[req.rid]
        r = copy.record
        d = rec.decode_worker
        early = self.prealloc and self.decode[d].prealloc_before_prefill
        if r is None or r.dropped:  # the prefill worker could never hold it: decode computes
            rec.landing_failed = True
            rec.landed_at = now
            if early:
                self.decode[d].cancel_remote(req)
            else:
                self._to_decode(req, d)
            return
        rec.prefill_s = r.first_token_s - copy.arrival
        if self.prealloc and not early:
            req.walk_from(self._hint("d", d, req.session))
            self.decode[d].reserve_remote(
                req, lambda: self._granted(req, now, lambda req: self._ship(req, r)))
            return
        self._ship(req, r)

    def _ship(self, req, r) -> None:
        """Book the prompt's KV on the link (``r``: the prefill's record)."""
        now = self.env.now
        rec = self.records[req.rid]
        nbytes, rank_bytes = shipped_kv_bytes(self.spec, self.gpus_per_replica,
                                              req.prompt_tokens)
        if self.state_rank_bytes:
            nbytes += self.state_rank_bytes * self.gpus_per_replica
            rank_bytes += self.state_rank_bytes
        busy = self.link.busy_seconds(rank_bytes)
        q = self._queue(self._link_key(rec.prefill_worker, rec.decode_worker))
        if self.streaming:  # layer by layer from the prefill's start
            start, end = q.book(r.admit_s, busy, now + busy / self.layers)
        else:
            start, end = q.book(now, busy)
        q.transfers.append((start, end, nbytes))
        arrive = end + self.link.latency_s
        rec.transfer_bytes = nbytes
        rec.transfer_queue_s = start - now  # negative when streaming began during prefill
        rec.transfer_s = arrive - start
        self.env.process(self._land_after(req, max(0.0, arrive - now)))

    def _land_after(self, req, delay: float):
        if delay > 0:
            yield self.env.timeout(delay)
        rec = self.records[req.rid]
        d = rec.decode_worker
        rec.landed_at = self.env.now
        if self.prealloc:  # into the room the decode worker pre-allocated
            rec.landed_blocks = int(req.ids.size)
            self.decode[d].land_remote(req)
            return
        if req.ids.size and not self.decode[d].insert_remote(req.ids):
            rec.landing_failed = True
        else:
            rec.landed_blocks = int(req.ids.size)
        self._to_decode(req, d)

    def _to_decode(self, req, d: int) -> None:
        req.walk_from(self._hint("d", d, req.session))
        self.decode[d].submit(req)

    def _finished(self, req) -> None:
        rec = self.records[req.rid]
        d = rec.decode_worker
        self.in_flight[d] -= 1
        self.in_flight_tokens[d] -= req.prompt_tokens
        if not self.decode_cache:
            self.decode[d].forget_unused()
        if self.cfg.pd.pd_return == "output" and rec.prefill_worker >= 0 \
                and req.record is not None and not req.record.dropped:
            self._send_back(req, rec)

    def _send_back(self, req, rec: PDRecord) -> None:
        final = req.prompt.finish
        extra = int(final.size) - int(req.ids.size)
        if extra <= 0:
            return
        # the output's KV: of a window group, the output's part of the final window
        nbytes, rank_bytes = shipped_kv_bytes(self.spec, self.gpus_per_replica, extra * self.bs)
        q = self._queue(self._link_key(rec.prefill_worker, rec.decode_worker, back=True))
        start, end = q.book(self.env.now, self.link.busy_seconds(rank_bytes))
        q.transfers.append((start, end, nbytes))
        rec.returned_bytes = nbytes
        self.env.process(self._return_after(rec.prefill_worker, final, req.ids.size,
                                            end + self.link.latency_s - self.env.now))

    def _return_after(self, p: int, final: np.ndarray, prompt_blocks: int, delay: float):
        if delay > 0:
            yield self.env.timeout(delay)
        e = self.prefill.replicas[p]
        if e.cache.gpu_prefix_blocks(final) >= prompt_blocks:  # the prompt is still there
            e.insert_remote(final)
