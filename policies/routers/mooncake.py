"""Mooncake's Conductor (FAST'25, Algorithm 1): the prefill instance with the least estimated
time to first token.

    TTFT_w = T_queue_w + T_prefill(prompt, prefix_w)
    T_queue_w: the predicted prefill times of the requests queued on w, summed
    T_prefill: the prefill time of the prompt's uncached part after the prefix w holds
"Conductor assigns the request to the instance with the shortest TTFT and updates the cache
and queue times for that instance." kvsim prices T_prefill with its own cost model (the run's
profile), in the engine's prefill chunks, where the paper fits a polynomial offline. The
paper's KV transfer branch (pull a much longer prefix from another instance when
``best_len / prefix_w`` exceeds ``kvcache_balancing_threshold``) needs a shared KV pool,
which a kvsim fleet does not have: each replica computes what it does not hold. Exact ties
are broken with the run's seeded RNG (the paper's strict ``<`` would take the first).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ttft(queue_s: Sequence[float], prefill_s: Sequence[float]) -> list[float]:
    return [q + p for q, p in zip(queue_s, prefill_s, strict=True)]


def select(queue_s: Sequence[float], prefill_s: Sequence[float],
           rng: np.random.Generator) -> int:
    """argmin of the estimated TTFT, exact ties at random."""
    est = ttft(queue_s, prefill_s)
    lo = min(est)
    best = [w for w, t in enumerate(est) if t == lo]
    return best[0] if len(best) == 1 else best[int(rng.integers(len(best)))]
