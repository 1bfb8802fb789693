"""Metric fixes (issue 11), each pinned by a test that failed before its fix."""

from __future__ import annotations

import pytest

from sim.config import RunConfig
from sim.kvcache.tree import RadixTree
from sim.runner import run

SYNTH = dict(trace="synthetic:claude-code?sessions=12", max_context=65536, gaps="tool",
             sessions=4, model="qwen3-8b")


class DeletionSpy:
    """Counts every block whose last copy leaves the cache, at the one place it happens."""

    def __init__(self, monkeypatch) -> None:
        self.blocks = 0
        real_delete, real_truncate = RadixTree.delete, RadixTree.truncate_tail

        def delete(tree, node, result):
            self.blocks += len(node.ids)
            return real_delete(tree, node, result)

        def truncate(tree, leaf, k, result):
            self.blocks += k
            return real_truncate(tree, leaf, k, result)

        monkeypatch.setattr(RadixTree, "delete", delete)
        monkeypatch.setattr(RadixTree, "truncate_tail", truncate)


@pytest.mark.parametrize("tiers", [
    dict(gpu_cache=98304),
    dict(gpu_cache=73728, cpu_cache=49152, tiering="unified"),
    dict(gpu_cache=73728, cpu_cache=49152, tiering="hicache"),
    dict(gpu_cache=73728, cpu_cache=49152, tiering="hicache",
         hicache_write_policy="write_back"),
    dict(gpu_cache=73728, cpu_cache=24576, tiering="hicache",
         hicache_write_policy="write_through_selective"),
], ids=["gpu", "unified", "hicache-wt", "hicache-wb", "hicache-wts"])
def test_evicted_tokens_count_every_deletion(monkeypatch, tiers: dict) -> None:
    """HiCache deletes host copies while backing up (write-through) and while loading; every
    deletion, wherever it happens, is in evicted_tokens."""
    preset = "sglang" if tiers.get("tiering") == "hicache" else "penelope"
    spy = DeletionSpy(monkeypatch)
    s = run(RunConfig(**SYNTH, **tiers, scheduler="lpm-cpu" if "cpu_cache" in tiers
                      else "lpm").with_preset(preset)).summary
    assert spy.blocks > 0
    assert s["evicted_tokens"] == spy.blocks * 64
