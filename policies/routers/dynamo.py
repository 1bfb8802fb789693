"""NVIDIA Dynamo's KV router: the cost function and its sampler.

``lib/kv-router`` ``DefaultWorkerSelector`` (classic form @ccd1706e, current
``selector/default.rs`` ``worker_logit`` @a4bdb9bf, 2026; with the defaults the two agree):

    prefill_blocks_w = (active_prefill_tokens_w + ISL) / block_size
    cost_w = prefill_load_scale * max(0, prefill_blocks_w - overlap_credit * overlap_w)
             + decode_blocks_w
    decode_blocks_w = active_blocks_w + request blocks not already active on w

``overlap_w``: the request's leading blocks cached on w (the router's index: KV events, or
its approximate mode: what it routed, forgotten after ``router_ttl_secs``);
``active_*``: the router's prediction of each worker's in-flight work (prefill tokens until
the first token, unique blocks until the request ends). Sampling: at temperature 0 the
lowest cost wins; ties go to the smallest cached tree, then uniformly at random; above 0 a
softmax over range-normalised costs, ``p ~ exp(-(cost / (max - min)) / T)``.
Defaults (KvRouterConfig, 2026): prefill_load_scale 1.0, overlap_score_credit 1.0,
router_temperature 0.0, router_ttl_secs 120 s, router_max_tree_size 2^20 blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

PREFILL_LOAD_SCALE = 1.0
OVERLAP_CREDIT = 1.0
TEMPERATURE = 0.0
TTL_S = 120.0
MAX_TREE_SIZE = 1 << 20


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


def sample(costs_w: Sequence[float], tree_sizes: Sequence[float], temperature: float,
           rng: np.random.Generator) -> int:
    """Dynamo's ``softmax_sample`` with its zero-temperature tie-break."""
    n = len(costs_w)
    lo, hi = min(costs_w), max(costs_w)
    if temperature <= 0.0:
        best = [w for w in range(n) if costs_w[w] == lo]
        if len(best) > 1:
            small = min(tree_sizes[w] for w in best)
            best = [w for w in best if tree_sizes[w] == small]
        return best[0] if len(best) == 1 else best[int(rng.integers(len(best)))]
    if hi == lo:
        return int(rng.integers(n))
    z = [-(c / (hi - lo)) / temperature for c in costs_w]
    top = max(z)
    p = np.array([math.exp(v - top) for v in z])
    return int(rng.choice(n, p=p / p.sum()))
