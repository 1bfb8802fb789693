"""What a policy may see: read-only cache nodes, the planner's view of the tree, the run's
context, and the events the engine reports.

Policies depend on these protocols only, never on ``sim``: the cache (``sim.kvcache.Node``)
and the planner (``sim.kvcache.planner``) implement them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

import numpy as np


class Tier(IntEnum):
    """Where a node's KV lives (sim/kvcache/tiering.py has the two-tier semantics).

    Under ``tiering="hicache"`` GPU means "has a device copy" (it may also have a host copy,
    ``Node.host``) and CPU means "host copy only"."""

    NONE = 0  # a hole: block ids known, KV freed (the phantom request refills it)
    GPU = 1
    CPU = 2
    DROPPED = 3  # cache engineering: KV freed on purpose, never refilled, never attended


# The policy API's names of a node's tier (``CacheNode.tier``).
HOLE, GPU, CPU = Tier.NONE, Tier.GPU, Tier.CPU


class PolicyError(ValueError):
    """Unknown policy, component or parameter (bad user input: exit status 2)."""

    exit_code = 2


class CacheNode(Protocol):
    """A radix node as policies see it (read only). Positions and sizes are in blocks.

    A node is a run of blocks ``[start, start + num_blocks)`` with one KV state (``tier``).
    """

    # Read-only properties (a concrete node may store them as plain attributes).
    @property
    def parent(self) -> CacheNode | None: ...  # None only for the root

    @property
    def children(self) -> Mapping[int, Any]: ...  # keyed by the child's first block id

    @property
    def start(self) -> int: ...  # absolute block position of the first block

    @property
    def tier(self) -> Tier: ...  # HOLE (ids known, KV freed), GPU or CPU

    @property
    def lock(self) -> int: ...  # running requests whose matched path includes this node

    @property
    def last_access(self) -> int: ...  # logical clock of the last match/insert covering it

    @property
    def hit_count(self) -> int: ...  # matches that covered the node

    @property
    def serial(self) -> int: ...  # creation order, unique: the deterministic tie-break

    @property
    def num_blocks(self) -> int: ...

    @property
    def end(self) -> int: ...


class TreeView(Protocol):
    """The tree as it will be once the steps planned so far are applied (the planner's
    virtual state): start strategies walk it instead of the nodes' raw fields."""

    def is_root(self, node: CacheNode) -> bool: ...

    def live_children(self, node: CacheNode) -> int:
        """Children still in the tree (or, for HiCache's device tier, still on the device)."""
        ...

    def is_hole(self, node: CacheNode) -> bool:
        """No KV left: a hole already, or freed by an earlier step of this plan."""
        ...


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session of the trace as policies see it (read only): ``PolicyContext.sessions[i]``
    describes the session that ``Arrival.session`` / ``Reply.session`` == i names."""

    id: str  # the trace's session id
    parent: int = -1  # index of the parent session (the main agent that spawned it); -1: none
    agent_type: str = ""  # the sub-agent's type when the trace records it (cc-traces)

    @property
    def is_subagent(self) -> bool:
        return self.parent >= 0


@dataclass(frozen=True)
class PolicyContext:
    """The run a policy is bound to (``EvictionPolicy.bind``). ``now`` is simulated seconds
    (never wall time); ``recompute_seconds(a, b)`` prices recomputing tokens ``[a, b)`` at their
    positions with the run's model and profile (Section 2.2: W + p per token and layer).
    ``sessions``: every session of the trace, by index (which are sub-agents, and of whom)."""

    now: Callable[[], float]
    block_size: int = 64
    seed: int = 0
    recompute_seconds: Callable[[int, int], float] | None = None
    sessions: tuple[SessionInfo, ...] = ()


STANDALONE = PolicyContext(now=lambda: 0.0)


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request reached the server (before it is matched or admitted)."""

    time: float
    session: int  # index of the session in the trace
    request: int  # index of the request in the trace
    prompt_tokens: int
    block_ids: np.ndarray  # the prompt's full blocks (read only)
    # traces.REGION_NAMES code of each block (system, tools, user, assistant, tool_result,
    # unknown), aligned with block_ids; None when the trace has no regions
    block_regions: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class Drop:
    """The server refused a request that reached it: it will never run, so it never replies
    (``reason``: ``context``, a prompt above the model's context, or ``cache``, a prompt that
    cannot fit even in an empty cache). The session goes on with its next request."""

    time: float
    session: int
    request: int
    reason: str


@dataclass(frozen=True, slots=True)
class Reply:
    """A request finished: its history is in the cache, unlocked.

    ``leaf`` is the node holding the request's last cached block: the handle of the session's
    history (it keeps its identity when later operations split it; ``None`` if nothing was
    cached). ``next_gap`` says what the client does next, as the reply itself reveals it:
    ``tool`` (the reply ends in a tool call), ``human`` (a person answers) or ``end`` (the
    session is over). ``next_gap_s`` is the wait before the session's next request in this
    replay: the future, given only to policies that declare ``clairvoyant = True`` (NaN
    otherwise). Under the open loop the next request goes at its recorded send time whatever
    the reply: the gap is that time minus the reply's, negative when it was sent already.
    ``queue_s`` is how long the request waited between its arrival and its (first)
    admission: what the server's queue cost it (NaN if never admitted)."""

    time: float
    session: int
    request: int
    context_tokens: int
    leaf: CacheNode | None
    next_gap: str
    next_gap_s: float = float("nan")
    queue_s: float = float("nan")
