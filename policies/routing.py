"""Routers: which replica of a fleet serves a request. Decisions only; the fleet
(``sim.fleet``) keeps the beliefs and executes the choice.

A router decides from what a real router can know, never from the engines' true state::

    request ──> RouteRequest (ids, session, prompt tokens, arrival)
                    │
    Router.route(request, view) ──> replica index
                    ▲
    RouterView: per replica (ReplicaView)
      cache belief   what the router THINKS is cached there: the overlap of this request's
                     prompt with the router's cache view, which the router declares
                     (``cache_view``): ApproxRadix (SMG 1.13: what it routed, one budget
                     for all workers, LRU leaf nodes), ApproxTree (SMG 1.9: per-worker size
                     cap, periodic LRU-leaf eviction), PodLRU (llm-d: per-pod LRU of block
                     hashes), ApproxTTL (Dynamo --no-kv-events: routed blocks expire after a
                     TTL), KVEvents (Dynamo / llm-d precise: the engines' stored/removed
                     events, delivered after ``lag_s``), or None (no cache view at all)
      load belief    router-local in-flight requests and tokens (always: every router counts
                     what it dispatched and saw finish); engine metrics scraped every
                     ``scrape_s`` (``ScrapedMetrics``: waiting queue, running, KV usage);
                     predicted active blocks and prefill tokens (``PredictedLoad``: Dynamo)

Granularity: beliefs are in the cache's blocks (``RunConfig.block_size`` tokens, 64 by default:
the finest identity a kvsim trace has). A router that matches characters or 16-token pages in
reality matches whole kvsim blocks here; sizes given in tokens are converted by the router.

Write a router as a subclass: declare parameters as annotated class attributes with defaults
(typed like the default, as eviction policies' are), the beliefs it reads, and ``route``::

    class LeastTokens(Router):
        name = "least-tokens"
        slack: int = 0
        def route(self, request, view):
            loads = [r.in_flight_tokens for r in view.replicas]
            return self.argmin(loads)        # ties: the run's seeded RNG

and run it with ``kvsim run --replicas 4 --router my_router.py:LeastTokens --router-param
slack=8``. ``cache_view``/``load_view`` may be class attributes or properties computed from the
parameters. A router instance belongs to one run; the fleet calls ``bind`` once before it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np

from costmodel.registry import Registry

from .context import PolicyError
from .eviction import Domain, Range, declared_parameters, set_parameters
from .eviction import OneOf as OneOf  # re-exported with Range and ranges: what a router
from .eviction import ranges as ranges  # declares its parameter_ranges with
from .guard import guard_user_router


# ---------------------------------------------------------------------- belief specs
# A router names the beliefs it wants; the fleet (sim.fleet.beliefs) builds and updates them.
# Each spec checks its own fields when it is made (a PolicyError naming the field), so a
# router whose parameters make a bad spec is refused before any run.
def _check_spec(spec: Any, ranges: Mapping[str, Range]) -> None:
    for k, domain in ranges.items():
        v = getattr(spec, k)
        if v not in domain:
            raise PolicyError(f"{type(spec).__name__}: {k} must be {domain}, got {v!r}")


@dataclass(frozen=True)
class ApproxTree:
    """SGLang's cache-aware router tree: every routed prompt is inserted for the chosen
    worker (the router never sees engine evictions). Every ``eviction_interval_s`` each
    worker holding more than ``max_blocks`` blocks loses its least recently routed leaves
    until it fits (between evictions the tree is unbounded). Overlap = the longest prefix
    of the prompt this worker's part of the tree holds."""

    max_blocks: int = 1 << 20
    eviction_interval_s: float = 120.0

    def __post_init__(self) -> None:
        _check_spec(self, {"max_blocks": Range(0), "eviction_interval_s": Range(0, lo_open=True)})


@dataclass(frozen=True)
class ApproxRadix:
    """SMG 1.13's tree (``crates/kv_index`` ``string_tree.rs``): a radix tree of the routed
    prompts, nodes split where prompts diverge, each node stamped per worker. An insert stamps
    only the node the prompt ends in (nodes it passes through keep their stamp, or 0 when the
    worker is new there); a match refreshes its deepest node's stamp for that node's first
    holder when the tree's epoch (one tick per match, one per insert, one per worker at start)
    is a multiple of ``refresh_every``. Every ``eviction_interval_s``, while the blocks of all
    workers together exceed ``max_blocks``, the least recently stamped (worker, leaf node) loses
    that worker from the whole node. Overlap = the longest prefix this worker's part holds."""

    max_blocks: int = 1 << 18
    eviction_interval_s: float = 60.0
    refresh_every: int = 8


@dataclass(frozen=True)
class PodLRU:
    """llm-d's approximate prefix index: per pod an LRU of block hashes (``capacity_blocks``
    entries), the whole routed prompt (its first ``max_prefix_blocks`` blocks) added for the
    chosen pod. With ``capacity_per_cache_block`` > 0 (llm-d's autoTune) a pod's capacity is
    that many entries per block of the replica's own cache instead (``capacity_blocks`` is
    then unused). Overlap follows llm-d's scan: walk the prompt's blocks, stop at the first
    block NO pod holds, and count for each pod the blocks it holds before that point (a pod
    missing an early block still counts later ones)."""

    capacity_blocks: int = 7812
    max_prefix_blocks: int = 64
    capacity_per_cache_block: float = 0.0

    def __post_init__(self) -> None:
        _check_spec(self, {"capacity_blocks": Range(0 if self.capacity_per_cache_block else 1),
                           "max_prefix_blocks": Range(1), "capacity_per_cache_block": Range(0)})


@dataclass(frozen=True)
class ApproxTTL:
    """Dynamo's approximate KV index (``--no-kv-events``): routed blocks are recorded for
    the chosen worker and expire ``ttl_s`` after their last routing; when the index holds
    more than ``max_blocks`` blocks (0: no bound) the least recently routed are pruned down
    to ``prune_ratio`` of it. Overlap = consecutive blocks from the start."""

    ttl_s: float = 120.0
    max_blocks: int = 1 << 20
    prune_ratio: float = 0.8

    def __post_init__(self) -> None:
        _check_spec(self, {"ttl_s": Range(0, lo_open=True), "max_blocks": Range(0),
                           "prune_ratio": Range(0, 1, lo_open=True)})


@dataclass(frozen=True)
class KVEvents:
    """An exact index fed by the engines' KV events (blocks stored on / removed from the
    GPU), each event applied ``lag_s`` seconds after the engine emitted it (0: the truth).
    Overlap = consecutive blocks from the start (a hole at the front is a miss).
    ``drop_orphans``: the index is a tree linked by parent hashes, as Dynamo 1.6's: a stored
    block whose parent the index does not hold for that worker is dropped, and removing a
    block leaves its descendants unreachable (they are forgotten for that worker)."""

    lag_s: float = 0.0
    drop_orphans: bool = False

    def __post_init__(self) -> None:
        _check_spec(self, {"lag_s": Range(0)})


CacheViewSpec = ApproxTree | ApproxRadix | PodLRU | ApproxTTL | KVEvents


@dataclass(frozen=True)
class ScrapedMetrics:
    """Engine metrics (waiting queue, running requests, KV usage) sampled every
    ``scrape_s`` simulated seconds, as a Prometheus scrape sees them (stale in between)."""

    scrape_s: float = 1.0

    def __post_init__(self) -> None:
        _check_spec(self, {"scrape_s": Range(0, lo_open=True)})


@dataclass(frozen=True)
class PredictedLoad:
    """Dynamo's router-predicted load: per worker the unique blocks of its active
    (routed, unfinished) requests, and the prefill tokens (prompt minus believed overlap) of
    those whose first token has not come back yet."""


LoadViewSpec = ScrapedMetrics | PredictedLoad


# ---------------------------------------------------------------------- what a router sees
# A request and a replica are immutable records built at every decision (n views each):
# named tuples, which build several times faster than frozen dataclasses.
class RouteRequest(NamedTuple):
    """The request being routed, as the router's front end sees it (no output length: a
    router cannot know it).

    ``block_ids``: the prompt's full blocks (``block_size`` tokens each), a read-only int64
    array; ids are chained, so equal ids at a position mean an equal prefix up to there
    (they stand for the block hashes real routers compute). ``session``: the trace's session
    index (a session-id header / user key; sub-agents are sessions of their own)."""

    rid: int
    session: int
    arrival_s: float
    prompt_tokens: int
    block_ids: np.ndarray
    block_size: int

    @property
    def blocks(self) -> int:
        return int(self.block_ids.size)


class ReplicaView(NamedTuple):
    """One replica as the router believes it is, at decision time. Read only.

    Cache belief (``None`` when the router declared no cache view):
      ``overlap_blocks``  believed cached prefix of THIS request on the replica, blocks
      ``belief_blocks``   blocks the router's view holds for the replica (SGLang's tenant
                          size, Dynamo's tree_size)
    Router-local load (always):
      ``in_flight``        requests dispatched here and not finished
      ``in_flight_tokens`` their prompt tokens
      ``routed``           requests ever dispatched here
    Scraped engine metrics (``ScrapedMetrics``; ``None`` otherwise, or before the first
    scrape): ``queue`` (waiting requests), ``running``, ``kv_usage`` (0-1: KV held by running
    requests and unevictable cache over capacity, as the engine reports it), ``scraped_at_s``.
    Predicted load (``PredictedLoad``; ``None`` otherwise): ``active_blocks`` (unique blocks of
    its active requests), ``active_prefill_tokens``, ``active_prefix_blocks`` (leading blocks of
    THIS request that its active requests hold: the request's blocks already counted in
    ``active_blocks``).
    """

    index: int
    overlap_blocks: int | None
    belief_blocks: int | None
    in_flight: int
    in_flight_tokens: int
    routed: int
    queue: int | None = None
    running: int | None = None
    kv_usage: float | None = None
    scraped_at_s: float | None = None
    active_blocks: int | None = None
    active_prefill_tokens: int | None = None
    active_prefix_blocks: int | None = None

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The fields, in order (the fleet's ``replica_views`` takes one column for each)."""
        return cls._fields

    def overlap_tokens(self, request: RouteRequest) -> int | None:
        """The believed cached prefix in tokens (capped at the prompt)."""
        if self.overlap_blocks is None:
            return None
        return min(self.overlap_blocks * request.block_size, request.prompt_tokens)


@dataclass(frozen=True, slots=True)
class RouterView:
    """Everything a router may read at one decision: the time and one ``ReplicaView`` per
    replica, in replica order (all replicas are healthy: kvsim models no failures)."""

    now: float
    replicas: tuple[ReplicaView, ...]
    # Leading blocks of this request held by the fleet's shared KV pool (``--pool``; None
    # without one, or for a router without a cache view): every replica can fetch them, so a
    # rule with a host/disk or shared-cache weight (Dynamo's) credits
    # ``max(0, pool_blocks - overlap_blocks)`` beyond its overlap.
    pool_blocks: int | None = None

    def __len__(self) -> int:
        return len(self.replicas)


# ---------------------------------------------------------------------- the router
_RESERVED = frozenset({"name", "cache_view", "load_view", "values", "rng", "n_replicas",
                       "block_size", "seed"})


class Router:
    """A routing policy: ``route(request, view) -> replica index`` (see the module docstring).

    ``cache_view`` (a ``CacheViewSpec`` or None) and ``load_view`` (a ``LoadViewSpec`` or
    None) say which beliefs the fleet keeps for it; router-local in-flight counts are always
    there. ``bind`` gives it the fleet's size and a seeded RNG (``self.rng``, a
    ``numpy.random.Generator``): use it, and only it, for random choices and ties, so a run
    stays a pure function of (trace, config, seed). Optional bookkeeping hooks (the fleet
    already keeps the in-flight counts): ``on_first_token`` when a request it routed gets its
    first token (its prefill is done), ``on_finish`` when it finishes or is dropped.
    """

    name: ClassVar[str] = ""
    # True: the rule prices time (queue or prefill seconds), so ``kvsim capacity`` (a replay
    # without a clock) refuses it.
    needs_clock: ClassVar[bool] = False
    cache_view: CacheViewSpec | None = None
    load_view: LoadViewSpec | None = None
    # The values each parameter may take (``Range``, ``OneOf``), checked when it is set:
    # every parameter of a registered router has one (tests/test_router_params.py).
    parameter_ranges: ClassVar[Mapping[str, Domain]] = {}

    def __init__(self, **params: Any) -> None:
        self.values = set_parameters(self, params, "router")
        self.n_replicas = 0
        self.block_size = 0
        self.rng = np.random.default_rng(0)
        self.prefill_seconds: Callable[[int, int], float] | None = None

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        """Declared parameters and their defaults: the annotated class attributes with a
        default that subclasses define (not ``ClassVar``s, not the belief specs)."""
        return declared_parameters(cls, Router, _RESERVED)

    def idle_parameters(self) -> dict[str, str]:
        """Parameters that do nothing under the others' values, each with the reason (a
        parameter given there is refused); none by default."""
        return {}

    def bind(self, n_replicas: int, block_size: int, rng: np.random.Generator) -> None:
        """Called once by the fleet before the run: its size, the cache block size, and the
        run's seeded RNG for this router."""
        self.n_replicas, self.block_size, self.rng = n_replicas, block_size, rng

    def bind_prefill_model(self, prefill_seconds: Callable[[int, int], float]) -> None:
        """Called by the fleet after ``bind``: ``prefill_seconds(cached, prompt)`` estimates
        the seconds one replica needs to prefill tokens ``[cached, prompt)`` of a prompt
        alone (the run's cost model). Routers that predict time (Mooncake's TTFT, Preble's
        load cost) read it as ``self.prefill_seconds``."""
        self.prefill_seconds = prefill_seconds

    def route(self, request: RouteRequest, view: RouterView) -> int:
        """The replica (0 .. len(view) - 1) that serves ``request``."""
        raise NotImplementedError

    def on_first_token(self, rid: int, replica: int, now: float) -> None:
        """The first token of a request this router sent to ``replica`` came back (again
        after a retraction re-runs its prefill)."""

    def on_finish(self, rid: int, replica: int, now: float) -> None:
        """A request this router sent to ``replica`` finished (or was dropped)."""

    # --- helpers for deterministic ties ----------------------------------------------------
    def pick(self, candidates: Sequence[int]) -> int:
        """One of ``candidates`` (non-empty), uniformly with the run's RNG; a single
        candidate costs no draw (so adding a tie-free router keeps the RNG stream)."""
        if len(candidates) == 1:
            return int(candidates[0])
        return int(candidates[int(self.rng.integers(len(candidates)))])

    def argmin(self, values: Sequence[float]) -> int:
        """Index of the smallest value; ties broken uniformly with the run's RNG."""
        best = min(values)
        return self.pick([i for i, v in enumerate(values) if v == best])

    def argmax(self, values: Sequence[float]) -> int:
        """Index of the largest value; ties broken uniformly with the run's RNG."""
        best = max(values)
        return self.pick([i for i, v in enumerate(values) if v == best])

    # --- identity ---------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """Name shown in tables: the name (or class name) with the parameters that differ
        from their defaults."""
        base = self.name or type(self).__name__
        defaults = type(self).parameters()
        changed = [f"{k}={v}" for k, v in getattr(self, "values", {}).items()
                   if not _same(v, defaults[k])]
        return f"{base}({','.join(changed)})" if changed else base

    def __repr__(self) -> str:
        return f"<router {self.label}>"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


# ---------------------------------------------------------------------- registry
ROUTERS: Registry[type[Router]] = Registry("router", PolicyError, base=Router)


def register_router(cls: type[Router]) -> type[Router]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name:
        raise PolicyError(f"{cls.__name__}: a registered router needs a name")
    return ROUTERS.register(cls.name, cls)


def get_router(text: str | Router, params: dict[str, Any] | None = None) -> Router:
    """A fresh router: a registered name (``policies/routers/``, registered when ``policies``
    is imported), or ``FILE.py:CLASS`` (a
    ``Router`` subclass in the user's file); parameters from ``params`` and/or after a ``?``
    as ``k=v`` pairs joined by ``&`` (``power-of-two?x=1``)."""
    from .registry import is_policy_file, split_spec

    if isinstance(text, Router):
        if params:
            raise PolicyError("router parameters can only be given with a router name")
        return text
    key, params = split_spec(text, params, "router")
    if is_policy_file(key):
        cls = ROUTERS.get(key)
        try:
            router = cls(**params)
        except PolicyError:
            raise
        except Exception as e:  # the user's constructor: one line, not a traceback
            raise PolicyError(f"{key}: cannot create the router: {type(e).__name__}: {e}"
                              ) from None
        return guard_user_router(router, Router)  # the user's methods: errors, answers
    low = key.lower()
    if low in ROUTERS:
        return ROUTERS.get(low)(**params)
    raise ROUTERS.unknown(text)
