"""Progress of long commands on stderr: a bar with an ETA on a terminal, plain lines in a log.

One helper for every command (``kvsim run``, ``sweep``, ``reproduce``, ``calibrate``, ...).
A command opens ``progress(label, unit)``; the code doing the work reports what it finished to
the tracker that is active (``current()``), and only when that tracker counts its kind of work
(``counts(unit)``): ``kvsim run`` hands ``sim.run.run`` the tracker's ``advance`` for the
replayed requests (a run imports no progress: it calls the ``on_reply`` it is given),
``sim.studies`` report finished runs, ``calibration`` timed calls. Workers of a local pool
or Ray report nothing themselves: the parent advances the tracker as each job's result
arrives.

Progress only observes. Nothing flows back from a tracker to the work, and the wall clock is
read here, for the elapsed time and the ETA on screen, never by the simulation: a run is the
same with or without a tracker.

On a terminal the tracker is a ``rich`` progress bar; elsewhere (stderr to a file or a pipe,
as under ``nohup`` or in tests) it prints a line at the first report, then at most one every
``LOG_EVERY_S`` seconds, and one when the work is done, so a log shows progress and an ETA
too (a tracker made ``quiet_s`` seconds quiet prints nothing for work done sooner; after a
failure there is no last line: the error is the line to read). The bar is redrawn at most every
``BAR_EVERY_S`` seconds: a run reports every reply, and drawing each would cost run time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

LOG_EVERY_S = 10.0  # plain-line mode: at most one line this often (plus the first and last)
BAR_EVERY_S = 0.1  # terminal: the bar's numbers at most this often (plus the last)


def _count(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:,.1f}"


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Tracker:
    """Counts ``done`` of ``total`` units of one kind of work and shows them on ``console``.

    The ETA is the pace since the first report (work already done before it, such as the
    finished points of a resumed sweep, does not count towards the pace) times what is left.
    """

    def __init__(self, label: str, unit: str, total: float, console: Console,
                 quiet_s: float = 0.0) -> None:
        self.label, self.unit, self.total, self.done = label, unit, total, 0
        self.quiet_s = quiet_s  # plain lines: none before this much time has passed
        self.detail = ""  # what is running now (a policy, a phase)
        self.console = console
        self._t0 = time.monotonic()
        self._base, self._base_t = 0, self._t0  # the pace counts from here (``resume``)
        self._last_line = -LOG_EVERY_S
        self._printed: int | None = None  # plain lines: ``done`` on the last one
        self._bar: Any = None
        self._task: Any = None

    def counts(self, unit: str) -> bool:
        """Whether this tracker counts ``unit`` (requests, runs, timings, ...)."""
        return unit == self.unit

    # --- reports from the work --------------------------------------------------------------
    def add_total(self, n: int) -> None:
        """``n`` more units are coming (work whose size is known only as it starts)."""
        self.total += n
        self._show()

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def resume(self, done: int, total: int | None = None) -> None:
        """``done`` units were finished before this command started (a resumed sweep): they
        count as done, not towards the pace."""
        self._base, self._base_t = done, time.monotonic()
        self.update(done, total)

    def stage(self, detail: str, done: int, total: int) -> None:
        """A new stage of the work (a plan's round) with its own count: shown at once, its
        pace (the ETA) counted from now."""
        self.detail = detail
        self._base, self._base_t, self.done, self.total = done, time.monotonic(), done, total
        self._show(force=True)

    def update(self, done: float, total: float | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        self._show()

    def describe(self, detail: str) -> None:
        """Say what is running now (shown after the label)."""
        self.detail = detail
        self._show(force=True)

    def log(self, message: str) -> None:
        """A line above the bar (or in the log)."""
        self.console.print(message, markup=False, highlight=False)

    # --- what is shown ------------------------------------------------------------------------
    def eta_s(self) -> float | None:
        """Seconds left at the pace so far; None before any unit is finished."""
        if self.total <= self.done:
            return 0.0
        if self.done <= self._base:
            return None
        rate = (self.done - self._base) / max(time.monotonic() - self._base_t, 1e-9)
        return (self.total - self.done) / rate

    def status(self) -> str:
        eta = self.eta_s()
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        return (f"{_count(self.done)}/{_count(self.total)} {self.unit}{pct}, "
                f"{_clock(time.monotonic() - self._t0)} elapsed, ETA "
                + ("?" if eta is None else _clock(eta)))

    def _heading(self) -> str:
        return f"{self.label}: {self.detail}" if self.detail else self.label

    def _show(self, force: bool = False) -> None:
        now = time.monotonic()
        finished = self.total and self.done >= self.total and self._printed != self.done
        if self._bar is not None:
            if not (force or finished or now - self._last_line >= BAR_EVERY_S):
                return
            self._last_line, self._printed = now, self.done
            eta = self.eta_s()
            self._bar.update(self._task, completed=self.done, total=max(self.total, 1),
                             description=self._heading(),
                             eta="?" if eta is None else _clock(eta))
            return
        if now - self._t0 < self.quiet_s:
            return
        if force or finished or now - self._last_line >= LOG_EVERY_S:
            self._last_line, self._printed = now, self.done
            self.console.print(f"{self._heading()}: {self.status()}", markup=False,
                               highlight=False)

    def start(self) -> None:
        if self.console.is_terminal:
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn(self.unit),
                                 TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
                                 console=self.console)
            self._bar.start()
            self._task = self._bar.add_task(self._heading(), total=max(self.total, 1), eta="?")

    def stop(self, failed: bool = False) -> None:
        """The last line (none after a failure: the error is the line to read)."""
        if self._bar is not None:
            if not failed:
                self._show(force=True)
            self._bar.stop()
            self._bar = None
        elif not failed and (self.done or self.total) and self.done != self._printed:
            self._show(force=True)


class _Idle:
    """The tracker when no command shows progress: counts nothing."""

    def counts(self, unit: str) -> bool:
        return False

    def add_total(self, n: int) -> None: ...

    def resume(self, done: int, total: int | None = None) -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def update(self, done: int, total: int | None = None) -> None: ...

    def stage(self, detail: str, done: int, total: int) -> None: ...

    def describe(self, detail: str) -> None: ...

    def log(self, message: str) -> None: ...


_IDLE = _Idle()
_ACTIVE: ContextVar[Tracker | None] = ContextVar("kvsim_progress", default=None)


def current() -> Tracker | _Idle:
    """The active tracker, or one that counts nothing."""
    return _ACTIVE.get() or _IDLE


@contextmanager
def progress(label: str, unit: str, total: int = 0,
             console: Console | None = None) -> Iterator[Tracker]:
    """Show progress of the block's work on ``console`` (default: stderr)."""
    tracker = Tracker(label, unit, total, console or Console(stderr=True, soft_wrap=True))
    tracker.start()
    token = _ACTIVE.set(tracker)
    try:
        yield tracker
    except BaseException:
        _ACTIVE.reset(token)
        tracker.stop(failed=True)
        raise
    _ACTIVE.reset(token)
    tracker.stop()
