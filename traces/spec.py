"""The ``?key=value&...`` part of a ``synthetic:NAME`` spec, parsed once for every generator
(traces/synthetic.py, traces/prefix_groups.py): keys in order, aliases mapped to their
canonical name, a key given twice refused (the last would win silently), sizes in the CLI's
grammar (traces/sizes.py)."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qsl

from .errors import OptionError
from .sizes import SizeError, parse_size


def query_items(spec: str, aliases: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(key, value)`` pairs of ``spec``'s query, each key under its canonical name
    (``aliases``: other spelling -> canonical). OptionError names a key given twice, under
    either spelling."""
    aliases = aliases or {}
    seen: dict[str, str] = {}
    out = []
    for key, val in parse_qsl(spec.partition("?")[2], keep_blank_values=True,
                              strict_parsing=False):
        name = aliases.get(key, key)
        if name in seen:
            what = (f"parameter {key!r} is given twice" if seen[name] == key else
                    f"parameter {key!r} repeats {seen[name]!r} (the same parameter)")
            raise OptionError(f"{spec}: {what}; give it once")
        seen[name] = key
        out.append((name, val))
    return out


def size_value(spec: str, key: str, val: str) -> int:
    """A token count as sizes are written everywhere else (``2k`` = 2,048, ``1e3``)."""
    try:
        return parse_size(val, f"{spec}: parameter {key!r}")
    except SizeError as e:
        raise OptionError(str(e)) from None
