"""Penelope's release order on vLLM's hybrid pool (sim/kvcache/hybridpool.py ``HybridPool.free``
with ``free_order="penelope"``) against a brute-force reference built on the REAL vLLM
``HybridKVCacheCoordinator`` (benchmarks/vllm_hybrid_ref.py).

Real vLLM has no Penelope: every manager frees its blocks tail first. The reference keeps
vLLM's own coordinator, managers and block pool for everything else and replaces only the
release at a finish or a preemption by the rule written out naively: take every group's table
before vLLM pops it, mark the positions up to the deepest block of the first full-attention
group whose id has two or more distinct cached continuations there (counted by scanning every
physical block) or that another request holds, then hand ``BlockPool.free_blocks`` the private
positions front first and the shared ones tail first, each position's blocks in group order
(nulls skipped). Both sides are driven by vLLM's V1 protocol (benchmarks/vllm_ops.py) and must
agree after every op on the op's result and the whole state, the free queue included.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.opstream import OpStream, random_stream
from benchmarks.vllm_ops import DriverConfig, ModelSide, RealSide, drive
from sim.kvcache.hybridpool import FULL, MAMBA, SLIDING, HybridGroup, HybridPool
from tests.diffkit import same_pool_state

pytestmark = pytest.mark.usefixtures("vllm")  # each pinned vLLM (tests/conftest.py)

LAYOUTS = {
    "sw-full": [HybridGroup(SLIDING, 128), HybridGroup(FULL)],
    "full-sw": [HybridGroup(FULL), HybridGroup(SLIDING, 100)],
    "two-windows": [HybridGroup(SLIDING, 40), HybridGroup(FULL), HybridGroup(SLIDING, 200)],
    "mamba-full": [HybridGroup(MAMBA), HybridGroup(FULL)],
    "mamba-sw-full": [HybridGroup(MAMBA), HybridGroup(SLIDING, 64), HybridGroup(FULL)],
}


class PenelopeReal(RealSide):
    """The real coordinator whose ``free`` releases in Penelope's order (module doc)."""

    def __init__(self, capacity_blocks: int, block_size: int, full: bool,
                 groups: list[HybridGroup], in_flight: int | None) -> None:
        super().__init__(capacity_blocks, block_size, full, groups=groups, in_flight=in_flight)
        self.parent: dict[int, int] = {}  # chained ids: an id's parent is fixed
        self.ids: dict[int, np.ndarray] = {}
        self.full_group = [g.kind for g in groups].index(FULL)
        self.releases = Counter()
        self.ref.manager.coordinator.free = self._free

    def _ensure(self, rid: int, ids: np.ndarray, num_tokens: int) -> None:
        prev = -1
        for x in np.asarray(ids).tolist():
            self.parent.setdefault(x, prev)
            prev = x
        self.ids[rid] = np.asarray(ids, np.int64)
        super()._ensure(rid, ids, num_tokens)

    def _children(self, x: int) -> int:
        """Distinct ids cached in the full group whose parent is ``x``, from every block."""
        ref = self.ref
        groups = ref.block_groups()
        cached = {ref._id_of(b) for b, g in zip(ref.pool.blocks[1:], groups, strict=True)
                  if g == self.full_group}
        return sum(1 for y in cached if self.parent.get(y) == x)

    def _free(self, request_id: str) -> None:
        managers = self.ref.manager.coordinator.single_type_managers
        tables = [list(m.req_to_blocks.get(request_id, [])) for m in managers]
        cached = managers[self.full_group].num_cached_block.get(request_id, 0)
        for m in managers:
            m.pop_blocks_for_free(request_id)  # vLLM's bookkeeping; the order is ours
        length = max((len(t) for t in tables), default=0)
        assert all(len(t) == length for t in tables), "tables of one request differ in length"
        ids = self.ids[int(request_id)]
        full = tables[self.full_group]
        last = -1
        for j in range(cached):
            if full[j].ref_cnt >= 2 or self._children(int(ids[j])) >= 2:
                last = j
        self.releases["shared"] += last + 1
        positions = list(range(last + 1, length)) + list(range(last, -1, -1))
        ordered = [t[j] for j in positions for t in tables if not t[j].is_null]
        self.releases["blocks"] += len(ordered)
        self.ref.pool.free_blocks(ordered)


def lockstep(stream: OpStream, config: DriverConfig, groups: list[HybridGroup],
             in_flight: int | None) -> Counter:
    cap = stream.capacity_blocks * len(groups)
    bs = stream.block_size
    real = PenelopeReal(cap, bs, config.full_sequence_must_fit, groups, in_flight)
    model = ModelSide(cap, bs, "penelope", config.full_sequence_must_fit, groups=groups,
                      in_flight=in_flight)
    model.pool = HybridPool(cap, bs, groups, max_in_flight_tokens=in_flight,
                            free_order="penelope", debug=True)
    seen: Counter = Counter()

    def on_op(kind: int, rid: int, k: int, results: list[Any]) -> None:
        where = f"{stream.name} op {seen['ops']} kind {kind} r{rid} k={k}"
        assert results[0] == results[1], f"{where}: reference {results[0]} != kvsim {results[1]}"
        same_pool_state(where, real.observe(), model.observe())
        seen["ops"] += 1

    drive(stream, [real, model], config, on_op)
    seen.update(real.releases)
    return seen


def _case(seed: int) -> tuple[OpStream, DriverConfig, int | None]:
    bs = (16, 32)[seed % 2]
    cap = (24, 40, 64)[(seed // 2) % 3]
    stream = random_stream(seed, n_ops=120, capacity_blocks=cap, block_size=bs, aligned=0.3,
                           resend=0.3)
    config = DriverConfig(max_running=1 + seed % 4, active=2 + seed % 5,
                          chunk=(None, 3 * bs, 50)[seed % 3], decode=(1, bs, 2 * bs)[seed % 3],
                          seed=seed, full_sequence_must_fit=seed % 5 != 4)
    return stream, config, (None, 64, 256)[seed % 3]


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10**6), layout=st.sampled_from(sorted(LAYOUTS)))
def test_penelope_release_matches_the_brute_force(seed: int, layout: str) -> None:
    stream, config, in_flight = _case(seed)
    lockstep(stream, config, LAYOUTS[layout], in_flight)


def test_penelope_release_is_exercised() -> None:
    """Not vacuous: shared prefixes are kept back, many blocks are released, and the free
    queue differs from vLLM's own order somewhere (else the test could not tell them apart)."""
    total: Counter = Counter()
    for seed in (1, 2, 3, 5):
        stream, config, in_flight = _case(seed)
        total += lockstep(stream, config, LAYOUTS["sw-full"], in_flight)
    assert total["shared"] > 20 and total["blocks"] > 200, total


def test_vllms_own_order_is_told_apart() -> None:
    """Negative control: kvsim's pool releasing in vLLM's order (tail first, group by group)
    diverges from the Penelope reference on the same streams."""
    stream, config, in_flight = _case(1)
    groups = LAYOUTS["sw-full"]
    cap, bs = stream.capacity_blocks * len(groups), stream.block_size
    real = PenelopeReal(cap, bs, config.full_sequence_must_fit, groups, in_flight)
    model = ModelSide(cap, bs, "vllm", config.full_sequence_must_fit, groups=groups,
                      in_flight=in_flight)

    def on_op(kind: int, rid: int, k: int, results: list[Any]) -> None:
        assert results[0] == results[1]
        same_pool_state("control", real.observe(), model.observe())

    with pytest.raises(AssertionError, match=r"free_queue|block_ids|refs|table"):
        drive(stream, [real, model], config, on_op)


# ---- goldens of small pressured runs ---------------------------------------------------------
GOLDEN = Path(__file__).parent / "goldens" / "vllm_hybrid_penelope.json"
PINNED = ("requests", "dropped_requests", "hit_rate", "ttft_mean_s", "ttft_p99_s",
          "jct_mean_s", "evicted_tokens", "evictions", "retractions", "recomputed_tokens",
          "prompt_tokens", "decode_steps", "preempted_recompute_tokens")
PRESSED = {"gpt-oss-120b": 40960, "qwen3-next-80b-a3b": 65536}


def test_pressured_hybrid_runs_are_their_golden() -> None:
    """gpt-oss-120b (a sliding and a full group) and Qwen3-Next (three Mamba groups and a full
    one) on the vllm engine with vLLM's order and Penelope's, sync and async, in caches that
    evict, pinned as saved (``KVSIM_REGEN_GOLDENS=1`` rewrites it); vLLM's order is pinned
    beside Penelope's so a change to the shared paths shows in both."""
    from sim.config import RunConfig
    from sim.run import run

    got: dict[str, dict] = {}
    for model, cache in PRESSED.items():
        for preset in ("vllm", "penelope"):
            for mode in ("sync", "async"):
                cfg = RunConfig.from_flat(
                    engine="vllm", model=model, trace="synthetic:claude-code?sessions=6",
                    max_context=32768, gpu_cache=cache, sessions=4, gaps="tool",
                    chunk_size=2048, vllm_async=mode == "async").with_preset(preset)
                s = run(cfg).summary
                got[f"{model}/{preset}/{mode}"] = {k: s[k] for k in PINNED}
    if os.environ.get("KVSIM_REGEN_GOLDENS") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(GOLDEN.read_text())
    for key, s in got.items():  # under pressure: every run evicts and still hits
        assert s["evicted_tokens"] > 0 and 0 < s["hit_rate"] < 1, key
    for model in PRESSED:  # the release order took effect: other blocks were evicted
        assert any(got[f"{model}/penelope/{m}"]["evicted_tokens"]
                   != got[f"{model}/vllm/{m}"]["evicted_tokens"] for m in ("sync", "async"))
