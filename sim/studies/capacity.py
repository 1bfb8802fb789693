"""Capacity analysis: the hit rate a cache of C tokens could reach on a trace, without timing.

The cache-only replay Mooncake's paper draws for its traces: requests in arrival order, each
one looked up in the cache and then inserted, no clock, no batching, no queueing. It answers
"how much cache does this traffic need?" in seconds, before any timed run.

One request against one cache (``CacheReplay.request``)::

    prompt blocks   [ reused (GPU) | holes | new ............ ][ output ]
                      match ------------->                               lock the matched path
                                     make room for holes + new + output  (policy's eviction order)
                      insert ----------------------------------------->  unlock

Semantics, exactly those of ``sim.kvcache.RadixKVCache`` under the chosen eviction policy: the
match stamps the path with one logical tick, the matched path is locked while room is made (a
request never evicts what it reuses), the insert makes every block resident. What a request
inserts is what an engine inserts when it finishes (``Trace.finish_block_ids``): its prompt's
full blocks, then the blocks its decoded output completes, which the next turn of a session
reuses where its prompt repeats the reply. The request is answered at once: its output is
cached before the next request arrives. A sequence longer than the cache keeps the longest
prefix that fits. A request reuses at most ``(prompt_tokens - 1) // block_size`` blocks (an
engine computes at least one token), and a partial trailing block is never cached, as in the
engines. Under LRU (``lru`` = lru+tail+block, the vLLM preset) this is a block LRU in which a
request's blocks are used tail to head: a history is freed from its end, oldest request first
(tests/test_capacity.py checks it against an ordered dict). That LRU is a stack algorithm,
so one replay gives every size of a curve (``lru_hits_all_sizes``, docs/capacity.md).

Arrival order: recorded send times (ties: trace order); a trace without them (closed-loop
synthetic generators) is ordered by each session's cumulative recorded gaps from time 0, as
if every session started at once and the server answered instantly.

Hit rates are over prompt tokens. The ideal (``ideal_hits``) is the same replay with an
unlimited cache, so every finite cache's hit rate is at most it; per request it is the hit of
an engine whose cache never fills (tests/test_capacity.py). It exceeds the prompt-only
infinite cache of ``kvsim trace stats`` (``Trace.infinite_cache_hits``) by the reply blocks
that later prompts reuse.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from policies import EvictionPolicy, get_policy
from sim.report.progress import current as current_progress

DEFAULT_POLICY = "vllm"  # LRU: lru+tail+block


class CapacityOptionError(ValueError):
    """A capacity request that cannot be answered (bad user input: exit status 2)."""

    exit_code = 2


def arrival_times(trace) -> np.ndarray:
    """Per request, the seconds at which it arrives (see the module doc)."""
    t = np.asarray(trace.send_time_s, dtype=np.float64)
    if len(t) and not np.isfinite(t).all():
        gaps = np.nan_to_num(np.asarray(trace.gap_s, dtype=np.float64), nan=0.0)
        t = np.zeros(len(trace), np.float64)
        for s in trace.sessions:
            lo, hi = s.first, s.first + s.count
            t[lo:hi] = np.cumsum(gaps[lo:hi])
    return t


def arrival_order(trace) -> np.ndarray:
    """Request indices in arrival order: by ``arrival_times``, ties in trace order."""
    return np.lexsort((np.arange(len(trace)), arrival_times(trace)))


def clockless_policy(policy: str | EvictionPolicy) -> EvictionPolicy:
    """The policy, if it can decide without a clock: no pins (they expire in seconds), no
    events (they report replies and gaps in time), no oracle (it reads the future replay)."""
    pol = get_policy(policy)
    why = ("pins" if pol.pins else "events" if pol.events
           else "the replay's future" if pol.clairvoyant else "")
    if why:
        raise CapacityOptionError(f"--policy {pol.label}: needs {why}, which a replay without a "
                            "clock does not have; use a policy without pins or events "
                            "(lru, sglang, vllm, penelope, lfu, ...)")
    return pol


class CacheReplay:
    """One cache of ``capacity_blocks`` blocks under ``policy``, fed prompts in order."""

    def __init__(self, capacity_blocks: int, policy: str | EvictionPolicy = DEFAULT_POLICY
                 ) -> None:
        from sim.kvcache import RadixKVCache  # the tree only for the policies that need it

        self.cache = RadixKVCache(int(capacity_blocks), clockless_policy(policy))
        self.evicted: list[np.ndarray] | None = None  # a list: collect what leaves the cache

    def request(self, ids: np.ndarray, finish: np.ndarray | None = None) -> int:
        """Serve one prompt (block ids) and cache ``finish``: its blocks then its decoded
        output's (``Trace.finish_block_ids``; the prompt alone when None). Returns the prompt
        blocks reused from the cache."""
        from sim.kvcache import Tier, split_match

        cache = self.cache
        seq = ids if finish is None else finish
        m = cache.match(seq)
        n = ids.shape[0]
        reused = split_match(m.segments, n)[0]
        cache.lock(m.node)
        keep = self._fitting_prefix(seq.shape[0], m)
        holes = m.matched_blocks - m.blocks_in(Tier.GPU)
        missing = keep - m.matched_blocks + (holes if keep else 0)
        if keep:
            res = cache.make_room(missing)
            if self.evicted is not None:
                self.evicted.extend(res.freed)
            cache.reserve(missing)
            cache.insert(seq[:keep])
            cache.release(missing)
        cache.unlock(m.node)
        return reused

    def prefix_blocks(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` cached now (read only): a router's exact view."""
        return self.cache.gpu_prefix_blocks(ids)

    @property
    def held_blocks(self) -> int:
        return self.cache.tree.gpu_blocks

    def _fitting_prefix(self, n: int, m) -> int:
        """How many leading blocks of an ``n``-block prompt can be made resident: all of them
        when the free and evictable room holds the missing ones; else the longest prefix that
        does (holes in the matched part count as missing)."""
        from sim.kvcache import Tier

        tree = self.cache.tree
        room = tree.free_blocks + tree.evictable_blocks
        holes = m.matched_blocks - m.blocks_in(Tier.GPU)
        if holes + n - m.matched_blocks <= room:
            return n
        if holes > room:
            return 0  # the matched holes alone do not fit: leave the cache as it is
        return m.matched_blocks + (room - holes)


class LruReplay:
    """The same replay as ``CacheReplay`` under ``vllm`` (lru+tail+block), without a tree.

    Every cached block belongs to the request that touched it last, and the blocks a request
    owns form one contiguous range of its prompt: a later request that reuses block ``j`` of
    it reuses its blocks ``0..j`` too (chained ids), so ownership only ever moves off the
    FRONT of a range. The cache is a queue of ranges, oldest request first::

        ranges (oldest first)                  starts: first block id of a range -> tick
        tick 3: prompt_a[12:40]  <- evict here, from the tail
        tick 7: prompt_b[0:25]
        tick 9: prompt_c[0:31]

    A request walks its prompt run by run: the owner of a cached block at position ``j``
    always starts its range exactly at ``j`` (the blocks before it are the earlier runs'; two
    ranges never hold one block), so ``starts`` finds the next run or says the hit ends. It
    cuts those runs off their owners' fronts, evicts from the oldest range's tail and appends
    its own range. Python work is per range, never per block.
    """

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = int(capacity_blocks)
        self.ranges: OrderedDict[int, list] = OrderedDict()  # tick -> [lo, hi, ids]
        self.starts: dict[int, int] = {}
        self.size = 0
        self.tick = 0
        # a list: collect what leaves the cache, least recent first (a pool's write-back)
        self.evicted: list[np.ndarray] | None = None
        # a list: collect every run a request reuses, (its tick, owner's tick, start, end),
        # for the stack distances of ``lru_hits_all_sizes``
        self.runs: list[tuple[int, int, int, int]] | None = None

    def request(self, ids: np.ndarray, finish: np.ndarray | None = None) -> int:
        """Serve one prompt (block ids) and cache ``finish`` (as ``CacheReplay.request``):
        returns the prompt blocks reused from the cache."""
        ranges, starts, runs = self.ranges, self.starts, self.runs
        seq = ids if finish is None else finish
        n = seq.shape[0]
        hit = 0
        while hit < n:  # the hit changes owner: cut each run off its owner's front
            tick = starts.pop(int(seq[hit]), None)
            if tick is None:
                break  # seq[hit] is not cached (its owner's run would start here)
            rng = ranges[tick]
            end = _agree(seq, rng[2], hit, min(rng[1], n))
            if runs is not None:
                runs.append((self.tick + 1, tick, hit, end))
            rng[0] = end
            if end < rng[1]:
                starts[int(rng[2][end])] = tick
            else:
                del ranges[tick]
            hit = end
        self.size -= hit
        keep = min(n, self.capacity)
        over = self.size + keep - self.capacity
        while over > 0:  # oldest request first, from its tail
            rng = next(iter(ranges.values()))
            k = min(rng[1] - rng[0], over)
            if self.evicted is not None:  # from the tail: the least recent block first
                self.evicted.append(rng[2][rng[1] - k:rng[1]][::-1])
            rng[1] -= k
            self.size -= k
            over -= k
            if rng[1] == rng[0]:
                del starts[int(rng[2][rng[0]])]
                ranges.popitem(last=False)
        if keep:
            self.tick += 1
            ranges[self.tick] = [0, keep, seq]
            starts[int(seq[0])] = self.tick
        self.size += keep
        return min(hit, ids.shape[0])


    def prefix_blocks(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` cached now (read only): the walk of ``request`` without
        the moves."""
        ranges, starts = self.ranges, self.starts
        n = ids.shape[0]
        hit = 0
        while hit < n:
            tick = starts.get(int(ids[hit]))
            if tick is None:
                break
            rng = ranges[tick]
            hit = _agree(ids, rng[2], hit, min(rng[1], n))
        return hit

    @property
    def held_blocks(self) -> int:
        return self.size


def _agree(a: np.ndarray, b: np.ndarray, lo: int, hi: int) -> int:
    """The end of the run where chained id arrays ``a`` and ``b`` agree, within [lo, hi):
    they agree on [lo, x) and differ from x on (chained ids), found by bisection."""
    if a[hi - 1] == b[hi - 1]:
        return hi
    while lo < hi:  # invariant: agree before lo, differ at hi - 1 or beyond
        mid = (lo + hi) // 2
        if a[mid] == b[mid]:
            lo = mid + 1
        else:
            hi = mid
    return lo


def replay_for(capacity_blocks: int, policy: str | EvictionPolicy
                ) -> CacheReplay | LruReplay:
    """The fast LRU replay for the vllm preset, the cache itself for any other policy."""
    pol = clockless_policy(policy)
    if pol == get_policy(DEFAULT_POLICY):
        return LruReplay(capacity_blocks)
    return CacheReplay(capacity_blocks, pol)


@dataclass(frozen=True)
class CapacityRow:
    """One point of a capacity curve (``--json`` rows). Capacities are per replica."""

    cache_tokens: int
    replicas: int
    router: str
    policy: str
    pool_tokens: int
    hit_rate: float
    ideal_hit_rate: float
    prompt_tokens: int
    hit_tokens: int
    pool_hit_rate: float = 0.0  # the part of hit_rate fetched from the shared pool
    pool_write: str = ""  # with a pool: write-through | write-back
    in_flight_s: float = 0.0  # the fleet's load model: seconds each request stays in flight
    idle_replicas: int = 0  # replicas that served under a tenth of an even share

    def as_dict(self) -> dict:
        return asdict(self)


def reusable_blocks(trace, r: int) -> int:
    """The most blocks request ``r`` can reuse: an engine computes at least one token of a
    prompt, so a hit stops at ``(prompt_tokens - 1) // block_size`` blocks."""
    return max(0, (int(trace.prompt_tokens[r]) - 1) // trace.block_size)


def replay_hits(trace, cache_tokens: int, policy: str | EvictionPolicy = DEFAULT_POLICY,
                order: np.ndarray | None = None) -> np.ndarray:
    """Per request (trace index), prompt blocks reused from one cache of ``cache_tokens``."""
    return serve_in_order(trace, replay_for(cache_tokens // trace.block_size, policy), order)


def ideal_hits(trace, order: np.ndarray | None = None) -> np.ndarray:
    """Per request, prompt blocks an unlimited cache reuses in the same replay: every block
    an earlier request cached (its prompt's and its output's) is still there."""
    return serve_in_order(trace, LruReplay(int(trace.finish_blocks().sum())), order)


def one_pass(policy: str | EvictionPolicy) -> bool:
    """Whether every size of ``policy``'s curve comes from one replay (``lru_hits_all_sizes``):
    the vllm preset, whose replay is an LRU stack (see there)."""
    return clockless_policy(policy) == get_policy(DEFAULT_POLICY)


def lru_hits_all_sizes(trace, cache_blocks: Sequence[int], order: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Per cache size (rows, in blocks) and request (columns, trace index), the prompt blocks
    ``LruReplay`` of that size reuses, and per request those of the unlimited cache
    (``ideal_hits``): every size from ONE replay, by LRU stack distances.

    Why one replay is exact: ``LruReplay`` makes a request's blocks the most recent, head
    first, and keeps the most recent ``C`` blocks. A cache of ``C`` blocks then always holds
    the top ``C`` of one stack (every block, most recent first) that does not depend on ``C``
    (a sequence longer than the cache keeps its first ``C`` blocks: the top ``C`` too), so a
    cache of ``C`` holds block ``j`` of a prompt iff its depth in that stack is below ``C``.
    With chained ids the blocks before ``j`` are above it (every request that used block
    ``j`` used them after it), so the depths along a prompt increase and its hit, the longest
    cached prefix, is the number of its blocks shallower than ``C``. The condition is the one
    ``LruReplay`` itself rests on (chained ids); other policies have no such stack.

    How: the unlimited replay records each run a request reuses (its blocks were last used by
    one earlier request, the owner, from the run's start on). The depth of the run's first
    block is the number of distinct blocks the requests between owner and reuser used: their
    blocks, less those a later one of them used again (runs nested in that interval, a
    weighted dominance count, ``_earlier_greater_sums``); the run's next blocks lie one deeper
    each. Python work is one replay's, per run; the rest is numpy over the runs."""
    order = arrival_order(trace) if order is None else order
    n_f = trace.finish_blocks()
    replay = LruReplay(int(n_f.sum()))
    replay.runs = []
    ideal = serve_in_order(trace, replay, order)
    served = order[n_f[order] > 0]  # tick k (from 1) is the request served[k - 1]
    cum = np.zeros(served.shape[0] + 1, np.int64)
    np.cumsum(n_f[served], out=cum[1:])  # blocks the first k ticks used
    runs = np.array(replay.runs, np.int64).reshape(-1, 4)
    tick, owner, lo, hi = runs.T
    nested = np.empty(runs.shape[0], np.int64)  # blocks used again within (owner, tick)
    by_tick = np.lexsort((owner, tick))  # a request's own runs never nest in each other
    nested[by_tick] = _earlier_greater_sums(owner[by_tick], (hi - lo)[by_tick])
    depth = cum[tick - 1] - cum[owner] - nested  # of the run's first block
    req = served[tick - 1]
    usable = np.maximum(0, (trace.prompt_tokens[req] - 1) // trace.block_size)
    span = np.clip(np.minimum(hi, usable) - lo, 0, None)  # the run's reusable blocks
    caps = np.asarray(cache_blocks, np.int64).reshape(-1, 1)
    took = np.minimum(span, np.clip(caps - depth, 0, None))
    hits = np.zeros((caps.shape[0], len(trace)), np.int64)
    for k in range(caps.shape[0]):
        hits[k] = np.bincount(req, weights=took[k], minlength=len(trace))
    return hits, ideal


def _earlier_greater_sums(keys: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per position ``i``: the sum of ``weights[m]`` over ``m < i`` with ``keys[m] >
    keys[i]`` (keys >= 0), bit by bit from the highest: at bit ``b`` the elements are grouped
    by their higher bits (a stable order), and an element whose bit is 0 gains the weights of
    the earlier ones of its group whose bit is 1. numpy work per bit, none per element."""
    n = keys.shape[0]
    out = np.zeros(n, np.int64)
    pos, k, w = np.arange(n), keys.astype(np.int64), weights.astype(np.int64)
    top = int(k.max()).bit_length() if n else 0
    for b in range(top - 1, -1, -1):
        group = k >> (b + 1)  # the order is stable-sorted by it
        bit = (k >> b) & 1
        ones = np.cumsum(w * bit) - w * bit  # weight of earlier ones, over all groups
        first = np.ones(n, bool)
        first[1:] = group[1:] != group[:-1]
        base = ones[np.maximum.accumulate(np.where(first, np.arange(n), 0))]
        zero = bit == 0
        out[pos[zero]] += (ones - base)[zero]
        o = np.argsort(k >> b, kind="stable")
        pos, k, w = pos[o], k[o], w[o]
    return out


def serve_in_order(trace, replay: CacheReplay | LruReplay,
                   order: np.ndarray | None = None) -> np.ndarray:
    """Every request through ``replay`` in arrival order: its prompt is matched, then its
    prompt and output blocks are cached (the engines' insert when a request finishes,
    ``Trace.finish_block_ids``), as if it were answered at once. Reports the requests done
    to the active progress tracker (sim/report/progress.py) when it counts requests."""
    order = arrival_order(trace) if order is None else order
    hits = np.zeros(len(trace), np.int64)
    bar = current_progress()
    counting = bar.counts("requests")
    step = max(1, len(order) // 100)
    for i, r in enumerate(order.tolist()):
        finish = trace.finish_block_ids(r)  # the prompt's blocks come first
        hits[r] = min(replay.request(finish[:trace.n_blocks(r)], finish),
                      reusable_blocks(trace, r))
        if counting and (i + 1) % step == 0:
            bar.advance(step)
    if counting:
        bar.advance(len(order) % step)
    return hits


def capacity_curve(trace, caches: Sequence[int], policies: Sequence[str] = (DEFAULT_POLICY,)
                   ) -> list[CapacityRow]:
    """Hit rate per (cache size, policy) with the unlimited cache's rate beside it. The
    vllm preset's sizes all come from the unlimited cache's replay (``lru_hits_all_sizes``);
    every other policy replays once per size."""
    bs = trace.block_size
    prompt = int(trace.prompt_tokens.sum())
    order = arrival_order(trace)
    lru = [c // bs for c in caches] if any(one_pass(p) for p in policies) else []
    lru_hits, per_req = lru_hits_all_sizes(trace, lru, order) if lru else (None, None)
    ideal = int((ideal_hits(trace, order) if per_req is None else per_req).sum()) * bs
    ideal_rate = ideal / prompt if prompt else math.nan
    rows = []
    for name in policies:
        label = clockless_policy(name).label
        for i, c in enumerate(caches):
            if lru_hits is not None and one_pass(name):
                hit = int(lru_hits[i].sum()) * bs
            else:
                if current_progress().counts("requests"):
                    current_progress().describe(f"{label}, {c:,}-token cache")
                hit = int(replay_hits(trace, c, name, order).sum()) * bs
            rows.append(CapacityRow(cache_tokens=int(c), replicas=1, router="none",
                                    policy=label, pool_tokens=0,
                                    hit_rate=hit / prompt if prompt else math.nan,
                                    ideal_hit_rate=ideal_rate, prompt_tokens=prompt,
                                    hit_tokens=hit))
    return rows
