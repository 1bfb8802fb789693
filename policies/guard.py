"""The boundary between kvsim and a policy or router the user wrote in their own file.

A policy from ``FILE.py:CLASS`` runs the user's code inside the planner and the engine, a
router inside the fleet. Two things go wrong there: the code raises, or it returns a value of
the wrong type (a ``key`` returning ``None`` or a str used to run silently in creation order;
``pinned_until`` returning a str failed deep inside the planner; a ``route`` returning
``None`` or ``"1"``). ``guard_user_policy`` and ``guard_user_router`` wrap the methods the
class overrides so that both become a ``UserPolicyError``: one line naming the policy or
router, the method and the user's file and line, and, as ``detail``, the traceback frames of
the user's own code only (the CLI prints them under the line; ``kvsim --debug`` shows every
frame instead).

Only plug-ins loaded from files are wrapped: the shipped ones stay direct calls (speed).
"""

from __future__ import annotations

import math
import numbers
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .context import PolicyError

# Methods of EvictionPolicy that the planner and the engine call, and of Router that the
# fleet calls (what each must return: ``CHECKS``).
GUARDED = ("key", "pinned_until", "on_arrival", "on_reply")
ROUTER_GUARDED = ("bind", "bind_prefill_model", "route", "on_first_token", "on_finish")
_KVSIM_PACKAGES = tuple(str(Path(__file__).resolve().parent.parent / p) + "/" for p in (
    "sim", "policies", "traces", "costmodel", "calibration"))


class UserPolicyError(PolicyError):
    """A user's policy raised or returned a wrong type (exit status 2). ``detail``: the
    traceback of the user's own frames (may be empty)."""

    def __init__(self, message: str, detail: str = "") -> None:
        # Both in ``args``: SimPy re-raises a process's exception as ``type(e)(*e.args)``,
        # and a sweep worker's comes back through pickle.
        super().__init__(message, detail)
        self.detail = detail

    def __str__(self) -> str:
        return str(self.args[0])


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not (isinstance(v, float) and math.isnan(v))


def _is_key(v: Any) -> bool:
    if isinstance(v, tuple):
        return bool(v) and all(_is_key(x) for x in v)
    return _is_number(v)


def _is_replica(v: Any, args: tuple) -> bool:
    """``route(request, view)``'s answer: an index into ``view``'s replicas."""
    return (isinstance(v, numbers.Integral) and not isinstance(v, bool)
            and 0 <= v < len(args[1]))


# method -> (is the value right, given the call's arguments; what it must be)
CHECKS: dict[str, tuple[Callable[[Any, tuple], bool], Callable[[tuple], str]]] = {
    "key": (lambda v, _: _is_key(v),
            lambda _: "a number or a tuple of numbers (the smallest is evicted first)"),
    "pinned_until": (lambda v, _: _is_number(v),
                     lambda _: "a number of simulated seconds (-inf: not pinned)"),
    "route": (_is_replica, lambda args: f"a replica index, an int in 0..{len(args[1]) - 1}"),
}


def _user_frames(tb: Any) -> list[traceback.FrameSummary]:
    return [f for f in traceback.extract_tb(tb)
            if not f.filename.startswith(_KVSIM_PACKAGES) and "site-packages" not in f.filename
            and not f.filename.startswith("<")]


def _where(fn: Callable, frames: list[traceback.FrameSummary]) -> str:
    if frames:
        return f"{frames[-1].filename}:{frames[-1].lineno}"
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code else "?"


def _guarded(who: str, method: str, fn: Callable) -> Callable:
    """``fn`` (``who``'s ``method``: ``policy NAME``, ``router NAME``) with its errors and
    its answer checked."""
    check = CHECKS.get(method)

    def call(*args: Any) -> Any:
        try:
            value = fn(*args)
        except PolicyError:
            raise  # a refusal the plug-in words itself (or an inner guard's line)
        except Exception as e:
            frames = _user_frames(e.__traceback__)
            text = " ".join(str(e).split())
            raise UserPolicyError(
                f"{who}: {method}() raised {type(e).__name__}"
                f"{': ' + text if text else ''} ({_where(fn, frames)})",
                "".join(traceback.format_list(frames))) from e
        if check is not None and not check[0](value, args):
            raise UserPolicyError(
                f"{who}: {method}() returned {value!r} ({type(value).__name__}); it "
                f"must return {check[1](args)} ({_where(fn, [])})")
        return value

    return call


def guard_user_policy(policy: Any) -> Any:
    """``policy`` with every ``GUARDED`` method its class overrides wrapped (see above)."""
    from .eviction import EvictionPolicy

    _wrap(policy, EvictionPolicy, GUARDED, f"policy {policy.label}")
    if type(policy).key is not EvictionPolicy.key:
        policy.sort_key = policy.key
    return policy


def guard_user_router(router: Any, base: type) -> Any:
    """``router`` with every ``ROUTER_GUARDED`` method its class overrides (from ``base``,
    ``policies.routing.Router``) wrapped: an exception, or a ``route`` answer that is not a
    replica index, is one line (see above)."""
    return _wrap(router, base, ROUTER_GUARDED, f"router {router.label}")


def _wrap(plugin: Any, base: type, methods: tuple[str, ...], who: str) -> Any:
    for method in methods:
        if getattr(type(plugin), method) is getattr(base, method):
            continue  # not the user's code
        setattr(plugin, method, _guarded(who, method, getattr(plugin, method)))
    return plugin
