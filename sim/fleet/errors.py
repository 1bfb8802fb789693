"""The fleet's errors, apart from the modules that raise them: a compiled module
(sim/native.py) cannot define an exception class."""

from __future__ import annotations


class RoutingError(RuntimeError):
    """A router returned something that is not a replica index (a bug in the router)."""
