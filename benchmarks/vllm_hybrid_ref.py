"""The real vLLM hybrid KV cache (``HybridKVCacheCoordinator`` with ``FullAttentionManager``
and ``SlidingWindowManager``), loaded as benchmarks/vllm_ref.py loads the full-attention
manager (each pinned install, heavy imports stubbed), driven by kvsim block ids.

``VllmHybridRef`` is ``VllmRef`` with a ``KVCacheConfig`` of several groups (one per
``sim.kvcache.hybridpool.HybridGroup``: ``FullAttentionSpec`` or ``SlidingWindowSpec`` with
its window, one layer each, one shared pool of ``capacity_blocks`` usable blocks), so the
manager builds vLLM's own hybrid coordinator; ``SlidingWindowSpec`` is registered with its
manager as ``register_all_kvcache_specs`` does. Observations add the group of each cached
block and every group's block table (null blocks as 0).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.vllm_ref import VllmRef, load_vllm_core
from sim.kvcache.hybridpool import FULL, MAMBA, HybridGroup


class VllmHybridRef(VllmRef):
    """One real vLLM KVCacheManager over a hybrid KV cache config (module doc)."""

    def __init__(
        self,
        capacity_blocks: int,
        block_size: int,
        groups: Sequence[HybridGroup],
        full_sequence_must_fit: bool = True,
        max_in_flight_tokens: int | None = None,
        version: str | None = None,
    ) -> None:
        mods = load_vllm_core(version)
        iface, single = mods["interface"], mods["single"]
        registry = mods["registry"].KVCacheSpecRegistry
        registry.register(iface.SlidingWindowSpec, single.SlidingWindowManager,
                          uniform_type_base_spec=iface.SlidingWindowSpec)
        registry.register(iface.MambaSpec, single.MambaManager,
                          uniform_type_base_spec=iface.MambaSpec)
        self.groups = list(groups)
        super().__init__(capacity_blocks, block_size, full_sequence_must_fit, version,
                         max_in_flight_tokens)
        assert type(self.manager.coordinator).__name__ == "HybridKVCacheCoordinator"

    def _group_specs(self, iface: types.ModuleType, torch: Any) -> list[Any]:
        """One group per ``HybridGroup``, one layer each."""
        specs = []
        for i, g in enumerate(self.groups):
            kw = dict(block_size=self.block_size, num_kv_heads=1, head_size=1,
                      dtype=torch.float16)
            if g.kind == MAMBA:  # prefix caching: align mode, a state per block edge
                spec = iface.MambaSpec(block_size=self.block_size, shapes=((1,),),
                                       dtypes=(torch.float16,), mamba_cache_mode="align")
            else:
                spec = (iface.FullAttentionSpec(**kw) if g.kind == FULL
                        else iface.SlidingWindowSpec(sliding_window=g.window, **kw))
            specs.append(iface.KVCacheGroupSpec([f"layers.{i}"], spec))
        return specs

    def new_step(self) -> None:
        """A scheduler step starts (``KVCacheManager.new_step_starts``)."""
        self.manager.new_step_starts()

    def block_groups(self) -> np.ndarray:
        """Per physical block 1..capacity: the group its cached hash is for (-1: none)."""
        get = self._mods["utils"].get_group_id
        return np.array([-1 if b.block_hash is None else get(b.block_hash)
                         for b in self.pool.blocks[1:]], np.int64)

    def extend(self, rid: int, num_new_tokens: int, known: int | None = None,
               in_flight: int = 0) -> bool:
        """``VllmRef.extend`` with ``in_flight`` tokens of steps not yet processed (vLLM's
        ``num_in_flight_tokens``: window frees read the processed tokens)."""
        req = self._reqs[rid]
        req.num_in_flight_tokens = in_flight
        try:
            return super().extend(rid, num_new_tokens, known)
        finally:
            req.num_in_flight_tokens = 0

    def admit_remote(self, rid: int, reserved: int = 0) -> tuple[bool, int]:
        """A decode worker's waiting request whose prompt a KV connector loads: lookup, then
        ``allocate_slots`` with every token past the local hit external
        (``num_external_computed_tokens``), ``delay_cache_blocks`` and ``reserved_blocks``.
        Returns (allocated, local hit blocks)."""
        req = self._reqs[rid]
        blocks, hit_tokens = self.manager.get_computed_blocks(req)[:2]
        out = self.manager.allocate_slots(
            req, 0, num_new_computed_tokens=hit_tokens, new_computed_blocks=blocks,
            num_external_computed_tokens=req.num_tokens - hit_tokens, delay_cache_blocks=True,
            reserved_blocks=reserved)
        if out is None:
            return False, hit_tokens // self.block_size
        req.status = self._status.RUNNING
        req.num_computed_tokens = req.num_tokens
        return True, hit_tokens // self.block_size
