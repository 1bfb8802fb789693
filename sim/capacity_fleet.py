"""Capacity analysis of a fleet: N replica caches behind a router, optionally over a shared
pool, replayed without timing (the fleet view of ``sim/capacity.py``).

Without a clock every replica is idle when a request arrives: the router's load view is
empty (no request in flight, empty queues, zero KV usage, zero predicted load) and its cache
view is the truth (each replica's cached prefix of the prompt, as an unlagged KV-event index
would report it), so a cache-aware router reduces to its cache rule and a load-only router to
its tie breaking. A router whose rule prices time (``Router.needs_clock``, or one that refuses
to decide without the fleet's prefill model) is refused with a one-line error.

One request::

    route (idle view + true overlaps + pool prefix) -> replica r
    replica r serves the prompt (its replay: sim/capacity.py)      -> h blocks reused there
    pool lookup from block h, in prefix order                       -> p blocks fetched
    write-through: the prompt's blocks enter the pool (those it lacks); write-back: the
    blocks replica r dropped serving it, least recent first

The pool is ``sim.fleet.pool.SharedPool`` (watermark eviction skipping leases; a fetch's
lease ends at once here). Hit rates are over prompt tokens; ``pool_hit_rate`` is the part the
pool served.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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

from .capacity import (
    DEFAULT_POLICY,
    CapacityOptionError,
    CapacityRow,
    arrival_order,
    clockless_policy,
    replay_for,
)
from .fleet.pool import SharedPool

ROUTER_STREAM = 0x524F55544552  # the fleet's router RNG stream (sim/fleet/run.py)


def clockless_router(name: str, params: dict | None = None) -> Router:
    """A fresh router, if it can decide without a clock (see the module doc)."""
    try:
        router = get_router(name, params)
    except PolicyError as e:
        raise CapacityOptionError(f"--router: {e}") from None
    if router.needs_clock:
        raise CapacityOptionError(f"--router {router.label}: its rule prices time (queue or "
                                  "prefill seconds), which a replay without a clock does not "
                                  "have; use a cache or session rule (round-robin, "
                                  "session-affinity, a cache-aware router)")
    return router


def _idle_view(router: Router, i: int, overlap: int | None, held: int | None,
               routed: int) -> ReplicaView:
    kw: dict = {}
    if isinstance(router.load_view, ScrapedMetrics):
        kw = dict(queue=0, running=0, kv_usage=0.0, scraped_at_s=0.0)
    elif isinstance(router.load_view, PredictedLoad):
        kw = dict(active_blocks=0, active_prefill_tokens=0)
    return ReplicaView(i, overlap, held, 0, 0, routed, **kw)


def fleet_hits(trace, cache_tokens: int, replicas: int, router: str = "round-robin",
               pool_tokens: int = 0, policy: str = DEFAULT_POLICY,
               order: np.ndarray | None = None, seed: int = 0,
               router_params: dict | None = None,
               progress: Callable[[int], None] | None = None,
               pool_write: str = "write-through"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request (trace index): blocks reused from its replica, blocks fetched from the
    pool, and the replica it went to."""
    bs = trace.block_size
    rt = clockless_router(router, router_params)
    rt.bind(replicas, bs, np.random.default_rng([seed, ROUTER_STREAM]))
    caches = [replay_for(cache_tokens // bs, policy) for _ in range(replicas)]
    pool = SharedPool(pool_tokens // bs) if pool_tokens >= bs else None
    write_back = pool is not None and pool_write == "write-back"
    if write_back:
        for c in caches:
            c.evicted = []
    cache_aware = rt.cache_view is not None
    order = arrival_order(trace) if order is None else order
    local = np.zeros(len(trace), np.int64)
    fetched = np.zeros(len(trace), np.int64)
    chosen = np.zeros(len(trace), np.int64)
    routed = [0] * replicas
    sessions = trace.session
    step = max(1, len(order) // 100)
    for i, r in enumerate(order):
        r = int(r)
        ids = trace.block_ids(r)
        views = tuple(_idle_view(rt, k, caches[k].prefix_blocks(ids) if cache_aware else None,
                                 caches[k].held_blocks if cache_aware else None, routed[k])
                      for k in range(replicas))
        req = RouteRequest(r, int(sessions[r]), 0.0, int(trace.prompt_tokens[r]), ids, bs)
        view = RouterView(0.0, views, pool.prefix(ids) if pool is not None and cache_aware
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
        routed[k] += 1
        h = caches[k].request(ids)
        local[r] = h
        chosen[r] = k
        if pool is not None:
            p = pool.prefix(ids, h)
            if p:
                got = ids[h:h + p]
                pool.lease(got)  # the fetch: most recent now; its lease ends at once
                pool.release(got)
            fetched[r] = p
            if write_back:  # what the replica dropped serving it, least recent first
                for gone in caches[k].evicted:
                    pool.put(gone)
                caches[k].evicted.clear()
            else:
                pool.put(ids)
        rt.on_first_token(r, k, 0.0)
        rt.on_finish(r, k, 0.0)
        if progress is not None and (i + 1) % step == 0:
            progress(step)
    if progress is not None:
        progress(len(order) % step)
    return local, fetched, chosen


def fleet_capacity_curve(trace, caches, replicas: int, router: str = "round-robin",
                         pool_tokens: int = 0, policies=(DEFAULT_POLICY,), seed: int = 0,
                         router_params: dict | None = None,
                         progress: Callable[[int], None] | None = None,
                         pool_write: str = "write-through") -> list[CapacityRow]:
    """Rows as ``capacity_curve``'s, for a fleet of ``replicas`` (capacities per replica)."""
    bs = trace.block_size
    prompt = int(trace.prompt_tokens.sum())
    ideal = int(trace.infinite_cache_hits().sum()) * bs
    ideal_rate = ideal / prompt if prompt else math.nan
    order = arrival_order(trace)
    label = clockless_router(router, router_params).label
    rows = []
    for name in policies:
        pol = clockless_policy(name).label
        for c in caches:
            local, fetched, _ = fleet_hits(trace, c, replicas, router, pool_tokens, name,
                                           order, seed, router_params, progress, pool_write)
            hit = int(local.sum() + fetched.sum()) * bs
            pool_hit = int(fetched.sum()) * bs
            rows.append(CapacityRow(
                cache_tokens=int(c), replicas=replicas, router=label, policy=pol,
                pool_tokens=int(pool_tokens), hit_rate=hit / prompt if prompt else math.nan,
                ideal_hit_rate=ideal_rate, prompt_tokens=prompt, hit_tokens=hit,
                pool_hit_rate=pool_hit / prompt if prompt else math.nan,
                pool_write=pool_write if pool_tokens else ""))
    return rows
