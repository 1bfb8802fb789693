"""Every cache kind in a fleet emits KV events (sim/kvcache/events.py, sim/fleet/kvevents.py):
the vLLM patches run behind a router, and a lag-free exact index equals every replica's true
contents at every routing decision and at the end, for the radix cache (with and without CPU
tiers) and for vLLM's stock and patched block pools."""

from __future__ import annotations

import ast
import json

import pytest
from click.testing import CliRunner
from conftest import REPO

from sim.cli.main import cli
from sim.config import RunConfig
from sim.fleet.fleet import Fleet
from sim.kvcache import RadixKVCache
from sim.run import run

TRACE = "synthetic:claude-code?sessions=8"
BASE = RunConfig.from_flat(trace=TRACE, max_context=32768, gaps="tool", gpu_cache=49152, sessions=6,
                           replicas=2, router="dynamo-kv?version=classic")


def truth(engine) -> set[int]:
    """The block ids a replica's cache holds on its GPU now (its public queries)."""
    cache = engine.cache
    if isinstance(cache, RadixKVCache):
        return set(cache.resident_block_ids().tolist())
    return set(cache.cached_ids().tolist())


def believed(fleet: Fleet, r: int) -> set[int]:
    return {b for b, mask in fleet.belief.holders.items() if mask >> r & 1}


def check_index(fleet: Fleet) -> None:
    fleet.feed.deliver()
    for r, engine in enumerate(fleet.replicas):
        held = truth(engine)
        assert believed(fleet, r) == held, f"replica {r}: the index is not the cache"
        assert fleet.belief.sizes()[r] == len(held)


@pytest.fixture
def checked(monkeypatch):
    """Compares the exact index with every replica's contents before each decision and after
    the run; returns the counts of checks."""
    counts = {"decisions": 0, "closed": 0}
    submit, close = Fleet.submit, Fleet.close

    def checked_submit(self, req):
        check_index(self)
        counts["decisions"] += 1
        submit(self, req)

    def checked_close(self):
        close(self)
        check_index(self)
        counts["closed"] += 1

    monkeypatch.setattr(Fleet, "submit", checked_submit)
    monkeypatch.setattr(Fleet, "close", checked_close)
    return counts


@pytest.mark.parametrize(("engine", "patch", "preset", "extra"), [
    ("vllm", "none", "vllm", {}),
    ("vllm", "penelope", "penelope", {}),
    ("vllm", "penelope", "vllm", {"vllm_async": False}),
    ("vllm", "continuum", "vllm", {}),
    ("vllm", "continuum-pins", "vllm", {}),
    ("sglang", "none", "sglang", {}),
    ("sglang", "none", "penelope", {}),
    ("sglang", "none", "penelope", {"gpu_cache": 40960, "cpu_cache": 32768,
                                    "scheduler": "lpm-cpu"}),
    ("sglang", "none", "sglang", {"gpu_cache": 36864, "cpu_cache": 98304,
                                  "tiering": "hicache", "hicache_write_policy": "write_back"}),
    ("sglang", "none", "sglang", {"gpu_cache": 40960, "cpu_cache": 65536,
                                  "tiering": "hicache"}),
])
def test_the_exact_index_is_every_replicas_cache_at_every_decision(checked, engine, patch,
                                                                   preset, extra):
    cfg = BASE.with_fields(engine=engine, vllm_patch=patch, **extra).with_preset(preset)
    s = run(cfg).summary
    assert checked["decisions"] == s["requests"] and checked["closed"] == 1
    assert s["evicted_tokens"] > 0  # under pressure: blocks come and go
    assert s["belief_error_mean_tokens"] == 0.0
    if patch != "none":
        assert s["vllm_patch"] == patch


@pytest.mark.parametrize("patch", ["penelope", "continuum"])
def test_vllm_patches_run_in_a_fleet(patch):
    """``--engine vllm --vllm-patch P --replicas 2 --router dynamo-kv`` runs (it was refused
    while a replica's events came from a re-typed stock pool); the summary names the patch and
    each replica's summary carries its own counters."""
    res = CliRunner().invoke(cli, [
        "run", "--trace", TRACE, "--max-context", "32k", "--gaps", "tool", "--gpu-cache", "48k",
        "--sessions", "6", "--engine", "vllm", "--vllm-patch", patch, "--replicas", "2",
        "--router", "dynamo-kv?version=classic", "--preset", "vllm", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    (r,) = doc["runs"]
    assert r["engine"] == f"vllm+{patch}-patch"
    s = r["summary"]
    assert s["vllm_patch"] == patch and s["replicas"] == 2
    if patch == "continuum":
        assert all("continuum_pins" in x for x in s["replica_summaries"])


def test_the_fleet_writes_nothing_on_engine_objects():
    """No module re-types an object (``x.__class__ = ...``), and the fleet sets no attribute on
    a replica's cache or recorder (it drains events and passes listeners at construction)."""
    product = [p for d in ("sim", "policies", "traces", "costmodel", "calibration")
               for p in sorted((REPO / d).rglob("*.py"))]
    for path in product:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign)
                       else [])
            for t in targets:
                if not isinstance(t, ast.Attribute):
                    continue
                assert t.attr != "__class__", f"{path}:{node.lineno} re-types an object"
                if path.parent.name == "fleet" and isinstance(t.value, ast.Attribute):
                    assert t.value.attr not in ("cache", "rec", "pool"), (
                        f"{path}:{node.lineno} writes {ast.unparse(t)} on an engine's object")
