"""kvsim's ``sglang-cache-aware`` (version 1.13) beside the real SGLang Model Gateway 1.13.0
(``smg launch --policy cache_aware``, the wheel's Rust binary) on 127.0.0.1, with four fake
workers that hold each request until the test releases it (tests/realrouters.py).

Teacher-forced: at every decision kvsim is fed the gateway's own history (its in-flight
counts, checked equal to the gateway's ``/workers`` loads, and the prompts inserted for the
workers the gateway chose), and must name the gateway's pick among the workers it would draw
from. Two kvsim views run side by side: the product one in 64-token blocks, and the same code
in 1-token blocks, which sees exactly what the gateway's character tree sees (tokens render as
four characters, the first unique). A pick outside the block view but inside the token view is
the documented granularity class (a match whole blocks shorten by up to 63 tokens, near the
0.3 threshold or below a deeper holder): counted and bounded per stream. A pick outside both
is a divergence: none allowed.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

from policies.routing import ReplicaView, RouteRequest, RouterView, get_router
from sim.fleet.fleet import build_belief
from tests import realrouters as rr
from tests import routerstreams as rs

N = 4
BS = 64
MAX_TREE_CHARS = rr.CHARS_PER_TOKEN * BS * 24  # the evicting stream's budget: 24 blocks
EVICT_SECS = 4  # a phase of the evicting stream must fit between two passes


def record(stream: str, counts: Counter) -> None:
    """Print one stream's counts (``pytest -s`` shows them: the figures docs/fleet.md quotes)."""
    print(f"\nsmg {stream}: {dict(sorted(counts.items()))}")


class Kvsim:
    """kvsim's 1.13 rule at one granularity, fed the gateway's history."""

    def __init__(self, block: int, params: dict) -> None:
        self.router = get_router("sglang-cache-aware", dict(params))
        self.router.bind(N, block, np.random.default_rng(0))
        self.belief = build_belief(self.router.cache_view, N)
        self.ids = rs.ChainIds(block)
        self.block = block

    def candidates(self, tokens, loads, now: float, routed=None
                   ) -> tuple[list[int], str, np.ndarray]:
        ids = self.ids(tokens)
        overlaps = self.belief.overlaps(ids, now)
        sizes = self.belief.sizes()
        routed = routed or [0] * N
        view = RouterView(now, tuple(ReplicaView(i, overlaps[i], sizes[i], loads[i], 0,
                                                 routed[i]) for i in range(N)))
        among, branch = self.router.candidates(
            RouteRequest(0, 0, now, len(tokens), ids, self.block), view)
        return among, branch, ids

    def routed(self, ids: np.ndarray, worker: int, now: float) -> None:
        self.belief.routed(ids, worker, now)


def drive(gateway: rr.Gateway, ops, params: dict, tick=None):
    """Run ``ops`` through the gateway and both kvsim views; returns the decisions:
    (real pick, block candidates, token candidates, loads, branch, candidates of the
    ``version=1.9`` rule fed the same history)."""
    block, token = Kvsim(BS, params), Kvsim(1, params)
    old = Kvsim(BS, {"version": "1.9", "eviction_interval_s": 3600.0})
    routed = [0] * N
    loads = [0] * N
    owner: dict[str, int] = {}
    out = []
    now = 0.0
    for op in ops:
        if op[0] == "tick":
            tick()
            now += EVICT_SECS
            continue
        if op[0] == "release":
            w = gateway.fleet.release(op[1])
            loads[w] -= 1
            rr.wait_until(lambda: gateway.loads() == loads, "the gateway to see the release")
            continue
        _, rid, tokens = op
        assert gateway.loads() == loads  # the gateway's load is the in-flight count
        b_among, branch, b_ids = block.candidates(tokens, loads, now)
        t_among, _, t_ids = token.candidates(tokens, loads, now)
        o_among, _, o_ids = old.candidates(tokens, loads, now, routed)
        real = gateway.send(rid, rr.render(tokens))
        out.append((real, b_among, t_among, list(loads), branch, o_among))
        block.routed(b_ids, real, now)
        token.routed(t_ids, real, now)
        old.routed(o_ids, real, now)
        loads[real] += 1
        routed[real] += 1
        owner[rid] = real
    return out


def classify(decisions) -> Counter:
    """agree / granularity / divergence of kvsim's 1.13 rule, and how often the
    ``version=1.9`` rule named a worker set without the gateway's pick (``old``)."""
    c = Counter()
    for real, b_among, t_among, _, _, o_among in decisions:
        c["old"] += real not in o_among
        if real in b_among:
            c["agree"] += 1
        elif real in t_among:
            c["granularity"] += 1
        else:
            c["divergence"] += 1
    return c


@pytest.fixture
def gateway(tmp_path, request):
    extra = getattr(request, "param", ())
    fleet = rr.FakeFleet(N)
    try:
        g = rr.Gateway(fleet, tmp_path / "smg.log", "--eviction-interval-secs", "3600", *extra)
    except BaseException:
        fleet.stop()
        raise
    yield g
    g.stop()
    assert not g.errors, g.errors


STREAMS = {
    # name: (ops, most granularity cases allowed)
    "agent-sessions": (rs.agent_sessions, 4),
    "many-in-flight": (rs.many_in_flight, 8),
    "shared-document": (rs.shared_document, 24),
}


@pytest.mark.parametrize("name", list(STREAMS))
def test_teacher_forced_matches_the_gateway(gateway, name):
    make, bound = STREAMS[name]
    decisions = drive(gateway, make(), {})
    c = classify(decisions)
    assert c["divergence"] == 0, (name, c, [d for d in decisions
                                            if d[0] not in d[1] and d[0] not in d[2]][:5])
    assert c["granularity"] <= bound, (name, c)
    assert c["agree"] + c["granularity"] == len(decisions)
    record(name, c)
    branches = Counter(d[4] for d in decisions)
    assert branches["hit"] > 0 and branches["miss"] > 0


def test_burst_on_one_document_splits_as_the_gateway_does(gateway):
    ops = rs.burst()
    decisions = drive(gateway, ops, {})
    c = classify(decisions)
    record("burst", c)
    assert c["agree"] == len(ops), c
    real = sorted(np.bincount([d[0] for d in decisions], minlength=N).tolist(), reverse=True)
    free, old = free_running(ops, {}), free_running(ops, {"version": "1.9"})
    print(f"smg burst split: gateway {real}, kvsim {free}, kvsim 1.9 {old}")
    assert real == free == [50, 50, 50, 0], (real, free)  # the fourth worker: none
    assert old != real  # the 1.9 rule piles the burst on its first holders


def free_running(ops, params: dict) -> list[int]:
    """kvsim alone on ``ops`` (its own picks, draws and in-flight counts): the split, most
    loaded first."""
    alone = Kvsim(BS, params)
    loads, routed = [0] * N, [0] * N
    for op in ops:
        ids = alone.ids(op[2])
        overlaps = alone.belief.overlaps(ids, 0.0)
        sizes = alone.belief.sizes()
        view = RouterView(0.0, tuple(ReplicaView(i, overlaps[i], sizes[i], loads[i], 0,
                                                 routed[i]) for i in range(N)))
        w = alone.router.route(RouteRequest(0, 0, 0.0, len(op[2]), ids, BS), view)
        alone.routed(ids, w, 0.0)
        loads[w] += 1
        routed[w] += 1
    return sorted(loads, reverse=True)


def _ticks(gateway: rr.Gateway):
    """Wait for the gateway's next eviction pass (its periodic "Tree memory" log line)."""
    seen = [0]

    def count() -> int:
        return len(re.findall("Tree memory", gateway.log_text()))

    seen[0] = count()

    def tick() -> None:
        start = seen[0]
        assert count() == start, "an eviction pass ran in the middle of a phase"
        rr.wait_until(lambda: count() > start, "an eviction pass", timeout=3 * EVICT_SECS)
        seen[0] = count()

    return tick


@pytest.mark.parametrize("gateway", [("--eviction-interval-secs", str(EVICT_SECS),
                                      "--max-tree-size", str(MAX_TREE_CHARS),
                                      "--log-level", "info")], indirect=True)
def test_an_evicting_tree_forgets_what_the_gateway_forgets(gateway):
    tick = _ticks(gateway)
    tick()  # start right after a pass: the stream's sends then fit between two
    params = {"max_tree_size": MAX_TREE_CHARS, "eviction_interval_s": float(EVICT_SECS)}
    decisions = drive(gateway, rs.evicting(), params, tick=tick)
    c = classify(decisions)
    record("evicting", c)
    assert c["agree"] == len(decisions), (c, decisions)
    # later phases miss on documents the trimmed tree lost
    assert Counter(d[4] for d in decisions[10:])["miss"] > 0


def test_the_tie_draw_is_uniform():
    r = get_router("sglang-cache-aware")
    r.bind(N, BS, np.random.default_rng(7))
    draws = Counter(r.pick([0, 1, 2, 3]) for _ in range(4000))
    chi2 = sum((draws[w] - 1000) ** 2 / 1000 for w in range(N))
    assert chi2 < 16.27, draws  # chi-square, 3 degrees of freedom, p = 0.001
