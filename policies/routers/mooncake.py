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

from ..context import PolicyError
from ..routing import KVEvents, Range, Router, RouteRequest, RouterView, ranges, register_router


def ttft(queue_s: Sequence[float], prefill_s: Sequence[float]) -> list[float]:
    return [q + p for q, p in zip(queue_s, prefill_s, strict=True)]


def select(queue_s: Sequence[float], prefill_s: Sequence[float],
           rng: np.random.Generator) -> int:
    """argmin of the estimated TTFT, exact ties at random."""
    est = ttft(queue_s, prefill_s)
    lo = min(est)
    best = [w for w, t in enumerate(est) if t == lo]
    return best[0] if len(best) == 1 else best[int(rng.integers(len(best)))]


@register_router
class Mooncake(Router):
    """Mooncake's Conductor (rule above). Cache view: the engines' KV events after
    ``event_lag_s`` (the open-source Conductor indexes vLLM's BlockStored/BlockRemoved).
    Queue time: the router's own ledger, as the Conductor "updates the queue time" of the
    instance it picks: each instance is busy with prefill until ``busy_until``; routing a
    request there adds its estimated prefill, so ``T_queue = max(0, busy_until - now)`` is
    the sum of the queued requests' estimates still ahead. Decode time is not in it (the
    paper's instances only prefill)."""

    name = "mooncake"
    event_lag_s: float = 0.0
    parameter_ranges = ranges(event_lag_s=Range(0.0))

    @property
    def cache_view(self) -> KVEvents:
        return KVEvents(lag_s=self.event_lag_s)

    def bind(self, n_replicas, block_size, rng) -> None:
        super().bind(n_replicas, block_size, rng)
        self.busy_until = [0.0] * n_replicas

    def route(self, request: RouteRequest, view: RouterView) -> int:
        price = self.prefill_seconds
        if price is None:
            raise PolicyError(f"router {self.name!r} needs the fleet's prefill model "
                              "(bind_prefill_model)")
        now, p = view.now, request.prompt_tokens
        queue = [max(0.0, self.busy_until[r.index] - now) for r in view.replicas]
        prefill = [price(r.overlap_tokens(request) or 0, p) for r in view.replicas]
        w = select(queue, prefill, self.rng)
        self.busy_until[w] = now + queue[w] + prefill[w]
        return w
