"""The shared pool on the fleet's clock (``--pool``): what enters it, when a replica fetches
from it, how long a fetch takes, and what it moved.

Engines know nothing of the pool. The fleet stands between the router and the chosen replica::

    route -> replica r
    r's resident prefix h (GPU + CPU tier, read only) -> pool lookup from block h, in prefix
    order, capped where the engine caps a hit (one token is always computed): p blocks
    fetch_s = wait for r's pool link + latency + p x block bytes / bandwidth
    recompute_s = the cost model's prefill seconds of tokens [h, h + p) at their positions
    fetch_s < recompute_s: lease the p blocks, and after fetch_s land them in r's cache
                           (inserted behind its prefix, as a CPU-tier load inserts loaded
                           blocks), release the lease, then hand r the request
    otherwise:             the fetch is refused; r gets the request now and recomputes

Overlap: none with the request's own prefill, as the engines' CPU-tier loads (their h2d
copies are waited for before the batch that needs them); the replica keeps serving other
requests during the fetch, as vLLM's asynchronous KV connectors park a request in
WAITING_FOR_REMOTE_KVS. Each replica has one pool link of ``bandwidth``: its fetches queue on
it in order (a fetch's wait counts in its fetch_s and in the refusal test).

Entry: write-through (every block a replica writes to its cache enters the pool if absent, as
LMCache stores the chunks of each saved sequence) or write-back (every block a replica drops
entirely: from its CPU tier when it has one, from its GPU otherwise).

Landing needs the replica's prefix before the fetched range on its GPU: a lookup whose
replica holds part of that prefix in its CPU tier fetches nothing (``behind_cpu``: the
engine loads its CPU part and computes the rest), and if eviction or a demotion took part of
it during the fetch, the fetched blocks are discarded (``wasted``). The landed blocks are not
pinned until admission (a CPU load's are not either once the request is queued). sglang
engine only: vLLM's block pool has no insertion point outside a running request.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from .pool import SharedPool


class PoolRecord:
    """Per routed request id: the pool's part of its prompt (built into columns at the end)."""

    def __init__(self) -> None:
        self.fetched: dict[int, int] = {}  # rid -> blocks fetched and landed
        self.behind: dict[int, int] = {}  # rid -> the replica's own blocks before them
        self.fetch_s: dict[int, float] = {}  # rid -> seconds it waited for the fetch
        self.refused: dict[int, int] = {}  # rid -> blocks a slower fetch left in the pool


class FleetPool:
    """``pool`` on ``env``'s clock for ``replicas`` (engines with observed radix caches)."""

    def __init__(self, env: simpy.Environment, pool: SharedPool, replicas: list,
                 block_size: int, block_bytes: int, bandwidth_bytes_per_s: float,
                 latency_s: float, write_policy: str,
                 recompute_seconds: Callable[[int, int], float]) -> None:
        self.env, self.pool, self.replicas = env, pool, replicas
        self.bs, self.block_bytes = block_size, block_bytes
        self.bandwidth, self.latency = bandwidth_bytes_per_s, latency_s
        self.write_policy = write_policy
        self.recompute_seconds = recompute_seconds
        self.link_free = [0.0] * len(replicas)
        self.record = PoolRecord()
        self.fetches = self.refusals = self.behind_cpu = 0
        self.fetched_blocks = self.wasted_blocks = self.refused_blocks = 0
        self.busy_s = 0.0  # link-seconds spent moving bytes (all links)
        # transfers (start, end, bytes) and occupancy samples, for plots
        self.transfers: list[tuple[float, float, int]] = []
        self.occ_time: list[float] = []
        self.occ_blocks: list[int] = []
        self.occ_leased: list[int] = []
        for engine in replicas:
            engine.cache.pool_sink = self

    # --- entry (the observed caches call these) --------------------------------------------
    def stored(self, ids: np.ndarray) -> None:
        if self.write_policy == "write-through" and ids.size:
            self.pool.put(ids)

    def dropped(self, ids: np.ndarray) -> None:
        if self.write_policy == "write-back" and ids.size:
            self.pool.put(ids)

    # --- the fleet's hand-off -------------------------------------------------------------
    def lookup(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` the pool holds (the router's credit; read only)."""
        return self.pool.prefix(ids)

    def submit(self, req, r: int) -> None:
        """Hand ``req`` to replica ``r``, after a fetch from the pool when one pays."""
        env, engine, ids = self.env, self.replicas[r], req.ids
        self._sample()
        h = engine.cache.resident_prefix_blocks(ids)
        usable = min(int(ids.size), (req.prompt_tokens - 1) // self.bs)
        p = self.pool.prefix(ids[:usable], h) if h < usable else 0
        if p == 0:
            engine.submit(req)
            return
        if engine.cache.gpu_prefix_blocks(ids) < h:
            # part of the replica's prefix is in its CPU tier: the fetched blocks could not
            # land behind it (kvsim inserts only behind a GPU prefix); the engine loads its
            # CPU part and computes the rest
            self.behind_cpu += 1
            engine.submit(req)
            return
        start = max(env.now, self.link_free[r])
        move_s = self.latency + p * self.block_bytes / self.bandwidth
        fetch_s = start + move_s - env.now
        if fetch_s >= self.recompute_seconds(h * self.bs, (h + p) * self.bs):
            self.refusals += 1
            self.refused_blocks += p
            self.record.refused[req.rid] = p
            engine.submit(req)
            return
        got = ids[h:h + p]
        self.pool.lease(got)
        self.link_free[r] = start + move_s
        self.fetches += 1
        self.busy_s += move_s
        self.transfers.append((start, start + move_s, p * self.block_bytes))
        self.record.fetch_s[req.rid] = fetch_s
        env.process(self._fetch(req, r, h, p, fetch_s))

    def _fetch(self, req, r: int, h: int, p: int, fetch_s: float):
        yield self.env.timeout(fetch_s)
        ids = req.ids
        self.pool.release(ids[h:h + p])
        if self._land(self.replicas[r], ids[:h + p], h):
            self.fetched_blocks += p
            self.record.fetched[req.rid] = p
            self.record.behind[req.rid] = h
        else:
            self.wasted_blocks += p
        self._sample()
        self.replicas[r].submit(req)

    def _land(self, engine, ids: np.ndarray, h: int) -> bool:
        """Insert ``ids`` (the prefix ``[0, h)`` already on the GPU) into the replica's cache
        as resident blocks, making room through its eviction policy; False when the prefix
        is no longer on the GPU or the room cannot be made."""
        cache = engine.cache
        if cache.gpu_prefix_blocks(ids) < h:
            return False
        new = int(ids.size) - cache.gpu_prefix_blocks(ids)
        m = cache.match(ids, touch=False)
        cache.lock(m.node)
        ok = True
        if cache.free_blocks < new:
            res = cache.make_room(new)
            engine.rec.evicted(res)
            ok = res.ok
        if ok:
            cache.reserve(new)
            cache.insert(ids)
            cache.release(new)
        cache.unlock(m.node)
        return ok

    def _sample(self) -> None:
        self.occ_time.append(self.env.now)
        self.occ_blocks.append(len(self.pool))
        self.occ_leased.append(len(self.pool.leases))

    # --- results ----------------------------------------------------------------------------
    def summary(self, duration_s: float, replicas: int) -> dict:
        moved = self.fetched_blocks + self.wasted_blocks
        moved_bytes = moved * self.block_bytes
        rate = moved_bytes / duration_s if duration_s > 0 else 0.0
        return {
            "pool_size_tokens": self.pool.capacity * self.bs,
            "pool_fetches": self.fetches,
            "pool_refused_fetches": self.refusals,
            "pool_behind_cpu_lookups": self.behind_cpu,
            "pool_fetched_tokens": self.fetched_blocks * self.bs,
            "pool_wasted_tokens": self.wasted_blocks * self.bs,
            "pool_refused_tokens": self.refused_blocks * self.bs,
            "pool_stored_tokens": self.pool.stored * self.bs,
            "pool_evicted_tokens": self.pool.evicted * self.bs,
            "pool_rejected_tokens": self.pool.rejected * self.bs,
            "pool_peak_tokens": max(self.occ_blocks, default=0) * self.bs,
            "pool_bytes_moved": moved_bytes,
            "pool_bytes_per_s": rate,
            # against every replica's link at full bandwidth for the whole run
            "pool_bandwidth_utilization": rate / (self.bandwidth * replicas),
        }
