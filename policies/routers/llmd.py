"""llm-d's inference scheduler (the Endpoint Picker, ex Gateway API Inference Extension):
weighted scorers and the max-score picker.

llm-d-inference-scheduler @520af478 (2026-05): with no config file the scheduler runs
``prefix-cache-scorer`` (weight 3), ``queue-scorer`` (2) and ``kv-cache-utilization-scorer``
(2) and picks the highest total (shuffle, then stable sort: a random tie-break):

    score(e) = sum_i weight_i * clamp(scorer_i(e), 0, 1)
    prefix:   matched hashed blocks / hashed blocks of the prompt (approximate index of what
              the router sent each pod; 16-token blocks, the first 256 of them, an LRU of
              31,250 hashes per pod)
    queue:    (maxQ - Q_e) / (maxQ - minQ) over the candidates, 1 if all equal
    kv-util:  1 - the pod's KV-cache usage (0..1)
Queue and KV usage are the engines' metrics as last scraped (Prometheus), not live values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..routing import (
    PodLRU,
    Range,
    Router,
    RouteRequest,
    RouterView,
    ScrapedMetrics,
    ranges,
    register_router,
)

PREFIX_WEIGHT = 3.0
QUEUE_WEIGHT = 2.0
KV_UTIL_WEIGHT = 2.0
BLOCK_TOKENS = 16
MAX_PREFIX_BLOCKS = 256
LRU_CAPACITY = 31_250
SCRAPE_S = 0.05  # GIE EPP --refresh-metrics-interval (50 ms)


def hashed_blocks(prompt_tokens: int, block_tokens: int = BLOCK_TOKENS,
                  max_blocks: int = MAX_PREFIX_BLOCKS) -> int:
    """Blocks the approximate producer hashes: the prompt cut into ``block_tokens`` chunks
    (the last partial chunk too), at most ``max_blocks``; none below one block."""
    if prompt_tokens < block_tokens:
        return 0
    return min(max_blocks, -(-prompt_tokens // block_tokens))


def prefix_score(matched_tokens: int, prompt_tokens: int, block_tokens: int = BLOCK_TOKENS,
                 max_blocks: int = MAX_PREFIX_BLOCKS) -> float:
    n = hashed_blocks(prompt_tokens, block_tokens, max_blocks)
    if n == 0:
        return 0.0
    return min(n, matched_tokens // block_tokens) / n


def queue_scores(queues: Sequence[float]) -> list[float]:
    lo, hi = min(queues), max(queues)
    if hi == lo:
        return [1.0] * len(queues)
    return [(hi - q) / (hi - lo) for q in queues]


def scores(prefix: Sequence[float], queues: Sequence[float], kv_usage: Sequence[float], *,
           prefix_weight: float = PREFIX_WEIGHT, queue_weight: float = QUEUE_WEIGHT,
           kv_util_weight: float = KV_UTIL_WEIGHT) -> list[float]:
    def clamp(x: float) -> float:
        return min(1.0, max(0.0, x))

    return [prefix_weight * clamp(p) + queue_weight * clamp(q) + kv_util_weight * clamp(1 - u)
            for p, q, u in zip(prefix, queue_scores(queues), kv_usage, strict=True)]


def max_score(total: Sequence[float], rng: np.random.Generator) -> int:
    """The max-score picker: the highest total, ties uniformly at random."""
    top = max(total)
    best = [w for w, s in enumerate(total) if s == top]
    return best[0] if len(best) == 1 else best[int(rng.integers(len(best)))]


@register_router
class LLMD(Router):
    """llm-d's default scheduler profile (rule and defaults above). The prefix index is the
    approximate one (per-pod LRU of what it routed; sizes in 16-token blocks become kvsim
    blocks: ``lru_capacity * block_tokens / block_size`` entries over the first
    ``max_prefix_blocks * block_tokens`` tokens); queue and KV usage are scraped every
    ``scrape_s`` (before the first scrape: empty queues, no usage)."""

    name = "llm-d"
    prefix_weight: float = PREFIX_WEIGHT
    queue_weight: float = QUEUE_WEIGHT
    kv_util_weight: float = KV_UTIL_WEIGHT
    block_tokens: int = BLOCK_TOKENS
    max_prefix_blocks: int = MAX_PREFIX_BLOCKS
    lru_capacity: int = LRU_CAPACITY
    scrape_s: float = SCRAPE_S
    parameter_ranges = ranges(prefix_weight=Range(0.0), queue_weight=Range(0.0),
                              kv_util_weight=Range(0.0), block_tokens=Range(1),
                              max_prefix_blocks=Range(1), lru_capacity=Range(1),
                              scrape_s=Range(0.0, lo_open=True))

    @property
    def cache_view(self) -> PodLRU:
        bs = max(1, self.block_size)
        return PodLRU(capacity_blocks=max(1, self.lru_capacity * self.block_tokens // bs),
                      max_prefix_blocks=max(1, self.max_prefix_blocks * self.block_tokens // bs))

    @property
    def load_view(self) -> ScrapedMetrics:
        return ScrapedMetrics(scrape_s=self.scrape_s)

    def route(self, request: RouteRequest, view: RouterView) -> int:
        reps = view.replicas
        prefix = [prefix_score(r.overlap_tokens(request) or 0, request.prompt_tokens,
                               self.block_tokens, self.max_prefix_blocks) for r in reps]
        total = scores(prefix, [r.queue or 0 for r in reps], [r.kv_usage or 0.0 for r in reps],
                       prefix_weight=self.prefix_weight, queue_weight=self.queue_weight,
                       kv_util_weight=self.kv_util_weight)
        return max_score(total, self.rng)
