"""Traffic: session processes that send a trace's requests to the server.

Closed loop (the paper's replay): ``N`` top-level sessions run at once; when one ends the next
in trace order starts. Within a session each request is sent after the previous reply plus its
gap (the run's gap model). A sub-agent starts ``start_offset_s`` after the reply of the parent
request it follows and runs concurrently; the parent's next request waits for every sub-agent
spawned before it. Open loop: every request is sent at its recorded send time; with
``max_concurrency`` C a request due while C are in flight waits for the next reply, then goes
(first due, first sent), as load generators with a concurrency cap send (inference-perf's
workers, ``vllm bench serve --max-concurrency``, the llm-d benchmark harness); the requests it
held back and for how long go into the run's summary (``throttle_fields``). A trace whose later
turns hold the previous answer (option ``traces.prefix_groups.AFTER_REPLY``: a multi-turn chat)
sends a session's request at max(its time, the previous request's reply) in the open loop, as
a chat client does: one event per request, handed over by the previous reply.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, Protocol, cast

import numpy as np
import simpy

from sim.context import FullPrompt, Prompt
from sim.engines import Req
from sim.kvcache.paths import WalkHint
from traces import GAP_KINDS
from traces.prefix_groups import AFTER_REPLY


class Front(Protocol):
    """What the replay sends to: one engine (``sim.engines.EngineBase``) or a fleet of them
    (``sim.fleet.Fleet``, the disaggregated ``sim.fleet.pd``), which looks like one."""

    rec: Any  # the recorder that times sessions (sim/engines/recorder.py)

    @property
    def request_class(self) -> type: ...

    def submit(self, req: Req) -> None: ...


class Replay:
    def __init__(self, env: simpy.Environment, trace, server: Front, gaps: np.ndarray,
                 offsets: np.ndarray, sessions: int, time_scale: float = 1.0,
                 context=None, on_reply: Callable[[], None] | None = None,
                 max_concurrency: int = 0) -> None:
        self.context = context  # sim.context.ContextRun, or None under ``full``
        self.max_concurrency = max_concurrency  # open loop: 0 = no limit
        self.in_flight = 0
        # sends waiting for a slot, first ready first: a reply hands its slot to the first
        self._slot_waiters: deque[simpy.Event] = deque()
        self.cap_delayed = 0  # open loop: sends the cap held back, and for how long in all
        self.cap_delay_s = 0.0
        self._last_send_s = 0.0
        self._unanswered = 0  # open loop: requests sent and not replied yet
        self._pending = 0  # open loop: requests waiting for their session's previous reply
        # open loop, AFTER_REPLY traces: per session, the event of its latest request's reply
        self._after_reply = bool(trace.options.get(AFTER_REPLY, False))
        self._turn_done: dict[int, simpy.Event] = {}
        self._all_sent = False
        self._answered = env.event()  # open loop: the last reply is in, every request sent
        # Called once per trace request when its (last) reply is in: progress on screen only,
        # it returns nothing to the replay.
        self.on_reply = on_reply
        # One walk hint per session: its requests are sequential and each extends the last,
        # so the cache's walk for a request starts where the previous one ended.
        self._hints: dict[int, WalkHint] = {}
        self.time_scale = time_scale  # open loop: recorded send times are multiplied by it
        self.env, self.trace, self.server, self.gaps = env, trace, server, gaps
        self.offsets = offsets  # sub-agent start delays under the gap model
        self.n = sessions
        self.children: dict[int, list[int]] = {}  # parent request index -> sub-agent sessions
        self.top: list[int] = []
        # open loop: each request's send time in the run (the future is fixed in advance)
        self.send_at: np.ndarray | None = None
        for i, s in enumerate(trace.sessions):
            if s.parent < 0:
                self.top.append(i)
            else:
                self.children.setdefault(s.after_request, []).append(i)

    def _prompts(self, r: int) -> list[Prompt]:
        """What the client sends for trace request r: the request itself, or under a context
        strategy its views (a summarization call first when one is due, sent at once)."""
        if self.context is None:
            t = self.trace
            return [cast(Prompt, FullPrompt(t, r, t.block_ids(r), t.prompt_tokens.item(r),
                                            max(1, t.output_tokens.item(r))))]
        return list(self.context.views(r))

    def _req(self, r: int, prompt: Prompt) -> Req:
        """The request the client sends now for ``prompt`` of trace request r; a summary
        call is followed at once by its turn, which the request's next gap says."""
        t = self.trace
        s = int(t.session.item(r))  # item(): Python scalars without numpy scalar objects
        sess = t.sessions[s]
        next_send_s = math.nan
        if prompt.kind == "summary":
            next_gap, next_gap_s = "tool", 0.0
            if self.send_at is not None:
                next_send_s = float(self.send_at.item(r))
        elif r + 1 < sess.first + sess.count:
            next_gap = GAP_KINDS[int(t.gap_kind.item(r + 1))]
            next_gap_s = float(self.gaps.item(r + 1))
            if self.send_at is not None:
                next_send_s = float(self.send_at.item(r + 1))
        else:
            next_gap, next_gap_s = "end", math.nan
        cls: type[Req] = self.server.request_class  # the engine's own (sim/engines/request.py)
        return cls(rid=r, session=s, arrival=self.env.now, seq=0,
                   prompt_tokens=prompt.prompt_tokens, output_tokens=max(1, prompt.output_tokens),
                   ids=prompt.ids, done=self.env.event(), prompt=prompt,
                   shared_blocks=sess.shared_prefix_blocks, next_gap=next_gap,
                   next_gap_s=next_gap_s, next_send_s=next_send_s, hint=self._hint(s))

    def _hint(self, s: int) -> WalkHint:
        """Session ``s``'s walk hint (made at its first request)."""
        hint = self._hints.get(s)
        if hint is None:
            hint = self._hints[s] = WalkHint()
        return hint

    def session(self, s: int, delay: float = 0.0) -> Generator:
        env, rec = self.env, self.server.rec
        if delay > 0:
            yield env.timeout(delay)
        sess = self.trace.sessions[s]
        rec.session_started(s, env.now)
        pending = [env.process(self.session(c, float(self.offsets[c])))
                   for c in self.children.get(-1, []) if self.trace.sessions[c].parent == s]
        for k in range(sess.count):
            r = sess.first + k
            if pending:
                yield env.all_of(pending)
                pending = []
            gap = float(self.gaps[r]) if k > 0 else 0.0
            if gap > 0 and math.isfinite(gap):
                yield env.timeout(gap)
            for prompt in self._prompts(r):
                req = self._req(r, prompt)
                self.server.submit(req)
                yield req.done
            if self.on_reply is not None:
                self.on_reply()
            pending = [env.process(self.session(c, float(self.offsets[c])))
                       for c in self.children.get(r, [])]
        if pending:
            yield env.all_of(pending)
        rec.session_ended(s, env.now)

    def closed_loop(self) -> Generator:
        """Keep ``n`` top-level sessions running; start the next as one ends."""
        env = self.env
        queue = list(self.top)
        active: list[simpy.Process] = []
        while queue or active:
            while queue and len(active) < self.n:
                active.append(env.process(self.session(queue.pop(0))))
            yield env.any_of(active)
            active = [p for p in active if not p.triggered]

    def open_loop(self) -> Generator:
        """Send every request at its recorded time (no waiting for replies; under
        AFTER_REPLY a session's request waits for its previous reply); end when every request
        has its reply."""
        env, t = self.env, self.trace
        times = np.nan_to_num(t.send_time_s, nan=0.0)
        order = np.argsort(times, kind="stable")
        t0 = float(times[order[0]]) if len(order) else 0.0
        self.send_at = (times - t0) * self.time_scale
        seen: set[int] = set()
        for r in order.tolist():
            due = float(self.send_at[r])
            if due > env.now:
                yield env.timeout(due - env.now)
            s = int(t.session[r])
            if s not in seen:
                seen.add(s)
                self.server.rec.session_started(s, env.now)
            turn_done: simpy.Event | None = None
            if self._after_reply:
                prev = self._turn_done.get(s)
                turn_done = self._turn_done[s] = env.event()
                if prev is not None and not prev.triggered:  # the previous reply is not in
                    self._pending += 1
                    env.process(self._send_after(prev, r, s, turn_done))
                    continue
            yield from self._send(r, s, turn_done, due)
        self._all_sent = True
        if self._unanswered or self._pending:
            yield self._answered  # the run ends with the last reply

    def _send(self, r: int, s: int, turn_done: simpy.Event | None, ready: float) -> Generator:
        """Send trace request r of session s now, each prompt once the cap has a slot.
        ``ready``: when it was due (its time, or its session's previous reply); under a cap
        the time since then is the cap's doing (a held send holds the ones due after it)."""
        env = self.env
        prompts = self._prompts(r)
        last = len(prompts) - 1
        for k, prompt in enumerate(prompts):
            if self.max_concurrency:
                if self.in_flight < self.max_concurrency and not self._slot_waiters:
                    self.in_flight += 1
                else:
                    slot = env.event()
                    self._slot_waiters.append(slot)
                    yield slot  # a reply handed its slot over (in_flight unchanged)
                if env.now - ready > 1e-9:  # not the float noise of now + (due - now)
                    self.cap_delayed += 1
                    self.cap_delay_s += env.now - ready
            req = self._req(r, prompt)
            self.server.submit(req)
            self._unanswered += 1
            self._last_send_s = env.now
            # A callback rather than a process per request: it runs where a process
            # waiting on the reply would resume (after the front's own callback).
            req.done.callbacks.append(self._reply_callback(s, k == last,
                                                           turn_done if k == last else None))

    def _send_after(self, prev: simpy.Event, r: int, s: int,
                    turn_done: simpy.Event) -> Generator:
        """Trace request r, once its session's previous request has its reply."""
        yield prev
        yield from self._send(r, s, turn_done, self.env.now)
        self._pending -= 1

    def throttle_fields(self) -> dict[str, Any]:
        """What ``max_concurrency`` did to the open loop (empty without a cap): the sends it
        held back, their mean wait, and the trace's offered send rate against the one
        achieved (trace requests per second from the first send to the last)."""
        if not self.max_concurrency or self.send_at is None:
            return {}
        n = len(self.trace)
        span = float(self.send_at.max()) if n else 0.0
        return {"concurrency_delayed_requests": self.cap_delayed,
                "concurrency_delay_mean_s": self.cap_delay_s / self.cap_delayed
                if self.cap_delayed else 0.0,
                "offered_send_rate_per_s": n / span if span > 0 else math.nan,
                "achieved_send_rate_per_s": n / self._last_send_s
                if self._last_send_s > 0 else math.nan}

    def _reply_callback(self, s: int, last: bool,
                        turn_done: simpy.Event | None) -> Callable[[simpy.Event], None]:
        return lambda _done: self._replied(s, last, turn_done)

    def _replied(self, s: int, last: bool, turn_done: simpy.Event | None = None) -> None:
        """A reply of session ``s`` is in (``last``: its trace request's last prompt;
        ``turn_done``: the event its session's next request waits on)."""
        if self.max_concurrency:
            if self._slot_waiters:
                self._slot_waiters.popleft().succeed()
            else:
                self.in_flight -= 1
        if turn_done is not None:
            turn_done.succeed()
        if last and self.on_reply is not None:
            self.on_reply()
        self.server.rec.session_ended(s, max(self.env.now, self.server.rec.session_end.get(
            s, 0.0)))
        self._unanswered -= 1
        if self._all_sent and not self._unanswered and not self._pending:
            self._answered.succeed()
