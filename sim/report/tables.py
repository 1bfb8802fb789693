"""Tables laid out for a terminal: each fits 100 columns without a truncated header.

Every command's tables (``kvsim reproduce``, ``kvsim sweep``) show their rows as a few narrow
tables, one per group of metrics, in one unit convention: times in seconds, rates in percent,
relative changes in signed percent, hit-rate changes in signed percentage points (``pp``: a
rate minus a rate, never a relative change of a rate). The JSON outputs have every field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

MAX_WIDTH = 100  # README: tables fit 100 columns, on a wider terminal or piped too


@dataclass(frozen=True)
class Col:
    """A column: its header, the row field, and how the value reads (``KINDS``). ``minus``
    names a second field subtracted from the first (a ``pp`` difference of two rates)."""

    head: str
    key: str
    kind: str = "text"
    minus: str | None = None


def _change(v: float) -> str:
    return f"{v:+.1%}"


def _tokens(v: int) -> str:
    return f"{v // 1024:,}K" if v % 1024 == 0 and v else f"{v:,}"


KINDS: dict[str, Callable[[Any], str]] = {
    "text": str,
    "int": lambda v: f"{v:,}",
    "tokens": _tokens,
    "s": lambda v: f"{v:.3f}",
    "ms": lambda v: f"{1000 * v:.2f}",
    "float3": lambda v: f"{v:.3f}",
    "rate": lambda v: f"{v:.1%}",
    "change": _change,
    "pp": lambda v: f"{100 * v:+.1f} pp",
    "ratio": lambda v: f"{v:.2f}",
    "x": lambda v: f"{v:.3f}x",  # a speedup
    "units": lambda v: f"{v:.3e}",  # attention-aware work units (Section 2.2)
    "usd": lambda v: f"{v:,.2f}",
    "per_s": lambda v: f"{v:,.0f}",
    # the paper's number: a relative change, or its text (a range such as "-60%..-36%")
    "paper": lambda v: v if isinstance(v, str) else _change(v),
    "paper_rate": lambda v: v if isinstance(v, str) else f"{v:.1%}",
}


def cell(row: dict[str, Any], col: Col) -> str:
    v = row.get(col.key)
    if col.minus is not None and v is not None:
        ref = row.get(col.minus)
        v = None if ref is None else v - ref
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return KINDS[col.kind](v)


def narrow_table(title: str, cols: list[Col], rows: list[dict[str, Any]]) -> Table:
    """A table whose headers wrap on their own lines, never truncated."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False)
    for c in cols:
        t.add_column(c.head, justify="left" if c.kind == "text" else "right",
                     overflow="fold")
    for r in rows:
        t.add_row(*(cell(r, c) for c in cols))
    # README's 100 columns on any console (a piped one is 200 wide): a wider table folds its
    # text columns; a number never breaks across lines (cut, it shows an ellipsis)
    wide = Console(width=10_000)
    if Measurement.get(wide, wide.options, t).maximum > MAX_WIDTH:
        t.width = MAX_WIDTH
        for col in t.columns:
            if col.justify == "right":
                col.no_wrap, col.overflow = True, "ellipsis"
    return t


# Units shared by every table (run, sweep, reproduce): rates and shares in percent, changes
# in signed percent, times in seconds, counts with thousands separators.
PERCENT_KEYS = ("hit_rate", "share", "fraction", "reuse_", "affinity", "attainment")
MS_KEYS = ("tpot_", "itl_")  # per-token latencies read in milliseconds


def _plain(key: str, v: Any) -> bool:
    """Whether ``fmt_metric`` writes ``key`` as a plain number (no unit, %, or exponent)."""
    return not (isinstance(v, bool | str) or key.endswith("_change") or key == "difference"
                or any(p in key for p in PERCENT_KEYS) or key.endswith("units")
                or key.startswith("bytes_") or (key.startswith(MS_KEYS) and key.endswith("_s")))


def fmt_mean(key: str, v: Any, ci: float | None) -> str:
    """A repeated run's mean and the half-width of its 95% interval (sim/run/repeats.py): no
    ``±`` where every repeat agrees (half-width 0); a plain number to the second significant
    digit of its half-width, at most 3 decimals, so a count's mean reads ``125,312 ±35,165``,
    not ``125,312.000 ±35,165.486``."""
    s = fmt_metric(key, v)
    if ci is None or ci != ci or ci == 0 or s == "-":
        return s
    if _plain(key, v):
        d = min(3, max(0, 1 - Decimal(abs(ci)).adjusted()))  # floor(log10), exactly
        s, half = f"{v:,.{d}f}", f"{ci:,.{d}f}"
    else:
        half = fmt_metric(key, ci).removesuffix(" ms")
    # a half-width that rounds to zero is float noise between equal repeats
    return f"{s} ±{half}" if any(c in "123456789" for c in half.split("e")[0]) else s


def fmt_metric(key: str, v: Any) -> str:
    """One table cell in the units above; ``-`` for a missing value."""
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    if isinstance(v, bool | str):
        return str(v)
    if key.endswith("_change") or key == "difference":
        return f"{v:+.1%}"
    if any(p in key for p in PERCENT_KEYS):
        return f"{v:.1%}"
    if key.startswith(MS_KEYS) and key.endswith("_s"):
        return f"{1000 * v:,.2f} ms"
    if key.endswith("units") or key.startswith("bytes_"):
        return f"{v:.3e}"
    if isinstance(v, float):
        return f"{v:,.3f}"
    return f"{v:,}"
