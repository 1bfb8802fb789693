"""Small vocabularies shared by the trace modules: gap kinds and content kinds."""

from __future__ import annotations

GAP_KINDS: tuple[str, ...] = ("first", "tool", "human")
GAP_FIRST, GAP_TOOL, GAP_HUMAN = 0, 1, 2

# Content kinds of a request's new tokens (cc-traces ``input_types``; other formats map onto
# these); bit i of ``Trace.input_kinds`` is set when kind i is present.
KIND_NAMES: tuple[str, ...] = ("text", "tool_result", "tool_use", "thinking", "image", "other")


def kinds_mask(kinds: list[str] | tuple[str, ...]) -> int:
    m = 0
    for k in kinds:
        i = KIND_NAMES.index(k) if k in KIND_NAMES else len(KIND_NAMES) - 1
        m |= 1 << i
    return m
