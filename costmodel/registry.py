"""One registry shape for every kind of named thing (Vidur ``utils/base_registry.py``).

A kind (eviction policies, victim orders, routers, engines, studies, model specs, ...) is a
``Registry``: ``register(name, item)`` (or ``@register(name)``), ``get(name)`` with one message
for a name it does not know (``unknown``: ``unknown KIND 'NAME'; known: a, b, c``), and
``names()`` in registration order. A registry made with ``base=`` also accepts
``FILE.py:CLASS``: ``get`` loads the file (it is Python code and runs like any module one
imports) and returns its subclass of ``base`` (the kinds users extend: policies, routers).

It lives here, beside ``detmath.py``, because it is a leaf like it: it imports only the
standard library, and every package may import the leaves of ``costmodel`` (``traces`` and
``costmodel`` import nothing else of kvsim's; ``policies`` imports neither ``sim`` nor
``traces``). A home in ``policies`` or ``sim`` would make ``traces`` and ``costmodel`` depend
upward.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def unknown(kind: str, name: object, known: Iterable[str], hint: str = "") -> str:
    """The one message for a name a kind does not know; ``hint`` says what else is
    accepted (``or FILE.py:CLASS``)."""
    listed = ", ".join(known) or "none"
    return f"unknown {kind} {name!r}; known: {listed}" + (f", {hint}" if hint else "")


def is_class_file(text: str) -> bool:
    """``path/to/file.py:ClassName``."""
    path, sep, _cls = text.rpartition(":")
    return bool(sep) and path.endswith(".py")


class Registry(Generic[T]):
    """Items of one kind by name. ``error``: the exception a lookup raises (the kind's own
    input error, so the commands report it in one line); ``base``: the class a user's
    ``FILE.py:CLASS`` must subclass (None: no files), ``file_kind`` what its messages call
    such a file (default: the kind); ``unique``: refuse a second registration of a name
    (``ValueError``; else the later one replaces it)."""

    def __init__(self, kind: str, error: type[Exception] = KeyError, *,
                 base: type | None = None, file_kind: str | None = None,
                 unique: bool = False) -> None:
        self.kind, self.error, self.base, self.unique = kind, error, base, unique
        self.file_kind = file_kind or kind
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T | None = None) -> Any:
        """Add ``item`` under ``name``; without ``item``, a decorator that adds what it
        decorates."""
        if item is None:
            def add(obj: T) -> T:
                self.register(name, obj)
                return obj

            return add
        if self.unique and name in self._items:
            raise ValueError(f"{self.kind} {name!r} registered twice")  # a bug, not input
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        """The item named ``name``, or (with ``base``) the class of a ``FILE.py:CLASS``."""
        if name in self._items:
            return self._items[name]
        if self.base is not None and isinstance(name, str) and is_class_file(name):
            path, _, cls = name.rpartition(":")
            return load_class(path, cls, self.base, self.file_kind, self.error)  # type: ignore[return-value]
        raise self.unknown(name)

    def message(self, name: object, also: Iterable[str] = (), hint: str = "") -> str:
        """The one line for a name this kind does not know: ``also`` lists names accepted
        beside the registered ones, ``hint`` other spellings."""
        if self.base is not None:
            hint = ", ".join(filter(None, (hint, "or FILE.py:CLASS")))
        return unknown(self.kind, name, [*also, *self._items], hint)

    def unknown(self, name: object, also: Iterable[str] = (), hint: str = "") -> Exception:
        """``message`` as this kind's error."""
        return self.error(self.message(name, also, hint))

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def items(self) -> list[tuple[str, T]]:
        return list(self._items.items())

    def values(self) -> list[T]:
        return list(self._items.values())

    def keys(self) -> list[str]:
        return list(self._items)

    def copy(self) -> Registry[T]:
        """A registry of the same kind holding the same items (tests register into one)."""
        other: Registry[T] = Registry(self.kind, self.error, base=self.base,
                                      file_kind=self.file_kind, unique=self.unique)
        other._items = dict(self._items)
        return other

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._items)})"


# --- user classes from files ----------------------------------------------------------------
class _LoadFailed(Exception):
    """A user's file failed to import: where (``path:line``) and why."""


@lru_cache(maxsize=64)
def _load_module(path: str, mtime_ns: int) -> Any:
    digest = hashlib.sha1(f"{path}:{mtime_ns}".encode()).hexdigest()[:12]
    name = f"kvsim_user_policy_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise _LoadFailed(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look classes up by module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's code: report where it failed, in one line
        del sys.modules[name]
        line, text = None, str(e)
        if isinstance(e, SyntaxError):
            line, text = e.lineno, e.msg
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == path:
                line = tb.tb_lineno
            tb = tb.tb_next
        where = f"{path}:{line}" if line else path
        raise _LoadFailed(where, f"{type(e).__name__}: {text}") from None
    return module


def load_class(path: str, class_name: str, base: type, what: str,
               error: type[Exception] = ValueError) -> type:
    """The subclass of ``base`` named ``class_name`` in the file ``path`` (a ``what``:
    policy, router); every failure is one ``error`` line naming the file."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise error(f"{path}: {what} file not found")
    try:
        module = _load_module(str(file), file.stat().st_mtime_ns)
    except _LoadFailed as e:
        if len(e.args) == 1:
            raise error(e.args[0]) from None
        raise error(f"{e.args[0]}: cannot load {what} file: {e.args[1]}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise error(f"{path}: no class {class_name!r} in the {what} file")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise error(f"{path}: {class_name!r} is not a subclass of {base.__name__}")
    return cls
