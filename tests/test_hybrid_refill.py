"""What a hole costs to refill on a hybrid model (sim/kvcache/refill.py, issue 54 item 4),
against a brute-force search: every start of every hole's refill pass and every hit point of a
small history, checked position by position, the cheapest plan every group can run."""

from __future__ import annotations

from itertools import product

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kvcache.refill import refill_plan


def _positions(intervals: list[tuple[int, int]]) -> set[int]:
    return {p for a, b in intervals for p in range(a, b)}


def _intervals(mask: list[bool]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for p, on in enumerate(mask):
        if on:
            if out and out[-1][1] == p:
                out[-1] = (out[-1][0], p + 1)
            else:
                out.append((p, p + 1))
    return out


def brute(length: int, holes: list[tuple[int, int]], windows: list[tuple[int, list]],
          states: list[int] | None) -> set[frozenset[int]]:
    """Every cheapest set of computed positions over all plans: each hole before the hit is
    refilled by a forward pass `[s, b)` from any start `s` at or before it (passes that meet
    merge), the request computes from its hit `h` to the end; a pass must start where every
    group can resume (the window before it resident or recomputed, a state at it) and so
    must the request at `h` (or continue a pass that ends there)."""
    hole = _positions(holes)
    present = [(w, _positions(iv) - hole) for w, iv in windows]
    state_set = None if states is None else set(states) | {0}

    def window_ok(s: int, r: set[int]) -> bool:
        return all(p in have or p in r for w, have in present for p in range(max(0, s - w), s))

    def feasible(r: set[int], h: int) -> bool:
        for s in r:
            if s - 1 in r:
                continue  # not the start of a pass
            if s and not ((state_set is None or s in state_set) and window_ok(s, r)):
                return False
        if h == 0:
            return True
        state = state_set is None or h in state_set or h - 1 in r
        return state and window_ok(h, r)

    best: set[frozenset[int]] = set()
    best_cost = None
    for h in range(length + 1):
        refilled = [(a, b) for a, b in holes if a < h]
        for starts in product(*(range(a + 1) for a, _ in refilled)):
            r = {p for (_, b), s in zip(refilled, starts, strict=True) for p in range(s, b)}
            if not feasible(r, h):
                continue
            computed = frozenset(r | set(range(h, length)))
            if best_cost is None or len(computed) < best_cost:
                best_cost, best = len(computed), {computed}
            elif len(computed) == best_cost:
                best.add(computed)
    return best


@st.composite
def histories(draw: st.DrawFn) -> tuple:
    length = draw(st.integers(1, 9))
    hole_mask = draw(st.lists(st.booleans(), min_size=length, max_size=length))
    holes = _intervals([m and draw(st.booleans()) for m in hole_mask])
    n_windows = draw(st.integers(0, 2))
    windows = []
    for _ in range(n_windows):
        w = draw(st.integers(1, 4))
        mask = draw(st.lists(st.booleans(), min_size=length, max_size=length))
        windows.append((w, _intervals(mask)))
    states = draw(st.none() | st.lists(st.integers(1, length), unique=True, max_size=length))
    return length, holes, windows, None if states is None else sorted(states)


@settings(max_examples=400, deadline=None)
@given(histories())
def test_refill_plan_is_the_cheapest_plan_every_group_can_run(case: tuple) -> None:
    length, holes, windows, states = case
    plan = refill_plan(length, holes, windows, states)
    computed = _positions(list(plan.ranges)) | set(range(plan.hit, length))
    cheapest = brute(length, holes, windows, states)
    assert len(cheapest) == 1, "the cheapest recompute set is unique"
    assert computed == set(next(iter(cheapest)))
    assert all(a < b for a, b in plan.ranges)
    assert all(b1 < a2 for (_, b1), (a2, _) in zip(plan.ranges, plan.ranges[1:], strict=False))


def test_refill_plan_full_attention_is_the_holes() -> None:
    assert refill_plan(100, [(10, 20), (40, 50)]) == ((( 10, 20), (40, 50)), 100)
    assert refill_plan(100, [(10, 20), (90, 100)]) == (((10, 20),), 90)  # a tail: the request's


def test_refill_plan_sliding_and_recurrent_go_back() -> None:
    # a window of 8: sliding KV kept only for [24, 32) (the last window before a turn end at
    # 32) and the tail; a hole [40, 60) restarts at 32, not 40
    windows = [(8, [(24, 32), (60, 100)])]
    assert refill_plan(100, [(40, 60)], windows) == (((32, 60),), 100)
    # a recurrent group with checkpoints at 32 and 100 only: the same restart, the hit at 100
    assert refill_plan(100, [(40, 60)], windows, [32, 100]) == (((32, 60),), 100)
    # without a checkpoint at the end the request starts over at the last one it can reach
    assert refill_plan(100, [(40, 60)], windows, [32]) == (((32, 60),), 60)
