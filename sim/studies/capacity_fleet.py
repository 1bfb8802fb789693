"""Capacity analysis of a fleet: N replica caches behind a router, optionally over a shared
pool, replayed without timing (the fleet view of ``sim/studies/capacity.py``).

Without a clock a router's cache view is the truth (each replica's cached prefix of the
prompt, as an unlagged KV-event index would report it) and its load view is what the
in-flight model (``InFlightModel``) says: each request counts as in flight on its replica
for ``in_flight_s`` seconds of the trace's own time after it arrives. With no hold (the
default) every replica is idle at every decision, so a cache-aware router reduces to its
cache rule and a load-only router to its tie breaking; a router with a load view (Dynamo's
predicted load, llm-d's scraped metrics) is then refused, since the replica holding a prefix
that every prompt shares would win every request. A router whose rule prices time
(``Router.needs_clock``, or one that refuses to decide without the fleet's prefill model) is
refused with a one-line error. The load model feeds the router only: each replica's cache
serves a request at once, as in sim/studies/capacity.py.

One request::

    end the requests whose hold is over (the router hears their first token and finish)
    route (in-flight view + true overlaps + pool prefix)     -> replica r
    replica r serves the prompt and caches it with its output
    (its replay: sim/studies/capacity.py)                              -> h blocks reused there
    pool lookup from block h, in prefix order                  -> p blocks fetched
    write-through: the blocks replica r cached enter the pool (those it lacks);
    write-back: the blocks replica r dropped serving it, least recent first

The pool is ``sim.fleet.pool.SharedPool`` (watermark eviction skipping leases; a fetch's
lease ends at once here). Hit rates are over prompt tokens; ``pool_hit_rate`` is the part the
pool served.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from policies.context import PolicyError
from policies.guard import UserPolicyError
from policies.routing import (
    PredictedLoad,
    ReplicaView,
    Router,
    RouteRequest,
    RouterView,
    ScrapedMetrics,
    get_router,
)
from sim.fleet.load import InFlight, Predicted
from sim.fleet.pool import SharedPool
from sim.report.progress import current as current_progress

from .capacity import (
    DEFAULT_POLICY,
    CapacityOptionError,
    CapacityRow,
    arrival_order,
    arrival_times,
    clockless_policy,
    ideal_hits,
    replay_for,
    reusable_blocks,
)

ROUTER_STREAM = 0x524F55544552  # the fleet's router RNG stream (sim/fleet/results.py)


def clockless_router(name: str, params: dict | None = None, in_flight_s: float = 0.0,
                     replicas: int = 2) -> Router:
    """A fresh router, if it can decide without a clock (see the module doc): one whose rule
    weighs a load view needs the in-flight model (``in_flight_s`` > 0) to choose among
    several ``replicas``."""
    try:
        router = get_router(name, params)
    except PolicyError as e:
        raise CapacityOptionError(f"--router: {e}") from None
    if router.needs_clock:
        raise CapacityOptionError(f"--router {router.label}: its rule prices time (queue or "
                                  "prefill seconds), which a replay without a clock does not "
                                  "have; use a cache or session rule (round-robin, "
                                  "session-affinity, a cache-aware router)")
    if router.load_view is not None and replicas > 1 and not in_flight_s > 0:
        raise CapacityOptionError(
            f"--router {router.label}: its rule weighs each replica's load, and a replay "
            "without a clock has none (every replica would look idle, and the replica "
            "holding a prefix every prompt shares would get every request); give "
            "--in-flight-s S (each request counts as in flight on its replica for S seconds "
            "of the trace's time, about a request's latency) or use a rule without a load "
            "view (round-robin, session-affinity, "
            "sglang-cache-aware?overload_protection=false)")
    return router


class InFlightModel:
    """The load a clockless fleet shows its router: each request is in flight on its replica
    from its arrival until ``hold_s`` seconds of trace time later (``arrival_times``; 0: it
    ends as it is served, and every replica looks idle). Per replica it counts what
    ``sim.fleet.load`` counts in a timed fleet: requests and prompt tokens in flight, and for
    a router with a load view the unique blocks of its in-flight requests, which give
    Dynamo's predicted active blocks (their prefill tokens count until they end: the first
    token has no time of its own here) and the scraped KV usage (those blocks over the
    cache). Without a service model waiting cannot be told from running: a scrape reports
    every in-flight request as both queued and running."""

    def __init__(self, n: int, hold_s: float, track_blocks: bool) -> None:
        self.hold_s = float(hold_s)
        self.inflight = InFlight(n)
        self.active = Predicted(n) if track_blocks else None
        self.queue: deque[tuple[float, int, int, int, np.ndarray]] = deque()

    def release_until(self, now: float, router: Router) -> None:
        """End every request whose hold is over by ``now`` (in arrival order)."""
        q = self.queue
        while q and q[0][0] <= now:
            end, rid, k, tokens, ids = q.popleft()
            self.inflight.finished(k, tokens)
            if self.active is not None:
                self.active.freed(k, rid, ids)
            router.on_first_token(rid, k, end)
            router.on_finish(rid, k, end)

    def dispatched(self, now: float, rid: int, k: int, tokens: int, ids: np.ndarray,
                   prefill_tokens: int) -> None:
        self.inflight.dispatched(k, tokens)
        if self.active is not None:
            self.active.added(k, rid, ids, prefill_tokens)
        self.queue.append((now + self.hold_s, rid, k, tokens, ids))

    def active_prefixes(self, router: Router, ids: np.ndarray, n: int) -> list[int | None]:
        """Per replica, the leading blocks of ``ids`` its in-flight requests hold, for a
        router with a predicted load (None otherwise)."""
        if self.active is None or not isinstance(router.load_view, PredictedLoad):
            return [None] * n
        return list(self.active.active_prefixes(ids))

    def view(self, router: Router, i: int, overlap: int | None, held: int | None,
             capacity_blocks: int, now: float, active_prefix: int | None) -> ReplicaView:
        inf, act = self.inflight, self.active
        kw: dict = {}
        if isinstance(router.load_view, ScrapedMetrics) and act is not None:
            used = act.active_blocks(i) / capacity_blocks if capacity_blocks else 0.0
            kw = dict(queue=inf.requests[i], running=inf.requests[i],
                      kv_usage=min(1.0, used), scraped_at_s=now)
        elif isinstance(router.load_view, PredictedLoad) and act is not None:
            kw = dict(active_blocks=act.active_blocks(i),
                      active_prefill_tokens=act.prefill_total[i],
                      active_prefix_blocks=active_prefix)
        return ReplicaView(i, overlap, held, inf.requests[i], inf.tokens[i], inf.routed[i],
                           **kw)


def idle_replicas(chosen: np.ndarray, replicas: int) -> int:
    """Replicas that served under a tenth of their even share of the requests."""
    if not chosen.shape[0]:
        return 0
    served = np.bincount(chosen, minlength=replicas)
    return int((served * replicas * IDLE_SHARE < chosen.shape[0]).sum())


IDLE_SHARE = 10  # idle: fewer than 1 / IDLE_SHARE of an even share of the requests


def fleet_hits(trace, cache_tokens: int, replicas: int, router: str = "round-robin",
               pool_tokens: int = 0, policy: str = DEFAULT_POLICY,
               order: np.ndarray | None = None, seed: int = 0,
               router_params: dict | None = None, pool_write: str = "write-through",
               in_flight_s: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request (trace index): prompt blocks reused from its replica, blocks fetched from
    the pool, and the replica it went to."""
    bs = trace.block_size
    rt = clockless_router(router, router_params, in_flight_s, replicas)
    rt.bind(replicas, bs, np.random.default_rng([seed, ROUTER_STREAM]))
    cache_blocks = cache_tokens // bs
    caches = [replay_for(cache_blocks, policy) for _ in range(replicas)]
    pool = SharedPool(pool_tokens // bs) if pool_tokens >= bs else None
    write_back = pool is not None and pool_write == "write-back"
    if write_back:
        for c in caches:
            c.evicted = []
    cache_aware = rt.cache_view is not None
    times = arrival_times(trace)
    order = arrival_order(trace) if order is None else order
    load = InFlightModel(replicas, in_flight_s, rt.load_view is not None)
    local = np.zeros(len(trace), np.int64)
    fetched = np.zeros(len(trace), np.int64)
    chosen = np.zeros(len(trace), np.int64)
    sessions = trace.session
    bar = current_progress()
    counting = bar.counts("requests")
    step = max(1, len(order) // 100)
    for i, r in enumerate(order.tolist()):
        now = float(times[r])
        load.release_until(now, rt)
        finish = trace.finish_block_ids(r)
        ids = finish[:trace.n_blocks(r)]
        overlaps = [caches[k].prefix_blocks(ids) if cache_aware else None
                    for k in range(replicas)]
        prefixes = load.active_prefixes(rt, ids, replicas)
        views = tuple(load.view(rt, k, overlaps[k],
                                caches[k].held_blocks if cache_aware else None, cache_blocks,
                                now, prefixes[k])
                      for k in range(replicas))
        prompt_tokens = int(trace.prompt_tokens[r])
        req = RouteRequest(r, int(sessions[r]), now, prompt_tokens, ids, bs)
        view = RouterView(now, views, pool.prefix(ids) if pool is not None and cache_aware
                          else None)
        try:
            k = rt.route(req, view)
        except UserPolicyError:
            raise  # the user's router failed: its own one-line message
        except PolicyError as e:
            raise CapacityOptionError(f"--router {rt.label}: cannot decide without a clock "
                                      f"({e})") from None
        k = int(k)
        if not 0 <= k < replicas:
            raise CapacityOptionError(f"--router {rt.label}: returned {k!r}, not a replica "
                                      f"index in 0..{replicas - 1}")
        believed = overlaps[k] or 0
        load.dispatched(now, r, k, prompt_tokens, ids, max(0, prompt_tokens - believed * bs))
        usable = reusable_blocks(trace, r)
        h = min(caches[k].request(ids, finish), usable)
        local[r] = h
        chosen[r] = k
        if pool is not None:
            p = pool.prefix(ids[:usable], h) if h < usable else 0
            if p:
                got = ids[h:h + p]
                pool.lease(got)  # the fetch: most recent now; its lease ends at once
                pool.release(got)
            fetched[r] = p
            if write_back:  # what the replica dropped serving it, least recent first
                for gone in caches[k].evicted:
                    pool.put(gone)
                caches[k].evicted.clear()
            else:  # every block the replica wrote, its output's too
                pool.put(finish)
        if not in_flight_s > 0:
            load.release_until(now, rt)  # no hold: it ends as it is served
        if counting and (i + 1) % step == 0:
            bar.advance(step)
    if counting:
        bar.advance(len(order) % step)
    return local, fetched, chosen


def fleet_capacity_curve(trace, caches, replicas: int, router: str = "round-robin",
                         pool_tokens: int = 0, policies=(DEFAULT_POLICY,), seed: int = 0,
                         router_params: dict | None = None,
                         pool_write: str = "write-through",
                         in_flight_s: float = 0.0) -> list[CapacityRow]:
    """Rows as ``capacity_curve``'s, for a fleet of ``replicas`` (capacities per replica);
    ``ideal_hit_rate`` is the trace's own (one unlimited cache shared by the fleet)."""
    bs = trace.block_size
    prompt = int(trace.prompt_tokens.sum())
    order = arrival_order(trace)
    ideal = int(ideal_hits(trace, order).sum()) * bs
    ideal_rate = ideal / prompt if prompt else math.nan
    label = clockless_router(router, router_params, in_flight_s, replicas).label
    rows = []
    for name in policies:
        pol = clockless_policy(name).label
        for c in caches:
            if current_progress().counts("requests"):
                current_progress().describe(f"{pol}, {c:,}-token caches")
            local, fetched, chosen = fleet_hits(trace, c, replicas, router, pool_tokens, name,
                                                order, seed, router_params, pool_write,
                                                in_flight_s)
            hit = int(local.sum() + fetched.sum()) * bs
            pool_hit = int(fetched.sum()) * bs
            rows.append(CapacityRow(
                cache_tokens=int(c), replicas=replicas, router=label, policy=pol,
                pool_tokens=int(pool_tokens), hit_rate=hit / prompt if prompt else math.nan,
                ideal_hit_rate=ideal_rate, prompt_tokens=prompt, hit_tokens=hit,
                pool_hit_rate=pool_hit / prompt if prompt else math.nan,
                pool_write=pool_write if pool_tokens else "", in_flight_s=float(in_flight_s),
                idle_replicas=idle_replicas(chosen, replicas)))
    return rows
