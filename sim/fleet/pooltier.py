"""The shared pool on the fleet's clock (``--pool``): what enters it, when a replica fetches
from it, how long a fetch takes, and what it moved.

Engines know nothing of the pool. The fleet stands between the router and the chosen replica::

    route -> replica r
    r's resident prefix h (GPU + CPU tier, read only) -> pool lookup from block h, in prefix
    order, capped where the engine caps a hit (one token is always computed): [h, h + p)
    the blocks of [h, h + p) that r lacks (holes and blocks past its tree; blocks r holds
    on its GPU behind a hole are not fetched), up to r's first CPU-resident block there: m
    fetch_s = wait for r's pool link + latency + m x block bytes / bandwidth
    recompute_s = the cost model's prefill seconds of those m blocks' tokens at their positions
    fetch_s < recompute_s: lease the m blocks, and after fetch_s land them in r's cache
                           (inserted behind its prefix, as a CPU-tier load inserts loaded
                           blocks: ``insert_remote``), release the lease, then hand r the
                           request
    otherwise:             the fetch is refused; r gets the request now and recomputes

Overlap: none with the request's own prefill, as the engines' CPU-tier loads (their h2d
copies are waited for before the batch that needs them); the replica keeps serving other
requests during the fetch, as vLLM's asynchronous KV connectors park a request in
WAITING_FOR_REMOTE_KVS. Each replica has one pool link of ``bandwidth``: its fetches queue on
it in order (a fetch's wait counts in its fetch_s and in the refusal test).

Entry: write-through (every block a replica writes to its cache enters the pool if absent, as
LMCache stores the chunks of each saved sequence) or write-back (every block a replica drops
entirely: from its CPU tier when it has one, from its GPU otherwise; evictions, HiCache
background deletions and the device nodes a HiCache load deletes). Both arrive as the
replicas' KV events (``ChainWritten``, ``BlocksDropped``; ``kvevents.KVEventFeed``), delivered
in the order the replicas emitted them before every pool operation, so the pool changes in
the order the replicas acted.

Landing needs the replica's prefix before the fetched blocks on its GPU: a lookup whose
replica holds part of that prefix in its CPU tier fetches nothing (``behind_cpu``: the
engine loads its CPU part and computes the rest), and if eviction or a demotion took part of
it during the fetch, the fetched blocks are discarded (``wasted``); a block between fetched
ones that left the GPU during the fetch cuts the landing there (the fetched blocks after it
are wasted). The landed blocks are not pinned until admission (a CPU load's are not either
once the request is queued). A request's ``pool_tokens`` are the blocks its fetch landed that
its admission reused (``admitted``). sglang engine only: vLLM's block pool has no insertion
point outside a running request (nor a chain written per insert).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from costmodel.gpus import kv_bytes_through
from costmodel.units import ranges_units
from sim.kvcache.events import BlocksDropped, ChainWritten, KVEvent
from sim.kvcache.node import Tier

from .kvevents import KVEventFeed
from .pool import SharedPool

if TYPE_CHECKING:  # pandas where a table is made: none before a run's first request (issue 55)
    import pandas as pd

_GPU, _CPU = Tier.GPU, Tier.CPU


class PoolRecord:
    """Per routed request id: the pool's part of its prompt (built into columns at the end)."""

    def __init__(self) -> None:
        self.landed: dict[int, list[tuple[int, int]]] = {}  # rid -> block runs it landed
        self.reused: dict[int, int] = {}  # rid -> landed blocks its admission reused
        self.fetch_s: dict[int, float] = {}  # rid -> seconds it waited for the fetch
        self.refused: dict[int, int] = {}  # rid -> blocks a slower fetch left in the pool


def _gpu_mask(runs, a: int, b: int) -> np.ndarray:
    """Per block of [a, b): on the GPU (``runs``: ``tier_runs`` of the prompt)."""
    mask = np.zeros(b - a, dtype=bool)
    for s, e, tier in runs:
        if tier is _GPU and e > a and s < b:
            mask[max(s, a) - a:min(e, b) - a] = True
    return mask


def _first_cpu(runs, a: int, b: int) -> int:
    """The first block of [a, b) on the CPU tier (``b`` if none)."""
    for s, e, tier in runs:
        if tier is _CPU and e > a and s < b:
            return max(s, a)
    return b


def _runs(mask: np.ndarray, offset: int) -> list[tuple[int, int]]:
    """The runs of True in ``mask`` as block ranges (``offset``: the block of mask[0])."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return [(offset + int(s), offset + int(e)) for s, e in zip(edges[::2], edges[1::2],
                                                                 strict=True)]


def _gather(ids: np.ndarray, runs: list[tuple[int, int]]) -> np.ndarray:
    return np.concatenate([ids[a:b] for a, b in runs])


class FleetPool:
    """``pool`` on ``env``'s clock for ``replicas`` (engines with radix caches, whose KV events
    it turns on: ``feed``, shared with the fleet's exact index)."""

    def __init__(self, env: simpy.Environment, pool: SharedPool, replicas: list,
                 block_size: int, block_bytes: int, bandwidth_bytes_per_s: float,
                 latency_s: float, write_policy: str,
                 recompute_seconds: Callable[[list[tuple[int, int]]], float]) -> None:
        self.env, self._pool, self.replicas = env, pool, replicas
        self.bs, self.block_bytes = block_size, block_bytes
        self.bandwidth, self.latency = bandwidth_bytes_per_s, latency_s
        self.write_policy = write_policy
        self.recompute_seconds = recompute_seconds  # token ranges -> prefill seconds
        self.link_free = [0.0] * len(replicas)
        self.record = PoolRecord()
        self.lookups = 0  # lookups that found blocks in the pool
        self.fetches = self.refusals = self.behind_cpu = 0
        self.fetched_blocks = self.wasted_blocks = self.refused_blocks = 0
        self.behind_cpu_blocks = 0  # pool blocks those lookups left behind a CPU prefix
        self.busy_s = 0.0  # link-seconds spent moving bytes (all links)
        # transfers (start, end, bytes) and occupancy samples, for plots
        self.transfers: list[tuple[float, float, int]] = []
        self.transfer_replicas: list[int] = []  # whose link moved transfers[i] (timeline)
        self.occ_time: list[float] = []
        self.occ_blocks: list[int] = []
        self.occ_leased: list[int] = []
        self.entry = ChainWritten if write_policy == "write-through" else BlocksDropped
        self.feed = KVEventFeed(env, [engine.cache for engine in replicas])
        self.feed.subscribe(self._kv_event, (self.entry,))

    @property
    def pool(self) -> SharedPool:
        """The shared pool with every KV event the replicas emitted so far applied."""
        self.feed.deliver()
        return self._pool

    # --- entry: the replicas' KV events -------------------------------------------------------
    def _kv_event(self, replica: int, at: float, event: KVEvent) -> None:
        """Write-through: the chain an insert wrote; write-back: blocks dropped entirely."""
        if type(event) is self.entry and event.ids.size:
            self._pool.put(event.ids)

    # --- the fleet's hand-off -------------------------------------------------------------
    def lookup(self, ids: np.ndarray) -> int:
        """Leading blocks of ``ids`` the pool holds (the router's credit; read only)."""
        self.feed.deliver()
        return self._pool.prefix(ids)

    def submit(self, req, r: int) -> None:
        """Hand ``req`` to replica ``r``, after a fetch from the pool when one pays."""
        env, engine, ids = self.env, self.replicas[r], req.ids
        self._sample()  # delivers the replicas' events first
        cache = engine.cache
        h = cache.resident_prefix_blocks(ids)
        usable = min(int(ids.size), (req.prompt_tokens - 1) // self.bs)
        p = self._pool.prefix(ids[:usable], h) if h < usable else 0
        if p == 0:
            engine.submit(req)
            return
        self.lookups += 1
        if cache.gpu_prefix_blocks(ids) < h:
            # part of the replica's prefix is in its CPU tier: the fetched blocks could not
            # land behind it (kvsim inserts only behind a GPU prefix); the engine loads its
            # CPU part and computes the rest
            self.behind_cpu += 1
            self.behind_cpu_blocks += p
            engine.submit(req)
            return
        tiers = cache.tier_runs(ids[:h + p])
        end = _first_cpu(tiers, h, h + p)  # a CPU block is loaded by the engine, not fetched
        missing = _runs(~_gpu_mask(tiers, h, end), h)  # block h itself is always missing
        m = sum(b - a for a, b in missing)
        start = max(env.now, self.link_free[r])
        move_s = self.latency + m * self.block_bytes / self.bandwidth
        fetch_s = start + move_s - env.now
        if fetch_s >= self.recompute_seconds([(a * self.bs, b * self.bs) for a, b in missing]):
            self.refusals += 1
            self.refused_blocks += m
            self.record.refused[req.rid] = m
            engine.submit(req)
            return
        self._pool.lease(_gather(ids, missing))
        self.link_free[r] = start + move_s
        self.fetches += 1
        self.busy_s += move_s
        self.transfers.append((start, start + move_s, m * self.block_bytes))
        self.transfer_replicas.append(r)
        self.record.fetch_s[req.rid] = fetch_s
        env.process(self._fetch(req, r, h, end, missing, fetch_s))

    def _fetch(self, req, r: int, h: int, end: int, missing: list[tuple[int, int]],
               fetch_s: float):
        yield self.env.timeout(fetch_s)
        self.feed.deliver()
        self._pool.release(_gather(req.ids, missing))
        landed = self._land(self.replicas[r], req.ids, h, end, missing)
        n = sum(b - a for a, b in landed)
        self.fetched_blocks += n
        self.wasted_blocks += sum(b - a for a, b in missing) - n
        if landed:
            self.record.landed[req.rid] = landed
        self._sample()
        self.replicas[r].submit(req)

    def _land(self, engine, ids: np.ndarray, h: int, end: int,
              fetched: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Land the ``fetched`` runs of ``ids[h:end]`` in the replica's cache behind its GPU
        prefix ``[0, h)``, up to the first block that is neither fetched nor on the GPU now
        (eviction or a demotion took it during the fetch); the runs landed (none when the
        prefix left the GPU or the room cannot be made)."""
        cache = engine.cache
        if cache.gpu_prefix_blocks(ids) < h:
            return []
        have = _gpu_mask(cache.tier_runs(ids[:end]), h, end)
        for a, b in fetched:
            have[a - h:b - h] = True
        stop = h + int(np.argmin(have)) if not have.all() else end
        landed = [(a, min(b, stop)) for a, b in fetched if a < stop]
        if not landed or not engine.insert_remote(ids[:stop]):
            return []
        return landed

    def admitted(self, req, found) -> None:
        """``req``'s record opened (its first admission) with match ``found`` (before any CPU
        load): how many of the blocks its fetch landed its admission reused on the GPU (its GPU
        runs, up to the engine's cap). A landed block demoted before admission and loaded
        back is a CPU load's, not the pool's."""
        landed = self.record.landed.get(req.rid)
        if landed is None:
            return
        usable = min(int(req.ids.size), (req.prompt_tokens - 1) // self.bs)
        n = 0
        for s, e, tier in found:
            if tier != _GPU:
                continue
            e = min(e, usable)
            n += sum(max(0, min(b, e) - max(a, s)) for a, b in landed)
        self.record.reused[req.rid] = n

    def _sample(self) -> None:
        self.feed.deliver()
        self.occ_time.append(self.env.now)
        self.occ_blocks.append(len(self._pool))
        self.occ_leased.append(len(self._pool.leases))

    # --- results ----------------------------------------------------------------------------
    def summary(self, duration_s: float, table: pd.DataFrame, cfg) -> dict:
        """The pool's summary fields over a fleet run of ``duration_s`` seconds whose requests
        (``table``) carry the pool's columns (``pool_columns``)."""
        self.feed.deliver()
        moved = self.fetched_blocks + self.wasted_blocks
        moved_bytes = moved * self.block_bytes
        rate = moved_bytes / duration_s if duration_s > 0 else 0.0
        fields = {
            "pool_size_tokens": self._pool.capacity * self.bs,
            "pool_fetches": self.fetches,
            "pool_refused_fetches": self.refusals,
            "pool_lookups": self.lookups,
            "pool_behind_cpu_lookups": self.behind_cpu,
            "pool_behind_cpu_tokens": self.behind_cpu_blocks * self.bs,
            "pool_fetched_tokens": self.fetched_blocks * self.bs,
            "pool_wasted_tokens": self.wasted_blocks * self.bs,
            "pool_refused_tokens": self.refused_blocks * self.bs,
            "pool_stored_tokens": self._pool.stored * self.bs,
            "pool_evicted_tokens": self._pool.evicted * self.bs,
            "pool_rejected_tokens": self._pool.rejected * self.bs,
            "pool_peak_tokens": max(self.occ_blocks, default=0) * self.bs,
            "pool_bytes_moved": moved_bytes,
            "pool_bytes_per_s": rate,
            # against every replica's link at full bandwidth for the whole run
            "pool_bandwidth_utilization": rate / (self.bandwidth * cfg.fleet.replicas),
        }
        for k, col in (("reused_gpu_tokens", "local_gpu_tokens"),
                       ("reused_cpu_tokens", "loaded_cpu_tokens"),
                       ("reused_pool_tokens", "pool_tokens")):
            fields[k] = int(table[col].sum()) if len(table) else 0
        prompt = int(table["prompt_tokens"].sum()) if len(table) else 0
        fields["pool_hit_rate"] = fields["reused_pool_tokens"] / prompt if prompt else 0.0
        fields["pool_fetch_s"] = float(table["fetch_s"].sum()) if len(table) else 0.0
        fields["pool_write"] = cfg.pool.pool_write
        fields["pool_bandwidth_gb_s"] = cfg.pool.pool_bandwidth
        fields["pool_latency_us"] = cfg.pool.pool_latency_us
        return fields


def build_pool(env: simpy.Environment, cfg, spec, profile, engines) -> FleetPool:
    """The shared pool of a fleet run, priced by the run's cost model."""
    def recompute_seconds(ranges: list[tuple[int, int]]) -> float:
        return profile.recompute_seconds(ranges_units(spec, ranges))

    pool, bs = cfg.pool, cfg.cache.block_size
    return FleetPool(env, SharedPool(pool.size // bs, pool.pool_watermark,
                                     pool.pool_evict_fraction),
                     engines, bs,  # every rank's share over the replica's one link
                     kv_bytes_through(spec, cfg.cache.replica_tp(profile.gpus), 1) * bs,
                     pool.pool_bandwidth * 1e9,
                     pool.pool_latency_us * 1e-6, pool.pool_write, recompute_seconds)


def pool_served(pool: FleetPool, table: pd.DataFrame, now: float, cfg, timeline=None
                ) -> tuple[pd.DataFrame, dict[str, Any], dict[str, pd.DataFrame]]:
    """What the pool adds to a fleet run's result (results.py ``fleet_served``): the requests'
    pool columns, its fields and notes, its tables; a ``timeline`` gets its fetches."""
    import pandas as pd  # (not at import: issue 55 start-up)

    table = pool_columns(table, pool, cfg.cache.block_size)
    notes = pool_notes(pool, table)
    tables = {"pool": pool_table(pool), "pool_transfers": pd.DataFrame(
        np.asarray(pool.transfers, dtype=float).reshape(-1, 3),
        columns=["start_s", "end_s", "bytes"])}
    if timeline is not None:
        timeline.pool_fetches(pool.transfers, pool.transfer_replicas, cfg.fleet.replicas)
    return table, pool.summary(now, table, cfg) | {"pool_notes": notes}, tables


def pool_columns(table: pd.DataFrame, pool: FleetPool, bs: int) -> pd.DataFrame:
    """Where each reused token came from: ``pool_tokens`` (fetched from the pool; they land on
    the replica's GPU, so ``hit_gpu_tokens`` counts them too: the blocks the request's fetch
    landed that its admission reused; landed blocks evicted before admission are not
    counted), ``local_gpu_tokens`` (the rest of the GPU hit), ``loaded_cpu_tokens`` (the
    replica's CPU tier, as before); ``fetch_s`` the seconds the request waited for its fetch
    (0: none)."""
    rec = pool.record
    rid = table["request"].to_numpy()
    table = table.copy()
    table["pool_tokens"] = np.asarray([rec.reused.get(int(r), 0) for r in rid],
                                      dtype=np.int64) * bs
    table["local_gpu_tokens"] = table["hit_gpu_tokens"].to_numpy() - table["pool_tokens"]
    table["fetch_s"] = np.asarray([rec.fetch_s.get(int(r), 0.0) for r in rid], dtype=float)
    return table


def pool_notes(pool: FleetPool, table: pd.DataFrame) -> list[str]:
    """What a user of this pool should know (``kvsim run`` prints them as warnings): prompts
    the pool cannot hold whole, and lookups that stopped behind a CPU-resident prefix."""
    notes = []
    size = pool.pool.capacity * pool.bs
    prompts = table["prompt_tokens"].to_numpy()
    over = int((prompts > size).sum())
    if over:
        notes.append(f"the pool ({size:,} tokens) is smaller than {over:,} of {prompts.size:,} "
                     f"prompts (the longest: {int(prompts.max()):,} tokens): it cannot hold "
                     "such a prompt whole, and a lookup stops at the first block it lacks")
    if pool.behind_cpu:
        notes.append(f"{pool.behind_cpu:,} of {pool.lookups:,} pool lookups that found blocks "
                     "stopped behind a prefix held partly in the replica's CPU tier "
                     f"({pool.behind_cpu_blocks * pool.bs:,} pooled tokens not fetched): "
                     "kvsim lands pool blocks only behind a GPU prefix, so those requests "
                     "loaded the CPU part and computed the rest")
    return notes


def pool_table(pool: FleetPool) -> pd.DataFrame:
    """Pool occupancy at every routing decision and landing (``kvsim plot`` draws it with
    the bytes moved per second)."""
    import pandas as pd  # (not at import: issue 55 start-up)

    return pd.DataFrame({
        "time_s": np.asarray(pool.occ_time, dtype=float),
        "blocks": np.asarray(pool.occ_blocks, dtype=np.int64),
        "leased_blocks": np.asarray(pool.occ_leased, dtype=np.int64),
        "tokens": np.asarray(pool.occ_blocks, dtype=np.int64) * pool.bs,
    })
