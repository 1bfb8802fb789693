"""What a fleet's pool moves and keeps, checked against the replicas' true caches over whole
runs (sim/fleet/pooltier.py): a fetch moves only blocks the replica lacks, write-back keeps
every block a replica drops entirely, and the run says when the pool cannot do its job."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import RunConfig
from sim.fleet.pool import SharedPool
from sim.fleet.pooltier import FleetPool
from sim.run import run
from tests.enginekit import instances

BASE = RunConfig.from_flat(trace="synthetic:claude-code?sessions=8", max_context=32768, gaps="tool",
                 gpu_cache=40960, sessions=4, replicas=2, router="round-robin", pool=1 << 20)


@pytest.fixture
def pools(monkeypatch) -> list[FleetPool]:
    """Every FleetPool a run builds (its replicas are the run's engines)."""
    return instances(monkeypatch, FleetPool)


@pytest.fixture
def leases(monkeypatch) -> list[tuple[int, set[int], np.ndarray]]:
    """Per fetch: the replica, the block ids on its GPU when the fetch was decided, and the
    ids leased (moved) for it."""
    seen: list[tuple[int, set[int], np.ndarray]] = []
    submit, lease = FleetPool.submit, SharedPool.lease
    moved: list[np.ndarray] = []

    def lease_spy(self, ids):
        moved.append(np.asarray(ids).copy())
        lease(self, ids)

    def submit_spy(self, req, r):
        gpu = set(self.replicas[r].cache.resident_block_ids().tolist())
        moved.clear()
        submit(self, req, r)
        if moved:
            seen.append((r, gpu, moved[0]))

    monkeypatch.setattr(SharedPool, "lease", lease_spy)
    monkeypatch.setattr(FleetPool, "submit", submit_spy)
    return seen


@pytest.mark.parametrize("router", ["round-robin", "session-affinity"])
def test_no_fetch_moves_a_block_the_replica_holds(leases, router):
    # Penelope makes holes: a prompt's resident prefix ends at the first one, and the blocks
    # behind it are on the replica's GPU. Before, the fetch moved them again (on a
    # 2-replica synthetic run, 5,232 of 38,576 fetched blocks under round robin).
    res = run(BASE.with_fields(router=router, gpu_cache=32768).with_preset("penelope"))
    assert res.summary["pool_fetches"] == len(leases) > 0
    assert res.summary["holes_made_tokens"] > 0
    for _r, gpu, ids in leases:
        assert not gpu.intersection(ids.tolist())
    moved = sum(ids.size for _r, _gpu, ids in leases)  # what the links carried, in blocks
    s = res.summary
    assert moved * 64 == s["pool_fetched_tokens"] + s["pool_wasted_tokens"]
    assert res.tables["pool_transfers"]["bytes"].sum() == s["pool_bytes_moved"]


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
    cfg = BASE.with_fields(router=router, pool_write="write-back", gpu_cache=32768, sessions=8,
                           **kw)
    res = run(cfg.with_preset(policy))
    (fp,) = pools
    dropped = 0
    for engine in fp.replicas:
        cache = engine.cache
        held = set(cache.resident_block_ids().tolist()) | set(
            cache.cpu_resident_block_ids().tolist())
        gone = set(engine.ever_blocks().tolist()) - held
        assert gone <= put, f"{len(gone - put)} dropped blocks never reached the pool"
        dropped += len(gone)
    assert dropped > 0 and res.summary["pool_stored_tokens"] > 0
    if tiering == "write_back":  # device nodes without a host copy that loads deleted
        assert sum(e.rec.counters["load_deleted_blocks"] for e in fp.replicas) > 0


# --- notes: a pool too small for a prompt, lookups that stop behind a CPU prefix --------------
def test_a_pool_smaller_than_a_prompt_is_noted():
    res = run(BASE.with_fields(pool=4096).with_preset("sglang"))
    notes = res.summary["pool_notes"]
    longest = int(res.requests["prompt_tokens"].max())
    assert longest > 4096
    assert any("smaller than" in n and f"{longest:,}" in n for n in notes), notes
    big = run(BASE.with_preset("sglang")).summary
    assert not any("smaller than" in n for n in big["pool_notes"])


def test_lookups_behind_a_cpu_prefix_are_counted_and_noted():
    res = run(BASE.with_fields(gpu_cache=24576, cpu_cache=32768, tiering="unified",
                               sessions=8).with_preset("penelope"))
    s = res.summary
    assert s["pool_behind_cpu_lookups"] > 0 and s["pool_behind_cpu_tokens"] > 0
    assert s["pool_lookups"] >= s["pool_behind_cpu_lookups"]
    assert any("CPU tier" in n for n in s["pool_notes"]), s["pool_notes"]


def test_cli_prints_the_pool_notes_as_warnings():
    out = CliRunner().invoke(cli, ["run", "--trace", "synthetic:claude-code?sessions=8",
                                   "--max-context", "32k", "--gpu-cache", "40k",
                                   "--replicas", "2", "--pool", "4k", "--preset", "sglang"])
    assert out.exit_code == 0, out.output
    assert "warning:" in out.stderr and "smaller than" in out.stderr
