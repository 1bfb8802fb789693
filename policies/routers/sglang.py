"""SGLang's cache-aware router (SGLang Model Gateway / SMG ``cache_aware``): the decision rule.

Version 1.13 (``version="1.13"``, the default): SMG 1.13.0 from PyPI, ``smg launch --policy
cache_aware`` over HTTP, proven against the real gateway binary in
tests/test_routers_real_smg.py. ``load`` is the gateway's count of requests in flight per
worker (up at selection, down when the response ends); the workers the overload protection
leaves out are not candidates.

1. The prompt is matched against the gateway's tree of the prompts it routed:
   ``match_rate = matched / input_len`` (in float32, as the gateway divides; 0 for an empty
   prompt). Above ``cache_threshold`` (strict) the candidates are the workers holding the
   deepest matched node: the least-loaded of them wins (ties drawn uniformly), unless every
   one trips the count-pressure gate; then the request spills to the least-loaded worker
   that does not trip it (all of them if every worker does).
2. Otherwise (a miss) the least-loaded worker wins, ties drawn uniformly.
3. Count-pressure gate (per candidate, no fleet-wide imbalance test any more): with ``S``
   the load of the ``n`` eligible workers and ``mean = S / n``, a worker trips it when
   ``load > balance_rel_threshold * mean`` and ``load > mean + margin``, ``margin =
   min(balance_abs_threshold, max(4, ceil(2 sqrt(mean))))``: the absolute threshold capped
   at the in-flight count's natural swing (measured against the binary; its ``--help``
   describes the cap).
4. Overload protection: a worker whose engine last reported (``/loads``, polled every
   ``load_monitor_interval_s``) at least ``overload_waiting_requests`` waiting requests or
   ``overload_kv_usage`` KV usage is left out while another is under both; when every worker
   is over them the request goes to the least-loaded one.

Version 1.9 (``version="1.9"``): lightseekorg/smg 73da68ca9 (the same as sglang
``sgl-model-gateway`` since PR #14650, 2025-12-09): if ``max_load - min_load >
balance_abs_threshold`` AND ``max_load > min_load * balance_rel_threshold`` the least-loaded
worker wins (ties: fewer requests processed, then the lower index); else a hit goes to one
holder of the longest match (drawn), a miss to the least-loaded worker, or before PR #14650
to the smallest tree (``miss_branch="smallest-tree"``). Its tree is bounded per worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import isqrt

import numpy as np

from ..routing import (
    ApproxRadix,
    ApproxTree,
    CacheViewSpec,
    OneOf,
    Range,
    Router,
    RouteRequest,
    RouterView,
    ScrapedMetrics,
    ranges,
    register_router,
)

V113, V19 = "1.13", "1.9"
VERSIONS = (V113, V19)
MIN_LOAD = "min-load"
SMALLEST_TREE = "smallest-tree"
MISS_BRANCHES = (MIN_LOAD, SMALLEST_TREE)

CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
EVICTION_INTERVAL_S = 60.0  # smg launch (smg/router_args.py of the 1.13.0 wheel)
MAX_TREE_SIZE = 1 << 26  # characters: shared by all workers (1.13), per worker (1.9)
CHARS_PER_TOKEN = 4.0  # to size the tree in tokens (llm-d's averageCharactersPerToken)
MIN_SPILL_MARGIN = 4
OVERLOAD_WAITING_REQUESTS = 8
OVERLOAD_KV_USAGE = 0.8
LOAD_MONITOR_INTERVAL_S = 10.0
MATCH_REFRESH_EVERY = 8  # a match refreshes its node's stamp when the epoch is a multiple

# which branch of the rule chose the worker (the fleet metrics count them)
IMBALANCED, HIT, MISS, SPILL, OVERLOADED = "imbalanced", "hit", "miss", "spill", "overloaded"


def least_loaded(loads: Sequence[int], among: Sequence[int]) -> list[int]:
    """The workers of ``among`` with the smallest load (the gateway draws one uniformly)."""
    best = min(loads[w] for w in among)
    return [w for w in among if loads[w] == best]


def spill_margin(total: int, n: int, abs_threshold: int) -> int:
    """``min(abs_threshold, max(4, ceil(2 sqrt(total / n))))`` in integers: the smallest
    ``q`` with ``n q^2 >= 4 total`` (no floating-point square root)."""
    q = isqrt(4 * total // n)
    while n * q * q < 4 * total:
        q += 1
    return min(abs_threshold, max(MIN_SPILL_MARGIN, q))


def trips_gate(load: int, total: int, n: int, abs_threshold: int, rel_threshold: float) -> bool:
    """SMG 1.13's count-pressure gate: ``load > rel * mean`` and ``load > mean + margin``."""
    return (load * n > rel_threshold * total
            and load * n > total + n * spill_margin(total, n, abs_threshold))


def is_hit(matched: int, input_len: int, threshold: float) -> bool:
    """``matched / input_len > threshold`` in float32, as the gateway compares."""
    if input_len <= 0:
        return False
    return bool(np.float32(matched) / np.float32(input_len) > np.float32(threshold))


def candidates_113(loads: Sequence[int], holders: Sequence[int], matched: int, input_len: int,
                   eligible: Sequence[int] | None = None, *,
                   cache_threshold: float = CACHE_THRESHOLD,
                   balance_abs_threshold: int = BALANCE_ABS_THRESHOLD,
                   balance_rel_threshold: float = BALANCE_REL_THRESHOLD
                   ) -> tuple[list[int], str]:
    """SMG 1.13's candidates for one request (the gateway draws the worker uniformly among
    them) and the branch: ``holders`` hold the deepest matched node (``matched`` of
    ``input_len`` units); ``eligible``: the workers overload protection leaves in (None:
    all)."""
    n_all = len(loads)
    elig = list(range(n_all)) if eligible is None else list(eligible)
    if not elig:
        return least_loaded(loads, range(n_all)), OVERLOADED
    if holders and is_hit(matched, input_len, cache_threshold):
        ok = set(elig)
        held = [h for h in holders if h in ok]
        if held:
            total, n = sum(loads[w] for w in elig), len(elig)

            def trips(w: int) -> bool:
                return trips_gate(loads[w], total, n, balance_abs_threshold,
                                  balance_rel_threshold)

            safe = [h for h in held if not trips(h)]
            if safe:
                return least_loaded(loads, safe), HIT
            spill = [w for w in elig if not trips(w)] or elig
            return least_loaded(loads, spill), SPILL
    return least_loaded(loads, elig), MISS


def is_imbalanced(min_load: float, max_load: float, abs_threshold: float,
                  rel_threshold: float) -> bool:
    """SMG 1.9's ``is_imbalanced`` without the KV-usage triggers (both off at their default
    1.0)."""
    return max_load - min_load > abs_threshold and max_load > min_load * rel_threshold


def min_load_worker(loads: Sequence[float], processed: Sequence[int]) -> int:
    """argmin of (load, requests processed so far, index): SMG PR #1714's tie-break."""
    return min(range(len(loads)), key=lambda w: (loads[w], processed[w], w))


def select(loads: Sequence[float], processed: Sequence[int], matched: int, input_len: int,
           holder: int | None, tree_sizes: Sequence[float] | None = None, *,
           cache_threshold: float = CACHE_THRESHOLD,
           balance_abs_threshold: float = BALANCE_ABS_THRESHOLD,
           balance_rel_threshold: float = BALANCE_REL_THRESHOLD,
           miss_branch: str = MIN_LOAD) -> tuple[int, str]:
    """SMG 1.9's (worker, branch) for one request.

    ``matched``: length of the longest prefix of the prompt in the router's tree, in the
    unit of ``input_len``; ``holder``: a worker holding that prefix (None when nothing
    matched); ``tree_sizes``: per worker, the size of its part of the tree (smallest-tree
    miss branch only)."""
    least = min_load_worker(loads, processed)
    if is_imbalanced(min(loads), max(loads), balance_abs_threshold, balance_rel_threshold):
        return least, IMBALANCED
    rate = matched / input_len if input_len > 0 else 0.0
    if rate > cache_threshold and holder is not None:
        return holder, HIT
    if miss_branch == SMALLEST_TREE:
        if tree_sizes is None:
            raise ValueError("the smallest-tree miss branch needs tree_sizes")
        return min(range(len(tree_sizes)), key=lambda w: (tree_sizes[w], w)), MISS
    return least, MISS


@register_router
class SGLangCacheAware(Router):
    """SGLang's ``cache_aware`` router (rules and defaults above). Its tree holds every
    prompt it routed (whole kvsim blocks stand for characters: ``max_tree_size`` characters
    become ``max_tree_size / chars_per_token / block_size`` blocks), trimmed every
    ``eviction_interval_s``; it never sees engine evictions. 1.13: radix nodes, one budget for
    all workers, least recently stamped leaf nodes first (an insert stamps the node it ends
    in, a match refreshes its node one epoch in 8); 1.9: a budget per worker, least recently
    routed leaf blocks first. Not modelled (documented in docs/fleet.md): the warm-up slice
    and hit diversion (1.13 runs them on the event-driven gRPC path only), the liveness
    vetoes (kvsim's replicas never fail), the KV-usage imbalance triggers (off by default)."""

    name = "sglang-cache-aware"
    version: str = V113
    cache_threshold: float = CACHE_THRESHOLD
    balance_abs_threshold: int = BALANCE_ABS_THRESHOLD
    balance_rel_threshold: float = BALANCE_REL_THRESHOLD
    eviction_interval_s: float = EVICTION_INTERVAL_S
    max_tree_size: int = MAX_TREE_SIZE
    chars_per_token: float = CHARS_PER_TOKEN
    overload_protection: bool = True
    overload_waiting_requests: int = OVERLOAD_WAITING_REQUESTS
    overload_kv_usage: float = OVERLOAD_KV_USAGE
    load_monitor_interval_s: float = LOAD_MONITOR_INTERVAL_S
    miss_branch: str = MIN_LOAD
    # a match rate is a ratio; a relative imbalance threshold below 1 acts as 1 (max_load
    # is never below min_load)
    parameter_ranges = ranges(cache_threshold=Range(0.0, 1.0), balance_abs_threshold=Range(0),
                              balance_rel_threshold=Range(1.0),
                              eviction_interval_s=Range(0.0, lo_open=True), max_tree_size=Range(0),
                              chars_per_token=Range(0.0, lo_open=True),
                              miss_branch=OneOf(MISS_BRANCHES), version=OneOf(VERSIONS),
                              overload_waiting_requests=Range(1),
                              overload_kv_usage=Range(0.0, 1.0, lo_open=True),
                              load_monitor_interval_s=Range(0.0, lo_open=True))

    def idle_parameters(self) -> dict[str, str]:
        if self.version == V113:
            return {"miss_branch": "it picks between 1.9's miss rules: use it with version=1.9"}
        why = "it is a 1.13 setting; version=1.9 has no overload protection"
        return {k: why for k in ("overload_protection", "overload_waiting_requests",
                                 "overload_kv_usage", "load_monitor_interval_s")}

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.branches = {IMBALANCED: 0, HIT: 0, MISS: 0, SPILL: 0, OVERLOADED: 0}

    @property
    def cache_view(self) -> CacheViewSpec:
        blocks = int(self.max_tree_size / self.chars_per_token / max(1, self.block_size))
        if self.version == V113:
            return ApproxRadix(max_blocks=blocks, eviction_interval_s=self.eviction_interval_s,
                               refresh_every=MATCH_REFRESH_EVERY)
        return ApproxTree(max_blocks=blocks, eviction_interval_s=self.eviction_interval_s)

    @property
    def protects(self) -> bool:
        """Whether overload protection runs (1.13 only): it reads scraped engine metrics."""
        return self.version == V113 and self.overload_protection

    @property
    def load_view(self) -> ScrapedMetrics | None:
        if self.protects:
            return ScrapedMetrics(scrape_s=self.load_monitor_interval_s)
        return None

    def eligible(self, view: RouterView) -> list[int] | None:
        """The workers overload protection leaves in (None: every one). Asked once per
        request: it tests ``protects``, not ``load_view``, which builds and checks a spec."""
        if not self.protects:
            return None
        return [r.index for r in view.replicas
                if r.queue is None or (r.queue < self.overload_waiting_requests
                                       and (r.kv_usage or 0.0) < self.overload_kv_usage)]

    def candidates(self, request: RouteRequest, view: RouterView) -> tuple[list[int], str]:
        """The workers the rule draws among, and the branch (1.9: the holders of a hit, else
        the one least-loaded worker)."""
        reps = view.replicas
        overlaps = [r.overlap_blocks or 0 for r in reps]
        best = max(overlaps)
        holders = [i for i, o in enumerate(overlaps) if o == best] if best else []
        matched = min(best * request.block_size, request.prompt_tokens)
        loads = [r.in_flight for r in reps]
        if self.version == V19:
            w, branch = select(loads, [r.routed for r in reps], matched, request.prompt_tokens,
                               holders[0] if holders else None,
                               [r.belief_blocks or 0 for r in reps],
                               cache_threshold=self.cache_threshold,
                               balance_abs_threshold=self.balance_abs_threshold,
                               balance_rel_threshold=self.balance_rel_threshold,
                               miss_branch=self.miss_branch)
            return (holders if branch == HIT else [w]), branch
        return candidates_113(loads, holders, matched, request.prompt_tokens,
                              self.eligible(view),
                              cache_threshold=self.cache_threshold,
                              balance_abs_threshold=self.balance_abs_threshold,
                              balance_rel_threshold=self.balance_rel_threshold)

    def route(self, request: RouteRequest, view: RouterView) -> int:
        if self.version == V113:
            among, branch = self.candidates(request, view)
            self.branches[branch] += 1
            return self.pick(among)
        reps = view.replicas
        overlaps = [r.overlap_blocks or 0 for r in reps]
        best = max(overlaps)
        holder = self.pick([i for i, o in enumerate(overlaps) if o == best]) if best else None
        matched = min(best * request.block_size, request.prompt_tokens)
        w, branch = select([r.in_flight for r in reps], [r.routed for r in reps], matched,
                           request.prompt_tokens, holder,
                           [r.belief_blocks or 0 for r in reps],
                           cache_threshold=self.cache_threshold,
                           balance_abs_threshold=self.balance_abs_threshold,
                           balance_rel_threshold=self.balance_rel_threshold,
                           miss_branch=self.miss_branch)
        self.branches[branch] += 1
        return w
