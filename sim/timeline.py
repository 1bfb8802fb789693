"""A timeline of one run as Chrome trace-event JSON (Perfetto UI and chrome://tracing open it).

``Timeline`` collects events from the recorders it is attached to (``RunRecorder.observer``;
without one a recorder pays a single ``None`` test per call): per replica (one trace
"process", ``pid`` = the replica) a track of complete events (``ph: X``): ``prefill`` (one
per batch: its requests and tokens; phantom refills of holes are tokens of the batch) and
``decode`` (one per decode event: its steps and batch size), instant events (``ph: i``) for
``evict`` (each call that freed GPU room: blocks deleted and demoted), ``cpu load`` and
``transfer`` (bytes each way), and a counter (``ph: C``) ``queue`` of waiting and running
requests at each batch; a fleet's shared pool adds a process of its fetches, a track per
replica's pool link; a disaggregated fleet (sim/run/kinds.py PDRun) has a process per prefill
and per decode worker and one per link (``link_name``), a slice per transfer. Times are the
simulated clock in microseconds, in whole nanoseconds (``_span``).

Every track (pid, tid) is one FIFO resource (a replica's GPU stream, one pool link, one PD
link), so its complete events never overlap: the trace-event format requires that slices on
one thread nest, and tests/test_timeline.py checks it on every kind of run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Timeline:
    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.events: list[dict[str, Any]] = []
        self._named: set[int] = set()

    def use_clock(self, now: Callable[[], float]) -> None:
        """Stamp instants with ``now`` (the run's simulated clock, known once it starts)."""
        self.now = now

    def track(self, replica: int, queue: Callable[[], tuple[int, int]],
              name: str | None = None) -> Track:
        """The observer of replica ``replica``'s recorder (``name``: its process's name,
        ``replica N`` unless given); ``queue`` gives its (waiting, running) requests."""
        if replica not in self._named:
            self._named.add(replica)
            self.events.append({"ph": "M", "name": "process_name", "pid": replica,
                                "tid": 0, "args": {"name": name or f"replica {replica}"}})
            for tid, name in ((1, "batches"), (2, "cache events")):
                self.events.append({"ph": "M", "name": "thread_name", "pid": replica,
                                    "tid": tid, "args": {"name": name}})
        return Track(self, replica, queue)

    def pool_fetches(self, transfers: list[tuple[float, float, float]], replicas: list[int],
                     pid: int) -> None:
        """A shared pool's fetches (start, end, bytes) as slices of a ``shared KV pool``
        process ``pid``, fetch i on the track of replica ``replicas[i]``'s pool link (tid
        replica + 1): fetches of different replicas overlap, one link's queue in order
        (sim/fleet/pooltier.py ``link_free``)."""
        self._process(pid, "shared KV pool")
        for r in sorted(set(replicas)):
            self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": r + 1,
                                "args": {"name": f"replica {r} link"}})
        self._transfers("pool fetch", transfers, pid, [r + 1 for r in replicas])

    def link(self, name: str, transfers: list[tuple[float, float, float]], pid: int) -> None:
        """A link's transfers (start, end, bytes: a FIFO, they never overlap) as slices of
        process ``pid`` named ``name``."""
        self._process(pid, name)
        self._transfers("transfer", transfers, pid, [1] * len(transfers))

    def _process(self, pid: int, name: str) -> None:
        self.events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                            "args": {"name": name}})

    def _transfers(self, name: str, transfers: list[tuple[float, float, float]], pid: int,
                   tids: list[int]) -> None:
        for (start, end, nbytes), tid in zip(transfers, tids, strict=True):
            ts, dur = _span(start, end - start)
            self.events.append({"ph": "X", "name": name, "pid": pid, "tid": tid,
                                "ts": ts, "dur": dur, "args": {"bytes": int(nbytes)}})

    def to_json(self) -> str:
        return json.dumps({"traceEvents": self.events, "displayTimeUnit": "ms"},
                          separators=(",", ":")) + "\n"

    def write(self, path: str | Path) -> None:
        from sim.io import atomic_write_text

        atomic_write_text(path, self.to_json())


def _us(seconds: float) -> float:
    return round(seconds * 1e9) / 1e3


def _span(start: float, seconds: float) -> tuple[float, float]:
    """(ts, dur) in microseconds of whole nanoseconds, the end rounded once: a slice that
    starts where the last one ended touches it and never overlaps it by a rounding (ts and
    dur rounded apart did, by 1 ns)."""
    a, b = round(start * 1e9), round((start + seconds) * 1e9)
    return a / 1e3, (b - a) / 1e3


def link_name(key: tuple) -> str:
    """A PD link's process name from its queue key (sim/fleet/pd.py ``_link_key``):
    ``("nic", p)``, ``("pair", p, d)``, either behind ``"back"`` (``--pd-return output``)."""
    back = key[0] == "back"
    kind, p, *d = key[1:] if back else key
    if kind == "nic":
        return f"link: prefill {p} NIC" + (", return" if back else "")
    ends = [f"prefill {p}", f"decode {d[0]}"]
    return "link: " + " -> ".join(ends[::-1] if back else ends)


class Track:
    """One replica's events (module docstring)."""

    def __init__(self, timeline: Timeline, pid: int,
                 queue: Callable[[], tuple[int, int]]) -> None:
        self.tl, self.pid, self.queue = timeline, pid, queue

    def _slice(self, name: str, start: float, seconds: float, args: dict[str, Any]) -> None:
        ts, dur = _span(start, seconds)
        self.tl.events.append({"ph": "X", "name": name, "pid": self.pid, "tid": 1,
                               "ts": ts, "dur": dur, "args": args})

    def _instant(self, name: str, args: dict[str, Any]) -> None:
        self.tl.events.append({"ph": "i", "s": "t", "name": name, "pid": self.pid, "tid": 2,
                               "ts": _us(self.tl.now()), "args": args})

    def batch(self, start: float, seconds: float, requests: int, tokens: int | None) -> None:
        waiting, running = self.queue()
        self.tl.events.append({"ph": "C", "name": "queue", "pid": self.pid, "tid": 1,
                               "ts": _us(start),
                               "args": {"waiting": waiting, "running": running}})
        args: dict[str, Any] = {"requests": requests}
        if tokens is not None:
            args["tokens"] = tokens
        self._slice("prefill", start, seconds, args)

    def decode(self, start: float, seconds: float, steps: int, batch: int | None) -> None:
        args: dict[str, Any] = {"steps": steps}
        if batch is not None:
            args["batch"] = batch
        self._slice("decode", start, seconds, args)

    def evicted(self, deleted_blocks: int, demoted_blocks: int) -> None:
        self._instant("evict", {"deleted_blocks": deleted_blocks,
                                "demoted_blocks": demoted_blocks})

    def loaded(self, blocks: int) -> None:
        self._instant("cpu load", {"blocks": blocks})

    def transferred(self, h2d_bytes: int, d2h_bytes: int) -> None:
        self._instant("transfer", {"h2d_bytes": h2d_bytes, "d2h_bytes": d2h_bytes})
