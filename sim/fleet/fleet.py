"""The fleet: receives every request the replay sends, asks the router where it goes, keeps
the router's beliefs, and records each decision beside the truth.

To the replay (``sim.replay``) a fleet looks like one server: ``submit``, ``busy``, ``close``
and ``rec`` (the recorder that times sessions). A request goes to the replica the router
names, whole; its session may move (its history then misses on the new replica).

The fleet reads its replicas only through public queries and the KV events it drains: before
each decision it delivers every event the replicas emitted since the last one
(``kvevents.KVEventFeed``) to the router's exact index, which applies each at the time it
happened (after its lag); each replica's recorder tells it (``ReplicaSignals``) when a
request's record opens and when its first token comes back.

At each decision, for the metrics only (the router never sees them), the fleet reads every
replica's true GPU-resident prefix of the prompt (``gpu_prefix_blocks``, read only): the
reuse available anywhere in the fleet, the reuse captured by the router's choice, and the
router's belief error on the chosen replica. Cost per request: one walk of the prompt's
blocks per replica plus one pass for the belief; no per-token work. At a request's first
admission it records the fleet's ideal: the prefix an unlimited cache shared by every replica
would hold then (a binary search per replica).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any, Final

import simpy

from costmodel.estimate import PrefillEstimate
from policies.routing import (
    ApproxRadix,
    ApproxTree,
    ApproxTTL,
    CacheViewSpec,
    KVEvents,
    PodLRU,
    PredictedLoad,
    ReplicaView,
    Router,
    RouteRequest,
    RouterView,
    ScrapedMetrics,
)
from sim.engines.base import EngineBase
from sim.engines.recorder import RunRecorder
from sim.engines.request import Req
from sim.kvcache.events import BlockRemoved, BlockStored

from .beliefs import CacheBelief, EventBelief, PodLRUBelief, TreeBelief, TTLBelief
from .errors import RoutingError
from .kvevents import KVEventFeed
from .load import InFlight, Predicted, Scraper
from .radix import RadixBelief

__all__ = ["Fleet", "ReplicaSignals", "RoutingError", "build_belief"]


_new_view: Final = tuple.__new__  # a ReplicaView from its fields, without the Python-level __new__
_VIEW_FIELDS: Final = len(ReplicaView._fields)


def replica_views(columns: list[Sequence[Any]]) -> tuple[ReplicaView, ...]:
    """One ``ReplicaView`` per replica from the views' ``columns`` (every field of
    ``ReplicaView``, in its order, one value per replica): how the fleet builds a decision's
    views, each as one tuple."""
    if len(columns) != _VIEW_FIELDS:
        raise TypeError(f"replica_views takes {_VIEW_FIELDS} columns "
                        f"({', '.join(ReplicaView._fields)}), got {len(columns)}")
    n = len(columns[0])
    for column in columns:
        if len(column) != n:
            raise ValueError(f"replica_views: columns of {n} and {len(column)} replicas")
    return tuple([_new_view(ReplicaView, tuple([column[i] for column in columns]))
                  for i in range(n)])


def build_belief(spec: CacheViewSpec | None, n: int,
                 cache_blocks: list[int] | None = None) -> CacheBelief | None:
    """The mechanism for a router's declared cache view (None: the router has none);
    ``cache_blocks``: each replica's cache capacity in blocks, as its engine reports it (a
    view sized by it reads it)."""
    if spec is None:
        return None
    if isinstance(spec, ApproxTree):
        return TreeBelief(n, spec)
    if isinstance(spec, ApproxRadix):
        return RadixBelief(n, spec)
    if isinstance(spec, PodLRU):
        return PodLRUBelief(n, spec, cache_blocks)
    if isinstance(spec, ApproxTTL):
        return TTLBelief(n, spec)
    if isinstance(spec, KVEvents):
        return EventBelief(n, spec)
    raise TypeError(f"unknown cache view {spec!r}")


class ReplicaSignals:
    """What replica ``replica``'s recorder tells the fleet (its ``RecordListener``): a
    request's first admission and its first token (Dynamo's prefill-complete signal). Made
    before the replica, whose engine owns the recorder; the fleet binds it when built."""

    __slots__ = ("fleet", "replica")

    def __init__(self, replica: int) -> None:
        self.replica = replica
        self.fleet: Fleet = None  # type: ignore[assignment]  # set by bind, before the run

    def bind(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def opened(self, req, found) -> None:
        self.fleet.opened(req, found)

    def first_token(self, req) -> None:
        self.fleet.first_token(self.replica, req)


class Decisions:
    """One row per routed request (columns as lists: built into a table at the end)."""

    def __init__(self) -> None:
        self.rid: list[int] = []
        self.session: list[int] = []
        self.time: list[float] = []
        self.replica: list[int] = []
        self.prompt_tokens: list[int] = []
        self.believed_tokens: list[float] = []  # NaN: the router has no cache view
        self.true_tokens: list[int] = []  # GPU-resident prefix on the chosen replica
        self.best_tokens: list[int] = []  # the longest on any replica
        self.follow_up: list[bool] = []  # the session sent a request before
        self.same_replica: list[bool] = []  # ... and this one went where that one did


class Fleet:
    """``replicas``: built engines (sharing ``env``); ``router``: a fresh ``Router``;
    ``rec``: the recorder the replay reports sessions to; ``signals``: each replica's
    recorder listener (``ReplicaSignals``), bound here."""

    def __init__(self, env: simpy.Environment, replicas: list[EngineBase], router: Router,
                 block_size: int, rec: RunRecorder, rng, pool=None,
                 signals: list[ReplicaSignals] | None = None) -> None:
        self.env, self.replicas, self.router, self.rec = env, replicas, router, rec
        self.pool = pool  # a FleetPool (sim/fleet/pooltier.py) or None
        self.bs = block_size
        n = len(replicas)
        router.bind(n, block_size, rng)
        # the run's prefill model, for routers that predict time (Mooncake, Preble)
        first = replicas[0]
        router.bind_prefill_model(PrefillEstimate(first.spec, first.profile,
                                                  first.cfg.engine.chunk_size))
        self.belief = build_belief(router.cache_view, n,
                                   [e.capacity_run_blocks() for e in replicas])
        # the replicas' KV events: the pool's feed when there is a pool (one drain for both)
        self.feed: KVEventFeed | None = pool.feed if pool is not None else None
        if self.belief is not None and self.belief.wants_events:
            if self.feed is None:
                self.feed = KVEventFeed(env, [e.cache for e in replicas])
            indexed: Any = self.belief  # a view that wants events takes them per replica
            self.feed.subscribe_replicas(indexed.replica_events, (BlockStored, BlockRemoved))
        self.inflight = InFlight(n)
        load = router.load_view
        self.scraper: Scraper | None = None
        if isinstance(load, ScrapedMetrics):
            self.scraper = Scraper(env, replicas, load.scrape_s)
            self.scraper.start()
        self.predicted = Predicted(n) if isinstance(load, PredictedLoad) else None
        for s in signals or ():
            s.bind(self)
        # rid -> the fleet's unlimited-cache prefix at its admission (blocks, capped as a hit)
        self.ideal_blocks: dict[int, int] = {}
        self.last_replica: dict[int, int] = {}  # session -> replica of its last request
        self.decisions = Decisions()
        # per-replica load over time: sampled at every decision (the truth, for plots)
        self.load_time: list[float] = []
        self.load_waiting: list[list[int]] = [[] for _ in range(n)]
        self.load_running: list[list[int]] = [[] for _ in range(n)]

    # --- the server interface the replay uses ----------------------------------------------
    @property
    def request_class(self) -> type:
        """The replicas' request record (one engine kind per fleet)."""
        return self.replicas[0].request_class

    def submit(self, req: Req) -> None:
        env, bs = self.env, self.bs
        now = env.now
        if self.feed is not None:
            self.feed.deliver()
        ids = req.ids
        n = len(self.replicas)
        truth = [e.cache.gpu_prefix_blocks(ids) for e in self.replicas]
        overlaps = self.belief.overlaps(ids, now) if self.belief is not None else None
        sizes = self.belief.sizes() if self.belief is not None else None
        request = RouteRequest(req.rid, req.session, now, req.prompt_tokens, ids, bs)
        view = RouterView(now, self._replica_views(ids, overlaps, sizes),
                          self.pool.lookup(ids) if self.pool is not None
                          and self.router.cache_view is not None else None)
        # Called untyped: a router may return a numpy integer, which the compiled core would
        # refuse where the protocol's ``-> int`` is known
        route: Any = self.router.route
        choice = route(request, view)
        if isinstance(choice, bool) or not isinstance(choice, numbers.Integral) \
                or not 0 <= int(choice) < n:
            raise RoutingError(f"router {self.router.label!r} returned {choice!r} for request "
                               f"{req.rid}: not a replica index in 0..{n - 1}")
        r = int(choice)  # numpy integers too
        if self.belief is not None:
            self.belief.routed(ids, r, now)
        self.inflight.dispatched(r, req.prompt_tokens)
        if self.predicted is not None:
            believed = overlaps[r] if overlaps is not None else 0
            self.predicted.added(r, req.rid, ids,
                                 max(0, req.prompt_tokens - believed * bs))
        self._record(req, r, now, overlaps, truth)
        req.done.callbacks.append(self._on_reply(req, r))
        if self.pool is not None:
            self.pool.submit(req, r)  # after a fetch from the pool when one pays
        else:
            self.replicas[r].submit(req)

    def busy(self) -> bool:
        return any(e.busy() for e in self.replicas)

    def close(self) -> None:
        if self.scraper is not None:
            self.scraper.stop()
        for e in self.replicas:
            e.close()
        if self.feed is not None:  # what the engines reported last (their final deletions)
            self.feed.deliver()

    # --- internals --------------------------------------------------------------------------
    def _replica_views(self, ids, overlaps, sizes) -> tuple[ReplicaView, ...]:
        """Every replica's view of the prompt ``ids``, built column by column (one decision
        asks for all)."""
        n = len(self.replicas)
        inf = self.inflight
        none: list[Any] = [None] * n
        queue = running = kv_usage = scraped_at = none
        if self.scraper is not None:
            samples = self.scraper.samples
            at = self.scraper.at
            queue = [m.queue if m is not None else None for m in samples]
            running = [m.running if m is not None else None for m in samples]
            kv_usage = [m.kv_usage if m is not None else None for m in samples]
            scraped_at = [at if m is not None else None for m in samples]
        active = prefill = held = none
        if self.predicted is not None:
            active = [self.predicted.active_blocks(i) for i in range(n)]
            prefill = self.predicted.prefill_total
            held = self.predicted.active_prefixes(ids)
        return replica_views([range(n), overlaps if overlaps is not None else none,
                              sizes if sizes is not None else none, inf.requests, inf.tokens,
                              inf.routed, queue, running, kv_usage, scraped_at, active,
                              prefill, held])

    def _record(self, req: Req, r: int, now: float, overlaps, truth: list[int]) -> None:
        d, bs, p = self.decisions, self.bs, req.prompt_tokens
        d.rid.append(req.rid)
        d.session.append(req.session)
        d.time.append(now)
        d.replica.append(r)
        d.prompt_tokens.append(p)
        d.believed_tokens.append(float(min(overlaps[r] * bs, p)) if overlaps is not None
                                 else float("nan"))
        d.true_tokens.append(min(truth[r] * bs, p))
        d.best_tokens.append(min(max(truth) * bs, p))
        prev = self.last_replica.get(req.session)
        d.follow_up.append(prev is not None)
        d.same_replica.append(prev == r)
        self.last_replica[req.session] = r
        self.load_time.append(now)
        for i, e in enumerate(self.replicas):
            self.load_waiting[i].append(len(e.waiting))
            self.load_running[i].append(len(e.running))

    def _on_reply(self, req, r: int) -> Callable[[Any], None]:
        """The callback of ``req``'s reply, routed to ``r``."""
        return lambda _done: self._finished(req, r)

    def _finished(self, req: Req, r: int) -> None:
        self.inflight.finished(r, req.prompt_tokens)
        if self.predicted is not None:
            self.predicted.freed(r, req.rid, req.ids)
        self.router.on_finish(req.rid, r, self.env.now)

    def opened(self, req: Req, found) -> None:
        """A request's first admission (``found``: its match before any CPU load): the prefix
        an unlimited cache shared by the fleet holds (every replica's cache ever held that
        replica's ``known_prefix_blocks``; with chained ids the union's prefix is the longest
        of them), capped where the engines cap a hit; then the pool's part of what it
        reused."""
        known = 0
        ids = req.ids
        for e in self.replicas:
            # Prefix-closed: a replica knows more than ``known`` blocks only if it knows block
            # ``known``, so most replicas cost one membership test instead of a bisection.
            if known < ids.size and e.knows_block(ids.item(known)):
                known += e.known_prefix_blocks(ids[known:])
        self.ideal_blocks[req.rid] = min(known, (req.prompt_tokens - 1) // self.bs)
        if self.pool is not None:
            self.pool.admitted(req, found)

    def first_token(self, replica: int, req: Req) -> None:
        """``req``'s first token came back from ``replica``."""
        if self.predicted is not None:
            self.predicted.prefill_done(replica, req.rid)
        self.router.on_first_token(req.rid, replica, self.env.now)
