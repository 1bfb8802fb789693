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

from collections.abc import Sequence

import numpy as np

WINDOW_S = 180.0
TPOT_S = 0.15
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
