"""Sizes in tokens as users write them: one grammar for every option and sweep field.

A number (digits with optional ``_`` grouping and a fraction, or an exponent) and an optional
unit. Units: ``Ki``/``Mi``/``Gi`` (binary, explicit) and ``k``/``m`` (binary too, either case:
kvsim's spelling from the start; the papers' "3 M" is ``3e6``). The commands turn a
``SizeError`` into their own option error (sim/cli/common.py ``parse_size``).
"""

from __future__ import annotations

# The grammar lives in the leaf package (trace specs parse sizes too, and traces/ imports
# nothing of sim's); one source, re-exported here for every room of sim.
from traces.sizes import MAX_SIZE, SIZE_GRAMMAR, SIZE_UNITS, SizeError, parse_size

__all__ = ["MAX_SIZE", "SIZE_GRAMMAR", "SIZE_UNITS", "SizeError", "parse_size", "tokens"]


def tokens(n: int) -> str:
    """A size as it is echoed back: whole tokens with thousands separators."""
    return f"{n:,} tokens"
