"""Helpers for context-strategy tests: an engine-like driver of one request view over a
RadixKVCache (block size 1: tokens are blocks), and a brute-force model of what each block's
KV must be under a session's history (what it could attend to, at which position)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.context.prefill import prefill_ranges
from sim.context.session import SessionState
from sim.context.view import RequestView
from sim.kvcache import RadixKVCache, Tier
from sim.kvcache.versions import raw_of


@dataclass
class Served:
    """What one request did: ``reused``/``computed`` logical blocks, or ``refused``."""

    reused: list[int]
    computed: list[int]
    segments: tuple
    refused: bool = False


def tree_rows(cache: RadixKVCache) -> list[tuple]:
    """The tree as (depth, start, end, tier, raw ids, dropped) rows, children in key order."""
    rows: list[tuple] = []

    def walk(node, depth: int) -> None:
        for key in sorted(node.children):
            c = node.children[key]
            rows.append((depth, c.start, c.end, c.tier.name, raw_of(c.ids).tolist(),
                         bool(c.ids[0] < 0)))
            walk(c, depth + 1)

    walk(cache.root, 0)
    return rows


def room(cache: RadixKVCache, blocks: int) -> bool:
    return cache.make_room(blocks).ok


def serve(cache: RadixKVCache, view: RequestView) -> Served:
    """The SGLang engine's protocol for one view (no chunking, block size 1): an arrival edit,
    match and lock, the plan (reuse, refill, restore), insert the prompt, unlock, a finish
    edit, insert the finish. A request that cannot get room is refused (nothing inserted)."""
    if view.edit is not None and not view.edit_on_finish:
        old, new, dest = view.edit
        cache.edit(old, new, dest, view.rotates)
    m = cache.match(view.ids)
    cache.lock(m.node)
    usable = view.prompt_tokens - 1
    ranges, _, _, _ = prefill_ranges(view, m.segments, usable, view.prompt_tokens, 1)
    computed = sorted({p for a, b in ranges for p in range(a, b) if p < len(view.ids)})
    reused = [p for s, e, t in m.segments for p in range(s, min(e, usable)) if t == Tier.GPU]
    if not room(cache, int(np.count_nonzero(view.ids >= 0))):
        cache.unlock(m.node)
        return Served([], [], m.segments, refused=True)
    cache.insert(view.ids)
    cache.unlock(m.node)
    if view.edit is not None and view.edit_on_finish:
        old, new, dest = view.edit
        cache.edit(old, new, dest, view.rotates)
    if room(cache, int(np.count_nonzero(view.finish >= 0))):
        cache.insert(view.finish)
    return Served(reused, computed, m.segments)


def requirement(state: SessionState, view: RequestView, i: int, after: bool) -> tuple:
    """What the KV of logical block i of ``view`` must be under the session's history:
    (raw id, the raw ids it attends to, its position). ``after``: after the request's own
    drop took effect (its output blocks, and its prompt once the request finished).

    Drop histories: block i attends every earlier block not dropped by an event whose
    trigger block is at or before i; with +repos its position is i minus the blocks dropped
    before it. Text edits (trim, splice): the kept blocks, contiguous (kvsim takes Leyline's
    claim that a spliced KV equals what the edited text produces)."""
    raw = raw_of(view.finish)
    if state.st.drops:
        # the request's own drop (it made the last event) takes effect after its prompt
        events = state.events if after or not view.edit_on_finish else state.events[:-1]

        def dropped_by(e, j: int) -> bool:
            return any(s <= j < t for s, t in zip(e.starts.tolist(), e.ends.tolist(),
                                                   strict=True))

        seen = tuple(int(raw[j]) for j in range(i)
                     if not any(e.trigger <= i and dropped_by(e, j) for e in events))
        before = sum(1 for j in range(i) if any(dropped_by(e, j) for e in events))
        return int(raw[i]), seen, i - before if state.st.repos else i
    return int(raw[i]), tuple(int(x) for x in raw[:i]), i


def sessions_states(strategy, n: int, space, bs: int = 1) -> list[SessionState]:
    return [SessionState(strategy, space, bs, k) for k in range(n)]
