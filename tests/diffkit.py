"""The lockstep drivers of the differential tests: one for SGLang's trees (the legacy
RadixCache, the UnifiedRadixCache and its hybrids: tests/test_sglang_diff.py,
test_sglang_unified_diff.py, test_sglang_hybrid_diff.py) and one for vLLM's pools (the block
pool and the hybrid pool: test_vllm_diff.py, test_vllm_hybrid_diff.py), each driving the real
code and kvsim's together and failing at the first difference; and the shadow pools that put
the real vLLM manager beside the pool the vLLM engine builds (sim/engines/vllm.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import numpy as np

from benchmarks.opreplay import replay
from benchmarks.opstream import ALLOC, CHUNK, FINISH, OP_NAMES, OpStream
from benchmarks.sglang_ref import torch_single_thread
from benchmarks.vllm_ops import ADMIT, VOP_NAMES, DriverConfig, ModelSide, RealSide, drive


def _id_list(x: np.ndarray | None) -> list[int]:
    return [] if x is None else x.tolist()


def sglang_lockstep(stream: OpStream, theirs: Any, ours: Any,
                    limits: dict[tuple[str, ...], int], label: str = "") -> Counter:
    """Replay ``stream`` through SGLang (``theirs``) and kvsim (``ours``), two sides of
    benchmarks/opreplay.py or benchmarks/sglang_unified_ops.py; after every op both agree on
    the hit, the branching point, the admission, the block ids freed in each pool and every
    key of the state (sizes, resident ids), and each sum of state keys in ``limits`` stays
    within its capacity. Returns what happened (ops by kind, hits, branching points, aborts,
    blocks freed; a hybrid's SWA blocks and Mamba states freed)."""
    seen: Counter = Counter()
    with torch_single_thread():
        for a, b in zip(replay(stream, theirs), replay(stream, ours), strict=True):
            where = f"{stream.name}{label} op {a.index} {OP_NAMES[a.op]} r{a.rid}"
            assert (a.hit, a.branching, a.ok) == (b.hit, b.branching, b.ok), (
                f"{where}: hit/branching/ok {(a.hit, a.branching, a.ok)} (SGLang) != "
                f"{(b.hit, b.branching, b.ok)} (kvsim)")
            fa, sa = _id_list(a.freed), _id_list(a.swa)
            fb, sb = _id_list(b.freed), _id_list(b.swa)
            assert fa == fb, f"{where}: freed {fa} (SGLang) != {fb} (kvsim)"
            assert sa == sb, f"{where}: SWA freed {sa} (SGLang) != {sb} (kvsim)"
            assert a.state is not None and b.state is not None
            assert a.state.keys() == b.state.keys(), f"{where}: observed keys differ"
            for k, va in a.state.items():
                vb = b.state[k]
                if isinstance(va, np.ndarray):
                    assert np.array_equal(va, vb), (
                        f"{where}: resident {k} differ: only SGLang {np.setdiff1d(va, vb)[:8]}, "
                        f"only kvsim {np.setdiff1d(vb, va)[:8]}")
                else:
                    assert va == vb, f"{where}: {k} {va} (SGLang) != {vb} (kvsim)"
            for keys, cap in limits.items():
                assert sum(a.state[k] for k in keys) <= cap, f"{where}: {keys} over {cap}"
            seen["ops"] += 1
            seen[OP_NAMES[a.op]] += 1
            seen["hit"] += max(a.hit, 0)
            seen["branching"] += a.branching is not None
            seen["aborted"] += not a.ok
            seen["freed"] += len(fa)
            seen["duplicates_freed"] += len(fa) if a.op in (CHUNK, FINISH) else 0
            if a.swa is not None:  # a hybrid's second pool: SWA block ids, a Mamba state -1
                states = sa.count(-1)
                seen["states_freed"] += states
                seen["swa_freed"] += len(sa) - states
                if a.op == ALLOC:
                    seen["swa_only_freed"] += len(sa) - states - len(fa)
    return seen


def same_pool_state(where: str, ra: dict[str, Any], rb: dict[str, Any]) -> None:
    """Two vLLM pool states (benchmarks/vllm_ops.py ``observe``) are the same: cached ids
    (and groups), ref counts, the free queue and every running request's table per group."""
    assert ra.keys() == rb.keys(), f"{where}: observed keys differ"
    for key in ra.keys() - {"tables"}:
        assert np.array_equal(ra[key], rb[key]), (
            f"{where}: {key} differ\n vLLM  {ra[key].tolist()}\n kvsim {rb[key].tolist()}")
    assert ra["tables"].keys() == rb["tables"].keys(), f"{where}: running requests differ"
    for r, ts in ra["tables"].items():
        for g, (x, y) in enumerate(zip(ts, rb["tables"][r], strict=True)):
            assert np.array_equal(x, y), f"{where}: table of r{r} group {g}: {x} != {y}"


def vllm_lockstep(stream: OpStream, config: DriverConfig, groups: list | None = None,
                  real_groups: list | None = None, in_flight: int | None = None,
                  pool_blocks: int | None = None) -> Counter:
    """Drive ``stream`` through the real vLLM manager and kvsim's pool together with vLLM's
    V1 protocol (benchmarks/vllm_ops.py ``drive``); fail at the first difference in an op's
    result or the whole state. ``groups`` (sim.kvcache.hybridpool.HybridGroup): the hybrid
    pool against vLLM's HybridKVCacheCoordinator, ``real_groups`` the real side's layout
    where it must differ (negative controls); the pool holds the stream's capacity per group
    unless ``pool_blocks`` says otherwise. Returns what happened (ops by kind, evictions,
    duplicates, hits, lazy hits, refusals, null blocks)."""
    full = config.full_sequence_must_fit
    cap = pool_blocks or stream.capacity_blocks * len(groups or [None])
    bs = stream.block_size
    real = RealSide(cap, bs, full, groups=real_groups or groups, in_flight=in_flight)
    model = ModelSide(cap, bs, "vllm", full, debug=True, groups=groups, in_flight=in_flight)
    seen: Counter = Counter()
    prev: dict = {"state": model.observe()}

    def on_op(kind: int, rid: int, k: int, results: list) -> None:
        where = f"{stream.name} op {seen['ops']} {VOP_NAMES[kind]} r{rid} k={k}"
        a, b = results
        assert a == b, f"{where}: vLLM {a} != kvsim {b}"
        rb = model.observe()
        same_pool_state(where, real.observe(), rb)
        before = prev["state"]
        seen["ops"] += 1
        seen[VOP_NAMES[kind]] += 1
        seen["evicted"] += int(((before["block_ids"] >= 0)
                                & (rb["block_ids"] != before["block_ids"])).sum())
        ids = rb["block_ids"][rb["block_ids"] >= 0]
        seen["duplicates"] = max(seen["duplicates"], len(ids) - len(np.unique(ids)))
        seen["nulls"] += sum(int((t == 0).sum()) for ts in rb["tables"].values() for t in ts)
        if kind == ADMIT:
            if a is None:
                seen["refused"] += 1
            elif a:
                seen["hit"] += a
                hit_blocks = rb["tables"][rid][0][:a]
                hit_blocks = hit_blocks[hit_blocks > 0] - 1
                seen["lazy_hits"] += int(np.count_nonzero(before["refs"][hit_blocks] == 0))
        prev["state"] = rb

    drive(stream, [real, model], config, on_op)
    return seen


class ShadowPool:
    """kvsim's block pool with the real vLLM KVCacheManager beside it: every call the vLLM
    engine (sim/engines/vllm.py) makes is applied to both, and their results and whole states
    (block ids, ref counts, free queue, block tables) must be identical after every call.
    So the engine's protocol (admission with the budget, chunk and decode allocations,
    decode runs allocated at once, preemption and finish frees in schedule order) is what
    the real manager accepts, op for op. ``engine_lockstep`` puts it in the engine's place."""

    made: ClassVar[list[ShadowPool]] = []

    def __init__(self, capacity_blocks: int, block_size: int, free_order: str, *,
                 debug: bool = False) -> None:
        from benchmarks.vllm_ref import VllmRef
        from sim.kvcache.blockpool import BlockPool

        assert free_order == "vllm", "only vLLM's own order exists in the real code"
        self._pair(BlockPool(capacity_blocks, block_size, free_order, debug=True),
                   VllmRef(capacity_blocks, block_size))

    def _pair(self, model: Any, real: Any) -> None:
        self.model, self.real = model, real
        self.known: set[int] = set()
        self.ops: Counter = Counter()
        ShadowPool.made.append(self)

    def __getattr__(self, name: str):  # counters and read-only queries: the model's
        return getattr(self.model, name)

    def admit(self, rid: int, ids: np.ndarray, num_tokens: int, k: int) -> int | None:
        if rid not in self.known:
            self.real.new_request(rid, ids, num_tokens)
            self.known.add(rid)
        else:  # resumed after preemption: its sampled tokens so far, as vLLM keeps them
            for _ in range(num_tokens - self.real.num_tokens(rid)):
                self.real.sample(rid)
        got = self.model.admit(rid, ids, num_tokens, k)
        ok, hit = self.real.admit(rid, k)
        assert (got is not None) == ok and (not ok or got == hit), (rid, got, ok, hit)
        self._compare("ADMIT", rid)
        self.ops["hit"] += got or 0
        return got

    def extend(self, rid: int, k: int, known: int | None = None, **kw: int) -> bool:
        got = self.model.extend(rid, k, known=known, **kw)
        assert got == self.real.extend(rid, k, known=known, **kw), (rid, k, got)
        self._compare("EXTEND", rid)
        return got

    def cache_known(self, rid: int, tokens: int) -> None:
        self.model.cache_known(rid, tokens)
        self.real.cache_known(rid, tokens)
        self._compare("CACHE", rid)

    def forget_free(self) -> None:
        raise AssertionError("not in vLLM: the lockstep runs keep the decode worker's cache")

    def free(self, rid: int) -> None:
        self.model.free(rid)
        self.real.preempt(rid)  # the manager frees alike for finish and preemption
        self._compare("FREE", rid)

    def _compare(self, op: str, rid: int) -> None:
        self.ops[op] += 1
        self.ops["ops"] += 1
        m, r = self.model, self.real
        where = f"op {self.ops['ops']} {op} r{rid}"
        state = r.blocks()
        assert np.array_equal(m.block_ids(), state[:, 0]), f"{where}: cached ids differ"
        if hasattr(m, "block_groups"):
            assert np.array_equal(m.block_groups(), r.block_groups()), f"{where}: groups differ"
        assert np.array_equal(m.ref_counts(), state[:, 1]), f"{where}: ref counts differ"
        queue = np.array([p for p, _ in r.free_queue()], np.int64)
        assert np.array_equal(m.free_queue(), queue), f"{where}: free queues differ"
        assert sorted(m.running()) == sorted(r.running()), f"{where}: running requests differ"
        for x in m.running():
            ours = m.tables(x) if hasattr(m, "tables") else [m.table(x)]
            for a, b in zip(ours, r.tables(x), strict=True):
                assert np.array_equal(a, b), f"{where}: table r{x}"


class ShadowHybrid(ShadowPool):
    """``ShadowPool`` for kvsim's hybrid pool and the real coordinator: a decode run is
    applied to the real one as its V1 steps (one token per request per step, in schedule
    order), a disaggregated decode worker's remote admission alike."""

    def __init__(self, capacity_blocks: int, block_size: int, groups: list, *,
                 max_in_flight_tokens: int | None = None, free_order: str = "vllm",
                 debug: bool = False) -> None:
        from benchmarks.vllm_hybrid_ref import VllmHybridRef
        from sim.kvcache.hybridpool import HybridPool

        assert free_order == "vllm", "only vLLM's own order exists in the real code"
        self._pair(HybridPool(capacity_blocks, block_size, groups,
                              max_in_flight_tokens=max_in_flight_tokens, debug=True),
                   VllmHybridRef(capacity_blocks, block_size, groups,
                                 max_in_flight_tokens=max_in_flight_tokens))

    def admit_remote(self, rid: int, ids: np.ndarray, num_tokens: int,
                     reserved: int = 0) -> int | None:
        assert rid not in self.known, "a remote request is new to its decode worker"
        self.real.new_request(rid, ids, num_tokens)
        self.known.add(rid)
        got = self.model.admit_remote(rid, ids, num_tokens, reserved)
        ok, hit = self.real.admit_remote(rid, reserved)
        assert (got is not None) == ok and (not ok or got == hit), (rid, got, ok, hit)
        self._compare("REMOTE", rid)
        self.ops["remote"] += ok
        if not ok:  # vLLM's request waits as it is; the next try looks up again
            self.known.discard(rid)
            self.real._reqs.pop(rid)
        return got

    def extend(self, rid: int, k: int, known: int | None = None, in_flight: int = 0) -> bool:
        # compiled ``WideBlocks`` passes every argument by position
        return super().extend(rid, k, known=known, in_flight=in_flight)

    def new_step(self) -> None:
        self.model.new_step()
        self.real.new_step()

    def decode_run(self, rids: list[int], steps: int, in_flight: int = 0, lag: int = 0) -> None:
        self.model.decode_run(rids, steps, in_flight, lag)
        for step in range(steps):
            if step:  # each V1 step starts one (the run's first: the engine's schedule)
                self.real.new_step()
            for rid in rids:
                c = self.real._reqs[rid].num_computed_tokens
                assert self.real.extend(rid, 1, known=c + 1 - lag, in_flight=in_flight)
        self.ops["run_steps"] += steps
        self._compare("RUN", rids[0])


class _Own:
    """A pool's own (``base``'s) methods and properties on ``pool``, past a subclass's
    overrides: the model half of ``shadow_block_pool``'s and ``shadow_hybrid_pool``'s
    pairs."""

    def __init__(self, pool: Any, base: type) -> None:
        self._pool = pool
        self._base = base

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name).__get__(self._pool)


def shadow_block_pool() -> type:
    """``ShadowPool`` as a ``BlockPool`` subclass: the engine's typed (compiled) code takes
    only a block pool, built as ``VllmServer.pool_class``; the shadow is its own model."""
    from benchmarks.vllm_ref import VllmRef
    from sim.kvcache.blockpool import BlockPool

    class ShadowBlockPool(ShadowPool, BlockPool):
        def __init__(self, capacity_blocks: int, block_size: int, free_order: str, *,
                     debug: bool = False) -> None:
            assert free_order == "vllm", "only vLLM's own order exists in the real code"
            BlockPool.__init__(self, capacity_blocks, block_size, free_order, debug=True)
            self._pair(_Own(self, BlockPool), VllmRef(capacity_blocks, block_size))

    return ShadowBlockPool


def shadow_hybrid_pool() -> type:
    """``ShadowHybrid`` as a ``HybridPool`` subclass: the engine's compiled code takes only a
    hybrid pool (as such, or under ``WideBlocks``), built as ``VllmServer.hybrid_pool_class``;
    the shadow is its own model."""
    from benchmarks.vllm_hybrid_ref import VllmHybridRef
    from sim.kvcache.hybridpool import HybridPool

    class ShadowHybridPool(ShadowHybrid, HybridPool):
        def __init__(self, capacity_blocks: int, block_size: int, groups: list, *,
                     max_in_flight_tokens: int | None = None, free_order: str = "vllm",
                     debug: bool = False) -> None:
            assert free_order == "vllm", "only vLLM's own order exists in the real code"
            HybridPool.__init__(self, capacity_blocks, block_size, groups,
                                max_in_flight_tokens=max_in_flight_tokens, debug=True)
            self._pair(_Own(self, HybridPool),
                       VllmHybridRef(capacity_blocks, block_size, groups,
                                     max_in_flight_tokens=max_in_flight_tokens))

    return ShadowHybridPool


def engine_lockstep(monkeypatch: Any, cfg: Any, trace: Any,
                    hybrid: bool = False) -> tuple[Counter, dict]:
    """Run ``cfg`` (on ``trace``) with the vLLM engine's pools shadowed by the real manager
    (``ShadowPool`` for the block pool, as the engine's ``pool_class``; ``ShadowHybrid`` for
    a hybrid model's pool, as its ``hybrid_pool_class``: which one every pool must be,
    ``hybrid`` says). Returns the ops compared and the run's summary."""
    import sim.engines.vllm as vllm_engine
    from sim.run import run

    ShadowPool.made = []
    if not hybrid:  # a pool class of its own keeps an engine off the hybrid pool
        monkeypatch.setattr(vllm_engine.VllmServer, "pool_class", shadow_block_pool())
    monkeypatch.setattr(vllm_engine.VllmServer, "hybrid_pool_class", shadow_hybrid_pool())
    res = run(cfg, trace)
    assert ShadowPool.made, "the engine built no pool"
    assert all(isinstance(p, ShadowHybrid) == hybrid for p in ShadowPool.made), (
        f"the engine built {'no' if hybrid else 'a'} hybrid pool")
    return sum((p.ops for p in ShadowPool.made), Counter()), res.summary
