"""``kvsim capacity --replicas N --router R --pool S``: the fleet view of the cache-only replay,
against independent brute-force LRUs (ordered dicts, no kvsim cache code)."""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from test_capacity import BS, Req, brute_force_lru, chained_trace, trace_requests, write_records

from policies.routers.simple import SessionAffinity
from sim.cli.main import cli
from sim.studies.capacity import arrival_order
from sim.studies.capacity_fleet import fleet_capacity_curve, fleet_hits
from traces import load_trace

SPEC = "synthetic:claude-code?sessions=8"


def test_session_affinity_equals_independent_lrus_over_each_replicas_sessions():
    trace = load_trace(SPEC, block_size=64, cache_dir=None)
    n, cache_blocks = 3, 400
    ring = SessionAffinity()
    ring.bind(n, 64, None)
    owner = {s: ring.owner(s) for s in set(trace.session.tolist())}
    assert len(set(owner.values())) > 1  # the sessions really are spread
    local, fetched, chosen = fleet_hits(trace, cache_blocks * 64, n, "session-affinity")
    reqs = list(zip(arrival_order(trace).tolist(), trace_requests(trace), strict=True))
    for k in range(n):
        mine = [(r, req) for r, req in reqs if owner[int(trace.session[r])] == k]
        want = brute_force_lru([req for _, req in mine], cache_blocks)
        assert [int(local[r]) for r, _ in mine] == want
        assert all(int(chosen[r]) == k for r, _ in mine)
    assert not fetched.any()


class BruteLRU:
    """The ordered-dict LRU of tests/test_capacity.py, one request at a time, reporting the
    blocks it evicts (least recent first)."""

    def __init__(self, capacity: int) -> None:
        self.cache: OrderedDict = OrderedDict()
        self.capacity = capacity

    def request(self, req: Req) -> tuple[int, list]:
        cache, capacity, ids = self.cache, self.capacity, req.cached
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
        return min(h, len(req.prompt), req.usable), gone


def brute_force_pool_fleet(requests: list[Req], n: int, cache: int, pool_cap: int,
                           write_back: bool = False) -> tuple[int, int]:
    """Round robin over ``n`` LRUs of ``cache`` blocks above a pool of ``pool_cap`` blocks:
    watermark 0.9, drop ceil(5 %) least recent; write-through of every block a replica
    caches, or write-back of every block a replica evicts. A fetch serves the prompt's blocks
    from the replica's hit up to the most the request can reuse."""
    caches = [BruteLRU(cache) for _ in range(n)]
    pool: OrderedDict = OrderedDict()
    local = fetched = 0
    for i, req in enumerate(requests):
        h, gone = caches[i % n].request(req)
        ids, p = req.prompt, 0
        while h + p < req.usable and ids[h + p] in pool:
            pool.move_to_end(ids[h + p])
            p += 1
        local, fetched = local + h, fetched + p
        for b in (gone if write_back else req.cached):
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
    want = brute_force_pool_fleet(trace_requests(trace), n, cache, pool, write_back)
    assert (int(local.sum()), int(fetched.sum())) == want


def test_brute_lru_is_the_capacity_tests_lru():
    trace = load_trace(SPEC, block_size=64, cache_dir=None)
    reqs = trace_requests(trace)
    lru = BruteLRU(300)
    assert [lru.request(req)[0] for req in reqs] == brute_force_lru(reqs, 300)


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
    for args, words in ((["--router", "nope"], "unknown router"),
                        (["--pool", "-4k"], "--pool must be >= 0"),
                        (["--pool", "lots"], "--pool: expected a size in tokens")):
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


def shared_prompt_file(path, n: int = 200, gap_ms: int = 100) -> str:
    """Mooncake records that all start with one shared 512-token block (a system prompt),
    then 7 blocks of their own, one request every ``gap_ms``."""
    recs = [{"timestamp": i * gap_ms, "input_length": 8 * BS, "output_length": 10,
             "hash_ids": [0, *range(1 + 7 * i, 8 + 7 * i)]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)


def served(trace, router: str, replicas: int, in_flight_s: float = 0.0) -> list[int]:
    _, _, chosen = fleet_hits(trace, 1 << 20, replicas, router, in_flight_s=in_flight_s)
    return np.bincount(chosen, minlength=replicas).tolist()


@pytest.mark.parametrize("router", ["dynamo-kv", "llm-d"])
def test_a_router_that_weighs_load_needs_the_in_flight_model(tmp_path, router):
    """Without a clock every replica looks idle, so the replica holding the shared first
    block wins every request (the whole fleet collapses onto one cache): refused with a
    reason and the way out; with ``--in-flight-s`` the load spreads the requests."""
    path = shared_prompt_file(tmp_path / "t.jsonl")
    res = CliRunner().invoke(cli, ["capacity", path, "--block-size", str(BS), "--replicas",
                                   "10", "--router", router, "--cache", "1m",
                                   "--cache-dir", "off"])
    assert res.exit_code == 2, res.output
    assert "weighs each replica's load" in res.output and "--in-flight-s" in res.output
    assert "round-robin" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(cli, ["capacity", path, "--block-size", str(BS), "--replicas",
                                   "10", "--router", router, "--cache", "1m", "--in-flight-s",
                                   "2", "--cache-dir", "off", "--json"])
    assert res.exit_code == 0, res.output
    row, = json.loads(res.stdout)
    assert (row["in_flight_s"], row["idle_replicas"]) == (2.0, 0)
    trace = load_trace(path, block_size=BS, cache_dir=None)
    counts = served(trace, router, 10, in_flight_s=2.0)
    assert min(counts) >= 10 and max(counts) <= 40  # 200 requests, about 20 in flight


def test_dynamo_kv_under_the_in_flight_model_hand_computed(tmp_path):
    """Two replicas, prompts [0, own x 7] (8 blocks) one second apart, each in flight for
    1.5 s. Request 1 sees request 0 on replica w: Dynamo's cost there is prefill (8 active
    + 8) - 1 overlap = 15, plus decode 8 active + 7 new = 30, against 8 + 8 = 16 on the other
    replica, so it goes to the other one. Idle (the old view), the overlap wins: 7 + 8 = 15
    against 16, and it would join request 0."""
    trace = load_trace(shared_prompt_file(tmp_path / "t.jsonl", n=2, gap_ms=1000),
                       block_size=BS, cache_dir=None)
    _, _, chosen = fleet_hits(trace, 1 << 20, 2, "dynamo-kv", in_flight_s=1.5)
    assert chosen[0] != chosen[1]
    _, _, chosen = fleet_hits(trace, 1 << 20, 2, "dynamo-kv", in_flight_s=0.5)
    assert chosen[0] == chosen[1]  # request 0 ended before request 1 arrived


def test_least_load_balances_what_is_in_flight(tmp_path):
    """Every request is still in flight when the next arrives: least-load fills the replicas
    in turn, so 200 requests over 4 replicas give 50 each."""
    trace = load_trace(shared_prompt_file(tmp_path / "t.jsonl"), block_size=BS,
                       cache_dir=None)
    assert served(trace, "least-load", 4, in_flight_s=1000.0) == [50] * 4


def test_a_fleet_left_idle_is_reported(tmp_path):
    f = tmp_path / "r.py"
    f.write_text("from policies.routing import Router\n"
                 "class First(Router):\n"
                 "    def route(self, request, view):\n        return 0\n")
    res = CliRunner().invoke(cli, ["capacity", SPEC, "--replicas", "4", "--router",
                                   f"{f}:First", "--cache", "64k", "--cache-dir", "off",
                                   "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["idle_replicas"] == 3
    assert "3 of 4 replicas served under a tenth" in res.stderr
    res = CliRunner().invoke(cli, ["capacity", SPEC, "--replicas", "4", "--cache", "64k",
                                   "--cache-dir", "off", "--json"])
    assert json.loads(res.stdout)[0]["idle_replicas"] == 0 and "warning" not in res.stderr


@pytest.mark.parametrize("args, words", [
    (["--in-flight-s", "2"], "--in-flight-s"),  # no fleet: nothing to route
    (["--router", "dynamo-kv", "--in-flight-s", "2"], "--in-flight-s"),  # one replica
    (["--replicas", "2", "--in-flight-s", "0"], "--in-flight-s"),
    (["--replicas", "2", "--in-flight-s", "inf"], "--in-flight-s"),
    (["--gaps", "tool"], "--gaps"),
    (["--gaps", "recorded"], "--gaps"),
])
def test_options_that_do_nothing_in_capacity_are_refused(args, words):
    res = CliRunner().invoke(cli, ["capacity", SPEC, "--cache", "64k", "--cache-dir", "off",
                                   *args])
    assert res.exit_code == 2, res.output
    assert words in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
