"""NVIDIA Dynamo's KV router: the cost function and its sampler.

``lib/kv-router`` ``DefaultWorkerSelector`` (classic form @ccd1706e, current
``selector/default.rs`` ``worker_logit``; with the defaults the two agree):

    prefill_blocks_w = (active_prefill_tokens_w + ISL) / block_size
    cost_w = prefill_load_scale * max(0, prefill_blocks_w - overlap_credit * overlap_w)
             + decode_blocks_w
    decode_blocks_w = active_blocks_w + request blocks not already active on w

``overlap_w``: the request's leading blocks cached on w (the router's index: KV events, or
its approximate mode: what it routed, forgotten after ``router_ttl_secs``);
``active_*``: the router's prediction of each worker's in-flight work (prefill tokens until
the first token, unique blocks until the request ends). Sampling at temperature 0: the
lowest cost wins, ties drawn uniformly (Dynamo 1.6.1, ``version="1.6"``: reservoir sampling in
``pick_default_worker``); ``version="classic"``: the selector @ccd1706e, ties to the smallest
cached tree first, then at random. Above 0 a softmax over range-normalised costs,
``p ~ exp(-(cost / (max - min)) / T)``.
Defaults as Dynamo 1.6.1 logs them at startup (``KvRouterConfig initialized``):
overlap_score_credit 1.0, prefill_load_scale 1.0, router_temperature 0.0, use_kv_events true,
router_ttl_secs 120, router_approximate_cache_policy ttl (no tree-size bound: 1.6.1 has no
``router_max_tree_size``). 1.6's event index drops a stored block whose parent it does not
hold, and a removed block takes its descendants (``KVEvents.drop_orphans``). Proven against
``dynamo.llm.SelectionService`` 1.6.1 in tests/test_routers_real_dynamo.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from costmodel import detmath

from ..context import PolicyError
from ..routing import (
    ApproxTTL,
    CacheViewSpec,
    KVEvents,
    OneOf,
    PredictedLoad,
    Range,
    Router,
    RouteRequest,
    RouterView,
    ranges,
    register_router,
)

PREFILL_LOAD_SCALE = 1.0
OVERLAP_CREDIT = 1.0
TEMPERATURE = 0.0
TTL_S = 120.0
MAX_TREE_SIZE = 0  # blocks of Dynamo's block size; 0: no bound (1.6.1); classic: 2^20
PRUNE_RATIO = 0.8
V16, CLASSIC = "1.6", "classic"
VERSIONS = (V16, CLASSIC)
ENGINE_BLOCK_TOKENS = 16  # vLLM's default block: the block Dynamo's sizes count


def costs(isl_tokens: int, block_size: int, overlap_blocks: Sequence[float],
          active_prefill_tokens: Sequence[float], decode_blocks: Sequence[float], *,
          prefill_load_scale: float = PREFILL_LOAD_SCALE,
          overlap_credit: float = OVERLAP_CREDIT) -> list[float]:
    """Per worker, Dynamo's cost (lower is better); ``decode_blocks`` already includes the
    request's blocks not active on that worker."""
    out = []
    for ov, pre, dec in zip(overlap_blocks, active_prefill_tokens, decode_blocks, strict=True):
        prefill = (pre + isl_tokens) / block_size
        out.append(prefill_load_scale * max(0.0, prefill - overlap_credit * ov) + dec)
    return out


def lowest(costs_w: Sequence[float]) -> list[int]:
    """The workers of lowest cost (Dynamo 1.6 draws one uniformly at temperature 0)."""
    lo = min(costs_w)
    return [w for w, c in enumerate(costs_w) if c == lo]


def sample(costs_w: Sequence[float], tree_sizes: Sequence[float] | None, temperature: float,
           rng: np.random.Generator) -> int:
    """Dynamo's sampler. At temperature 0: the lowest cost, ties uniformly (1.6) or, given
    ``tree_sizes`` (classic), to the smallest tree first."""
    n = len(costs_w)
    lo, hi = min(costs_w), max(costs_w)
    if temperature <= 0.0:
        best = lowest(costs_w)
        if len(best) > 1 and tree_sizes is not None:
            small = min(tree_sizes[w] for w in best)
            best = [w for w in best if tree_sizes[w] == small]
        return best[0] if len(best) == 1 else best[int(rng.integers(len(best)))]
    if hi == lo:
        return int(rng.integers(n))
    z = [-(c / (hi - lo)) / temperature for c in costs_w]
    top = max(z)
    p = np.array([detmath.exp(v - top) for v in z])
    return int(rng.choice(n, p=p / p.sum()))


@register_router
class DynamoKV(Router):
    """Dynamo's KV router (cost, sampler and defaults above; KvRouterConfig 2026). Cache
    view: the engines' KV events after ``event_lag_s`` (``use_kv_events``, Dynamo's default),
    or the approximate mode (routed blocks live ``ttl_s``; ``max_tree_size`` blocks of
    ``engine_block_tokens`` tokens, pruned to 80%). Load: the router's prediction, as
    Dynamo's slot manager keeps it (the fleet's ``PredictedLoad``): per worker the prefill
    tokens of requests whose first token has not come back, the unique blocks of its active
    requests and how many leading blocks of this request they hold (its blocks already
    active there)."""

    name = "dynamo-kv"
    load_view = PredictedLoad()
    version: str = V16
    prefill_load_scale: float = PREFILL_LOAD_SCALE
    overlap_credit: float = OVERLAP_CREDIT
    temperature: float = TEMPERATURE
    use_kv_events: bool = True
    event_lag_s: float = 0.0
    ttl_s: float = TTL_S
    max_tree_size: int = MAX_TREE_SIZE
    engine_block_tokens: int = ENGINE_BLOCK_TOKENS
    parameter_ranges = ranges(prefill_load_scale=Range(0.0), overlap_credit=Range(0.0),
                              temperature=Range(0.0), event_lag_s=Range(0.0),
                              ttl_s=Range(0.0, lo_open=True), max_tree_size=Range(0),
                              engine_block_tokens=Range(1), version=OneOf(VERSIONS))

    def idle_parameters(self) -> dict[str, str]:
        if self.use_kv_events:
            why = "it sizes the approximate index, used only with use_kv_events=false"
            return {k: why for k in ("ttl_s", "max_tree_size", "engine_block_tokens")}
        return {"event_lag_s": "it delays KV events, which use_kv_events=false turns off"}

    @property
    def cache_view(self) -> CacheViewSpec:
        if self.use_kv_events:
            return KVEvents(lag_s=self.event_lag_s, drop_orphans=self.version == V16)
        blocks = self.max_tree_size * self.engine_block_tokens // max(1, self.block_size)
        return ApproxTTL(ttl_s=self.ttl_s, max_blocks=max(1, blocks) if blocks else 0,
                         prune_ratio=PRUNE_RATIO)

    def costs(self, request: RouteRequest, view: RouterView) -> list[float]:
        """Every worker's cost for ``request`` (lower is better)."""
        n = len(request.block_ids)
        decode = []
        for r in view.replicas:
            if r.active_blocks is None or r.active_prefix_blocks is None:
                raise PolicyError(f"router {self.name!r}: replica {r.index}'s view has no "
                                  "predicted load (active_blocks, active_prefix_blocks), "
                                  "which its load_view (PredictedLoad) asks for")
            decode.append(r.active_blocks + n - r.active_prefix_blocks)
        return costs(request.prompt_tokens, request.block_size,
                     [r.overlap_blocks or 0 for r in view.replicas],
                     [r.active_prefill_tokens or 0 for r in view.replicas], decode,
                     prefill_load_scale=self.prefill_load_scale,
                     overlap_credit=self.overlap_credit)

    def route(self, request: RouteRequest, view: RouterView) -> int:
        sizes = ([r.belief_blocks or 0 for r in view.replicas] if self.version == CLASSIC
                 else None)
        return sample(self.costs(request, view), sizes, self.temperature, self.rng)
