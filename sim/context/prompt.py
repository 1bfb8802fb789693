"""What a request's prompt is to the engine and the recorder (``Prompt``), and its trivial
implementation under the ``full`` strategy (``FullPrompt``): the prompt as the trace records
it, every key attended.

The engines and the recorder read a request only through its prompt: the keys it matches
and inserts (``ids``, ``finish``), the regions policies see (``regions``), the edit its
history asks of the cache (``edit``), the keys a token does not attend (``units`` prices a
computed range with exactly the keys its tokens attend), and which recomputed positions it
counts. ``sim.context.view.RequestView`` is the prompt under every other strategy.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import numpy as np

from costmodel.specs import ModelSpec
from costmodel.units import Units, range_units
from sim.kvcache.node import Tier
from sim.kvcache.results import split_match


class Prompt(Protocol):
    kind: str  # "turn" | "summary" (the summarization call of summarize:T:S)
    rid: int  # the trace request
    ids: np.ndarray  # keys of the prompt's full blocks
    prompt_tokens: int
    output_tokens: int
    edit: Any  # (old, new, dest) keys the history re-keys in the cache, or None
    edit_on_finish: bool  # apply ``edit`` when the request finishes (else on arrival)
    freed_positions: int  # positions repositioning gave back (the context limit counts)
    prompt_dropped_tokens: int  # prompt tokens dropped before this request: no KV needed
    ideal_blocks: int  # leading blocks an unlimited cache holds at least
    # computed by the engine's plan (``sim.context.prefill``; zero under ``full``)
    skipped_tokens: int
    restored_tokens: int
    reprefill_tokens: int
    rerotated_tokens: int

    @property
    def finish(self) -> np.ndarray:
        """Keys of prompt + output full blocks: what the finish inserts."""
        ...

    @property
    def regions(self) -> np.ndarray | None:
        """Region code of each prompt block (policies' Arrival event)."""
        ...

    @property
    def dropped_tokens(self) -> int:
        """Tokens whose KV the history dropped by the end of this request."""
        ...

    def units(self, spec: ModelSpec, a: int, b: int) -> Units:
        """Units of computing tokens [a, b) with the keys each of them attends."""
        ...

    def prefill_ranges(self, segments: Any, usable: int, fill_tokens: int, bs: int
             ) -> tuple[list[tuple[int, int]], int, int, int]:
        """(token ranges to compute, reused, hole and CPU tokens) given the match
        ``segments`` (block runs with a tier, after any CPU load), the ``usable`` blocks of a
        match and the ``fill_tokens`` the prefill must reach."""
        ...

    def recomputed_ranges(self, segments: Any, planned: list[tuple[int, int]], ideal: int,
                          bs: int) -> list[tuple[int, int]]:
        """Token ranges computed again inside the ``ideal`` prefix (what an unlimited cache
        would hold), given the match ``segments`` and the engine's ``planned`` ranges."""
        ...


class FullPrompt:
    """The prompt as the trace records it: nothing dropped, nothing edited. ``finish`` and
    ``regions`` are read from the trace when asked (once per request at most)."""

    __slots__ = ("ids", "output_tokens", "prompt_tokens", "rid", "trace")

    kind: ClassVar[str] = "turn"
    edit: ClassVar[None] = None
    edit_on_finish: ClassVar[bool] = False
    freed_positions: ClassVar[int] = 0
    prompt_dropped_tokens: ClassVar[int] = 0
    dropped_tokens: ClassVar[int] = 0
    ideal_blocks: ClassVar[int] = 0
    skipped_tokens: ClassVar[int] = 0
    restored_tokens: ClassVar[int] = 0
    reprefill_tokens: ClassVar[int] = 0
    rerotated_tokens: ClassVar[int] = 0

    def __init__(self, trace: Any, rid: int, ids: np.ndarray, prompt_tokens: int,
                 output_tokens: int) -> None:
        self.trace, self.rid, self.ids = trace, rid, ids
        self.prompt_tokens, self.output_tokens = prompt_tokens, output_tokens

    @property
    def finish(self) -> np.ndarray:
        return self.trace.finish_block_ids(self.rid)

    @property
    def regions(self) -> np.ndarray | None:
        return self.trace.block_regions(self.rid)

    def units(self, spec: ModelSpec, a: int, b: int) -> Units:
        return range_units(spec, a, b)

    def prefill_ranges(self, segments: Any, usable: int, fill_tokens: int, bs: int
             ) -> tuple[list[tuple[int, int]], int, int, int]:
        """Reuse the GPU runs, load the CPU ones, compute the holes (the phantom request)
        and the tail from the end of the match; adjacent ranges merge."""
        gpu, cpu, holes, end = split_match(segments, min(self.ids.size, usable))
        ranges = [(s * bs, e * bs) for s, e in holes]
        ranges.append((end * bs, fill_tokens))
        merged: list[tuple[int, int]] = []
        for a, b in ranges:
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            elif b > a:
                merged.append((a, b))
        return merged, gpu * bs, sum(e - s for s, e in holes) * bs, cpu * bs

    def recomputed_ranges(self, segments: Any, planned: list[tuple[int, int]], ideal: int,
                          bs: int) -> list[tuple[int, int]]:
        """Everything inside ``ideal`` not on the GPU: the match's other segments (holes),
        then the tail past the match (``segments``: the match after any CPU load)."""
        out = []
        pos = 0
        for s, e, tier in segments:
            a, b = s * bs, min(e * bs, ideal)
            if a >= ideal:
                break
            if tier != Tier.GPU and b > a:
                out.append((a, b))
            pos = b
        if pos < ideal:
            out.append((pos, ideal))
        return out


class PrefillOnlyPrompt(FullPrompt):
    """The prompt of a prefill-only request (a disaggregated fleet's prefill worker,
    sim/fleet/pd.py): the trace's prompt, one output token (the one the prefill samples), and
    a finish that inserts the prompt's blocks only (the output is decoded elsewhere)."""

    __slots__ = ()

    def __init__(self, trace: Any, rid: int, ids: np.ndarray, prompt_tokens: int) -> None:
        super().__init__(trace, rid, ids, prompt_tokens, 1)

    @property
    def finish(self) -> np.ndarray:
        return self.ids
