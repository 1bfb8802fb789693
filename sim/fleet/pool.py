"""A KV pool shared by every replica of a fleet (Mooncake Store, LMCache's remote backend,
Dynamo's host/disk tiers), without timing: what it holds, what a lookup hits, what it evicts.

Objects are kvsim blocks (``block_size`` tokens, keyed by their chained id: equal ids are an
equal prefix, so the pool deduplicates across replicas as Mooncake's prefix-hash keys do).

- **put** (``put``): blocks a replica computed (write-through, as LMCache stores chunks) or
  dropped from its own tiers (write-back). A block already held keeps its recency (a put is
  not a read). Before each new block, if the pool holds ``watermark`` x capacity blocks or
  more, one eviction pass runs; if the pool is still full the block is not stored (Mooncake's
  failed ``PutStart``; counted in ``rejected``).
- **eviction pass** (Mooncake Store's ``BatchEvict``): drop ``ceil(evict_fraction x held)``
  blocks (at least one), least recently used first, skipping blocks leased by an in-flight
  fetch. Mooncake orders by lease timeout, an approximation of LRU; kvsim keeps the exact
  order it approximates.
- **lookup** (``prefix``): blocks of a prompt held from position ``start`` on, in prefix order,
  stopping at the first miss (LMCache's chunk scan). Read only.
- **fetch** (``lease`` then ``release``): the fetched blocks become most recent and stay
  leased (unevictable) until the fetch completes.

Python work is per block (a dict operation each); the pool is only built when asked for.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

WRITE_POLICIES = ("write-through", "write-back")


class SharedPool:
    """``capacity_blocks`` blocks with the eviction above."""

    def __init__(self, capacity_blocks: int, watermark: float = 0.90,
                 evict_fraction: float = 0.05) -> None:
        if capacity_blocks < 1:
            raise ValueError(f"a pool needs at least one block, got {capacity_blocks}")
        if not 0.0 < watermark <= 1.0:
            raise ValueError(f"pool watermark must be in (0, 1], got {watermark}")
        if not 0.0 < evict_fraction <= 1.0:
            raise ValueError(f"pool eviction fraction must be in (0, 1], got {evict_fraction}")
        self.capacity = int(capacity_blocks)
        self.high = watermark * self.capacity
        self.fraction = evict_fraction
        self.blocks: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.leases: dict[int, int] = {}  # block -> fetches in flight holding it
        self.stored = 0  # blocks ever added
        self.evicted = 0
        self.rejected = 0  # puts refused: full of leased blocks
        self.passes = 0

    def __len__(self) -> int:
        return len(self.blocks)

    def __contains__(self, block: int) -> bool:
        return block in self.blocks

    def prefix(self, ids: np.ndarray, start: int = 0) -> int:
        """How many blocks of ``ids`` from ``start`` on the pool holds, contiguously."""
        blocks = self.blocks
        for k, b in enumerate(ids[start:].tolist()):
            if b not in blocks:
                return k
        return max(0, int(ids.shape[0]) - start)

    def lease(self, ids: np.ndarray) -> None:
        """A fetch of ``ids`` (all held) starts: they become most recent and unevictable."""
        blocks, leases = self.blocks, self.leases
        for b in ids.tolist():
            blocks.move_to_end(b)
            leases[b] = leases.get(b, 0) + 1

    def release(self, ids: np.ndarray) -> None:
        """The fetch of ``ids`` completed."""
        leases = self.leases
        for b in ids.tolist():
            left = leases[b] - 1
            if left:
                leases[b] = left
            else:
                del leases[b]

    def put(self, ids: np.ndarray) -> int:
        """Store ``ids`` (new ones only, in order); returns how many were added."""
        blocks = self.blocks
        new = [b for b in ids.tolist() if b not in blocks]
        if len(blocks) + len(new) <= self.high:  # no pass can start: append them at once
            blocks.update(dict.fromkeys(new))
            self.stored += len(new)
            return len(new)
        added = 0
        for b in ids.tolist():  # a pass may drop a block of ids held before: check each
            if b in blocks:
                continue
            if len(blocks) >= self.high:
                self._evict_pass()
                if len(blocks) >= self.capacity:
                    self.rejected += 1
                    continue
            blocks[b] = None
            added += 1
        self.stored += added
        return added

    def _evict_pass(self) -> None:
        blocks, leases = self.blocks, self.leases
        want = max(1, math.ceil(self.fraction * len(blocks)))
        self.passes += 1
        if not leases:
            k = min(want, len(blocks))
            for _ in range(k):
                blocks.popitem(last=False)
            self.evicted += k
            return
        victims = []
        for b in blocks:
            if b not in leases:
                victims.append(b)
                if len(victims) == want:
                    break
        for b in victims:
            del blocks[b]
        self.evicted += len(victims)
