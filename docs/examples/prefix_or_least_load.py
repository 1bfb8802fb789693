"""A user's router (docs/fleet.md walks through it): send a request where the longest
prefix of its prompt is cached, unless that replica is busier than the least loaded one by
more than ``slack`` in-flight requests; then the least loaded. Beliefs: an exact index fed by
the engines' KV events, ``lag_s`` seconds late.

    kvsim run --replicas 4 --router docs/examples/prefix_or_least_load.py:PrefixOrLeastLoad \
        --router-param slack=2 --router-param lag_s=0.5
"""

from policies.routing import KVEvents, Router


class PrefixOrLeastLoad(Router):
    name = "prefix-or-least-load"
    slack: int = 4  # in-flight requests a cache hit may cost over the least loaded replica
    lag_s: float = 0.0  # KV events reach the router this late

    @property
    def cache_view(self):
        return KVEvents(lag_s=self.lag_s)

    def route(self, request, view):
        loads = [r.in_flight for r in view.replicas]
        least = min(loads)
        overlaps = [r.overlap_blocks if loads[i] <= least + self.slack else -1
                    for i, r in enumerate(view.replicas)]
        if max(overlaps) > 0:
            return self.argmax(overlaps)  # ties: the run's seeded RNG
        return self.argmin(loads)
