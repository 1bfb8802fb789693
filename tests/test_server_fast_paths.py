"""The one-server fast paths against their plain references: each must leave every result as
the plain code computes it.

- the SGLang engine's chunk continuation (``SGLangServer._continue_alone``): a pass that can
  only continue the chunk in flight skips the adder loop and ``_commit``'s bookkeeping; the
  reference runs every pass through them;
- the planner's inlined chains of the built-in starts: the reference is the same start
  behind a ``WrappedStart``, which the planner asks through ``chain``;
- ``insert(..., lock=True)`` against ``insert`` then ``lock``;
- a prefill batch's units summed as numbers against ``Units`` additions.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.run.build
from costmodel.profile import Profile, ServerCoeffs, load_profile
from costmodel.specs import get_spec
from costmodel.units import Units
from policies import BLOCK, LEAF_HEAD, NODE, PRIVATE_HEAD, TAIL, EvictionPolicy
from policies.eviction import WrappedStart
from sim.config import RunConfig
from sim.engines import SGLangServer, engine_class
from sim.engines.base import EngineBase
from sim.kvcache import RadixKVCache
from sim.run import run
from tests.cachepair import OPS, drive_pair
from tests.enginekit import KitTrace


class PlainSGLang(SGLangServer):
    """Every pass through the adder loop and ``_commit`` (no continuation fast path)."""

    calls = 0

    def _continue_alone(self, req, take, base):
        PlainSGLang.calls += 1
        return None


SESSIONS = st.lists(st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 300),
                                       st.floats(0.0, 5.0)), min_size=1, max_size=5),
                    min_size=1, max_size=6)


def _kit(sessions) -> KitTrace:
    """Append-only sessions: each prompt is the previous one plus the drawn growth."""
    out = []
    for turns in sessions:
        total, reqs = 0, []
        for grow, output, gap in turns:
            total += grow
            reqs.append((total, output, gap))
            total += output
        out.append(reqs)
    return KitTrace(out, shared_blocks=[3, 3, 0, 3, 0, 3][: len(out)])


def _outputs(cfg: RunConfig, trace) -> tuple[dict, pd.DataFrame]:
    res = run(cfg, trace)
    return json.dumps(res.summary, sort_keys=True, default=str), res.requests  # NaN-safe


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions=SESSIONS, preset=st.sampled_from(["sglang", "penelope"]),
       scheduler=st.sampled_from(["fcfs", "lpm"]), cache_k=st.integers(4, 24),
       chunk=st.sampled_from([64, 256, 1000, 8192]), concurrent=st.integers(1, 6),
       tiers=st.sampled_from([None, "unified", "hicache"]))
def test_chunk_continuation_runs_as_the_plain_passes(sessions, preset, scheduler, cache_k,
                                                     chunk, concurrent, tiers) -> None:
    if tiers == "hicache" and preset == "penelope":
        tiers = "unified"  # HiCache's device tier evicts from the tail only
    cpu = dict(cpu_cache=8192, tiering=tiers) if tiers else {}
    cfg = RunConfig.from_flat(gpu_cache=cache_k * 1024, sessions=concurrent, chunk_size=chunk,
                              scheduler=scheduler, debug_cache=True, **cpu).with_preset(preset)
    trace = _kit(sessions)
    fast = _outputs(cfg, trace)
    before = PlainSGLang.calls
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sim.run.build, "engine_class", lambda c: PlainSGLang)
        plain = _outputs(cfg, trace)
    if json.loads(fast[0])["prefill_batches"] > len(trace):  # some request was chunked
        assert PlainSGLang.calls > before  # the reference really took the plain passes
    assert fast[0] == plain[0]
    pd.testing.assert_frame_equal(fast[1], plain[1])


def test_plain_reference_is_the_engine_of_the_run() -> None:
    """The patched name is the one the run builds through (else the test above is void)."""
    assert engine_class(RunConfig()) is SGLangServer
    assert sim.run.build.engine_class is engine_class


@pytest.mark.parametrize("start,granularity",
                         [(PRIVATE_HEAD, BLOCK), (PRIVATE_HEAD, NODE), (TAIL, BLOCK),
                          (TAIL, NODE), (LEAF_HEAD, NODE)], ids=lambda x: x.name)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_inlined_chains_plan_as_the_start_objects(start, granularity, ops) -> None:
    fast = RadixKVCache(20, EvictionPolicy(order="lru", start=start, granularity=granularity),
                        debug=True)
    slow = RadixKVCache(20, EvictionPolicy(order="lru", start=WrappedStart(start),
                                           granularity=granularity), debug=True)
    assert fast.policy.start is start and slow.policy.start is not start
    drive_pair(fast, slow, ops)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, preset=st.sampled_from(["sglang", "vllm", "penelope"]))
def test_insert_and_lock_in_one_call(ops, preset) -> None:
    fused = RadixKVCache(20, preset, debug=True)
    apart = RadixKVCache(20, preset, debug=True)
    drive_pair(fused, apart, ops, fused=True)


class _Prompt:
    def __init__(self, spec) -> None:
        self.spec = spec

    def units(self, spec, a: int, b: int) -> Units:
        from costmodel.units import range_units
        return range_units(spec, a, b)


class _Req:
    def __init__(self, prompt, redo_until: int = 0) -> None:
        self.prompt, self.redo_until = prompt, redo_until


class _Profile:
    def prefill_seconds(self, units: Units) -> float:
        self.seen = units
        return 0.0


def test_step_cpu_is_priced_only_where_the_server_has_it(tmp_path, monkeypatch) -> None:
    """A prefill batch's server CPU time (``Profile.step_seconds``) is asked only of a profile
    whose server has CPU terms (a neutral one answers the kernels' seconds unchanged), and
    such a server still pays it: SGLang overlaps it, so a batch takes the larger of the two."""
    calls: list[int] = []
    plain = Profile.step_seconds

    def counted(self, gpu_s, seqs, tokens):
        calls.append(seqs)
        return plain(self, gpu_s, seqs, tokens)

    monkeypatch.setattr(Profile, "step_seconds", counted)
    trace = _kit([[(900, 40, 0.0), (300, 20, 1.0)], [(700, 30, 0.0)]])
    cfg = RunConfig.from_flat(gpu_cache=16 * 1024, sessions=2, chunk_size=256).with_preset("sglang")
    neutral = run(cfg, trace).summary
    assert not calls and neutral["prefill_batches"] > 0
    path = tmp_path / "cpu.yaml"
    load_profile(cfg.cache.profile, cfg.cache.model).with_server(
        ServerCoeffs(cpu_step_s=1.0), "t").dump(path)
    paid = run(cfg.with_fields(profile=str(path)), trace).summary
    assert calls and min(calls) >= 1  # asked for every batch, each of one request or more
    assert paid["ttft_mean_s"] >= 1.0 > neutral["ttft_mean_s"]


RANGES = st.lists(st.lists(st.tuples(st.integers(0, 200_000), st.integers(0, 9000)),
                           min_size=1, max_size=4), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(batch=RANGES, spec=st.sampled_from(["qwen3-8b", "gpt-oss-120b", "gemma-3-27b"]))
@pytest.mark.pure_path("hands the engine's pricing stand-in requests, which compiled code refuses")
def test_units_summed_as_numbers_are_the_units_sums(batch, spec) -> None:
    model = get_spec(spec)
    prompt = _Prompt(model)
    reqs = [(_Req(prompt), [(a, a + n) for a, n in ranges]) for ranges in batch]
    engine = EngineBase.__new__(EngineBase)  # only the pricing state is read
    engine.spec, engine.profile, engine._rerotate_s = model, _Profile(), 0.0
    _seconds, per_req = engine._prefill_seconds(reqs)
    total = Units()
    for (req, ranges), got in zip(reqs, per_req, strict=True):
        u = Units()
        for a, b in ranges:
            u = u + req.prompt.units(model, a, b)
        assert tuple(got) == tuple(u) and type(got) is Units
        total = total + u
    assert tuple(engine.profile.seen) == tuple(total)
