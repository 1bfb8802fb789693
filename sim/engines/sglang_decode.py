"""Decode runs of the SGLang engine (a mixin of ``SGLangServer``): how many steps the running
batch can take at once, retraction when it cannot take one, and the bookkeeping after a run.

A run of k steps is one event: k is the number of steps to the first finish, cut to what
free + evictable memory holds for every running request (``_steps_in``, closed form).
Memory is reserved for exactly the tokens a run generated, after the run.
"""

from __future__ import annotations

from sim.kvcache import RadixKVCache
from sim.metrics import RunRecorder

from .base import steps_fitting
from .request import Req

# SGLANG_RETRACT_DECODE_STEPS: after releasing a retracted request, SGLang evicts the cache
# until this many tokens per remaining request are free; the new ratio assumes as many more
# tokens per survivor.
RETRACT_DECODE_STEPS = 20


class DecodeRuns:
    """Decode-phase methods; state (``running``, ``waiting``, ``cache``, ``ratio``...) is the
    server's own."""

    bs: int
    cache: RadixKVCache
    rec: RunRecorder
    running: list[Req]
    waiting: list[Req]
    ratio: float
    batch_is_full: bool

    def _decode_plan(self) -> int:
        """Steps the running batch can take now: to the first finish, limited by memory
        (free + evictable blocks)."""
        steps = min(r.output_tokens - r.generated for r in self.running)
        return self._steps_in(self.cache.free_blocks + self.cache.evictable_blocks, steps)

    def _steps_in(self, room: int, cap: int) -> int:
        """Largest k <= cap such that k more tokens of every running request need at most
        ``room`` more blocks. Request i needs a new block at steps t_i, t_i + bs, ... where
        t_i = (its reserved blocks * bs - its tokens) + 1, so the (room+1)-th smallest of
        these is the first step that does not fit."""
        bs = self.bs
        # steps_fitting checks each t_i is in [1, bs]: the invariant reserved == ceil(own / bs)
        return steps_fitting([r.reserved * bs - r.own_tokens + 1 for r in self.running], bs,
                             room, cap)

    def _retract(self) -> None:
        """SGLang retract_decode: fewest generated first, ties longest prompt, then the last
        in the running batch; keep one. Each release (``release_req``) frees the victim's
        own tokens, unlocks its tree part, then evicts until 20 tokens per remaining request
        are free."""
        order = {id(r): i for i, r in enumerate(self.running)}
        victims = sorted(self.running, key=lambda r: (r.generated, -r.prompt_tokens,
                                                      -order[id(r)]))
        while len(self.running) > 1 and self._decode_plan() == 0:
            v = victims.pop(0)
            self.running.remove(v)
            v.redo_until = max(v.redo_until, v.context_tokens)
            self.cache.release(v.reserved)
            v.reserved = v.own_tokens = 0
            self._unlock_all(v)
            self.rec.retracted(v)
            self._seq += 1
            v.seq = self._seq
            self.waiting.append(v)
            short = self._blocks(RETRACT_DECODE_STEPS * len(self.running)) - self.cache.free_blocks
            if short > 0 and self.cache.evictable_blocks:
                self.rec.evicted(self.cache.evict(min(short, self.cache.evictable_blocks)))
        self.batch_is_full = False  # the running batch shrank
        survivors = self.running
        out = sum(r.generated for r in survivors)
        self.ratio = min(1.0, (out + RETRACT_DECODE_STEPS * len(survivors)) / (
            sum(self._max_new(r) for r in survivors) + 1))

    def _reserve_decode(self, steps: int) -> None:
        """Hold memory for the ``steps`` tokens every running request just generated (the
        plan made sure it exists: nothing else ran since)."""
        for r in self.running:
            ok = self._reserve_tokens(r, steps)
            assert ok, f"decode plan promised room for {steps} steps of request {r.rid}"

    def _apply_decode(self, steps: int, retracted: bool = False) -> None:
        """After a run of ``steps`` decode steps. SGLang decays the ratio once per decode
        iteration that did not retract: the first step of a run that began with a
        retraction (``retracted``; it SET the ratio, perhaps below the floor) does not."""
        for r in self.running:
            r.generated += steps
        decays = steps - 1 if retracted else steps
        if decays:
            self.ratio = max(self.ratio - decays * self._decay, self.cfg.new_token_ratio_min)
        finished = [r for r in self.running if r.generated >= r.output_tokens]
        if finished:
            self.running = [r for r in self.running if r.generated < r.output_tokens]
            for r in finished:
                self._finish(r)
