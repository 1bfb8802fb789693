"""The paper's Figure 1 microbenchmark, priced in closed form.

A context of ``C`` tokens is cached; ~30% of it (``round(0.3 * C)`` tokens) is deleted either
as a segment starting at position 2K (``front``) or from the end (``tail``); 512 new tokens are
appended. The next request recomputes the deleted tokens at their original positions plus the
new ones, so both variants compute the same number of tokens and differ only in attention::

    front: [2048, 2048 + d) + [C, C + 512)        tail: [C - d, C) + [C, C + 512)

``speedup`` is the ratio of units of the whole next request (tail / front),
``segment_speedup`` the ratio of the recomputed segments alone, ``speedup_seconds`` the ratio of
the profile's prefill seconds of the whole next request.
"""

from __future__ import annotations

from typing import Any

from .profile import Profile
from .specs import ModelSpec
from .units import range_units, ranges_units

CONTEXTS_K = (8, 16, 32, 64, 128)
FRONT_START = 2048
APPEND = 512
DELETE_FRACTION = 0.3
# Measured by the paper on one H100 with Qwen3-8B (seed text); None where it gives no number,
# and for every other model (the paper measured only this one).
PAPER_MODEL = "qwen3-8b"
PAPER_MEASURED = {8: 1.14, 16: None, 32: None, 64: None, 128: 2.93}


def figure1_row(spec: ModelSpec, profile: Profile, context: int) -> dict[str, Any]:
    spec = profile.pricing_spec(spec)  # a hybrid's kinds at their own rates (units weighted)
    d = round(DELETE_FRACTION * context)
    if FRONT_START + d > context:
        raise ValueError(f"context {context} too short to delete {d} tokens from {FRONT_START}")
    new = (context, context + APPEND)
    front = ranges_units(spec, [(FRONT_START, FRONT_START + d), new])
    tail = ranges_units(spec, [(context - d, context), new])
    seg_front = range_units(spec, FRONT_START, FRONT_START + d)
    seg_tail = range_units(spec, context - d, context)
    t_front, t_tail = profile.prefill_seconds(front), profile.prefill_seconds(tail)
    k = context // 1024
    return {
        "context_tokens": context,
        "deleted_tokens": d,
        "front_units": front.total,
        "tail_units": tail.total,
        "speedup": tail.total / front.total,
        "segment_speedup": seg_tail.total / seg_front.total,
        "front_seconds": t_front,
        "tail_seconds": t_tail,
        "speedup_seconds": t_tail / t_front,
        "paper_measured_speedup": PAPER_MEASURED.get(k)
        if context % 1024 == 0 and spec.name == PAPER_MODEL else None,
    }


def figure1(spec: ModelSpec, profile: Profile, contexts_k=CONTEXTS_K) -> list[dict[str, Any]]:
    return [figure1_row(spec, profile, k * 1024) for k in contexts_k]


def illustrative_example(spec: ModelSpec, shared: int = 16_000, private: int = 100_000,
                         free: int = 30_000) -> dict[str, Any]:
    """The seed's example: 16K shared + 100K private, free 30K from the front of the private
    history or from its end; only the restored segment is counted (1K = 1000 here)."""
    end = shared + private
    front = range_units(spec, shared, shared + free)
    tail = range_units(spec, end - free, end)
    return {
        "shared_tokens": shared, "private_tokens": private, "freed_tokens": free,
        "front_units": front.total, "tail_units": tail.total,
        "attention_ratio": tail.attention / front.attention,
        "speedup": tail.total / front.total,
    }
