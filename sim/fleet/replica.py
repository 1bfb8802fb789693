"""The small hooks that let an unchanged engine serve in a fleet.

An engine never learns it is in a fleet. The fleet builds each replica exactly as a single run
builds its server (``sim.fleet.run.build_engine``), then ``observe`` gives it:

- an observed cache: the engine's cache object is re-typed to its observed subclass
  (``ObservedRadixKVCache`` for the sglang engine's ``RadixKVCache``, ``ObservedBlockPool``
  for vllm's ``BlockPool``): the same state and the same behaviour (the subclasses add no
  state and change no decision), which also reports KV events
  (blocks stored on / removed from the GPU) to an optional sink, and answers a read-only
  question the fleet asks to measure its router's belief: how many leading blocks of a
  prompt are on the GPU right now (``gpu_prefix_blocks``);
- an observed recorder (``ObservedRecorder``, handed to the engine when it is built): a
  ``RunRecorder`` which also tells a listener when a request's first token comes back
  (Dynamo's prefill-complete signal).

Event coverage: every GPU gain (insert, CPU load) and every GPU loss the cache reports with
ids (evictions, demotions, HiCache background deletions, the device nodes a HiCache load
deletes to make room) is an event; context strategies are not run in fleets. The same
results tell a shared pool every block the replica drops entirely (write-back).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from sim.kvcache import RadixKVCache
from sim.kvcache.blockpool import BlockPool
from sim.kvcache.node import Tier
from sim.kvcache.results import EvictResult, InsertResult, LoadResult
from sim.metrics import RequestRecord, RunRecorder

_GPU = Tier.GPU


class KVEventSink(Protocol):
    def stored(self, ids: np.ndarray, parent: int | None) -> None:
        """``ids`` (a chain) became GPU-resident; ``parent``: the block before ids[0] (-1:
        none, the root; None: not said, a load behind a GPU-resident prefix)."""

    def removed(self, ids: np.ndarray) -> None: ...


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.empty(0, dtype=np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class PoolSink(Protocol):
    def stored(self, ids: np.ndarray) -> None: ...

    def dropped(self, ids: np.ndarray) -> None: ...


class ObservedRadixKVCache(RadixKVCache):
    """``RadixKVCache`` that reports its GPU gains and losses to ``events`` (when set), and
    the blocks it writes and the blocks it drops entirely to ``pool_sink`` (when set: the
    fleet's shared pool, sim/fleet/pooltier.py)."""

    events: KVEventSink | None = None
    pool_sink: PoolSink | None = None

    def insert(self, ids, hint=None) -> InsertResult:
        gained = self._not_on_gpu(np.asarray(ids, dtype=np.int64)) if self.events else None
        res = super().insert(ids, hint)
        if gained is not None:  # every block of ids is GPU-resident now
            for parent, run in gained:
                self.events.stored(run, parent)
        if self.pool_sink is not None:
            self.pool_sink.stored(np.asarray(ids, dtype=np.int64))
        return res

    def evict(self, n: int) -> EvictResult:
        res = super().evict(n)
        self._report_losses(res)
        return res

    def make_room(self, n: int) -> EvictResult:  # frees through the tiering, not evict
        res = super().make_room(n)
        self._report_losses(res)
        return res

    def background_evictions(self) -> EvictResult:
        res = super().background_evictions()
        self._report_losses(res)
        return res

    def load(self, node, limit_blocks: int | None = None) -> LoadResult:
        res = super().load(node, limit_blocks)
        if self.events is not None:
            self.events.removed(_concat(res.deleted + res.demoted))
            for run in res.loaded:  # root-ward first; each run's parent is GPU-resident
                if len(run):
                    self.events.stored(run, None)
        if self.pool_sink is not None and res.deleted:  # their last copy left the replica
            self.pool_sink.dropped(_concat(res.deleted))
        return res

    def _not_on_gpu(self, ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """The runs of ``ids`` not on the GPU now, each with the block before it (-1: none),
        read only: what an engine reports as stored when it inserts ``ids`` (a real engine
        never re-reports blocks it already holds)."""
        path, partial, k, pos = self.tree.walk(ids, stop_at_holes=False)
        runs: list[tuple[int, np.ndarray]] = []
        for nd in path:
            if nd.tier is not _GPU:
                runs.append((int(ids[nd.start - 1]) if nd.start else -1, nd.ids))
        if partial is not None and k and partial.tier is not _GPU:
            runs.append((int(ids[partial.start - 1]) if partial.start else -1,
                         ids[partial.start:pos]))
        if pos < ids.size:
            runs.append((int(ids[pos - 1]) if pos else -1, ids[pos:]))
        return runs

    def _report_losses(self, res: EvictResult) -> None:
        if self.events is not None:
            self.events.removed(_concat(res.freed + res.demoted))
        if self.pool_sink is not None and res.freed:  # their last copy left the replica
            self.pool_sink.dropped(_concat(res.freed))

    def gpu_prefix_blocks(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` resident on the GPU now (read only: no stamp, no
        split); the hit an arriving request would see before any eviction."""
        return tree_prefix_blocks(self, ids, gpu_only=True)

    def resident_prefix_blocks(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` held on the GPU or the CPU tier now (read only): where
        a lookup in a pool below the replica starts."""
        return tree_prefix_blocks(self, ids, gpu_only=False)

    def tier_runs(self, ids: np.ndarray) -> list[tuple[int, int, Tier]]:
        """Where the blocks of ``ids`` are now, read only (no stamp, no split): runs
        ``(start, end, tier)`` of the tree's path for ``ids``, through holes (tier NONE),
        in prefix order; blocks past the last run are not in the tree."""
        path, partial, k, _pos = self.tree.walk(ids, stop_at_holes=False)
        runs = [(nd.start, nd.start + len(nd.ids), nd.tier) for nd in path]
        if partial is not None:
            runs.append((partial.start, partial.start + k, partial.tier))
        return runs


def tree_prefix_blocks(cache: RadixKVCache, ids: np.ndarray, gpu_only: bool = True) -> int:
    """Leading blocks of ``ids`` that ``cache`` holds (on the GPU only, or in any tier), read
    only: no stamp, no split."""
    path, partial, _k, pos = cache.tree.walk(ids, stop_at_holes=True)
    hit = 0
    for nd in path:
        if gpu_only and nd.tier is not _GPU:
            return hit
        hit = nd.start + len(nd.ids)
    if partial is not None and (not gpu_only or partial.tier is _GPU):
        hit = pos
    return hit


class ObservedBlockPool(BlockPool):
    """vLLM's ``BlockPool`` that reports hashed (stored) blocks and the last copy of an id
    dropped by lazy eviction (removed) to ``events`` (when set)."""

    events: KVEventSink | None = None

    def _cache(self, seq) -> None:
        before = seq.cached
        super()._cache(seq)
        if self.events is not None and seq.cached > before:
            self.events.stored(seq.ids[before:seq.cached],
                               int(seq.ids[before - 1]) if before else -1)

    def _evict(self, ps: np.ndarray) -> None:
        if self.events is None:
            super()._evict(ps)
            return
        xs = self._bid[ps].copy()  # the ids these physical blocks cache
        super()._evict(ps)
        gone = [x for x in xs.tolist() if not self.is_cached(x)]
        if gone:
            self.events.removed(np.asarray(gone, dtype=np.int64))

    def gpu_prefix_blocks(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` cached now (read only)."""
        return self.lookup(ids, ids.size * self.block_size + 1)


class ObservedRecorder(RunRecorder):
    """``RunRecorder`` that also calls ``on_open(req, segments)`` when a request's record
    opens at its first admission (``segments``: its match then, as the engine read it) and
    ``on_first_token(req)`` (each when set)."""

    on_open: Callable[[object, object], None] | None = None
    on_first_token: Callable[[object], None] | None = None

    def open(self, req, now: float, *, segments, **kw) -> RequestRecord:
        rec = super().open(req, now, segments=segments, **kw)
        if self.on_open is not None:
            self.on_open(req, segments)
        return rec

    def first_token(self, req, now: float) -> None:
        super().first_token(req, now)
        if self.on_first_token is not None:
            self.on_first_token(req)


OBSERVED: dict[type, type] = {RadixKVCache: ObservedRadixKVCache, BlockPool: ObservedBlockPool}


def observe(engine) -> None:
    """Re-type ``engine``'s cache to its observed subclass (in place: every reference the
    engine holds sees it). Re-typing, not rebuilding, keeps the fleet independent of how an
    engine constructs its cache; the subclasses only add reports and read-only queries."""
    cache = engine.cache
    observed = OBSERVED.get(type(cache))
    if observed is None:
        raise TypeError(f"no observed variant of {type(cache).__name__}: a fleet replica "
                        "needs RadixKVCache or BlockPool")
    cache.__class__ = observed
