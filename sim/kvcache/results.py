"""Plain results of cache operations (all sizes in blocks). The immutable ones (``Match``,
``InsertResult``) are named tuples: every prefill chunk makes some, and a tuple is the cheapest
record to build."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .node import Node, Tier


def split_match(segments, usable: int) -> tuple[int, int, list[tuple[int, int]], int]:
    """The first ``usable`` blocks of a match's ``segments``: (GPU blocks: reused, CPU
    blocks: loaded, hole runs ``(start, end)``: recomputed, the block where the match stops).
    A DROPPED run is none of them: its KV is neither kept nor needed."""
    gpu = cpu = end = 0
    holes: list[tuple[int, int]] = []
    for s, e, tier in segments:
        if s >= usable:
            break
        e = min(e, usable)
        if tier == Tier.GPU:
            gpu += e - s
        elif tier == Tier.CPU:
            cpu += e - s
        elif tier == Tier.NONE:
            holes.append((s, e))
        end = e
    return gpu, cpu, holes, end


class Match(NamedTuple):
    """Result of ``RadixKVCache.match``.

    node: deepest matched node, the handle to ``lock``/``unlock`` (the root when nothing
      matched); the match ends exactly at ``node.end`` because match splits the node it ends in.
    matched_blocks: length of the matched path, holes included.
    hit_blocks: GPU-resident blocks before the first non-GPU block (SGLang's hit length).
    segments: runs ``(start_block, end_block, tier)`` covering ``[0, matched_blocks)`` in
      order, adjacent runs of one tier merged: GPU = reuse, CPU = load, NONE = recompute.
    """

    node: Node
    matched_blocks: int
    hit_blocks: int
    segments: tuple[tuple[int, int, Tier], ...]

    def blocks_in(self, tier: Tier) -> int:
        return sum(e - s for s, e, t in self.segments if t == tier)

    @property
    def cpu_blocks(self) -> int:
        """Matched blocks resident on CPU only (to load before the prefill): unified = every
        CPU run on the path; hicache = the host-only part right below the device prefix."""
        return self.blocks_in(Tier.CPU)

    @property
    def hole_blocks(self) -> int:
        """Matched blocks whose KV must be recomputed (a phantom prefill)."""
        return self.blocks_in(Tier.NONE)


@dataclass(eq=False, kw_only=True)
class EvictResult:
    """Result of ``evict``/``make_room``.

    ok: the request was met (``evict``: at least n freed; ``make_room``: free_blocks >= n).
    freed_blocks: GPU blocks freed (deleted from the GPU + demoted to the CPU).
    deleted_blocks: blocks whose last copy was removed, either tier; freed: their ids, one
      array per deleted run in the order deleted (each run in ascending position). Without a
      CPU tier deleted_blocks == freed_blocks.
    demoted_blocks: GPU blocks moved to the CPU tier (unified: a d2h copy; hicache: the device
      copy of a backed-up node dropped, no copy, except write_back's copy at eviction);
      demoted: their ids. Informational only: every d2h copy is reported (once) by
      ``RadixKVCache.backup_pending``.
    holes_made: deleted blocks still in the tree as NONE when the call returns (the rest left
      the tree).
    """

    ok: bool
    freed_blocks: int = 0
    freed: list[np.ndarray] = field(default_factory=list)
    holes_made: int = 0
    deleted_blocks: int = 0
    demoted_blocks: int = 0
    demoted: list[np.ndarray] = field(default_factory=list)

    def freed_ids(self) -> np.ndarray:
        """All freed ids, concatenated in the order freed."""
        if not self.freed:
            return np.empty(0, dtype=np.int64)
        return np.concatenate(self.freed)


class InsertResult(NamedTuple):
    """Result of ``insert``: node holds ids[-1] (root for empty ids); new_blocks became a new
    leaf, filled_blocks were holes refilled or CPU-resident nodes promoted to GPU (a CPU
    tier), existing_blocks were GPU already."""

    node: Node
    new_blocks: int
    filled_blocks: int
    existing_blocks: int

    @property
    def added_blocks(self) -> int:
        """GPU blocks the tree gained (new + filled)."""
        return self.new_blocks + self.filled_blocks


@dataclass(slots=True, kw_only=True)
class LoadResult:
    """Result of ``RadixKVCache.load`` (sizes in blocks).

    ok: False when GPU room could not be made (too much locked or reserved): nothing changed.
    loaded_blocks: blocks copied h2d (CPU -> GPU); the only place h2d traffic is reported.
      loaded: their ids, one array per loaded run, root-ward first.
    skipped: hicache only: the host part was under ``load_threshold_tokens`` and was not
      loaded (ok stays True; the caller recomputes those tokens).
    demoted_blocks / deleted_blocks: GPU room this load made (unified: demotions only, a load
      never deletes; hicache: demoted backed-up nodes and deleted ones). The d2h copies of
      unified demotions are reported by ``backup_pending`` (not here, to avoid double counting).
      demoted / deleted: their ids, one array per run (deleted: blocks whose last copy the
      load removed, either tier, in the order deleted).
    swap_blocks: loaded blocks that went through the CPU swap buffer because both tiers were
      full (unified only); swap_chunks: buffer rounds, ceil(swap_blocks / swap_buffer_blocks).
    """

    ok: bool
    loaded_blocks: int = 0
    demoted_blocks: int = 0
    deleted_blocks: int = 0
    swap_blocks: int = 0
    swap_chunks: int = 0
    skipped: bool = False
    loaded: list[np.ndarray] = field(default_factory=list)
    demoted: list[np.ndarray] = field(default_factory=list)
    deleted: list[np.ndarray] = field(default_factory=list)
