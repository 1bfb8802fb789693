"""kvsim's ``dynamo-kv`` beside NVIDIA Dynamo 1.6.1's selector (``dynamo.llm.SelectionService``,
the runtime-free selection core of ``lib/kv-router``) in process, fed vLLM-format KV events
over ZMQ on 127.0.0.1 by fake engines (tests/realrouters.py).

Teacher-forced: kvsim's index gets the same events (through the fleet's event belief with
Dynamo's ``drop_orphans``), its predicted load the same lifecycle (reservation at selection,
prefill complete, free at the end), and at every decision its lowest-cost workers must be
exactly Dynamo's (read from ``potential_loads``: cost = potential prefill tokens / block +
potential decode blocks at the 1.6.1 defaults) and Dynamo's pick one of them. Before each
decision the test waits (bounded) until Dynamo's index reports the overlaps kvsim's does, so
an index that kept or dropped different blocks fails here too.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter

import numpy as np
import pytest

from policies.routers import dynamo
from policies.routing import ReplicaView, RouteRequest, RouterView, get_router
from sim.fleet.fleet import build_belief
from sim.fleet.load import Predicted
from tests import realrouters as rr
from tests import routerstreams as rs

N = 4
BLOCK = 16
# the selector's Rust tracing logs at INFO from its own threads, some after a test returns
# (read when dynamo is first imported, inside the tests)
os.environ.setdefault("DYN_LOG", "error")


async def _until(what: str, check, timeout: float = rr.WAIT_S):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        got = await check()
        if got:
            return got
        if loop.time() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


async def _device_overlaps(svc, tokens) -> list[int]:
    doc = await svc.overlap_scores({"token_ids": list(tokens)})
    by = {w["worker_id"]: w["device_blocks"] for w in doc["workers"]}
    return [by.get(w, 0) for w in range(N)]


async def _run_teacher_forced(ops, capacity: int, seed: int):
    from dynamo.llm import SelectionService

    rng = np.random.default_rng(seed)
    pub = rr.DynamoPublisher(N)
    svc = SelectionService(indexer_threads=1)
    try:
        for w in range(N):
            await svc.upsert_worker({"worker_id": w, "endpoint": f"fake-{w}",
                                     "kv_events_endpoint": f"tcp://127.0.0.1:{pub.ports[w]}",
                                     "block_size": BLOCK})
        router = get_router("dynamo-kv")
        router.bind(N, BLOCK, np.random.default_rng(seed))
        belief = build_belief(router.cache_view, N)
        predicted = Predicted(N)
        engines = [rr.FakeEngine(capacity) for _ in range(N)]
        chain = rs.ChainIds(BLOCK)
        tokens_of: dict[int, list[int]] = {}
        # a probe block per worker, so the listeners are subscribed before the stream
        for w in range(N):
            probe = [rs.FILLER - 1 - w] * BLOCK
            ids = chain(probe)
            tokens_of[int(ids[0])] = probe

            async def seen(w=w, probe=probe, b=int(ids[0])):
                # re-sent until it lands: a PUB socket drops what it sends before the
                # listener's subscription arrives
                pub.publish(w, [("stored", None, [b])], tokens_of, BLOCK)
                await asyncio.sleep(0.02)
                return (await _device_overlaps(svc, probe))[w] == 1
            await _until(f"worker {w}'s events", seen, timeout=15.0)
            pub.publish(w, [("removed", [int(ids[0])])], tokens_of, BLOCK)

            async def gone(w=w, probe=probe):
                return (await _device_overlaps(svc, probe))[w] == 0
            await _until(f"worker {w}'s removal", gone)

        live: dict[str, tuple[int, np.ndarray, bool]] = {}
        decisions = []
        for op in ops:
            if op[0] == "tick":
                continue
            if op[0] == "release":
                w, ids, prefilled = live.pop(op[1])
                if not prefilled:
                    await svc.prefill_complete(op[1])
                await svc.free_reservation(op[1])
                predicted.freed(w, int(op[1][1:]), ids)
                continue
            _, rid, tokens = op
            ids = chain(tokens)
            for k, b in enumerate(ids.tolist()):
                tokens_of.setdefault(b, tokens[k * BLOCK:(k + 1) * BLOCK])
            want = belief.overlaps(ids, 0.0)

            async def agrees(tokens=tokens, want=want):
                return await _device_overlaps(svc, tokens) == want
            await _until(f"Dynamo's index to hold what kvsim's does for {rid}", agrees)
            pot = {p["worker_id"]: p for p in await svc.potential_loads(
                {"token_ids": list(tokens)})}
            real_cost = [pot[w]["potential_prefill_tokens"] / BLOCK
                         + pot[w]["potential_decode_blocks"] for w in range(N)]
            request = RouteRequest(int(rid[1:]), 0, 0.0, len(tokens), ids, BLOCK)
            view = RouterView(0.0, tuple(ReplicaView(
                w, want[w], belief.sizes()[w], 0, 0, 0,
                active_blocks=predicted.active_blocks(w),
                active_prefill_tokens=predicted.prefill_total[w],
                active_prefix_blocks=predicted.active_prefixes(ids)[w]) for w in range(N)))
            ours = dynamo.lowest(router.costs(request, view))
            sel = await svc.select_and_reserve({"token_ids": list(tokens), "selection_id": rid})
            real = int(sel["worker_id"])
            sizes = belief.sizes()
            classic = [w for w in ours if sizes[w] == min(sizes[x] for x in ours)]
            decisions.append((real, ours, dynamo.lowest(real_cost), classic))
            # teacher forcing: kvsim books the gateway's choice, the engine prefills it
            predicted.added(real, int(rid[1:]), ids, max(0, len(tokens) - want[real] * BLOCK))
            prefilled = bool(rng.integers(2))
            if prefilled:
                await svc.prefill_complete(rid)
                predicted.prefill_done(real, int(rid[1:]))
            live[rid] = (real, ids, prefilled)
            events = engines[real].prefill(ids)
            for ev in events:
                if ev[0] == "stored":
                    belief.stored(real, np.asarray(ev[2]), 0.0, -1 if ev[1] is None else ev[1])
                else:
                    belief.removed(real, np.asarray(ev[1]), 0.0)
            pub.publish(real, events, tokens_of, BLOCK)
        return decisions, belief.dropped
    finally:
        svc.shutdown()
        pub.close()


STREAMS = {
    "agent-sessions": (rs.agent_sessions, 1 << 20),
    "many-in-flight": (rs.many_in_flight, 1 << 20),
    "shared-document": (rs.shared_document, 1 << 20),
    "burst": (rs.burst, 1 << 20),
    "evicting": (lambda: rs.evicting(block=BLOCK * 4), 60),
}


@pytest.mark.parametrize("name", list(STREAMS))
def test_teacher_forced_matches_the_selector(name):
    make, capacity = STREAMS[name]
    ops = make()
    decisions, _ = asyncio.run(_run_teacher_forced(ops, capacity, seed=len(name)))
    for real, ours, real_set, _ in decisions:
        assert sorted(ours) == sorted(real_set), (name, ours, real_set)
        assert real in ours
    tied = sum(len(real_set) > 1 for _, _, real_set, _ in decisions)
    classic_off = sum(real not in classic for real, _, _, classic in decisions)
    print(f"\ndynamo {name}: {len(decisions)} decisions, {tied} tied, the classic "
          f"smallest-tree step misses {classic_off}")
    assert tied > 0  # a cold fleet ties at least on its first request
    if name == "burst":
        real = sorted(np.bincount([d[0] for d in decisions], minlength=N).tolist(),
                      reverse=True)
        free = free_running_dynamo_kv(ops, capacity, seed=3)
        print(f"dynamo burst split: selector {real}, kvsim {free}")
        assert sum(real) == sum(free) == len(ops)


def free_running_dynamo_kv(ops, capacity: int, seed: int) -> list[int]:
    """kvsim's dynamo-kv alone on ``ops``: its own picks and draws, its own fake engines'
    events, prefill done at once: the split, most loaded first."""
    router = get_router("dynamo-kv")
    router.bind(N, BLOCK, np.random.default_rng(seed))
    belief = build_belief(router.cache_view, N)
    predicted = Predicted(N)
    engines = [rr.FakeEngine(capacity) for _ in range(N)]
    chain = rs.ChainIds(BLOCK)
    counts = [0] * N
    for i, op in enumerate(ops):
        if op[0] != "send":
            continue
        ids = chain(op[2])
        overlaps = belief.overlaps(ids, 0.0)
        request = RouteRequest(i, 0, 0.0, len(op[2]), ids, BLOCK)
        view = RouterView(0.0, tuple(ReplicaView(
            w, overlaps[w], belief.sizes()[w], 0, 0, 0,
            active_blocks=predicted.active_blocks(w),
            active_prefill_tokens=predicted.prefill_total[w],
            active_prefix_blocks=predicted.active_prefixes(ids)[w]) for w in range(N)))
        w = router.route(request, view)
        predicted.added(w, i, ids, 0)
        counts[w] += 1
        for ev in engines[w].prefill(ids):
            if ev[0] == "stored":
                belief.stored(w, np.asarray(ev[2]), 0.0, -1 if ev[1] is None else ev[1])
            else:
                belief.removed(w, np.asarray(ev[1]), 0.0)
    return sorted(counts, reverse=True)


async def _orphans():
    from dynamo.llm import SelectionService

    from policies.routing import KVEvents

    pub = rr.DynamoPublisher(1)
    svc = SelectionService(indexer_threads=1)
    try:
        await svc.upsert_worker({"worker_id": 0, "endpoint": "fake-0",
                                 "kv_events_endpoint": f"tcp://127.0.0.1:{pub.ports[0]}",
                                 "block_size": BLOCK})
        tokens = list(range(1, 4 * BLOCK + 1))  # blocks A B C D
        a, b, c, d = range(100, 104)
        tokens_of = {x: tokens[i * BLOCK:(i + 1) * BLOCK] for i, x in enumerate((a, b, c, d))}
        linked = build_belief(KVEvents(drop_orphans=True), 1)
        plain = build_belief(KVEvents(), 1)
        script = [("stored", None, [a, b, c]), ("removed", [a]),  # B, C now unreachable
                  ("stored", None, [a]), ("stored", c, [d])]  # D's parent C: not indexed
        for ev in script:
            for bel in (linked, plain):
                if ev[0] == "stored":
                    bel.stored(0, np.asarray(ev[2]), 0.0, -1 if ev[1] is None else ev[1])
                else:
                    bel.removed(0, np.asarray(ev[1]), 0.0)
        ids = np.asarray([a, b, c, d])
        want = linked.overlaps(ids, 0.0)

        async def settled():
            for ev in script:  # idempotent: re-sent until the listener has them all
                pub.publish(0, [ev], tokens_of, BLOCK)
            await asyncio.sleep(0.05)
            return await _device_overlaps(svc, tokens) == want + [0] * (N - 1)
        await _until("Dynamo's index to settle", settled, timeout=15.0)
        return want, plain.overlaps(ids, 0.0), linked.dropped
    finally:
        svc.shutdown()
        pub.close()


def test_the_index_drops_a_store_whose_parent_it_lost():
    linked, plain, dropped = asyncio.run(_orphans())
    assert linked == [1] and dropped == 1  # Dynamo: only A; B, C unreachable, D dropped
    assert plain == [4]  # an index without parent links would count all four


def test_zero_temperature_ties_are_drawn_uniformly():
    rng = np.random.default_rng(11)
    draws = Counter(dynamo.sample([5.0, 5.0, 7.0, 5.0], None, 0.0, rng) for _ in range(3000))
    assert set(draws) == {0, 1, 3}
    chi2 = sum((draws[w] - 1000) ** 2 / 1000 for w in (0, 1, 3))
    assert chi2 < 13.82, draws  # chi-square, 2 degrees of freedom, p = 0.001
    # the classic selector sends the same tie to the smallest tree every time
    assert {dynamo.sample([5.0, 5.0, 7.0, 5.0], [9, 2, 0, 4], 0.0, rng)
            for _ in range(50)} == {1}
