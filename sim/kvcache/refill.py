"""What a hole costs to refill on a hybrid model: the phantom request's ranges (issue 54 item 4).

A hole is a run of positions whose KV an eviction freed in every group (kvsim's NONE node). On
a full-attention model the phantom request recomputes exactly the hole: computing `[a, b)`
needs the KV of `[0, a)`, which is cached. On a hybrid the forward pass that regenerates the
hole's full-attention KV runs every layer, so it needs, at the position `s` where it starts:

- **full groups**: the KV of `[0, s)` (holes before `s` are refilled first, in order);
- **sliding groups** (window `w`): their KV of `[s - w, s)` (SGLang's match rule: the last
  `w` tokens before a hit point; SGLang frees the sliding KV of older tokens, leaving
  *tombstones* whose full KV stays);
- **recurrent groups** (Gated DeltaNet / Mamba): the state after `s` tokens, kept only at
  checkpoints (and the empty state at 0).

So the phantom computes `[s, b)` with `s` the latest *restart point* at or before `a` (and at
or after the end of the previous range, where the pass can simply continue). Every token costs
its own `W + position term` wherever it is computed, so the latest restart point gives the
least recompute, and refilling every hole before the request's hit point costs less than
falling back to a hit before the hole (that fallback would recompute a superset). The request's
own computation starts at the latest restart point at or before the history's end (SGLang's
hit rule); a hole reaching the end is the request's own computation, not a refill.
docs/hybrid.md ("Eviction on hybrids") derives it with worked examples;
tests/test_hybrid_refill.py checks it against a brute-force search over every recompute set.

Positions are in any unit (tokens, or blocks with windows in blocks); intervals are half-open,
sorted and disjoint. Work is per interval, never per position.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NamedTuple

Interval = tuple[int, int]


class RefillPlan(NamedTuple):
    """`ranges`: what the phantom request computes (holes and their run-up), in order;
    `hit`: where the request's own computation starts (its reusable prefix ends)."""

    ranges: tuple[Interval, ...]
    hit: int


def _subtract(present: Sequence[Interval], holes: Sequence[Interval]) -> list[Interval]:
    """`present` minus `holes` (a hole frees every group's KV)."""
    out: list[Interval] = []
    for s, e in present:
        cur = s
        for a, b in holes:
            if b <= cur or a >= e:
                continue
            if a > cur:
                out.append((cur, a))
            cur = max(cur, b)
        if cur < e:
            out.append((cur, e))
    return out


def _add(cover: list[Interval], s: int, e: int) -> list[Interval]:
    """`cover` with `[s, e)` merged in."""
    out: list[Interval] = []
    for a, b in sorted([*cover, (s, e)]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _latest_window(cover: Sequence[Interval], w: int, x: int) -> int:
    """The largest `s <= x` whose window `[max(0, s - w), s)` lies in `cover` (0 always does)."""
    for c0, c1 in reversed(cover):
        lo = 0 if c0 == 0 else c0 + w
        if lo <= x and lo <= c1:
            return min(x, c1)
    return 0


def _latest_restart(x: int, cont: int, covers: Sequence[tuple[int, list[Interval]]],
                    states: Sequence[int] | None) -> int:
    """The largest restart point in `[cont, x]`: `cont` (the pass continues) or a point every
    sliding group has its window before and every recurrent group a state at."""
    while x > cont:
        y = x
        for w, cover in covers:
            y = _latest_window(cover, w, y)
        if states is not None:
            i = bisect.bisect_right(states, y)
            y = states[i - 1] if i else 0
        if y == x:
            return x
        x = y
    return cont


def refill_plan(length: int, holes: Sequence[Interval],
                windows: Sequence[tuple[int, Sequence[Interval]]] = (),
                states: Sequence[int] | None = None) -> RefillPlan:
    """The phantom ranges and the hit point of a request reusing a `length`-position history.

    `holes`: where every group's KV was freed; `windows`: per sliding group its window and the
    intervals where its KV is resident (tombstones are the gaps; holes are taken out);
    `states`: the sorted positions with a recurrent state checkpoint, None without a recurrent
    group (the empty state at 0 is implicit). A full-attention model passes `holes` alone and
    gets the holes back.
    """
    holes = [(a, b) for a, b in holes if b > a]
    while holes and holes[-1][1] >= length:  # a hole at the end: the request computes it
        length = min(length, holes.pop()[0])
    covers = [(w, _subtract(present, holes)) for w, present in windows]
    st = None if states is None else sorted(set(states))
    ranges: list[Interval] = []
    cont = 0
    for a, b in holes:
        s = _latest_restart(a, cont, covers, st)
        if ranges and s == cont:
            ranges[-1] = (ranges[-1][0], b)
        else:
            ranges.append((s, b))
        covers = [(w, _add(cover, s, b)) for w, cover in covers]
        cont = b
    return RefillPlan(tuple(ranges), _latest_restart(length, cont, covers, st))
