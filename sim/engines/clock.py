"""The run's simulated clock: SimPy's environment, with a shortcut for a process that waits
out a delay while nothing else is due.

A server runs pass after pass, each a timeout; under a queue nearly every one ends before
anything else happens (an arrival, a finish elsewhere, a KV event). ``Clock.advance`` lets
such a pass end without an event: the clock moves exactly as processing the timeout would
have moved it, and nothing else could have run in between, so the run is the same
(tests/test_clock.py runs the standard setups both ways and requires equal outputs).
Compiled with the core (sim/native.py): every server pass asks it.
"""

from __future__ import annotations

from typing import Any, Final

import simpy
from simpy.core import Infinity
from simpy.events import Event, Timeout

_INFINITY: Final = Infinity  # what an empty queue's ``peek`` answers


class Clock(simpy.Environment):
    # SimPy binds its event classes to an environment of its own class only
    # (``BoundClass.bind_early``): on a subclass each ``env.timeout``/``env.event`` went
    # through the descriptor, a bound method made per call. The same constructions, direct.
    def timeout(self, delay: float = 0, value: Any = None) -> Timeout:
        return Timeout(self, delay, value)

    def event(self) -> Event:
        return Event(self)

    def advance(self, delay: float) -> bool:
        """Move the clock ``delay`` forward now, as ``yield self.timeout(delay)`` would, when
        no scheduled event is due at or before then; False (and no change) otherwise, and the
        caller yields the timeout. Exact: an event due later is processed after the timeout
        either way, one due at the same instant is processed before it (so that case takes
        the event), and only running processes schedule events, so none can appear in
        between. The caller must be the only callback of the event that resumed it (a
        server's own timeouts and doorbells): another callback of that event would run
        after it, at the old time."""
        if not delay >= 0:
            return False  # negative (SimPy's timeout raises) or NaN
        at = self._now + delay  # SimPy's own clock (``now`` reads it; no public setter)
        # ``peek()`` read in place (the next event's time, infinity when none; SimPy's queue
        # of (time, priority, id, event)): no interpreted call per server pass.
        queue = self._queue
        if (queue[0][0] if queue else _INFINITY) <= at:
            return False
        self._now = at
        return True
