"""``--engine vllm --vllm-patch penelope`` (sim/engines/vllm_patch.py, ``HolePool`` in
sim/kvcache/blockpool.py): the lookup continues past missing blocks, which are refilled in the
request's own step.

The timelines are hand-built (tests/enginekit.KitTrace, 64-token blocks) so that exactly the
first two blocks of a session's history are evicted while it waits:

- s0 r0: 640 tokens (10 blocks, ids a0..a9), 1 output token, at t = 0; on finish, penelope
  releases its private history front first: the free queue is [14 never-used blocks] then
  [a0 .. a9].
- s1 r0: 1024 tokens (16 blocks), starts at ``S1_START`` (after s0 r0 finished): it pops the
  14 unused blocks and then a0, a1 (lazy eviction drops their ids): a HOLE of 2 blocks.
- s0 r1: 1280 tokens (20 blocks) after ``GAP``: stock vLLM's lookup stops at a0 and computes
  all 1280 tokens; the patched lookup reuses a2..a9 (512 tokens) and computes the hole
  [0, 128) and the new tokens [640, 1280) in the same step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.eviction import penelope_free_order, vllm_free_order
from sim.cli.main import cli
from sim.config import ConfigError, RunConfig
from sim.engines import VllmServer
from sim.kvcache.blockpool import BlockPool, HolePool, computed_ranges, reused_runs, span
from sim.run import run
from tests.enginekit import PROF, KitTrace, instances, prefill, row
from tests.test_vllm_blockpool import BS as BS4
from tests.test_vllm_blockpool import BruteForce

BS = 64
S1_START = 0.05
GAP = 0.2
GOLDEN = Path(__file__).parent / "goldens" / "vllm_unpatched.json"


def patch_cfg(patch: str = "penelope", preset: str = "penelope", **kw) -> RunConfig:
    # the hand-computed timelines are the synchronous scheduler's (async has its own tests)
    base = dict(engine="vllm", vllm_patch=patch, gpu_cache=24 * BS, sessions=4,
                debug_cache=True, profile=PROF.name, vllm_async=False)
    base.update(kw)
    return RunConfig.from_flat(**base).with_preset(preset)


def hole_trace(extra: list | None = None) -> KitTrace:
    sessions = [[(640, 1, 0.0), (1280, 1, GAP)], [(1024, 1, 0.0)]] + (extra or [])
    trace = KitTrace(sessions)
    trace.sessions[1].start_offset_s = S1_START
    return trace


@pytest.fixture
def vllm_servers(monkeypatch) -> list[VllmServer]:
    return instances(monkeypatch, VllmServer)


# --- the engine: hand-computed timelines ---------------------------------------------------
def test_a_hole_is_refilled_in_the_requests_own_step(vllm_servers) -> None:
    t0 = prefill((0, 640))
    assert S1_START > t0 and GAP > S1_START + prefill((0, 1024))  # the timeline above holds
    patched = run(patch_cfg(), hole_trace())
    r1 = row(patched, "s0", 1)
    # one step: the hole [0, 128) and the new tokens [640, 1280), priced at their positions
    assert r1.send_s == pytest.approx(t0 + GAP)
    assert r1.ttft_s == pytest.approx(prefill((0, 128), (640, 1280)), rel=1e-12)
    assert (r1.hit_gpu_tokens, r1.hole_tokens, r1.recomputed_tokens, r1.new_tokens) == (
        512, 128, 128, 640)
    assert r1.ideal_hit_tokens == 640
    assert patched.summary["vllm_patch"] == "penelope"
    # afterwards the whole history is cached again: the refilled hole and the new blocks
    pool = vllm_servers[-1].pool
    assert isinstance(pool, HolePool)
    s0 = hole_trace().finish_block_ids(1)
    assert all(pool.is_cached(int(x)) for x in s0)
    # stock vLLM with the same free order: the lookup stops at the hole
    stock = row(run(patch_cfg(patch="none"), hole_trace()), "s0", 1)
    assert stock.ttft_s == pytest.approx(prefill((0, 1280)), rel=1e-12)
    assert (stock.hit_gpu_tokens, stock.recomputed_tokens) == (0, 640)
    assert "vllm_patch" not in run(patch_cfg(patch="none"), hole_trace()).summary


def test_a_hole_that_does_not_fit_the_budget_is_chunked_like_a_prefill() -> None:
    # A budget of 100 tokens: the 768 tokens to compute take 8 steps; the second one ends
    # the hole and starts the new tokens (one row, two ranges); the reused blocks between
    # them cost nothing.
    res = run(patch_cfg(chunk_size=100), hole_trace())
    r1 = row(res, "s0", 1)
    steps = [[(0, 100)], [(100, 128), (640, 712)]] + [
        [(a, min(a + 100, 1280))] for a in range(712, 1280, 100)]
    assert sum(b - a for s in steps for a, b in s) == 768
    assert all(sum(b - a for a, b in s) == 100 for s in steps[:-1])
    assert r1.ttft_s == pytest.approx(sum(prefill(*s) for s in steps), rel=1e-12)
    assert (r1.hit_gpu_tokens, r1.hole_tokens, r1.new_tokens) == (512, 128, 640)
    assert res.summary["prefill_batches"] == 7 + 11 + len(steps)  # 640, 1024 and 768 tokens
    assert S1_START > sum(prefill((a, min(a + 100, 640))) for a in range(0, 640, 100))


def test_the_budget_is_shared_with_decode_as_for_any_prefill(monkeypatch) -> None:
    # s2 (64 tokens, 64 outputs: 2 blocks, decoding from the first step to well after s0 r1
    # arrives) rides along. With a budget of 512, the step that admits s0 r1 gives s2's
    # decode row its token first; s0 r1 gets 511 tokens: the hole [0, 128) and [640, 1023)
    # (the reused [128, 640) is skipped for free); the next step: s2 again, then
    # [1023, 1280). A mixed step costs max(prefill of every row's ranges, decode step).
    steps: list[tuple[list, float]] = []
    seconds = VllmServer._step_seconds

    def spy(self, step):
        t = seconds(self, step)
        steps.append(([(r.rid, dec, s, n) for (r, s, n), dec in zip(step.rows, step.decode,
                                                                       strict=True)], t))
        return t

    monkeypatch.setattr(VllmServer, "_step_seconds", spy)
    trace = hole_trace(extra=[[(64, 64, 0.0)]])
    res = run(patch_cfg(gpu_cache=26 * BS, chunk_size=512), trace)
    r1 = row(res, "s0", 1)
    s2 = row(res, "s2", 0)
    assert s2.end_s > r1.first_token_s  # s2 decodes throughout
    assert (r1.hit_gpu_tokens, r1.hole_tokens, r1.new_tokens) == (512, 128, 640)
    mine = [(rows, t) for rows, t in steps if any(rid == 1 for rid, *_ in rows)]
    assert len(mine) == 2
    (first, t1), (second, t2) = mine
    (d1, d1_dec, p1, n1), (a1, _, s1, m1) = first
    (d2, _, p2, _), (a2, _, s2_, m2) = second
    assert (d1, d1_dec, n1, a1, s1, m1) == (3, True, 1, 1, 0, 1023)
    assert (d2, a2, s2_, m2, p2) == (3, 1, 1023, 257, p1 + 1)
    assert t1 == pytest.approx(max(prefill((p1, p1 + 1), (0, 128), (640, 1023)),
                                   PROF.decode_step_seconds(1, p1)), rel=1e-12)
    assert t2 == pytest.approx(max(prefill((p2, p2 + 1), (1023, 1280)),
                                   PROF.decode_step_seconds(1, p2)), rel=1e-12)
    assert r1.first_token_s - r1.admit_s == pytest.approx(t1 + t2, rel=1e-12)


# request columns added after the golden was saved (tests/goldens/CHANGES.md)
COLUMNS_SINCE = ("tpot_s", "itl_max_s", "aborted")


# --- without --vllm-patch nothing moves ----------------------------------------------------
def test_unpatched_vllm_runs_are_byte_identical_to_before_the_patch() -> None:
    """Summaries and per-request tables of stock vllm-engine runs, saved from the code before
    the patch existed (tests/goldens/vllm_unpatched.json)."""
    import hashlib

    want = json.loads(GOLDEN.read_text())
    synth = dict(trace="synthetic:claude-code?sessions=12", max_context=65536, gaps="tool",
                 gpu_cache=98304, sessions=4, model="qwen3-8b",
                 profile="derived-h100-qwen3-8b", engine="vllm", vllm_async=False)
    for key, golden in want.items():
        preset, chunk = key.split("/")
        r = run(RunConfig.from_flat(**synth, chunk_size=int(chunk.removeprefix("chunk")))
                .with_preset(preset))
        got = json.loads(json.dumps(r.summary, default=str).replace("NaN", "null"))
        # the requests table on the columns the golden was saved with (later ones: new data)
        got["requests_sha1"] = hashlib.sha1(r.requests.drop(
            columns=list(COLUMNS_SINCE)).to_csv(index=False).encode()).hexdigest()
        if os.environ.get("KVSIM_REGEN_GOLDENS") == "1":  # tests/goldens/CHANGES.md says why
            want[key] = got
            continue
        assert {k: got.get(k) for k in golden} == golden, key  # the fields it pins
    if os.environ.get("KVSIM_REGEN_GOLDENS") == "1":
        GOLDEN.write_text(json.dumps(want, indent=1, sort_keys=True) + "\n")


# --- configuration -------------------------------------------------------------------------
def test_the_patch_is_refused_on_the_sglang_engine() -> None:
    res = CliRunner().invoke(cli, ["run", "--engine", "sglang", "--vllm-patch", "penelope",
                                   "--preset", "penelope"])
    assert res.exit_code == 2
    assert "vllm_patch" in res.output and "--engine vllm" in res.output
    with pytest.raises(ConfigError, match="vllm_patch"):
        RunConfig.from_flat(vllm_patch="lmcache", engine="vllm").validate()
    assert RunConfig.from_flat(engine="vllm", vllm_patch="penelope").engine_label == (
        "vllm+penelope-patch")
    assert RunConfig.from_flat(engine="vllm").engine_label == "vllm"


def test_the_cli_reports_the_patch(tmp_path) -> None:
    from tests.enginekit import write_cc_traces

    write_cc_traces(tmp_path / "tr", sessions=3, turns=4)
    res = CliRunner().invoke(cli, ["run", "--trace", str(tmp_path / "tr"), "--engine", "vllm",
                                   "--vllm-patch", "penelope", "--preset", "vllm,penelope",
                                   "--gpu-cache", "16k", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [r["engine"] for r in doc["runs"]] == ["vllm+penelope-patch"] * 2
    assert all(r["summary"]["vllm_patch"] == "penelope" for r in doc["runs"])


# --- the pool: span and ranges against a token-by-token reference ---------------------------
def _brute_reused(hit: list[bool], bs: int, start: int, end: int, budget: int) -> tuple[int, int]:
    """Walk positions one by one: reused blocks (after the first miss) are free."""
    first_miss = hit.index(False) if False in hit else len(hit)
    reused = {i for i, h in enumerate(hit) if h and i > first_miss}
    x, cost = start, 0
    while x < end:
        free = x // bs in reused
        if not free and cost == budget:
            break
        cost += not free
        x += 1
    return x - start, cost


@settings(max_examples=300, deadline=None)
@given(st.lists(st.booleans(), min_size=0, max_size=12), st.integers(1, 4),
       st.integers(1, 400), st.data())
def test_span_and_computed_ranges_match_a_token_walk(hit, bs_mult, budget, data) -> None:
    bs = 8 * bs_mult
    runs = reused_runs(np.array(hit, bool))
    first_miss = hit.index(False) if False in hit else len(hit)
    end = len(hit) * bs + data.draw(st.integers(1, 3 * bs))
    start = data.draw(st.integers(min(first_miss, len(hit)) * bs, end - 1))
    if any(a * bs < start < b * bs for a, b in runs):
        start = next(b * bs for a, b in runs if a * bs < start < b * bs)
    n, cost = span(runs, bs, start, end, budget)
    bn, bcost = _brute_reused(hit, bs, start, end, budget)
    assert cost == bcost and cost <= budget
    # the span stops at the reference's stop, or (when the budget is spent just before a
    # reused run) the reference walks on over it for free: both compute the same tokens
    got = computed_ranges(runs, bs, start, start + n)
    ref = computed_ranges(runs, bs, start, start + bn)
    assert got == ref and sum(b - a for a, b in got) == cost
    assert all(not any(ra * bs < b and a < rb * bs for ra, rb in runs) for a, b in got)


def test_without_holes_the_patched_pool_is_the_stock_pool() -> None:
    """A tail-first stream that never leaves a hole: every admission, hit and free-queue
    state of HolePool equals BlockPool's."""
    rng = np.random.default_rng(3)
    a, b = BlockPool(40, 4), HolePool(40, 4)
    ids = np.arange(200, dtype=np.int64)
    for rid in range(60):
        n = int(rng.integers(2, 30))
        tokens = n * 4 + int(rng.integers(1, 4))
        seq = ids[: n + 1]
        assert a.lookup(seq, tokens) == b.lookup(seq, tokens)
        ha = a.admit(rid, seq, tokens, 1 << 20)
        hb = b.admit(rid, seq, tokens, 1 << 20)
        assert ha == hb
        if ha is not None:
            a.free(rid)
            b.free(rid)
        assert np.array_equal(a.free_queue(), b.free_queue())
        assert np.array_equal(a.block_ids(), b.block_ids())


@pytest.mark.parametrize("budget", [8192, 2048, 300])
def test_patched_runs_under_pressure_keep_every_invariant(budget: int) -> None:
    """Tight memory, a shared prefix, chunked prefills, decode runs and preemptions: the pool's
    invariants are recounted after every operation (``debug_cache``), every request is
    served, holes are refilled, and each prompt's tokens add up."""
    trace = KitTrace([[(1500 + 700 * k, 400 + 150 * k, 1.0 + 0.3 * k) for k in range(6)]
                      for _ in range(4)], shared_blocks=12)
    res = run(patch_cfg(gpu_cache=8000, sessions=3, chunk_size=budget), trace)
    s, df = res.summary, res.requests
    assert s["requests"] == len(trace) and s["dropped_requests"] == 0
    assert s["hole_tokens"] > 0 and s["retractions"] > 0
    assert (df.hit_gpu_tokens + df.recomputed_tokens + df.new_tokens == df.prompt_tokens).all()
    assert (df.hole_tokens <= df.recomputed_tokens).all()


# --- the pool against a brute-force model ---------------------------------------------------
class BruteHoles(BruteForce):
    """The patched lookup and allocation over tests/test_vllm_blockpool.BruteForce (vLLM's
    pool as plain Python): every cached block of the chain up to the cap is reused, holes
    get fresh blocks, a step computes tokens one by one and skips reused blocks."""

    def match(self, ids, n) -> list[bool]:
        hit = [bool(self.copies.get(int(x))) for x in ids[: min(len(ids), (n - 1) // self.bs)]]
        while hit and not hit[-1]:
            hit.pop()
        return hit

    def lookup(self, ids, n) -> int:
        return sum(self.match(ids, n))

    def admit(self, rid, ids, n, k, full=True):
        bs = self.bs
        hit = self.match(ids, n)
        h = hit.index(False) if False in hit else len(hit)
        reused = {j for j in range(h, len(hit)) if hit[j]}
        x, cost = h * bs, 0
        while x < n:  # k tokens to compute; reused blocks on the way are free
            if cost == k:
                break
            if x // bs in reused:
                x = (x // bs + 1) * bs
                continue
            cost += 1
            x += 1
        hits = {j: self.copies[int(ids[j])][0] for j in range(len(hit)) if hit[j]}
        ev = sum(self.ref[p] == 0 for p in hits.values())
        if full and max(-(-n // bs) - len(hits), 0) + ev > len(self.queue):
            return None
        blocks = max(len(hit), -(-x // bs))
        if blocks - len(hits) + ev > len(self.queue):
            return None
        for p in hits.values():
            if self.ref[p] == 0:
                self.queue.remove(p)
            self.ref[p] += 1
        fresh = iter(self._pop(blocks - len(hits)))
        table = [hits[j] if j in hits else next(fresh) for j in range(blocks)]
        seq = [ids, table, x, h, reused]
        self.seqs[rid] = seq
        self._cache(seq)
        return h

    def _cache(self, seq) -> None:
        ids, table, computed, cached = seq[:4]
        for j in range(cached, computed // self.bs):
            if j in seq[4]:
                continue
            x = int(ids[j])
            self.bid[table[j]] = x
            self.copies.setdefault(x, []).append(table[j])
            self.parent[x] = int(ids[j - 1]) if j else -1
        seq[3] = max(cached, computed // self.bs)

    def free(self, rid) -> None:
        self.seqs[rid] = self.seqs[rid][:4]
        super().free(rid)


def _hole_pool_stream(draw, order: str, cap: int) -> int:
    """Three sessions over a one-block shared prefix, each prompt extending its session's
    chain (what makes Penelope's holes), with admissions, chunk extensions and frees drawn
    by ``draw(kind, lo, hi)``: the patched pool and the brute-force model are compared
    after every call. Returns how many admissions reused blocks past a hole."""
    order_fn = {"vllm": vllm_free_order, "penelope": penelope_free_order}[order]
    pool, ref = HolePool(cap, BS4, order, debug=True), BruteHoles(cap, BS4, order_fn)
    ids: dict[tuple, int] = {}
    length = [2, 2, 2]
    running: list[int] = []
    holes = 0
    for rid in range(draw("steps", 1, 30)):
        action = ("admit", "extend", "free", "admit")[draw("action", 0, 3)]
        if action == "admit" or not running:
            s = draw("session", 0, 2)
            length[s] = min(length[s] + draw("grow", 0, 2), cap - 2)
            chain = [ids.setdefault(key, len(ids))
                     for key in [("shared", 0)] + [(s, i) for i in range(length[s])]]
            n = len(chain) * BS4 - draw("short", 0, 3)
            k = n if draw("whole", 0, 2) else draw("k", 1, n)
            assert pool.lookup(np.array(chain, np.int64), n) == ref.lookup(chain, n)
            a = pool.admit(rid, np.array(chain, np.int64), n, k, full_sequence_must_fit=False)
            assert a == ref.admit(rid, chain, n, k, full=False)
            if a is not None:
                running.append(rid)
                holes += bool(pool.reuse_of(rid)[1])
                assert pool.computed_tokens(rid) == ref.seqs[rid][2]
                assert pool.table(rid).tolist() == ref.seqs[rid][1]
        elif action == "extend":
            r = running[draw("which", 0, len(running) - 1)]
            start = pool.computed_tokens(r)
            end = len(ref.seqs[r][0]) * BS4
            if end > start:
                n, cost = pool.span(r, start, end, draw("budget", 1, end - start))
                assert sum(b - a for a, b in pool.computed_ranges(r, start, start + n)) == cost
                assert pool.extend(r, n) == ref.extend(r, n)
        else:
            r = running.pop(draw("which", 0, len(running) - 1))
            pool.free(r)
            ref.free(r)
        assert pool.block_ids().tolist() == ref.bid[1:]
        assert pool.ref_counts().tolist() == ref.ref[1:]
        assert pool.free_queue().tolist() == ref.queue
    return holes


@settings(max_examples=80, deadline=None)
@given(data=st.data(), order=st.sampled_from(["vllm", "penelope"]), cap=st.integers(6, 20))
def test_hole_pool_matches_brute_force(data, order: str, cap: int) -> None:
    _hole_pool_stream(lambda kind, lo, hi: data.draw(st.integers(lo, hi), label=kind),
                      order, cap)


def test_hole_pool_matches_brute_force_on_streams_with_holes() -> None:
    """The same comparison on 120 seeded streams under penelope's order, which make holes."""
    import random

    def seeded(rng: random.Random):
        def draw(kind: str, lo: int, hi: int) -> int:
            if kind == "steps":
                return 40
            if kind == "action":  # admit 9, free 9, extend 2 in 20
                return rng.choice([0] * 9 + [2] * 9 + [1] * 2)
            return rng.randint(lo, hi)
        return draw

    holes = 0
    for seed in range(120):
        rng = random.Random(seed)
        holes += _hole_pool_stream(seeded(rng), "penelope", rng.randint(8, 20))
    assert holes >= 50


def test_sweep_points_keep_their_ids_and_the_patch_is_a_grid_key(tmp_path) -> None:
    """Unpatched points keep the ids they had before the field existed (sweeps resume), and
    ``vllm_patch`` is a grid key like any other (its rows carry the summary field)."""
    from sim.sweep import load_sweep, point_id

    # ids computed by the code before vllm_patch existed
    # (sync vLLM points: async ones get new ids, their results moved)
    assert point_id(RunConfig.from_flat(engine="vllm", preset="penelope", gpu_cache=98304,
                                        vllm_async=False)) == "27ea1e0cbedf"
    assert point_id(RunConfig()) == "90411c5a0aae"
    cfg = tmp_path / "s.yaml"
    cfg.write_text("base: {engine: vllm, preset: penelope, gpu_cache: 96k, vllm_async: off}\n"
                   "grid: {vllm_patch: [none, penelope]}\n")
    sweep = load_sweep(cfg)
    assert [p.cfg.engine.vllm_patch for p in sweep.points] == ["none", "penelope"]
    assert sweep.points[0].id == "27ea1e0cbedf" != sweep.points[1].id
    cfg.write_text("base: {engine: sglang, preset: penelope}\ngrid: {vllm_patch: [penelope]}\n")
    with pytest.raises(ConfigError, match="vllm_patch"):
        load_sweep(cfg)
