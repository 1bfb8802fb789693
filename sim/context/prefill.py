"""What a request under a context strategy computes, and what that costs.

``prefill_ranges`` is the plan of a request with a ``RequestView``
(``RequestView.prefill_ranges``). Besides the usual reuse (GPU), load (CPU), phantom
refill (holes) and tail, it knows which blocks the history dropped:

- a dropped block needs no KV of its own: it is neither reused nor computed (``skipped``);
- but a token attends every key that was visible when it was computed, so a block computed
  now (a refilled hole, an evicted tail, the new input) needs the dropped blocks it could
  still see (dropped by an event whose trigger lies after it). Their KV is gone, so they are
  computed again, only to be attended, and not kept (``restored``: AKV's restore). Restoring
  a block can need older dropped blocks in turn: intervals are visited from the last one
  back, each against everything computed above it.

``RequestView.units`` prices a computed range with the keys each token attends to: the range
is cut at every drop trigger inside it, and each piece skips the intervals dropped before it.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING

import numpy as np

from sim.kvcache.results import split_match

from .strategies import mask_runs

if TYPE_CHECKING:
    from .view import RequestView



def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if b <= a:
            continue
        if out and out[-1][1] >= a:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _hits(starts: list[int], ranges: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """Does any of the sorted disjoint ``ranges`` (``starts`` their starts) meet [lo, hi)?"""
    if hi <= lo:
        return False
    i = bisect_left(starts, hi) - 1
    return i >= 0 and ranges[i][1] > lo


def prefill_ranges(view: RequestView, segments, usable: int, context_tokens: int, bs: int
                ) -> tuple[list[tuple[int, int]], int, int, int]:
    """(token ranges to compute, reused tokens, hole tokens, cpu tokens) for ``view``'s
    request given its match ``segments`` (block runs with a tier) and ``usable`` blocks;
    sets ``view.restored_tokens``, ``skipped_tokens`` and ``reprefill_tokens``."""
    n = min(len(view.ids), usable)
    any_dropped = view.prompt_dropped_tokens > 0
    gpu, cpu_blocks, hole_runs, end = split_match(segments, n)
    reused, cpu = gpu * bs, cpu_blocks * bs
    holes = sum(e - s for s, e in hole_runs) * bs
    ranges = [(s * bs, e * bs) for s, e in hole_runs]
    if end < n:  # the tail beyond the match: every block the history still sees
        keep = ~(view.ids[end:n] < 0) if any_dropped else None
        if keep is None or keep.all():
            ranges.append((end * bs, n * bs))
        else:
            ks, ke = mask_runs(keep)
            for a, b in zip(ks.tolist(), ke.tolist(), strict=True):
                ranges.append(((end + a) * bs, (end + b) * bs))
    ranges.append((n * bs, context_tokens))
    computed = _merge(ranges)
    restored = 0
    # A dropped interval needs restoring only if a token computed now lies before its
    # trigger; usually every trigger is behind everything computed (only the new tail).
    # Intervals dropped before this request come first (events are in time order).
    prior = view.prior_intervals
    if any_dropped and n and prior and int(view.hid_t[prior - 1]) > computed[0][0]:
        dropped = view.ids[:n] < 0
        hs, he, ht = view.hid_s // bs, view.hid_e // bs, view.hid_t
        starts = [a for a, _ in computed]
        for j in np.argsort(-hs, kind="stable").tolist():
            s, e = int(hs[j]), min(int(he[j]), n)
            if s >= n or not dropped[s]:  # dropped only from this request's end on
                continue
            if _hits(starts, computed, e * bs, int(ht[j])):
                piece = (s * bs, e * bs)
                i = bisect_left(starts, piece[0])
                computed.insert(i, piece)
                starts.insert(i, piece[0])
                restored += piece[1] - piece[0]
        computed = _merge(computed)
    view.restored_tokens = restored
    skipped = view.prompt_dropped_tokens if n == len(view.ids) else (
        int(np.count_nonzero(view.ids[:n] < 0)) * bs if any_dropped else 0)
    view.skipped_tokens = skipped - restored
    lo, hi = view.reprefill_blocks
    view.reprefill_tokens = sum(max(0, min(b, hi * bs) - max(a, lo * bs))
                                for a, b in computed) if hi > lo else 0
    return computed, reused, holes, cpu
