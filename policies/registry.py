"""Finding a policy by what users type: a preset, a spec, a registered name, or a file.

``get_policy(text, params)`` always returns a NEW instance (policies may keep per-run state):

- a preset: ``sglang``, ``vllm``, ``penelope``;
- a spec ``order+start+granularity``, e.g. ``lru+private-head+block``;
- a registered policy class (``@register_policy``), e.g. the zoo's;
- ``path/to/file.py:ClassName``: a subclass of ``EvictionPolicy`` defined in the user's file.
  The file is Python code and runs like any module one imports.

Parameters may follow a ``?`` as ``k=v`` pairs joined by ``&`` (``ttl?tau_s=5&cold=true``),
the same grammar as synthetic trace names, so one string names a configured policy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from .context import PolicyError
from .eviction import PRESETS, EvictionPolicy
from .guard import guard_user_policy

POLICIES: dict[str, type[EvictionPolicy]] = {}


def register_policy(cls: type[EvictionPolicy]) -> type[EvictionPolicy]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name:
        raise PolicyError(f"{cls.__name__}: a registered policy needs a name")
    POLICIES[cls.name] = cls
    return cls


def is_policy_file(text: str) -> bool:
    path, sep, _cls = text.rpartition(":")
    return bool(sep) and path.endswith(".py")


def split_spec(text: str, params: dict[str, Any] | None, what: str
               ) -> tuple[str, dict[str, Any]]:
    """``NAME?k=v&k2=v2`` -> (``NAME``, its parameters merged with ``params``); a pair
    without ``=`` or a parameter given twice is refused (``what``: policy, router)."""
    params = dict(params or {})
    key, _, query = text.strip().partition("?")
    for item in filter(None, query.split("&")):
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise PolicyError(f"{what} {text!r}: {item!r} is not k=v")
        if k in params:
            raise PolicyError(f"{what} {text!r}: parameter {k!r} given twice")
        params[k] = v
    return key, params


def get_policy(text: str | EvictionPolicy, params: dict[str, Any] | None = None
               ) -> EvictionPolicy:
    """A fresh policy for ``text`` (see the module docstring); ``params`` go to its class."""
    if isinstance(text, EvictionPolicy):
        if params:
            raise PolicyError("parameters can only be given with a policy name")
        return text
    key, params = split_spec(text, params, "policy")
    if is_policy_file(key):
        path, _, name = key.rpartition(":")
        cls = load_policy_class(path, name)
        try:
            policy = cls(**params)
        except PolicyError:
            raise
        except Exception as e:  # the user's constructor: one line, not a traceback
            raise PolicyError(f"{key}: cannot create the policy: {type(e).__name__}: {e}"
                              ) from None
        return guard_user_policy(policy)  # the user's methods: errors and types checked
    low = key.lower()
    if low in PRESETS or low.count("+") == 2:
        if params:
            raise PolicyError(f"policy {key!r} takes no parameters (got {sorted(params)})")
        if low in PRESETS:
            return EvictionPolicy(*PRESETS[low])
        return EvictionPolicy(*low.split("+"))
    if low in POLICIES:
        return POLICIES[low](**params)
    known = [*PRESETS, *sorted(POLICIES)]
    raise PolicyError(
        f"unknown eviction policy {text!r}: use one of {', '.join(known)}, a spec such as "
        "lru+private-head+block, or FILE.py:CLASS"
    )


@lru_cache(maxsize=64)
def _load_module(path: str, mtime_ns: int):
    digest = hashlib.sha1(f"{path}:{mtime_ns}".encode()).hexdigest()[:12]
    name = f"kvsim_user_policy_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PolicyError(f"{path}: not a Python file")
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
        raise PolicyError(f"{where}: cannot load policy file: {type(e).__name__}: {text}"
                          ) from None
    return module


def load_policy_class(path: str, class_name: str) -> type[EvictionPolicy]:
    """The ``EvictionPolicy`` subclass ``class_name`` defined in the file ``path``."""
    return load_user_class(path, class_name, EvictionPolicy, "policy")


def load_user_class(path: str, class_name: str, base: type, what: str) -> type:
    """The subclass of ``base`` named ``class_name`` in the file ``path`` (a ``what``:
    policy, router)."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise PolicyError(f"{path}: {what} file not found")
    module = _load_module(str(file), file.stat().st_mtime_ns)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise PolicyError(f"{path}: no class {class_name!r} in the {what} file")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise PolicyError(f"{path}: {class_name!r} is not a subclass of {base.__name__}")
    return cls
