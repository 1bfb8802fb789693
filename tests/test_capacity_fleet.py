"""``kvsim capacity --replicas N --router R --pool S``: the fleet view of the cache-only replay,
against independent brute-force LRUs (ordered dicts, no kvsim cache code)."""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from test_capacity import BS, brute_force_lru, chained_trace, write_records

from policies.routers.simple import SessionAffinity
from sim.capacity import arrival_order
from sim.capacity_fleet import fleet_capacity_curve, fleet_hits
from sim.cli.main import cli
from traces import load_trace

SPEC = "synthetic:claude-code?sessions=8"


def prompts_in_order(trace) -> list[tuple[int, list[int]]]:
    return [(int(r), trace.block_ids(int(r)).tolist()) for r in arrival_order(trace)]


def test_session_affinity_equals_independent_lrus_over_each_replicas_sessions():
    trace = load_trace(SPEC, block_size=64, cache_dir=None)
    n, cache_blocks = 3, 400
    ring = SessionAffinity()
    ring.bind(n, 64, None)
    owner = {s: ring.owner(s) for s in set(trace.session.tolist())}
    assert len(set(owner.values())) > 1  # the sessions really are spread
    local, fetched, chosen = fleet_hits(trace, cache_blocks * 64, n, "session-affinity")
    for k in range(n):
        mine = [(r, ids) for r, ids in prompts_in_order(trace)
                if owner[int(trace.session[r])] == k]
        want = brute_force_lru([ids for _, ids in mine], cache_blocks)
        assert [int(local[r]) for r, _ in mine] == want
        assert all(int(chosen[r]) == k for r, _ in mine)
    assert not fetched.any()


class BruteLRU:
    """The ordered-dict LRU of tests/test_capacity.py, one request at a time, reporting the
    blocks it evicts (least recent first)."""

    def __init__(self, capacity: int) -> None:
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.capacity = capacity

    def request(self, ids: list[int]) -> tuple[int, list[int]]:
        cache, capacity = self.cache, self.capacity
        h = 0
        while h < len(ids) and ids[h] in cache:
            h += 1
        for b in ids[:h]:
            cache.move_to_end(b)
        need = len(ids) - h
        gone = []
        while len(cache) + need > capacity and len(cache) > h:
            gone.append(cache.popitem(last=False)[0])
        fit = min(need, capacity - len(cache))
        for b in ids[h:h + fit]:
            cache[b] = None
        for b in reversed(ids[:h + fit]):
            cache.move_to_end(b)
        return h, gone


def brute_force_pool_fleet(prompts: list[list[int]], n: int, cache: int, pool_cap: int,
                           write_back: bool = False) -> tuple[int, int]:
    """Round robin over ``n`` LRUs of ``cache`` blocks above a pool of ``pool_cap`` blocks:
    watermark 0.9, drop ceil(5 %) least recent; write-through of every prompt block, or
    write-back of every block a replica evicts."""
    caches = [BruteLRU(cache) for _ in range(n)]
    pool: OrderedDict[int, None] = OrderedDict()
    local = fetched = 0
    for i, ids in enumerate(prompts):
        h, gone = caches[i % n].request(ids)
        p = 0
        while h + p < len(ids) and ids[h + p] in pool:
            pool.move_to_end(ids[h + p])
            p += 1
        local, fetched = local + h, fetched + p
        for b in (gone if write_back else ids):
            if b in pool:
                continue
            if len(pool) >= 0.9 * pool_cap:
                for _ in range(min(len(pool), max(1, math.ceil(0.05 * len(pool))))):
                    pool.popitem(last=False)
            if len(pool) < pool_cap:
                pool[b] = None
    return local, fetched


@settings(max_examples=40, deadline=None)
@given(records=chained_trace(), n=st.integers(1, 3), cache=st.integers(1, 12),
       pool=st.integers(1, 60), write_back=st.booleans())
def test_round_robin_over_a_pool_equals_brute_force(tmp_path_factory, records, n, cache, pool,
                                                    write_back):
    path = write_records(tmp_path_factory.mktemp("capf") / "t.jsonl", records)
    trace = load_trace(str(path), block_size=BS, cache_dir=None)
    local, fetched, _ = fleet_hits(trace, cache * BS, n, "round-robin", pool * BS,
                                   pool_write="write-back" if write_back else "write-through")
    want = brute_force_pool_fleet([ids for _, ids in prompts_in_order(trace)], n, cache, pool,
                                  write_back)
    assert (int(local.sum()), int(fetched.sum())) == want


def test_brute_lru_is_the_capacity_tests_lru():
    trace = load_trace(SPEC, block_size=64, cache_dir=None)
    prompts = [ids for _, ids in prompts_in_order(trace)]
    lru = BruteLRU(300)
    assert [lru.request(ids)[0] for ids in prompts] == brute_force_lru(prompts, 300)


def test_a_pool_raises_the_hit_rate_of_a_round_robin_fleet():
    trace = load_trace(SPEC, block_size=64, cache_dir=None)
    base, pooled = (fleet_capacity_curve(trace, [64 * 1024], 4, "round-robin", p)[0]
                    for p in (0, 4 << 20))
    assert base.pool_hit_rate == 0.0 < pooled.pool_hit_rate
    assert base.hit_rate < pooled.hit_rate <= pooled.ideal_hit_rate + 1e-12
    assert pooled.hit_rate - base.hit_rate == pytest.approx(pooled.pool_hit_rate, abs=0.05)


def test_capacity_fleet_cli_rows(tmp_path):
    res = CliRunner().invoke(cli, ["capacity", SPEC, "--cache", "64k,1m", "--replicas", "2",
                                   "--router", "session-affinity", "--pool", "2m",
                                   "--cache-dir", "off", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [(r["replicas"], r["router"], r["pool_tokens"]) for r in rows] == \
        [(2, "session-affinity", 2 << 20)] * 2
    assert all(0 <= r["pool_hit_rate"] <= r["hit_rate"] <= r["ideal_hit_rate"] for r in rows)


def test_a_router_that_needs_a_clock_is_refused_in_one_line(tmp_path):
    f = tmp_path / "r.py"
    f.write_text("from policies.routing import Router\n"
                 "class Clocked(Router):\n    needs_clock = True\n"
                 "    def route(self, request, view):\n        return 0\n")
    res = CliRunner().invoke(cli, ["capacity", SPEC, "--replicas", "2", "--router",
                                   f"{f}:Clocked", "--cache-dir", "off"])
    assert res.exit_code == 2, res.output
    assert "prices time" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_unknown_router_and_bad_pool_fail_in_one_line():
    for args, words in ((["--router", "nope"], "unknown router"), (["--pool", "0"], "--pool")):
        res = CliRunner().invoke(cli, ["capacity", SPEC, *args, "--cache-dir", "off"])
        assert res.exit_code == 2, res.output
        assert words in res.output and "Traceback" not in res.output


def test_a_router_that_cannot_decide_without_a_clock_is_refused(tmp_path):
    """A router that refuses to decide without the fleet's prefill model (as Mooncake's and
    Preble's do) stops the replay with one line."""
    f = tmp_path / "r.py"
    f.write_text("from policies.context import PolicyError\n"
                 "from policies.routing import Router\n"
                 "class Timed(Router):\n"
                 "    def route(self, request, view):\n"
                 "        raise PolicyError('needs the prefill model')\n")
    res = CliRunner().invoke(cli, ["capacity", SPEC, "--replicas", "2", "--router",
                                   f"{f}:Timed", "--cache", "64k", "--cache-dir", "off"])
    assert res.exit_code == 2, res.output
    assert "cannot decide without a clock" in res.output and "Traceback" not in res.output
