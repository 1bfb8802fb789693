"""Preble's E2 scheduler (WukLab/preble @8e7906a, ``global_scheduler_with_time.py``):
exploit a cached prefix when it is longer than what is missing, else explore.

    cached = the prompt's prefix in Preble's global tree of routed prompts
    missed = the rest of the prompt
    if missed < cached:   EXPLOIT: among the GPUs holding that prefix, the one with the
                          least load cost (the only holder if there is one)
    else:                 EXPLORE: the GPU with the least load cost
    load_cost(g) = over the window (3 minutes), the prefill time of what g computed for the
                   requests routed to it + active requests on g * expected output * TPOT
Preble computes the prefill part per tree node (miss rate x hits x prefill time / number of
holders); kvsim charges each routed request's uncached prefill to its GPU, which is the same
sum when every node has one holder. Defaults: window 180 s, TPOT 0.15 s (Preble's initial
value), expected output = the median of the outputs seen (its per-node median). Preble's
rebalancing (moving prefixes off a GPU loaded 1.5x the least one) is not modelled. Ties in
an argmin go to the run's seeded RNG.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from ..context import PolicyError
from ..routing import (
    ApproxTree,
    Range,
    Router,
    RouteRequest,
    RouterView,
    ranges,
    register_router,
)

WINDOW_S = 180.0
TPOT_S = 0.15
MAX_TOKENS_GPU = 198_516  # Preble's per-GPU token budget of its mirrored LRU
EXPLOIT, EXPLORE = "exploit", "explore"


def least_cost(candidates: Sequence[int], load_cost: Sequence[float],
               rng: np.random.Generator) -> int:
    lo = min(load_cost[g] for g in candidates)
    best = [g for g in candidates if load_cost[g] == lo]
    return best[0] if len(best) == 1 else best[int(rng.integers(len(best)))]


def select(cached: int, prompt: int, holders: Sequence[int], load_cost: Sequence[float],
           rng: np.random.Generator) -> tuple[int, str]:
    """(gpu, branch): ``cached`` tokens of the ``prompt`` are in the global tree, held by
    ``holders`` (the GPUs the longest matched prefix was routed to)."""
    missed = prompt - cached
    if holders and missed < cached:
        if len(holders) == 1:
            return holders[0], EXPLOIT
        return least_cost(holders, load_cost, rng), EXPLOIT
    return least_cost(range(len(load_cost)), load_cost, rng), EXPLORE


def window_cost(prefill_s: Sequence[float], active: int, expected_output: float,
                tpot_s: float = TPOT_S) -> float:
    """One GPU's load cost: its windowed prefill seconds plus its decode backlog."""
    return float(sum(prefill_s)) + active * expected_output * tpot_s


@register_router
class Preble(Router):
    """Preble's E2 (rule above). Its global tree is the router's tree of routed prompts
    with per-GPU holders, each GPU's part capped at ``max_tokens_gpu`` tokens and trimmed
    LRU-leaf-first every ``eviction_interval_s`` (Preble mirrors each GPU's LRU; a short
    interval approximates that). ``expected_output_tokens`` stands in for Preble's per-node
    median output length (a router does not see outputs here)."""

    name = "preble"
    window_s: float = WINDOW_S
    tpot_s: float = TPOT_S
    expected_output_tokens: int = 256
    max_tokens_gpu: int = MAX_TOKENS_GPU
    eviction_interval_s: float = 1.0
    parameter_ranges = ranges(window_s=Range(0.0, lo_open=True), tpot_s=Range(0.0),
                              expected_output_tokens=Range(0), max_tokens_gpu=Range(0),
                              eviction_interval_s=Range(0.0, lo_open=True))

    @property
    def cache_view(self) -> ApproxTree:
        return ApproxTree(max_blocks=self.max_tokens_gpu // max(1, self.block_size),
                          eviction_interval_s=self.eviction_interval_s)

    def bind(self, n_replicas, block_size, rng) -> None:
        super().bind(n_replicas, block_size, rng)
        self.history: list[deque[tuple[float, float]]] = [deque() for _ in range(n_replicas)]
        self.window_prefill = [0.0] * n_replicas

    def load_costs(self, view: RouterView) -> list[float]:
        out = []
        for r in view.replicas:
            h = self.history[r.index]
            while h and h[0][0] <= view.now - self.window_s:
                self.window_prefill[r.index] -= h.popleft()[1]
            prefill = max(0.0, self.window_prefill[r.index]) if h else 0.0
            out.append(prefill + r.in_flight * self.expected_output_tokens * self.tpot_s)
        return out

    def route(self, request: RouteRequest, view: RouterView) -> int:
        price = self.prefill_seconds
        if price is None:
            raise PolicyError(f"router {self.name!r} needs the fleet's prefill model "
                              "(bind_prefill_model)")
        p = request.prompt_tokens
        cached = [r.overlap_tokens(request) or 0 for r in view.replicas]
        best = max(cached)
        holders = [i for i, c in enumerate(cached) if c == best] if best else []
        w, _branch = select(best, p, holders, self.load_costs(view), self.rng)
        cost = price(cached[w], p)
        self.history[w].append((view.now, cost))
        self.window_prefill[w] += cost
        return w
