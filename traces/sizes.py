"""Sizes in tokens as users write them: one grammar for every option, sweep field and
synthetic trace parameter (``synthetic:prefix-groups?prefix=2k``). It lives here, in the leaf
package, so that trace specs parse sizes as the CLI does; ``sim.io.sizes`` re-exports it.

A number (digits with optional ``_`` grouping and a fraction, or an exponent) and an optional
unit. Units: ``Ki``/``Mi``/``Gi`` (binary, explicit) and ``k``/``m`` (binary too, either case:
kvsim's spelling from the start; the papers' "3 M" is ``3e6``). The commands turn a
``SizeError`` into their own option error (sim/cli/common.py ``parse_size``).
"""

from __future__ import annotations

import re
from decimal import Decimal

_SIZE = re.compile(r"^\s*(?:(?P<exp>\d(?:_?\d)*(?:\.\d+)?[eE]\d+)"
                   r"|(?P<num>\d(?:_?\d)*(?:\.\d+)?)\s*(?P<unit>[kmg]i|[km])?)\s*$",
                   re.IGNORECASE)
SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30}
MAX_SIZE = 1 << 50  # tokens: far beyond any cache, well inside int64 block arithmetic
SIZE_GRAMMAR = ("3000000, 3_000_000 or 3e6 (decimal); 256Ki, 3Mi or 1Gi (binary, Ki = 1,024), "
                "which 256k and 3m also mean")


class SizeError(ValueError):
    """Not a size in tokens (bad input: exit status 2)."""

    exit_code = 2


def parse_size(text: str | int, what: str = "size") -> int:
    """A size in tokens. Decimal: ``3000000``, ``3_000_000``, ``3e6``, ``1.5e6``. Binary:
    ``256Ki`` = 262,144, ``3Mi`` = 3,145,728, ``1Gi``; ``256k`` and ``3m`` (either case)
    mean ``256Ki`` and ``3Mi``. A fraction rounds to the nearest token (``15.6k`` =
    15,974). Raises ``SizeError`` naming ``what`` on anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE.match(str(text))
        if m is None or isinstance(text, bool):
            if str(text).strip().startswith("-"):
                raise SizeError(f"{what} must be >= 0, got {text!r}")
            raise SizeError(f"{what}: expected a size in tokens: {SIZE_GRAMMAR}; got {text!r}")
        number = (m.group("exp") or m.group("num")).replace("_", "")
        value = round(Decimal(number) * SIZE_UNITS[(m.group("unit") or "").lower()])
    if value < 0:
        raise SizeError(f"{what} must be >= 0, got {text!r}")
    if value > MAX_SIZE:
        raise SizeError(f"{what}: {text!r} is more than {MAX_SIZE:,} tokens")
    return value
