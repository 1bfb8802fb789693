"""Scheduling policies: the order in which waiting requests are considered for prefill.

A policy is a sort key over candidates (SGLang ``schedule_policy.py``): the engine matches
candidates against the cache (with SGLang's side effects: a match splits and stamps), then
sorts stably by the key, so ties keep queue order (FIFO for new arrivals).

- ``fcfs``: queue order. SGLang matches only the candidates it examines.
- ``lpm``: longest cached prefix first ("most reusable cache first"). Every waiting request is
  matched each pass; above ``LPM_QUEUE_LIMIT`` waiting requests SGLang neither matches nor sorts.
- ``lpm-cpu``: as lpm, counting the CPU-resident part of the prefix as reusable too.
- ``program-fcfs``: Continuum's program-level FCFS (arXiv 2511.02230): requests in order of
  their program's first arrival (kvsim: a program is a trace session), then queue order; a
  program that arrived first keeps its place through all of its turns, so a returning turn
  does not queue behind programs that started after it. Matches like fcfs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from costmodel.registry import Registry

LPM_QUEUE_LIMIT = 128


class SchedulerKind(StrEnum):
    FCFS = "fcfs"
    LPM = "lpm"
    LPM_CPU = "lpm-cpu"
    PROGRAM_FCFS = "program-fcfs"


@dataclass(frozen=True)
class Candidate:
    """What a scheduler may look at: queue position, reusable cache (blocks) and the first
    arrival of the request's program (its session; simulated seconds)."""

    queue_pos: int
    gpu_blocks: int = 0
    cpu_blocks: int = 0
    program_start: float = 0.0


@dataclass(frozen=True)
class SchedulePolicy:
    kind: SchedulerKind
    matches_all: bool  # match every waiting request each pass (and touch its prefix)
    sorts: bool = True  # False: the queue order is the order (no key is computed)

    def key(self, c: Candidate) -> tuple[float, ...]:
        if self.kind is SchedulerKind.FCFS:
            return (c.queue_pos,)
        if self.kind is SchedulerKind.PROGRAM_FCFS:
            return (c.program_start, c.queue_pos)
        reusable = c.gpu_blocks + (c.cpu_blocks if self.kind is SchedulerKind.LPM_CPU else 0)
        return (-reusable, c.queue_pos)


SCHEDULERS: Registry[SchedulePolicy] = Registry("scheduler")


def register(policy: SchedulePolicy) -> None:
    SCHEDULERS.register(policy.kind.value, policy)


register(SchedulePolicy(SchedulerKind.FCFS, matches_all=False, sorts=False))
register(SchedulePolicy(SchedulerKind.LPM, matches_all=True))
register(SchedulePolicy(SchedulerKind.LPM_CPU, matches_all=True))
register(SchedulePolicy(SchedulerKind.PROGRAM_FCFS, matches_all=False))


def get_scheduler(name: str) -> SchedulePolicy:
    return SCHEDULERS.get(name)
