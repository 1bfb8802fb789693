"""vLLM's request protocol as cache operations, and a lockstep driver over several caches.

An op stream for vLLM cannot be fixed in advance the way SGLang's is (benchmarks/opstream.py):
which request is admitted, preempted or resumed depends on the cache. So the ops are produced
by a small driver that does what vLLM 0.33's V1 scheduler does to its KVCacheManager, without
time (one loop pass = one scheduler step):

LOOKUP r      a request arrives: get_computed_blocks (read-only; the hit is recorded).
EXTEND r k    every running request, in order, gets slots for its next k tokens (the rest of
              its prefill, cut to the chunk budget, or k decode tokens); when that fails the
              LAST running request is preempted (PREEMPT: its blocks are freed, it goes back
              to the front of the waiting queue with its outputs so far) and the call retried.
ADMIT r k     if nobody was preempted this step: waiting requests in FCFS order, up to
              `max_running` running, are scheduled (lookup + allocate_slots for the first k
              tokens; the whole sequence must fit); the first refusal ends admission.
FREE r        a request whose last output token is computed finishes: its blocks are freed.

A request has `in` prompt and `out` output tokens: `out - 1` decode tokens get KV (the last
sampled token never does), so it holds ceil((in + out - 1) / bs) blocks at its end; its ids
are `Request.finish_ids` (every block that becomes full). Sessions run as a closed loop:
`active` sessions at a time, each sends its next request when the previous one finished.
A request that could never fit (more blocks than the cache) is not sent (counted as dropped).

The driver applies every op to every side and hands the results to `on_op`; the differential
test compares them (and each side's state) there, so both sides see exactly the same ops as
long as they agree, and the first disagreement stops the run.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from benchmarks.opstream import OpStream, Request

LOOKUP, ADMIT, EXTEND, PREEMPT, FREE = range(5)
VOP_NAMES = ("LOOKUP", "ADMIT", "EXTEND", "PREEMPT", "FREE")


class VllmSide(Protocol):
    """One cache driven through vLLM's protocol (sizes in blocks, lengths in tokens)."""

    name: str

    def lookup(self, rid: int, ids: np.ndarray, num_tokens: int) -> int: ...
    def admit(self, rid: int, ids: np.ndarray, num_tokens: int, k: int) -> int | None: ...
    def extend(self, rid: int, k: int) -> bool: ...
    def free(self, rid: int, preempted: bool) -> None: ...
    def sample(self, rid: int) -> None: ...
    def observe(self) -> dict[str, Any]: ...


class ModelSide:
    """kvsim's vLLM model: sim.kvcache.blockpool.BlockPool, or with ``groups`` the hybrid
    pool (sim.kvcache.hybridpool.HybridPool, ``in_flight``: its admission cap
    ``max_in_flight_tokens``)."""

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int,
        free_order: str = "vllm",
        full_sequence_must_fit: bool = True,
        debug: bool = False,
        groups: Sequence[Any] | None = None,
        in_flight: int | None = None,
    ) -> None:
        if groups is None:
            from sim.kvcache.blockpool import BlockPool

            self.name = f"kvsim blockpool ({free_order})"
            self.pool: Any = BlockPool(capacity_blocks, block_size, free_order, debug=debug)
        else:
            from sim.kvcache.hybridpool import HybridPool

            self.name = "kvsim hybridpool"
            self.pool = HybridPool(capacity_blocks, block_size, list(groups),
                                   max_in_flight_tokens=in_flight, debug=debug)
        self.hybrid = groups is not None
        self.full = full_sequence_must_fit

    def lookup(self, rid: int, ids: np.ndarray, num_tokens: int) -> int:
        return self.pool.lookup(ids, num_tokens)

    def admit(self, rid: int, ids: np.ndarray, num_tokens: int, k: int) -> int | None:
        return self.pool.admit(rid, ids, num_tokens, k, full_sequence_must_fit=self.full)

    def extend(self, rid: int, k: int) -> bool:
        return self.pool.extend(rid, k)

    def free(self, rid: int, preempted: bool) -> None:
        self.pool.free(rid)

    def sample(self, rid: int) -> None:
        """Sampled tokens only matter to the cache once computed (extend)."""

    def new_step(self) -> None:
        if self.hybrid:  # the Mamba manager's new_step_starts
            self.pool.new_step()

    def observe(self) -> dict[str, Any]:
        """The state a differential test compares: the kvsim id cached in each physical
        block (hybrid: and its group), each block's ref count, the free queue front to back
        and every running request's block table per group (null blocks 0)."""
        p = self.pool
        state = {"block_ids": p.block_ids(), "refs": p.ref_counts(),
                 "free_queue": p.free_queue(),
                 "tables": {r: p.tables(r) if self.hybrid else [p.table(r)]
                            for r in p.running()}}
        if self.hybrid:
            state["groups"] = p.block_groups()
        return state


class RealSide:
    """The real vLLM KVCacheManager (benchmarks/vllm_ref.py: the pinned install ``use_vllm``
    chose), with ``groups`` over a hybrid KV cache config (benchmarks/vllm_hybrid_ref.py:
    vLLM's HybridKVCacheCoordinator)."""

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int,
        full_sequence_must_fit: bool = True,
        groups: Sequence[Any] | None = None,
        in_flight: int | None = None,
    ) -> None:
        if groups is None:
            from benchmarks.vllm_ref import VllmRef

            self.name = "vLLM KVCacheManager"
            self.ref: Any = VllmRef(capacity_blocks, block_size, full_sequence_must_fit)
        else:
            from benchmarks.vllm_hybrid_ref import VllmHybridRef

            self.name = "vLLM HybridKVCacheCoordinator"
            self.ref = VllmHybridRef(capacity_blocks, block_size, groups,
                                     full_sequence_must_fit, in_flight)
        self.hybrid = groups is not None
        self._known: set[int] = set()

    def _ensure(self, rid: int, ids: np.ndarray, num_tokens: int) -> None:
        if rid not in self._known:
            self.ref.new_request(rid, ids, num_tokens)
            self._known.add(rid)

    def lookup(self, rid: int, ids: np.ndarray, num_tokens: int) -> int:
        self._ensure(rid, ids, num_tokens)
        return self.ref.lookup(rid)

    def admit(self, rid: int, ids: np.ndarray, num_tokens: int, k: int) -> int | None:
        self._ensure(rid, ids, num_tokens)
        ok, hit = self.ref.admit(rid, k)
        return hit if ok else None

    def extend(self, rid: int, k: int) -> bool:
        return self.ref.extend(rid, k)

    def free(self, rid: int, preempted: bool) -> None:
        if preempted:
            self.ref.preempt(rid)
        else:
            self.ref.free(rid)
            self._known.discard(rid)

    def sample(self, rid: int) -> None:
        self.ref.sample(rid)

    def new_step(self) -> None:
        if self.hybrid:
            self.ref.new_step()

    def observe(self) -> dict[str, Any]:
        """``ModelSide.observe``'s state, of the real manager."""
        r = self.ref
        blocks = r.blocks()
        state = {"block_ids": blocks[:, 0], "refs": blocks[:, 1],
                 "free_queue": np.array([p for p, _ in r.free_queue()], np.int64),
                 "tables": {rid: r.tables(rid) for rid in r.running()}}
        if self.hybrid:
            state["groups"] = r.block_groups()
        return state


@dataclass
class _Live:
    """Driver-side state of one request (vLLM's Request fields that matter here)."""

    req: Request
    outputs: int = 0  # output tokens sampled and appended to the sequence
    computed: int = 0  # tokens with KV (0 again after a preemption)
    prefill_to: int = 0  # while > computed, the request is (re)computing its sequence

    @property
    def num_tokens(self) -> int:
        return self.req.in_tokens + self.outputs


@dataclass
class DriverConfig:
    """How the driver schedules (all random choices come from `seed`).

    max_running: requests running at once (vLLM's max_num_seqs); active: sessions sending;
    chunk: prefill tokens per step per request (None: whole prompt); decode: max decode tokens
    per step (drawn in 1..decode); full_sequence_must_fit: vLLM's scheduler_reserve_full_isl.
    """

    max_running: int = 2
    active: int = 4
    chunk: int | None = None
    decode: int = 1
    seed: int = 0
    full_sequence_must_fit: bool = True


@dataclass
class DriveStats:
    ops: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    hits: dict[int, int] = field(default_factory=dict)  # rid -> hit blocks at (last) admission
    admitted: int = 0  # admissions (a preempted request is admitted again)
    dropped: int = 0


OnOp = Callable[[int, int, int, list[Any]], None]  # (op, rid, k, results per side)


def drive(
    stream: OpStream,
    sides: Sequence[VllmSide],
    config: DriverConfig,
    on_op: OnOp | None = None,
) -> DriveStats:
    """Run every session of `stream` through `sides` with vLLM's protocol (module doc)."""
    if stream.sessions is None:
        raise ValueError(f"{stream.name}: the stream has no session lists")
    bs, cap = stream.block_size, stream.capacity_blocks
    rng = np.random.default_rng(config.seed)
    stats = DriveStats()
    pending = deque(deque(s) for s in stream.sessions if s)
    ring: list[deque[int]] = []
    idle: list[deque[int]] = []  # sessions of the ring with no request outstanding
    waiting: deque[_Live] = deque()
    running: list[_Live] = []
    session_of: dict[int, deque[int]] = {}

    def op(kind: int, rid: int, k: int, call: Callable[[VllmSide], Any]) -> Any:
        results = [call(s) for s in sides]
        stats.ops += 1
        name = VOP_NAMES[kind]
        stats.by_op[name] = stats.by_op.get(name, 0) + 1
        if on_op is not None:
            on_op(kind, rid, k, results)
        return results[0]

    def send(sess: deque[int]) -> None:
        while sess:
            req = stream.request(sess.popleft())
            if -(-(req.in_tokens + req.out_tokens - 1) // bs) > cap:
                stats.dropped += 1
                continue
            live = _Live(req)
            session_of[req.rid] = sess
            ids = req.finish_ids
            op(LOOKUP, req.rid, 0, lambda s, r=req, i=ids: s.lookup(r.rid, i, r.in_tokens))
            waiting.append(live)
            return
        ring.remove(sess)

    def work(lv: _Live) -> int:
        """Tokens of the next step: the rest of the (re)prefill, cut to the chunk budget, or
        k decode tokens (never past the request's last token with KV)."""
        if lv.prefill_to > lv.computed:
            left = lv.prefill_to - lv.computed
            return left if config.chunk is None else min(left, config.chunk)
        last = lv.req.in_tokens + lv.req.out_tokens - 1
        return min(int(rng.integers(1, config.decode + 1)), last - lv.computed)

    def computed(lv: _Live, k: int) -> None:
        """k tokens got KV; a step that reaches the end of the sequence samples one token."""
        lv.computed += k
        if lv.computed >= lv.num_tokens:
            lv.outputs += 1
            for s in sides:
                s.sample(lv.req.rid)

    def extend(lv: _Live, k: int) -> bool:
        rid = lv.req.rid
        if lv.prefill_to <= lv.computed:
            # Decode: the k - 1 tokens after the pending sampled one are appended first (k
            # steps at once); they stay appended if the allocation is refused.
            lv.outputs = max(lv.outputs, lv.computed + k - lv.req.in_tokens)
        return op(EXTEND, rid, k, lambda s, r=rid, n=k: s.extend(r, n))

    def done(lv: _Live) -> bool:
        return lv.outputs == lv.req.out_tokens and lv.prefill_to <= lv.computed

    while pending or ring or waiting or running:
        for s in sides:  # a scheduler step starts (new_step_starts: the Mamba manager's)
            step = getattr(s, "new_step", None)
            if step is not None:
                step()
        while len(ring) < config.active and pending:
            sess = pending.popleft()
            ring.append(sess)
            idle.append(sess)
        for sess in list(idle):
            idle.remove(sess)
            send(sess)
        preempted = False
        i = 0
        while i < len(running):
            lv = running[i]
            k = work(lv)
            ok = extend(lv, k)
            while not ok:
                victim = running.pop()
                vr = victim.req.rid
                op(PREEMPT, vr, 0, lambda s, r=vr: s.free(r, True))
                victim.computed = victim.prefill_to = 0
                waiting.appendleft(victim)
                preempted = True
                if victim is lv:
                    break
                ok = extend(lv, k)
            if ok:
                computed(lv, k)
                i += 1
        if not preempted:
            while waiting and len(running) < config.max_running:
                lv = waiting[0]
                n = lv.num_tokens
                k = n if config.chunk is None else config.chunk
                req = lv.req
                hit = op(
                    ADMIT, req.rid, k, lambda s, r=req, n=n, k=k: s.admit(r.rid, r.finish_ids, n, k)
                )
                if hit is None:
                    break
                waiting.popleft()
                running.append(lv)
                stats.hits[req.rid] = hit
                stats.admitted += 1
                lv.computed, lv.prefill_to = hit * bs, n
                computed(lv, min(k, n - hit * bs))
            if waiting and not running:
                # Nothing holds blocks and the head was refused: it never fits.
                raise AssertionError(f"{stream.name}: request {waiting[0].req.rid} can never run")
        for lv in [x for x in running if done(x)]:
            running.remove(lv)
            rid = lv.req.rid
            op(FREE, rid, 0, lambda s, r=rid: s.free(r, False))
            idle.append(session_of.pop(rid))
    return stats
