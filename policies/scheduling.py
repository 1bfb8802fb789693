"""Scheduling policies: the order in which waiting requests are considered for prefill.

A policy is a sort key over candidates (SGLang ``schedule_policy.py``): the engine matches
candidates against the cache (with SGLang's side effects: a match splits and stamps), then
sorts stably by the key, so ties keep queue order (FIFO for new arrivals).

- ``fcfs``: queue order. SGLang matches only the candidates it examines.
- ``lpm``: longest cached prefix first ("most reusable cache first"). Every waiting request is
  matched each pass; above ``LPM_QUEUE_LIMIT`` waiting requests SGLang neither matches nor sorts.
- ``lpm-cpu``: as lpm, counting the CPU-resident part of the prefix as reusable too.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

LPM_QUEUE_LIMIT = 128


class SchedulerKind(StrEnum):
    FCFS = "fcfs"
    LPM = "lpm"
    LPM_CPU = "lpm-cpu"


@dataclass(frozen=True)
class Candidate:
    """What a scheduler may look at: queue position and reusable cache (blocks)."""

    queue_pos: int
    gpu_blocks: int = 0
    cpu_blocks: int = 0


@dataclass(frozen=True)
class SchedulePolicy:
    kind: SchedulerKind
    matches_all: bool  # match every waiting request each pass (and touch its prefix)

    def key(self, c: Candidate) -> tuple[int, ...]:
        if self.kind is SchedulerKind.FCFS:
            return (c.queue_pos,)
        reusable = c.gpu_blocks + (c.cpu_blocks if self.kind is SchedulerKind.LPM_CPU else 0)
        return (-reusable, c.queue_pos)


_REGISTRY: dict[SchedulerKind, SchedulePolicy] = {}


def register(policy: SchedulePolicy) -> None:
    _REGISTRY[policy.kind] = policy


register(SchedulePolicy(SchedulerKind.FCFS, matches_all=False))
register(SchedulePolicy(SchedulerKind.LPM, matches_all=True))
register(SchedulePolicy(SchedulerKind.LPM_CPU, matches_all=True))


def get_scheduler(name: str) -> SchedulePolicy:
    try:
        return _REGISTRY[SchedulerKind(name)]
    except ValueError:
        known = [k.value for k in _REGISTRY]
        raise KeyError(f"unknown scheduler {name!r}; known: {known}") from None
