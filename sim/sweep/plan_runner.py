"""The points of a ``kvsim plan``, run as soon as they are known to be needed.

A plan's search (sim/sweep/plan.py) decides in rounds, but a question's next size depends
only on its own last result, so the planner asks for a point as soon as that result proves
the rounds will ask for it (``Planner._follow``), not once the whole round is in. This
module runs what was asked, on one executor for the whole plan:

- every point once, by id (one replica is one point for every router), into
  ``out/points/<id>`` as a sweep's (sim/sweep/resume.py: a finished folder is resumed);
- in stop mode (``run_or_stop``: a run that can no longer meet its SLO ends early) or
  whole (a point that stopped runs again whole: its stopped summary goes first);
- in the planner's order whenever a worker frees (``Request.rank``: the search's points by
  size, the longest expected first at one size, whole runs again to fill in), so that no
  round's longest point starts last and leaves the other workers idle.

What runs is decided by results only (each point's result is a pure function of its config
and trace), so the set of points run and every summary are the same on every executor and at
any speed; only their order follows the measured costs. An executor with ``stream``
(``LocalPoolExecutor``) runs a job as soon as a worker frees; any other runs what is asked
in batches through ``map``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .identity import Point
from .resume import point_done, run_point
from .table import summary_path


def plan_job(cfg, arg: tuple[str, bool], get_trace) -> dict[str, Any]:
    """One point into ``out/points/<id>`` (``arg``: ``(out, whole)``): whole, or in stop mode
    (sim/sweep/early_stop.py), with the CPU seconds the worker spent on it, which only orders
    later points (``Planner._rank``); no result depends on it."""
    from .early_stop import run_or_stop

    out, whole = arg
    start = time.process_time()
    info = run_point(cfg, out, get_trace, write=None if whole else run_or_stop)
    info["cpu_s"] = time.process_time() - start
    return info


class BatchStream:
    """A stream over an executor without one (this process, Ray): the jobs submitted since
    the last ``wait`` run together through ``map``."""

    slots = sys.maxsize  # hand over everything that is ready; map spreads it

    def __init__(self, executor, fn) -> None:
        self._executor, self._fn = executor, fn
        self._queued: list[tuple[Any, Any]] = []

    def __len__(self) -> int:
        return len(self._queued)

    def submit(self, key: Any, job) -> None:
        self._queued.append((key, job))

    def stop(self) -> None:
        self._queued = []

    def wait(self) -> list[tuple[Any, Any]]:
        batch, self._queued = self._queued, []
        return [(batch[i][0], res) for i, res in self._executor.map(
            self._fn, [job for _, job in batch])]


@dataclass
class Request:
    point: Point
    whole: bool  # run whole (not in stop mode); a stopped summary does not satisfy it
    rank: tuple  # the smallest runs first (``Planner._rank``)
    order: int  # ties: first asked, first run


@dataclass
class State:
    """One point id: its summaries (or error), what runs or waits for it."""

    point: Point
    # the summary it first had (in stop mode, maybe stopped: what the round that asked for
    # it in stop mode reads, even once a whole run replaced it) and its latest
    first: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    running: str = ""  # "stop" or "whole" while a job runs it
    cpu_s: float = 0.0  # what its last run cost (0 for a point resumed from disk)
    waiting: Request | None = None  # asked for, not yet running


class PointRunner:
    """Runs requested points into ``out`` (module docstring); ``on_settled(pid)`` is called
    once a point's run (or a resumed summary) is in, and may request more points."""

    def __init__(self, out: str | Path, executor) -> None:
        self.out = Path(out)
        self.states: dict[str, State] = {}
        self.on_settled: Callable[[str], None] | None = None
        self.runs = 0  # jobs run (a point stopped early and run again whole counts twice)
        self._order = 0
        self._settled: list[str] = []  # to announce (on_settled), in order
        make = getattr(executor, "stream", None)
        self._stream = make(plan_job) if make is not None else BatchStream(executor, plan_job)

    def request(self, point: Point, whole: bool, rank: tuple = ()) -> None:
        """Ask for ``point`` (stop mode, or ``whole``); nothing runs before ``settle``."""
        pid = point.id
        state = self.states.get(pid)
        if state is None:
            state = self.states[pid] = State(point)
            if point_done(self.out, pid):  # resumed: an earlier plan's folder
                state.first = state.summary = json.loads(summary_path(self.out,
                                                                      pid).read_text())
        if self.done(pid, whole) or state.running == "whole" or (
                state.running == "stop" and not whole):
            if self.done(pid, whole):
                self._settled.append(pid)  # (again: a new asker learns it is in)
            return  # what runs answers it (a stop-mode run may stop: whole runs after it)
        if state.waiting is None or (whole and not state.waiting.whole):
            self._order += 1
            state.waiting = Request(point, whole, rank, self._order)

    def done(self, pid: str, whole: bool) -> bool:
        """Whether ``pid`` is in as asked: its first summary (stop mode) or a whole one; or
        its error."""
        state = self.states[pid]
        if state.running:
            return whole is False and state.first is not None
        if state.error is not None:
            return True
        if whole:
            return state.summary is not None and not state.summary.get("stopped_early")
        return state.first is not None

    def result(self, pid: str, whole: bool) -> dict[str, Any] | None:
        """The summary a round that asked for ``pid`` reads once ``done``; None where it
        failed (``error``)."""
        state = self.states[pid]
        if whole:
            return None if state.error is not None else state.summary
        return state.first

    def error(self, pid: str) -> dict[str, Any] | None:
        return self.states[pid].error

    def settle(self, asks: list[tuple[str, bool]],
               progress: Callable[[int, int], None] | None = None) -> None:
        """Run until every ``(pid, whole)`` of ``asks`` is in (others run meanwhile, as
        workers free)."""
        want = list(dict.fromkeys(asks))
        count = -1
        while True:
            self._announce()
            now = sum(self.done(*a) for a in want)
            if progress and now != count:
                progress(now, len(want))
            count = now
            if count == len(want):
                return
            self._dispatch()
            if not len(self._stream):
                raise RuntimeError(f"points {[a for a in want if not self.done(*a)]} were "
                                   "asked for but nothing runs them")
            self._collect()

    def drain(self) -> None:
        """Wait for every job in flight (nothing is left running behind the plan)."""
        while len(self._stream):
            self._collect()

    def stop(self) -> None:
        """Interrupted: end the jobs in flight now (their points are unfinished: a rerun
        runs them)."""
        self._stream.stop()
        for state in self.states.values():
            state.running = ""

    def _announce(self) -> None:
        while self._settled:
            pid = self._settled.pop(0)
            if self.on_settled is not None:
                self.on_settled(pid)

    def _dispatch(self) -> None:
        """Start waiting requests, longest expected first, while workers are free."""
        running = sum(bool(s.running) for s in self.states.values())
        waiting = sorted((s.waiting for s in self.states.values() if s.waiting is not None),
                         key=lambda r: (r.rank, r.order))
        for req in waiting:
            if running >= self._stream.slots:
                break
            pid = req.point.id
            state = self.states[pid]
            if state.running:  # its stop-mode run first; whole after, if that stops
                continue
            state.waiting = None
            if self.done(pid, req.whole):
                continue
            if req.whole and state.summary is not None:  # a stopped one: runs again whole
                summary_path(self.out, pid).unlink(missing_ok=True)
            state.running = "whole" if req.whole else "stop"
            state.summary = state.error = None
            running += 1
            self.runs += 1
            self._stream.submit(pid, (req.point.cfg, (str(self.out), req.whole)))

    def _collect(self) -> None:
        """Wait for finished jobs (at least one) and take their results in."""
        for pid, info in self._stream.wait():
            state = self.states[pid]
            state.running = ""
            state.cpu_s = info.get("cpu_s", 0.0)
            if info["error"]:
                state.error = info
            else:
                state.summary = json.loads(summary_path(self.out, pid).read_text())
                if state.first is None:
                    state.first = state.summary
            self._settled.append(pid)
