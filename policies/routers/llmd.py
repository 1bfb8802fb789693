"""llm-d's inference scheduler (the Endpoint Picker, ex Gateway API Inference Extension):
weighted scorers and the max-score picker.

llm-d-inference-scheduler (2026; defaults.go @520af478, approximateprefix/types.go @0a4fd844
and plugin.go @d04c61e9): with no config file the scheduler runs ``prefix-cache-scorer``
(weight 3), ``queue-scorer`` (2) and ``kv-cache-utilization-scorer`` (2) and picks the highest
total (shuffle, then stable sort: a random tie-break):

    score(e) = sum_i weight_i * clamp(scorer_i(e), 0, 1)
    prefix:   matched hashed blocks / hashed blocks of the prompt
    queue:    (maxQ - Q_e) / (maxQ - minQ) over the candidates, 1 if all equal
    kv-util:  1 - the pod's KV-cache usage (0..1)

The approximate prefix index (``approx-prefix-cache-producer``, the default): what the router
sent each pod, hashed in blocks, an LRU of hashes per pod. ``autoTune`` is on by default: the
hash block is the engine's reported ``CacheBlockSize`` clamped up to 64 tokens
(``minBlockSizeTokens``, llm-d-router #1158), and each pod's LRU holds as many hashes as the
engine reports GPU blocks (``CacheNumBlocks``, in the engine's own blocks: with vLLM's 16 the
index holds four times the tokens the engine can), so under pressure it believes blocks the
engine evicted; without autoTune: ``blockSizeTokens`` 16 and 31,250 hashes per pod. The first
``maxPrefixBlocksToMatch`` 256 hash blocks of a prompt are hashed. ``precise``: the
``precise-prefix-cache-scorer`` instead (llm-d-kv-cache over the engines' vLLM KV events): the
longest run of leading blocks the pod holds / the prompt's blocks. Queue and KV usage are the
engines' metrics as last scraped (Prometheus), not live values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..routing import (
    CacheViewSpec,
    KVEvents,
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
BLOCK_TOKENS = 16  # blockSizeTokens: the hash block without autoTune (vLLM's default)
MIN_BLOCK_TOKENS = 64  # autoTune's floor on the hash block (minBlockSizeTokens)
ENGINE_BLOCK_TOKENS = 16  # the CacheBlockSize the engines report (vLLM's default)
MAX_PREFIX_BLOCKS = 256
LRU_CAPACITY = 31_250  # hashes per pod without autoTune
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
    """llm-d's default scheduler profile (rule and defaults above). Sizes in hash blocks
    become kvsim blocks: a pod's LRU of ``n`` hashes of ``h`` tokens holds ``n * h /
    block_size`` kvsim blocks, over the prompt's first ``max_prefix_blocks * h`` tokens. With
    ``auto_tune`` ``h = max(64, engine_block_tokens)`` and ``n`` is the pod's cache in engine
    blocks (its capacity in tokens / ``engine_block_tokens``); without, ``h = block_tokens``
    and ``n = lru_capacity``. ``precise``: an exact index from the engines' KV events after
    ``event_lag_s``. Queue and KV usage are scraped every ``scrape_s`` (before the first
    scrape: empty queues, no usage)."""

    name = "llm-d"
    prefix_weight: float = PREFIX_WEIGHT
    queue_weight: float = QUEUE_WEIGHT
    kv_util_weight: float = KV_UTIL_WEIGHT
    precise: bool = False
    event_lag_s: float = 0.0
    auto_tune: bool = True
    block_tokens: int = BLOCK_TOKENS
    engine_block_tokens: int = ENGINE_BLOCK_TOKENS
    max_prefix_blocks: int = MAX_PREFIX_BLOCKS
    lru_capacity: int = LRU_CAPACITY
    scrape_s: float = SCRAPE_S
    parameter_ranges = ranges(prefix_weight=Range(0.0), queue_weight=Range(0.0),
                              kv_util_weight=Range(0.0), block_tokens=Range(1),
                              engine_block_tokens=Range(1), max_prefix_blocks=Range(1),
                              lru_capacity=Range(1), event_lag_s=Range(0.0),
                              scrape_s=Range(0.0, lo_open=True))

    def idle_parameters(self) -> dict[str, str]:
        if self.precise:
            why = "it shapes the approximate index, which precise=true replaces"
            return {k: why for k in ("auto_tune", "block_tokens", "max_prefix_blocks",
                                     "lru_capacity")}
        if self.auto_tune:
            return {"block_tokens": "auto_tune sizes the hash block from the engines' block",
                    "lru_capacity": "auto_tune sizes each pod's index from its engine's cache",
                    "event_lag_s": "it delays KV events, which only precise=true reads"}
        return {"engine_block_tokens": "it is read by auto_tune and precise only",
                "event_lag_s": "it delays KV events, which only precise=true reads"}

    @property
    def hash_tokens(self) -> int:
        """Tokens per hash block of the approximate index."""
        if self.auto_tune:
            return max(MIN_BLOCK_TOKENS, self.engine_block_tokens)
        return self.block_tokens

    @property
    def cache_view(self) -> CacheViewSpec:
        if self.precise:
            return KVEvents(lag_s=self.event_lag_s)
        bs, h = max(1, self.block_size), self.hash_tokens
        prefix = max(1, self.max_prefix_blocks * h // bs)
        if self.auto_tune:  # n = the pod's cache blocks * block_size / engine_block_tokens
            return PodLRU(capacity_blocks=0, max_prefix_blocks=prefix,
                          capacity_per_cache_block=h / self.engine_block_tokens)
        return PodLRU(capacity_blocks=max(1, self.lru_capacity * h // bs),
                      max_prefix_blocks=prefix)

    @property
    def load_view(self) -> ScrapedMetrics:
        return ScrapedMetrics(scrape_s=self.scrape_s)

    def prefix_scores(self, request: RouteRequest, view: RouterView) -> list[float]:
        reps = view.replicas
        if self.precise:
            n = request.blocks
            return [min(1.0, (r.overlap_blocks or 0) / n) if n else 0.0 for r in reps]
        h = self.hash_tokens
        return [prefix_score(r.overlap_tokens(request) or 0, request.prompt_tokens, h,
                             self.max_prefix_blocks) for r in reps]

    def route(self, request: RouteRequest, view: RouterView) -> int:
        reps = view.replicas
        total = scores(self.prefix_scores(request, view), [r.queue or 0 for r in reps],
                       [r.kv_usage or 0.0 for r in reps],
                       prefix_weight=self.prefix_weight, queue_weight=self.queue_weight,
                       kv_util_weight=self.kv_util_weight)
        return max_score(total, self.rng)
