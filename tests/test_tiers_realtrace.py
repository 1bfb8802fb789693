"""Real cc-traces sessions through both tierings with debug recounts after every operation.

The benchmark's op stream (tests/test_cache_realtrace.py) with a CPU tier: a request matches,
locks, loads its CPU-resident blocks, then makes room, reserves, inserts, releases, unlocks.
Skipped when ../shared/data is absent."""

from __future__ import annotations

import pytest
from conftest import CC_TRACES

from policies import get_policy

GPU = 384

pytestmark = [
    pytest.mark.shared_data,
    pytest.mark.skipif(not CC_TRACES.is_dir(), reason="../shared/data/cc-traces not present"),
]


@pytest.fixture(scope="module")
def tier_stream():
    from benchmarks.opstream import trace_stream

    return trace_stream(
        CC_TRACES, sessions=12, active=3, capacity_blocks=GPU, max_requests_per_session=30
    )


def replay_tiered(tier_stream, preset: str, cpu: int, tiering: str = "unified", debug: bool = True):
    from benchmarks.opreplay import OursSide, replay
    from sim.kvcache import RadixKVCache, Tier

    loads = {"loaded": 0, "swap": 0, "chunks": 0, "failed": 0, "d2h": 0}

    class TieredSide(OursSide):
        def __init__(self) -> None:
            super().__init__(GPU, preset, record=False)
            self.cache = RadixKVCache(
                GPU, get_policy(preset), cpu_capacity_blocks=cpu, tiering=tiering, debug=debug
            )

        def arrive(self, rid, inp):
            m = self.cache.match(inp.match_ids, touch=True)
            self.cache.lock(m.node)
            ld = self.cache.load(m.node)
            loads["loaded"] += ld.loaded_blocks
            loads["swap"] += ld.swap_blocks
            loads["chunks"] += ld.swap_chunks
            loads["failed"] += not ld.ok
            gpu = m.blocks_in(Tier.GPU) + ld.loaded_blocks
            reuse = gpu if (ld.ok and not ld.skipped) else m.hit_blocks
            self._running[rid] = [m.node, reuse, 0, False]
            return reuse

    side = TieredSide()
    hits = 0
    for ob in replay(tier_stream, side, observe=False):
        c = side.cache
        assert c.gpu_blocks + c.reserved_blocks <= GPU and c.cpu_blocks <= cpu
        hits += ob.hit or 0
        loads["d2h"] += c.backup_pending()
    return side.cache, hits, loads


@pytest.mark.parametrize(
    ("preset", "tiering", "cpu"),
    # hicache backs up from the root: its host tier must hold the ~244-block shared prefix
    [("penelope", "unified", 128), ("sglang", "unified", 128), ("sglang", "hicache", 384)],
)
def test_real_sessions_through_two_tiers(tier_stream, preset: str, tiering: str, cpu: int) -> None:
    cache, hits, loads = replay_tiered(tier_stream, preset, cpu, tiering)
    cache.check()
    assert cache.protected_blocks == 0 and cache.reserved_blocks == 0
    assert loads["loaded"] > 0 and loads["d2h"] > 0  # the CPU tier was used both ways
    if tiering == "unified":
        assert loads["swap"] > 0 and loads["chunks"] > 0  # both tiers full at times
    _, gpu_only_hits, _ = replay_tiered(tier_stream, preset, 0, debug=False)
    assert hits > gpu_only_hits  # a CPU tier of the same size helps


def test_hicache_with_an_unbounded_host_equals_unified_sglang(tier_stream) -> None:
    """Write-through backs up every inserted node; with a host that never fills, every device
    eviction is a demotion, exactly what unified does under the same (sglang) order while its
    CPU tier is not full: the same hits and loads."""
    big = 4096
    _, hits_h, loads_h = replay_tiered(tier_stream, "sglang", big, "hicache", debug=False)
    _, hits_u, loads_u = replay_tiered(tier_stream, "sglang", big, "unified", debug=False)
    assert hits_h == hits_u and loads_h["loaded"] == loads_u["loaded"] > 0
