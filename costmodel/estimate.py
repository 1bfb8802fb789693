"""Estimates a router may ask for: the seconds a replica would spend prefilling a prompt's
uncached part alone, in the engine's prefill chunks (one batch per chunk, priced by the
profile like the engines price theirs). A router's guess, not the engine's schedule: it
ignores other requests in the batch and decode steps between chunks."""

from __future__ import annotations

from dataclasses import dataclass

from .profile import Profile
from .specs import ModelSpec
from .units import range_units


@dataclass(frozen=True)
class PrefillEstimate:
    spec: ModelSpec
    profile: Profile
    chunk_tokens: int = 8192

    def __call__(self, cached_tokens: int, prompt_tokens: int) -> float:
        """Seconds to compute tokens ``[cached_tokens, prompt_tokens)`` of one prompt."""
        if self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {self.chunk_tokens}")
        total, a = 0.0, max(0, int(cached_tokens))
        while a < prompt_tokens:
            b = min(int(prompt_tokens), a + self.chunk_tokens)
            total += self.profile.prefill_seconds(range_units(self.spec, a, b))
            a = b
        return total
