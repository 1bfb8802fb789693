"""SGLang's cache-aware router (SGLang Model Gateway / SMG ``cache_aware``): the decision rule.

Rule of SMG ``policies/cache_aware.rs`` ``select_worker`` (lightseekorg/smg 73da68ca9,
2026-08; the same as sglang ``sgl-model-gateway`` since PR #14650, 2025-12-09):

1. ``load`` is the router's own count of requests in flight per worker. The fleet is
   imbalanced when ``max_load - min_load > balance_abs_threshold`` AND
   ``max_load > min_load * balance_rel_threshold``; then the least-loaded worker wins (ties:
   fewer requests processed so far, then the lower index) and the cache is ignored.
2. Otherwise the prompt is matched against the router's approximate tree of the prompts it
   routed: ``match_rate = matched / input_len`` (0 for an empty prompt). Above
   ``cache_threshold`` the worker holding the deepest matched prefix wins; else the miss
   branch: the least-loaded worker (current rule) or, before PR #14650, the worker with the
   smallest tree (``miss_branch="smallest-tree"``, "most available cache space").
CLI defaults (what users run; smg main.rs and the Python RouterArgs agree): cache_threshold
0.3, balance_abs_threshold 64, balance_rel_threshold 1.5, eviction interval 120 s (Python
bindings: 60 s), max_tree_size 2^26 characters per worker.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..routing import (
    ApproxTree,
    OneOf,
    Range,
    Router,
    RouteRequest,
    RouterView,
    ranges,
    register_router,
)

MIN_LOAD = "min-load"
SMALLEST_TREE = "smallest-tree"
MISS_BRANCHES = (MIN_LOAD, SMALLEST_TREE)

CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
EVICTION_INTERVAL_S = 120.0
MAX_TREE_SIZE = 1 << 26  # characters per worker
CHARS_PER_TOKEN = 4.0  # to size the tree in tokens (llm-d's averageCharactersPerToken)

# which branch of the rule chose the worker (the fleet metrics count them)
IMBALANCED, HIT, MISS = "imbalanced", "hit", "miss"


def is_imbalanced(min_load: float, max_load: float, abs_threshold: float,
                  rel_threshold: float) -> bool:
    """SMG ``is_imbalanced`` without the KV-usage triggers (both off at their default 1.0)."""
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
    """(worker, branch) for one request.

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
    """SGLang's ``cache_aware`` router (SMG 73da68ca9; rule above). Its tree holds every
    prompt it routed (whole kvsim blocks stand for characters; ``max_tree_size`` characters
    per worker become ``max_tree_size / chars_per_token / block_size`` blocks), trimmed by
    least-recent leaves every ``eviction_interval_s``; it never sees engine evictions. The
    worker "holding the deepest match" is one of those with the longest believed prefix
    (SGLang returns an arbitrary one; here the run's RNG draws it).
    ``miss_branch=smallest-tree``: the rule before sglang PR #14650 (2025-12-09)."""

    name = "sglang-cache-aware"
    cache_threshold: float = CACHE_THRESHOLD
    balance_abs_threshold: int = BALANCE_ABS_THRESHOLD
    balance_rel_threshold: float = BALANCE_REL_THRESHOLD
    eviction_interval_s: float = EVICTION_INTERVAL_S
    max_tree_size: int = MAX_TREE_SIZE
    chars_per_token: float = CHARS_PER_TOKEN
    miss_branch: str = MIN_LOAD
    # a match rate is a ratio; a relative imbalance threshold below 1 acts as 1 (max_load
    # is never below min_load)
    parameter_ranges = ranges(cache_threshold=Range(0.0, 1.0), balance_abs_threshold=Range(0),
                              balance_rel_threshold=Range(1.0),
                              eviction_interval_s=Range(0.0, lo_open=True), max_tree_size=Range(0),
                              chars_per_token=Range(0.0, lo_open=True),
                              miss_branch=OneOf(MISS_BRANCHES))

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.branches = {IMBALANCED: 0, HIT: 0, MISS: 0}

    @property
    def cache_view(self) -> ApproxTree:
        blocks = int(self.max_tree_size / self.chars_per_token / max(1, self.block_size))
        return ApproxTree(max_blocks=blocks, eviction_interval_s=self.eviction_interval_s)

    def route(self, request: RouteRequest, view: RouterView) -> int:
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
