"""Input errors and the strict field readers every loader uses.

A bad trace never crashes with a traceback: loaders raise ``TraceFormatError`` naming the file,
the record and the field; the CLI turns it into one stderr line and exit status 2. With
``lenient=True`` loaders skip the bad record instead and count it in ``Trace.skipped``.
"""

from __future__ import annotations

import math
from typing import Any


def record_label(record: str | int) -> str:
    """How a record is named in messages: ``line N`` (text files, from 1), ``row N`` (tables,
    from 0), ``record PATH`` (a place inside a JSON document, ``[i]`` from 0)."""
    if isinstance(record, int):
        return f"row {record}"
    return record if record.startswith(("line ", "row ")) else f"record {record}"


def origin_note(label: str) -> str:
    """Says where the numbers in a record label start, e.g. ``(lines count from 1)``."""
    notes = []
    if label.startswith("line "):
        notes.append("lines count from 1")
    if label.startswith("row "):
        notes.append("rows count from 0")
    if "[" in label:
        notes.append("[i] counts from 0")
    return f" ({', '.join(notes)})" if notes else ""


class TraceFormatError(ValueError):
    """Bad trace input. ``exit_code = 2`` makes the CLI print the message and exit 2.

    The message is one line: ``FILE: RECORD: field 'F': what`` and, when the record has
    numbers, where they start (``line 3 ... (lines count from 1)``)."""

    exit_code = 2

    def __init__(self, file: str, record: str | int | None, field: str | None, message: str):
        self.file, self.record, self.field = str(file), record, field
        self._args = (file, record, field, message)
        where = [self.file]
        note = ""
        if record is not None:
            label = record_label(record)
            where.append(label)
            note = origin_note(label)
        if field is not None:
            where.append(f"field {field!r}")
        super().__init__(f"{': '.join(where)}: {' '.join(message.split())}{note}")

    def __reduce__(self):  # rebuilt from its arguments when a sweep worker sends it back
        return type(self), self._args


class OptionError(ValueError):
    """A bad option value (gap model, select, spec parameters); exit status 2 in the CLI."""

    exit_code = 2


class RecordReader:
    """Typed access to one JSON record; every failure names file, record and field.

    Numbers may be JSON numbers or numeric strings (cc-traces stores some as strings); booleans,
    NaN, infinities and (for counts) negatives or fractions are rejected.
    """

    __slots__ = ("file", "obj", "record")

    def __init__(self, file: str, record: str | int, obj: Any):
        self.file, self.record = file, record
        if not isinstance(obj, dict):
            raise TraceFormatError(file, record, None,
                                   f"expected a JSON object, got {type(obj).__name__}")
        self.obj = obj

    def fail(self, field: str | None, message: str) -> TraceFormatError:
        return TraceFormatError(self.file, self.record, field, message)

    def raw(self, field: str, default: Any = ...) -> Any:
        if field not in self.obj:
            if default is ...:
                raise self.fail(field, "missing")
            return default
        return self.obj[field]

    def number(self, field: str, default: Any = ..., *, allow_null: bool = False) -> float | None:
        v = self.raw(field, default)
        if v is None and (allow_null or default is None):
            return None
        if v is default and default is not ...:
            return v
        return self._to_float(field, v)

    def _to_float(self, field: str, v: Any) -> float:
        if isinstance(v, bool):
            raise self.fail(field, f"expected a number, got {v!r}")
        if isinstance(v, int | float):
            x = float(v)
        elif isinstance(v, str):
            try:
                x = float(v.strip())
            except ValueError:
                raise self.fail(field, f"expected a number, got {v!r}") from None
        else:
            raise self.fail(field, f"expected a number, got {type(v).__name__}")
        if not math.isfinite(x):
            raise self.fail(field, f"expected a finite number, got {v!r}")
        return x

    def count(self, field: str, default: Any = ...) -> int:
        """A non-negative integer (token counts, lengths)."""
        v = self.raw(field, default)
        if v is default and default is not ...:
            return v
        x = self._to_float(field, v)
        if x < 0 or x != int(x):
            raise self.fail(field, f"expected a non-negative integer, got {v!r}")
        return int(x)

    def seconds(self, field: str, default: Any = ...) -> float | None:
        """A non-negative time or duration; ``null`` gives ``default`` when one is given."""
        v = self.raw(field, default)
        if v is None or (v is default and default is not ...):
            if v is None and default is ...:
                raise self.fail(field, "expected a number, got null")
            return default
        x = self._to_float(field, v)
        if x < 0:
            raise self.fail(field, f"expected a non-negative number, got {v!r}")
        return x

    def string(self, field: str, default: Any = ...) -> str:
        v = self.raw(field, default)
        if v is default and default is not ...:
            return v
        if not isinstance(v, str):
            raise self.fail(field, f"expected a string, got {type(v).__name__}")
        return v

    def str_list(self, field: str, default: Any = ...) -> list[str]:
        v = self.raw(field, default)
        if v is default and default is not ...:
            return v
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.fail(field, "expected a list of strings")
        return v

    def obj_list(self, field: str, default: Any = ...) -> list[Any]:
        v = self.raw(field, default)
        if v is default and default is not ...:
            return v
        if not isinstance(v, list):
            raise self.fail(field, f"expected a list, got {type(v).__name__}")
        return v

    def id_list(self, field: str) -> list[int]:
        """A list of integer block ids (checked cheaply: numpy conversion, no per-id Python)."""
        v = self.raw(field)
        if not isinstance(v, list):
            raise self.fail(field, f"expected a list of integers, got {type(v).__name__}")
        return v
