"""SGLang's waiting-queue order (``schedule_policy.py`` ``calc_priority``), as one object that
owns its state: the fcfs prefix-refresh counter and each session's first arrival.

lpm (at most ``LPM_QUEUE_LIMIT`` waiting): every waiting prompt is matched (touching its
prefix) and sorted by the scheduler's key; in-batch prefix caching sends a prompt with almost
nothing cached that shares its first block with an earlier such prompt to the back. fcfs (or
lpm above the limit): queue order, with SGLang's periodic touch of the first 128 prefixes.
program-fcfs: no match, sorted by the session's first arrival (Continuum).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from policies.scheduling import LPM_QUEUE_LIMIT, Candidate, SchedulePolicy
from sim.kvcache import RadixKVCache, split_match

from .request import Req

# SGLang touches the prefixes of the first 128 waiting requests every 32nd fcfs pass.
FCFS_TOUCH_EVERY: Final = 32
FCFS_TOUCH_COUNT: Final = 128
# In-batch prefix caching (lpm): a waiting request whose cached prefix is at most this many
# tokens and that shares at least as many with an earlier such waiting request goes to the
# back of the queue (IN_BATCH_PREFIX_CACHING_CHECK / _DEPRIORITIZE_THRESHOLD, both 32).
IN_BATCH_PREFIX_TOKENS: Final = 32


class WaitingOrder:
    """Orders an SGLang server's waiting queue before each scheduling pass."""

    def __init__(self, scheduler: SchedulePolicy, cache: RadixKVCache | Any, block_size: int,
                 usable_blocks: Callable[[Req], int]) -> None:
        self.scheduler = scheduler
        self.cache = cache
        self.bs = block_size
        self.usable_blocks = usable_blocks  # blocks of a prompt a hit may cover
        self._refresh_calls = 0  # fcfs passes that looked at the queue (prefix refresh)
        # program-fcfs: each session's first arrival, noted the first time one of its
        # requests waits here (sessions send one request at a time, so it is their first)
        self._program_start: dict[int, float] = {}

    def order(self, waiting: list[Req]) -> list[Req]:
        """The queue in scheduling order (a new list; ``waiting`` is not modified)."""
        sched = self.scheduler
        starts = self._program_start
        if sched.matches_all and len(waiting) <= LPM_QUEUE_LIMIT:
            cands = []
            # In-batch prefix caching: the first blocks of the waiting prompts with nothing
            # cached, in queue order. Sharing 32 tokens means sharing the first block here
            # (ids name 64-token blocks; a shorter common prefix is invisible to kvsim).
            scratch: set[int] = set()
            for pos, req in enumerate(waiting):
                m = self.cache.match(req.ids, touch=True, hint=req.hint)
                usable = self.usable_blocks(req)
                gpu, cpu, _, _ = split_match(m.segments, usable)
                first_at = starts.setdefault(req.session, req.arrival)
                key = (0, *sched.key(Candidate(pos, gpu, cpu, first_at)))
                if m.hit_blocks * self.bs <= IN_BATCH_PREFIX_TOKENS and req.ids.size:
                    first = int(req.ids[0])
                    if first in scratch:
                        key = (1, pos)  # deprioritized: after the others, in queue order
                    else:
                        scratch.add(first)
                cands.append((key, req))
            cands.sort(key=lambda kv: kv[0])
            return [r for _, r in cands]
        # fcfs (or lpm above 128 waiting: SGLang falls back to fcfs): every 32nd pass that
        # looks at the queue, the first included, refreshes the first 128 waiting prefixes.
        refresh = self._refresh_calls % FCFS_TOUCH_EVERY == 0
        self._refresh_calls += 1
        if refresh:
            for req in reversed(waiting[:FCFS_TOUCH_COUNT]):
                self.cache.match(req.ids, touch=True, hint=req.hint)
        if not sched.matches_all and sched.sorts:  # program-fcfs: no match, a key
            keyed = [(sched.key(Candidate(pos, program_start=starts.setdefault(
                req.session, req.arrival))), req) for pos, req in enumerate(waiting)]
            keyed.sort(key=lambda kv: kv[0])
            return [r for _, r in keyed]
        return list(waiting)
