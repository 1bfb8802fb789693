"""Load-only routers: no cache view. Each cites the rule it reproduces.

- ``round-robin``: a counter modulo the replicas (Vidur's default global scheduler; SMG's
  ``round_robin``).
- ``random``: uniform over the replicas (Vidur ``random``, SMG ``random``).
- ``least-load``: fewest outstanding requests (Vidur's ``lor``), counted router-side: requests
  dispatched to the replica and not finished; ties drawn with the run's RNG.
- ``power-of-two``: two distinct replicas drawn at random, the one with fewer in-flight
  requests wins, ties to the first drawn (SMG ``power_of_two`` without KV-usage snapshots).
- ``session-affinity``: a consistent-hash ring of the session (``vnodes`` points per replica):
  every request of a session goes to one replica, and a fleet of N+1 replicas moves only
  about 1/(N+1) of the sessions.
"""

from __future__ import annotations

import bisect
import hashlib

from ..routing import Range, Router, RouteRequest, RouterView, ranges, register_router


@register_router
class RoundRobin(Router):
    name = "round-robin"

    def bind(self, n_replicas, block_size, rng) -> None:
        super().bind(n_replicas, block_size, rng)
        self.counter = 0

    def route(self, request: RouteRequest, view: RouterView) -> int:
        r = self.counter % len(view)
        self.counter += 1
        return r


@register_router
class RandomRouter(Router):
    name = "random"

    def route(self, request: RouteRequest, view: RouterView) -> int:
        return int(self.rng.integers(len(view)))


@register_router
class LeastLoad(Router):
    name = "least-load"

    def route(self, request: RouteRequest, view: RouterView) -> int:
        return self.argmin([r.in_flight for r in view.replicas])


@register_router
class PowerOfTwo(Router):
    name = "power-of-two"

    def route(self, request: RouteRequest, view: RouterView) -> int:
        n = len(view)
        if n == 1:
            return 0
        a, b = (int(x) for x in self.rng.choice(n, size=2, replace=False))
        return b if view.replicas[b].in_flight < view.replicas[a].in_flight else a


def _hash64(text: str) -> int:
    """A stable 64-bit hash (never Python's salted ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@register_router
class SessionAffinity(Router):
    name = "session-affinity"
    vnodes: int = 64
    parameter_ranges = ranges(vnodes=Range(1))

    def bind(self, n_replicas, block_size, rng) -> None:
        super().bind(n_replicas, block_size, rng)
        ring = sorted((_hash64(f"replica-{r}-{v}"), r) for r in range(n_replicas)
                      for v in range(self.vnodes))
        self.points = [p for p, _ in ring]
        self.owners = [r for _, r in ring]

    def owner(self, session: int) -> int:
        """The replica owning ``session`` on the ring (the first point at or after its hash)."""
        i = bisect.bisect_left(self.points, _hash64(f"session-{session}"))
        return self.owners[i % len(self.owners)]

    def route(self, request: RouteRequest, view: RouterView) -> int:
        return self.owner(request.session)
