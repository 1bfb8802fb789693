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

from typing import Any

from costmodel.registry import Registry, is_class_file

from .context import PolicyError
from .eviction import PRESETS, EvictionPolicy
from .guard import guard_user_policy

POLICIES: Registry[type[EvictionPolicy]] = Registry(
    "eviction policy", PolicyError, base=EvictionPolicy, file_kind="policy")


def register_policy(cls: type[EvictionPolicy]) -> type[EvictionPolicy]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name:
        raise PolicyError(f"{cls.__name__}: a registered policy needs a name")
    return POLICIES.register(cls.name, cls)


def is_policy_file(text: str) -> bool:
    return is_class_file(text)


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
        cls = POLICIES.get(key)
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
            return EvictionPolicy(*PRESETS.get(low))
        return EvictionPolicy(*low.split("+"))
    if low in POLICIES:
        return POLICIES.get(low)(**params)
    raise POLICIES.unknown(text, also=PRESETS.names(),
                           hint="a spec such as lru+private-head+block")


def load_policy_class(path: str, class_name: str) -> type[EvictionPolicy]:
    """The ``EvictionPolicy`` subclass ``class_name`` defined in the file ``path``."""
    return POLICIES.get(f"{path}:{class_name}")
