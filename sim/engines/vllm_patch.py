"""Named patches of the vLLM engine: what vLLM would do if a contributor changed its code.

``penelope`` (``--vllm-patch penelope``): the Penelope paper's hole refill as a vLLM patch.
The lookup continues past missing blocks (``sim.kvcache.blockpool.HolePool``): a request
reuses every cached block of its chain, and the missing ones before the last cached block
(holes) are recomputed in the same step as its new tokens, as prefill tokens of the V1 token
budget (holes first, in position order; what does not fit is chunked like any prefill), each
priced by the cost model at its position. Eviction is the run's free order (``penelope``:
the front of the private history after the shared prefix goes first, block by block).
docs/engine.md says what the patch changes in vLLM's code and what it assumes.

The engine is ``VllmServer`` unchanged except at three points: the lookup and allocation
(the pool), the positions a row spans and what they cost the budget (``_chunk``), and the
units of a row (``_row_units``: reused blocks inside a row are not computed).
"""

from __future__ import annotations

from costmodel.registry import Registry
from costmodel.units import Units, range_units
from sim.kvcache import Tier
from sim.kvcache.blockpool import HolePool

from .vllm import VllmReq, VllmServer
from .vllm_continuum import (
    ContinuumFixedVllmServer,
    ContinuumVllmServer,
    PinsOnlyVllmServer,
    ProgramOrderVllmServer,
)


class PenelopeVllmServer(VllmServer):
    """vLLM 0.33 with the Penelope patch (hole refill in the same step)."""

    pool_class = HolePool
    pool: HolePool

    def _chunk(self, req: VllmReq, start: int, end: int, budget: int) -> tuple[int, int]:
        return self.pool.span(req.rid, start, end, budget)

    def _row_units(self, req: VllmReq, start: int, n: int) -> Units:
        units = Units()
        for a, b in self.pool.computed_ranges(req.rid, start, start + n):
            units = units + range_units(self.spec, a, b)
        return units

    def _admitted(self, req: VllmReq, hit_blocks: int) -> None:
        """Open the record at the first admission: reused = the prefix and every block
        reused past a hole; holes = the blocks refilled (recomputed inside ``ideal``)."""
        now = self.env.now
        req.admitted_at = now
        if req.record is not None:
            return
        prefix, reused = self.pool.reuse_of(req.rid)
        segments = [(0, prefix, Tier.GPU)] if prefix else []
        at = prefix
        for a, b in reused:
            segments += [(at, a, Tier.NONE), (a, b, Tier.GPU)]
            at = b
        bs = self.bs
        reused_tokens = (prefix + sum(b - a for a, b in reused)) * bs
        hole_tokens = sum(e - s for s, e, t in segments if t == Tier.NONE) * bs
        req.known_blocks = self._ideal_blocks(req)
        ideal = min(req.known_blocks, (req.prompt_tokens - 1) // bs) * bs
        req.record = self.open_record(req, now, reused=reused_tokens, holes=hole_tokens,
                                      ideal=ideal, segments=segments)


# --vllm-patch NAME -> the engine class (``none`` is vLLM as deployed)
VLLM_PATCHES: Registry[type[VllmServer]] = Registry("vLLM patch")
VLLM_PATCHES.register("none", VllmServer)
VLLM_PATCHES.register("penelope", PenelopeVllmServer)
VLLM_PATCHES.register("continuum", ContinuumVllmServer)
VLLM_PATCHES.register("continuum-fixed", ContinuumFixedVllmServer)
VLLM_PATCHES.register("continuum-pins", PinsOnlyVllmServer)
VLLM_PATCHES.register("continuum-fcfs", ProgramOrderVllmServer)
