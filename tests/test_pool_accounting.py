"""What a fleet's pool keeps, checked against the replicas' true caches over whole runs
(sim/fleet/pooltier.py): write-back keeps every block a replica drops entirely."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim.config import RunConfig
from sim.fleet.pool import SharedPool
from sim.fleet.pooltier import FleetPool
from sim.runner import run

BASE = RunConfig(trace="synthetic:claude-code?sessions=8", max_context=32768, gaps="tool",
                 gpu_cache=40960, sessions=4, replicas=2, router="round-robin", pool=1 << 20)


@pytest.fixture
def pools(monkeypatch) -> list[FleetPool]:
    """Every FleetPool a run builds (its replicas are the run's engines)."""
    made: list[FleetPool] = []
    init = FleetPool.__init__

    def spy(self, *a, **kw):
        init(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(FleetPool, "__init__", spy)
    return made


@pytest.mark.parametrize("tier", [("gpu", "sglang"), ("gpu", "penelope"),
                                  ("unified", "sglang"), ("unified", "penelope"),
                                  ("write_through", "sglang"),
                                  ("write_through_selective", "sglang"),
                                  ("write_back", "sglang"), ("write_back", "vllm")])
@pytest.mark.parametrize("router", ["round-robin", "session-affinity"])
def test_write_back_keeps_every_block_a_replica_drops_entirely(pools, monkeypatch, tier,
                                                                router):
    # Every block a replica ever held and holds no more (in neither tier) was put in the
    # pool. Before, the device nodes a HiCache load deleted to make room were their last
    # copy and never reached it (HiCache write_back here: 19 such blocks lost for good at
    # the end of the round-robin run; 1,098 with 16 sessions on 64K + 64K tokens).
    put: set[int] = set()
    store = SharedPool.put

    def put_spy(self, ids):
        put.update(np.asarray(ids).tolist())
        return store(self, ids)

    monkeypatch.setattr(SharedPool, "put", put_spy)
    tiering, policy = tier
    kw = {} if tiering == "gpu" else dict(cpu_cache=16384, tiering="unified")
    if tiering.startswith("write"):
        kw = dict(cpu_cache=16384, tiering="hicache", hicache_write_policy=tiering)
    cfg = replace(BASE, router=router, pool_write="write-back", gpu_cache=32768, sessions=8,
                  **kw)
    res = run(cfg.with_preset(policy))
    (fp,) = pools
    dropped = 0
    for engine in fp.replicas:
        cache = engine.cache
        held = set(cache.resident_block_ids().tolist()) | set(
            cache.cpu_resident_block_ids().tolist())
        gone = engine.ever - held
        assert gone <= put, f"{len(gone - put)} dropped blocks never reached the pool"
        dropped += len(gone)
    assert dropped > 0 and res.summary["pool_stored_tokens"] > 0
    if tiering == "write_back":  # device nodes without a host copy that loads deleted
        assert sum(e.rec.counters["load_deleted_blocks"] for e in fp.replicas) > 0
