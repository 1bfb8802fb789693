"""kvsim's hybrid KV cache (sim/kvcache/hybridpool.py) on its own: a decode run applied block
edge by block edge equals its V1 steps one token at a time, ``decode_fit`` is the steps that
fit; the vLLM engine picks it for models of several groups (sim/engines/vllm.py
``vllm_kv_groups``) and refuses what it does not model yet. Its equality with the real vLLM
coordinator is tests/test_vllm_hybrid_diff.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kvcache.hybridpool import FULL, MAMBA, SLIDING, HybridGroup, HybridPool


def _pool(seed: int, bs: int, groups: list[HybridGroup], cap: int) -> tuple[HybridPool, list]:
    pool = HybridPool(cap, bs, groups, max_in_flight_tokens=2 * bs, debug=True)
    rng = np.random.default_rng(seed)
    rids = []
    for rid in range(4):
        n = int(rng.integers(1, 12 * bs))
        ids = np.arange(rid * 1000, rid * 1000 + 400)
        if rid % 2:
            ids[:3] = np.arange(3)  # a shared prefix: blocks held twice
        if pool.admit(rid, ids, n, n) is not None:
            rids.append(rid)
        pool.new_step()  # a Mamba state cached by one admission is hit by the next's
    return pool, rids


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), bs=st.sampled_from([4, 8, 16]), w=st.integers(1, 70),
       w2=st.integers(1, 40), three=st.booleans(), cap=st.integers(20, 90),
       steps=st.integers(1, 160), asynchronous=st.booleans())
def test_decode_run_is_its_steps(seed: int, bs: int, w: int, w2: int, three: bool, cap: int,
                                 steps: int, asynchronous: bool) -> None:
    groups = [HybridGroup(SLIDING, w), HybridGroup(FULL)]
    if three:
        groups.append(HybridGroup(SLIDING, w2))
    _check_decode_run(seed, bs, groups, cap, steps, asynchronous)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), bs=st.sampled_from([4, 8, 16]),
       layout=st.sampled_from(["mamba-full", "full-mamba-mamba", "mamba-sw-full"]),
       w=st.integers(1, 70), cap=st.integers(12, 90), steps=st.integers(1, 160),
       asynchronous=st.booleans(), blocked=st.booleans())
def test_mamba_decode_run_is_its_steps(seed: int, bs: int, layout: str, w: int, cap: int,
                                       steps: int, asynchronous: bool, blocked: bool) -> None:
    """A decode run over Mamba groups (a state block per block edge, the one before retired
    a step later: ``_remove_skipped``) equals its steps one token at a time, and
    ``decode_fit`` counts the states it frees (shared states freed by their last holder);
    ``blocked``: a refused request waits, so the run ends before the first step after which
    more blocks are free than now (the ``ceiling``)."""
    groups = {"mamba-full": [HybridGroup(MAMBA), HybridGroup(FULL)],
              "full-mamba-mamba": [HybridGroup(FULL), HybridGroup(MAMBA), HybridGroup(MAMBA)],
              "mamba-sw-full": [HybridGroup(MAMBA), HybridGroup(SLIDING, w),
                                HybridGroup(FULL)]}[layout]
    _check_decode_run(seed, bs, groups, cap, steps, asynchronous, blocked)


def _check_decode_run(seed: int, bs: int, groups: list[HybridGroup], cap: int, steps: int,
                      asynchronous: bool, blocked: bool = False) -> None:
    in_flight = lag = int(asynchronous)
    run, rids = _pool(seed, bs, groups, cap)
    if not rids:
        return
    stepped, _ = _pool(seed, bs, groups, cap)
    ceiling = run.free_blocks if blocked else None
    fit = run.decode_fit(rids, steps, in_flight, ceiling)
    done = 0
    while done < steps and all(
            stepped.extend(r, 1, known=stepped.computed_tokens(r) + 1 - lag,
                           in_flight=in_flight) for r in rids) and (
            ceiling is None or stepped.free_blocks <= ceiling):
        done += 1
    assert fit == done
    run, _ = _pool(seed, bs, groups, cap)
    stepped, _ = _pool(seed, bs, groups, cap)
    run.decode_run(rids, fit, in_flight, lag)
    for _ in range(fit):
        for r in rids:
            stepped.extend(r, 1, known=stepped.computed_tokens(r) + 1 - lag, in_flight=in_flight)
    for name in ("block_ids", "block_groups", "ref_counts", "free_queue"):
        assert np.array_equal(getattr(run, name)(), getattr(stepped, name)()), name
    for r in rids:
        for a, b in zip(run.tables(r), stepped.tables(r), strict=True):
            assert np.array_equal(a, b)


def test_groups_are_checked() -> None:
    with pytest.raises(ValueError, match="kind"):
        HybridGroup("linear")
    with pytest.raises(ValueError, match="window"):
        HybridGroup(SLIDING, 0)
    with pytest.raises(ValueError, match="two or more"):
        HybridPool(10, 16, [HybridGroup(FULL)])


def test_vllm_groups_of_the_catalog() -> None:
    """vLLM's groups (kv_cache_planning: group_size = the smallest bucket): gpt-oss one
    sliding and one full group of 18 layers; Gemma 3 six sliding groups of 10 (one padded)
    and one full; one-group models and kinds not modelled yet stay on BlockPool."""
    from costmodel.specs import get_spec
    from sim.engines.vllm import vllm_kv_groups

    assert vllm_kv_groups(get_spec("gpt-oss-120b")) == [HybridGroup(SLIDING, 128),
                                                        HybridGroup(FULL)]
    assert vllm_kv_groups(get_spec("gemma-3-27b")) == [HybridGroup(SLIDING, 1024)] * 6 + [
        HybridGroup(FULL)]
    # Qwen3-Next: 36 Gated DeltaNet layers, 12 full: three Mamba groups of 12 and a full one
    assert vllm_kv_groups(get_spec("qwen3-next-80b-a3b")) == [HybridGroup(MAMBA)] * 3 + [
        HybridGroup(FULL)]
    for name in ("qwen3-8b", "deepseek-v3.2"):
        assert vllm_kv_groups(get_spec(name)) is None


def test_a_hybrid_run_uses_the_hybrid_pool(monkeypatch) -> None:
    """gpt-oss-120b on --engine vllm keeps a sliding group: its blocks outside the window go
    back to the pool while the request runs, so the same memory evicts less than one
    full-attention group over every layer did."""
    import sim.engines.vllm as vllm_engine
    from sim.config import RunConfig
    from sim.run import run

    made: list[HybridPool] = []

    class Spy(HybridPool):
        def __init__(self, *a, **k) -> None:
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(vllm_engine.VllmServer, "hybrid_pool_class", Spy)
    cfg = RunConfig.from_flat(engine="vllm", model="gpt-oss-120b",
                              trace="synthetic:claude-code?sessions=4", max_context=32768,
                              gpu_cache=49152, sessions=2, gaps="tool").with_preset("vllm")
    res = run(cfg, None)
    assert len(made) == 1 and [g.kind for g in made[0].groups] == [SLIDING, FULL]
    assert res.summary["requests"] > 0


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_window_models_decode_runs_are_its_steps(monkeypatch, asynchronous: bool) -> None:
    """gpt-oss-120b on --engine vllm in tight memory: a decode run (one event for many V1
    steps) gives the same run as one event per step. Blocks leaving the window free room
    inside a run, and vLLM retries the refused waiting head after every step's running
    rows, so a run with requests waiting ends before the step after which more blocks are
    free than its refusal saw (``VllmServer._refused_at``, ``HybridPool.decode_fit``)."""
    from sim.config import RunConfig
    from tests.enginekit import DECODE_RUN_TRACE, KitTrace, assert_decode_runs_are_steps

    trace = KitTrace(DECODE_RUN_TRACE, shared_blocks=12)
    for preset, cache, budget in (("vllm", 13000, 8192), ("vllm", 10500, 2048),
                                  ("penelope", 10500, 2048)):
        cfg = RunConfig.from_flat(engine="vllm", model="gpt-oss-120b", gpu_cache=cache,
                                  sessions=3, chunk_size=budget, vllm_async=asynchronous,
                                  profile="derived-h100-gpt-oss-120b").with_preset(preset)
        assert_decode_runs_are_steps(monkeypatch, cfg, trace, (
            "hit_gpu_tokens", "recomputed_tokens", "retractions", "decoded_tokens",
            "preempted_recompute_tokens"))


@pytest.mark.parametrize(("model", "flags", "field"), [
    ("gpt-oss-120b", ["--preset", "vllm", "--vllm-patch", "continuum"], "vllm_patch"),
    ("gpt-oss-120b", ["--preset", "vllm", "--vllm-patch", "penelope"], "vllm_patch"),
    ("qwen3-next-80b-a3b", ["--preset", "vllm", "--vllm-patch", "penelope"], "vllm_patch"),
])
def test_what_the_hybrid_pool_does_not_model_is_refused(model: str, flags: list[str],
                                                        field: str) -> None:
    from tests.clikit import invoke

    code, _out, err = invoke("run", "--engine", "vllm", "--model", model, "--trace",
                             "synthetic:claude-code?sessions=2", *flags)
    assert code == 2 and "KV cache groups" in err and field in err
    assert len(err.strip().splitlines()) == 1, err


def test_kv_events_report_the_full_groups_history() -> None:
    """A prefix router's KV events (sim/fleet/kvevents.py): ids cached in the first full
    group are stored with their parent, an id whose last copy there is reused is removed;
    a window group's blocks report nothing."""
    from sim.kvcache.events import BlockRemoved, BlockStored

    pool = HybridPool(8, 4, [HybridGroup(SLIDING, 4), HybridGroup(FULL)])
    pool.enable_events()
    pool.admit(1, np.arange(10, 14), 13, 13)  # 3 full blocks + 1 token
    stored = [e for _t, e in pool.take_events()]
    assert [type(e) for e in stored] == [BlockStored]
    assert stored[0].ids.tolist() == [10, 11, 12] and stored[0].parent == -1
    pool.free(1)
    pool.admit(2, np.arange(20, 24), 16, 16)  # 8 blocks: every cached one is reused
    events = [e for _t, e in pool.take_events()]
    removed = sorted(x for e in events if isinstance(e, BlockRemoved) for x in e.ids.tolist())
    assert removed == [10, 11, 12]


def test_forget_free_drops_every_unheld_hash() -> None:
    """A decode worker without its cache (``--decode-cache off``): what finished requests
    left cached is unhashed in every group and no longer hits."""
    pool = HybridPool(16, 4, [HybridGroup(SLIDING, 4), HybridGroup(FULL)], debug=True)
    ids = np.arange(10, 16)
    pool.admit(1, ids, 21, 21)
    pool.free(1)
    assert pool.lookup(ids, 21) == 5
    pool.forget_free()
    assert pool.lookup(ids, 21) == 0 and pool.cached_blocks == 0 and pool.free_blocks == 16


@pytest.mark.parametrize("reads_shared", [False, True])
def test_the_release_order_says_how_the_pool_frees(reads_shared: bool) -> None:
    """The pool frees in the batches its release order gives (policies/eviction.py
    ``ReleaseOrder.release_groups``), whatever the order's name: vLLM's tail-first order
    under another name still frees group by group, as vLLM's coordinator does; an order of
    its own (here the same ranks) frees position by position, every group's block of a
    position together."""
    from policies.eviction import ReleaseOrder, TailFirst

    class Renamed(TailFirst):
        name = "tail-first"

    class ByPosition(ReleaseOrder):
        name = "by-position"

        def __call__(self, shared: np.ndarray) -> np.ndarray:
            return np.arange(len(shared) - 1, -1, -1, dtype=np.int64)

    ByPosition.reads_shared = reads_shared
    groups = [HybridGroup(SLIDING, 64), HybridGroup(FULL)]
    queues = []
    for order in ("vllm", Renamed(), ByPosition()):
        pool = HybridPool(16, 16, groups, free_order=order, debug=True)
        pool.admit(1, np.arange(10, 14), 64, 64)  # 4 blocks in each group, no nulls
        tables = pool.tables(1)
        pool.free(1)
        queues.append(pool.free_queue()[-8:].tolist())
    per_group = tables[0][::-1].tolist() + tables[1][::-1].tolist()
    by_position = np.stack(tables)[:, ::-1].T.ravel().tolist()
    assert queues == [per_group, per_group, by_position] and per_group != by_position


class _FreedInTurn(HybridPool):
    """``HybridPool``'s frees by their definition: each batch freed in turn as vLLM's
    ``free_blocks`` does (one hold less each, then the unheld hashed blocks join the tail in
    order and the unheld unhashed ones the front, the first of them first), whether the pool
    frees it as arrays (``_free_batches``, ``_free_blocks``) or block by block
    (``_free_few``, a block edge's)."""

    def _free_batches(self, batches) -> None:
        for batch in batches:
            self._free_blocks(np.asarray(batch, np.int64))

    def _free_few(self, batches) -> None:
        self._free_batches(batches)

    def _free_blocks(self, ordered: np.ndarray) -> None:
        blocks = ordered.tolist()
        for p in blocks:
            self._ref[p] -= 1
        unheld = [p for p in blocks if self._ref[p] == 0]
        cached = self.block_ids()  # per block 1..capacity
        self._queue.prepend(np.array([p for p in unheld if cached[p - 1] < 0], np.int64))
        self._queue.append(np.array([p for p in unheld if cached[p - 1] >= 0], np.int64))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), bs=st.sampled_from([4, 8]),
       layout=st.sampled_from(["sw-full", "mamba-mamba-full", "mamba-sw-full"]),
       w=st.integers(1, 40), cap=st.integers(16, 80), order=st.sampled_from(["vllm", "penelope"]))
def test_batched_frees_are_the_batches_freed_in_turn(seed: int, bs: int, layout: str, w: int,
                                                     cap: int, order: str) -> None:
    """A release, and a window's or a Mamba state's retirement, free every group's blocks in
    one pass (``_free_batches``: the unhashed ones of a later group before an earlier's at
    the front; a block edge's few one by one, ``_free_few``); the same ops freeing group by
    group, each batch as vLLM's ``free_blocks``, leave the same queue, holds, hashes and
    tables. Requests share prefixes and stop inside blocks, so releases free hashed and
    unhashed blocks of several groups at once."""
    groups = {"sw-full": [HybridGroup(SLIDING, w), HybridGroup(FULL)],
              "mamba-mamba-full": [HybridGroup(MAMBA), HybridGroup(MAMBA), HybridGroup(FULL)],
              "mamba-sw-full": [HybridGroup(MAMBA), HybridGroup(SLIDING, w),
                                HybridGroup(FULL)]}[layout]
    pools = [kind(cap, bs, groups, max_in_flight_tokens=2 * bs, free_order=order, debug=True)
             for kind in (HybridPool, _FreedInTurn)]
    rng = np.random.default_rng(seed)
    running: list[int] = []
    for rid in range(60):
        for p in pools:
            p.new_step()  # a Mamba state cached by one op may be hit by the next
        op = int(rng.integers(3))
        if op == 0 or not running:
            ids = np.arange(rid * 100, rid * 100 + 40)
            shared = int(rng.integers(0, 6))
            ids[:shared] = np.arange(shared)  # a prefix other requests hold or cached
            n = int(rng.integers(1, 10 * bs))
            got = [p.admit(rid, ids, n, n) for p in pools]
            assert got[0] == got[1]
            if got[0] is not None:
                running.append(rid)
        elif op == 1:
            r = running[int(rng.integers(len(running)))]
            n = int(rng.integers(1, 2 * bs))
            c = pools[0].computed_tokens(r)
            if (c + n) // bs > 40:
                continue
            known = c + n - int(rng.integers(0, 2))  # the last token may not be known yet
            in_flight = int(rng.integers(0, 2))
            ok = [p.extend(r, n, known=known, in_flight=in_flight) for p in pools]
            assert ok[0] == ok[1]
        else:
            r = running.pop(int(rng.integers(len(running))))
            for p in pools:
                p.free(r)
        for name in ("block_ids", "block_groups", "ref_counts", "free_queue"):
            assert np.array_equal(getattr(pools[0], name)(), getattr(pools[1], name)()), name
        for r in running:
            for a, b in zip(pools[0].tables(r), pools[1].tables(r), strict=True):
                assert np.array_equal(a, b)
