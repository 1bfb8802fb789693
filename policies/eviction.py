"""Eviction policies: a victim order, a start position and a granularity; optional pins and
events. Decisions only: the cache's planner (``sim.kvcache.planner``) asks, the cache applies.

1. **Victim order** -- which cached history goes first. A history is identified by an
   *evictable leaf*: a childless, unlocked node holding KV. ``key(leaf)`` sorts them, smallest
   first (``policies.orders``; ties break on the node serial).
2. **Start position** -- ``chain(leaf, view)``: the nodes to free, in order, for that leaf::

       root -- A -- B ---- C ---- D          D is the victim leaf; B has two children,
                     \\                        so A-B is shared with E's history.
                      E
       tail          (D,) freed from its last block backward       (SGLang, vLLM)
       leaf-head     (D,) freed from its first block forward
       private-head  (C, D): from the first private node forward     (Penelope)

   The private-head walk stops below a parent that is the root, has several children, is
   locked by a running request, or is already a hole.
3. **Granularity** -- ``take(blocks, need)``: how many blocks of a node to free when ``need``
   are still wanted. ``node`` frees whole nodes (may overshoot, as SGLang); ``block`` splits at
   a block boundary and frees exactly what is needed.

Where two combinations coincide they are the same thing: ``leaf-head`` + ``node`` frees the
whole leaf, exactly like ``tail`` + ``node`` (pinned in tests/test_eviction_golden.py).

Users write a policy as a subclass (``docs/policies.md``)::

    class RecentFirst(EvictionPolicy):
        name = "recent-first"
        start, granularity = PRIVATE_HEAD, BLOCK
        def key(self, node):
            return -node.last_access

and run it with ``kvsim run --policy my_policies.py:RecentFirst --policy-param k=v``.
"""

from __future__ import annotations

import inspect
import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from costmodel.registry import Registry

from .context import (
    STANDALONE,
    Arrival,
    CacheNode,
    Drop,
    PolicyContext,
    PolicyError,
    Reply,
    TreeView,
)
from .orders import get_order, lru


# ---------------------------------------------------------------------- release orders
class ReleaseOrder(ABC):
    """A start position on a block pool (vLLM's; ``sim.kvcache.blockpool``), where the only
    freedom eviction has is the ORDER in which a finished request's blocks join the free
    queue: released first = evicted first. ``__call__(shared)`` returns the positions of the
    request's block table in release order; ``shared`` marks the positions up to the deepest
    block another history shares (a branch point, or a block another request holds). An
    order that does not read it (``reads_shared`` False) is given an all-False mask, and a
    pool that only ever frees in such an order keeps no child counts to build one."""

    name: ClassVar[str]
    reads_shared: ClassVar[bool]

    @abstractmethod
    def __call__(self, shared: np.ndarray) -> np.ndarray: ...

    def release(self, table: np.ndarray, shared: np.ndarray | None) -> np.ndarray:
        """``table`` (a request's blocks by position) in release order, ``table[self(shared)]``
        (``shared`` is None for an order that does not read it): what the pool frees in
        order, as vLLM's manager hands ``free_blocks`` its ordered blocks."""
        return table[self(np.zeros(len(table), bool) if shared is None else shared)]

    def release_groups(self, tables: list[np.ndarray],
                       shared: np.ndarray | None) -> list[np.ndarray]:
        """A hybrid pool's request (sim/kvcache/hybridpool.py: per KV cache group its physical
        blocks by position, 0 a null, every table one length) as the batches the pool frees
        in turn, nulls dropped: by position in this order, every group's block of a position
        together, so an eviction opens the same positions in every group (docs/hybrid.md
        "Penelope on vLLM's hybrid pool")."""
        stacked = np.stack(tables)
        n = stacked.shape[1]
        ordered = stacked[:, self(np.zeros(n, bool) if shared is None else shared)].T.ravel()
        return [ordered[ordered > 0]]

    def __repr__(self) -> str:
        return self.name


class TailFirst(ReleaseOrder):
    """vLLM: the request's blocks in reverse (its tail is evicted first)."""

    name, reads_shared = "vllm", False

    def __call__(self, shared: np.ndarray) -> np.ndarray:
        return np.arange(len(shared) - 1, -1, -1, dtype=np.int64)

    def release(self, table: np.ndarray, shared: np.ndarray | None) -> np.ndarray:
        return table[::-1]  # vLLM's reversed(req_blocks)

    def release_groups(self, tables: list[np.ndarray],
                       shared: np.ndarray | None) -> list[np.ndarray]:
        """vLLM's coordinator frees manager by manager (``SingleTypeKVCacheManager.free``):
        per group in order its blocks, tail first, the null head dropped."""
        return [t[t > 0][::-1] for t in tables]


class PrivateFrontFirst(ReleaseOrder):
    """Penelope: the private history from its FRONT first, then the shared prefix tail
    first."""

    name, reads_shared = "penelope", True

    def __call__(self, shared: np.ndarray) -> np.ndarray:
        private = np.flatnonzero(~shared)
        return np.concatenate([private, np.flatnonzero(shared)[::-1]])


vllm_free_order, penelope_free_order = TailFirst(), PrivateFrontFirst()
FREE_ORDERS: Registry[ReleaseOrder] = Registry("free order", ValueError)
for _order in (vllm_free_order, penelope_free_order):
    FREE_ORDERS.register(_order.name, _order)


def get_free_order(order: str | ReleaseOrder) -> ReleaseOrder:
    """A release order by name (``FREE_ORDERS``), or one given as is."""
    if isinstance(order, ReleaseOrder):
        return order
    return FREE_ORDERS.get(order)


# ---------------------------------------------------------------------- start positions
class StartPosition(ABC):
    """Where freeing begins in a victim's history. ``chain`` returns the nodes to free in
    order, ending with the leaf; each node but the leaf must have exactly one live child, and
    all must be unlocked and hold KV (the planner checks). ``from_head``: a partial take frees
    a node's FIRST blocks (leaving a hole in front of what follows) instead of its last."""

    name: ClassVar[str]
    from_head: ClassVar[bool]
    makes_holes: ClassVar[bool]  # freeing may leave KV-less nodes with children behind
    reads_node_boundaries: ClassVar[bool]  # results depend on where nodes were split
    # This start on a block pool (vLLM), or None: no release order expresses it there (a
    # pool has no nodes to start from, nor victims to report or keep).
    release_order: ClassVar[ReleaseOrder | None] = None
    # Declared: every chain is the victim leaf alone, so the planner builds it without the
    # call (sim/kvcache/planner.py). A subclass whose chain says otherwise declares False.
    leaf_only: ClassVar[bool] = False

    @abstractmethod
    def chain(self, leaf: CacheNode, view: TreeView) -> Sequence[CacheNode]: ...

    def __repr__(self) -> str:
        return self.name


class Tail(StartPosition):
    name, from_head, makes_holes, reads_node_boundaries = "tail", False, False, False
    leaf_only = True
    release_order = vllm_free_order

    def chain(self, leaf: CacheNode, view: TreeView) -> Sequence[CacheNode]:
        return (leaf,)


class LeafHead(StartPosition):
    name, from_head, makes_holes, reads_node_boundaries = "leaf-head", True, True, True
    leaf_only = True

    def chain(self, leaf: CacheNode, view: TreeView) -> Sequence[CacheNode]:
        return (leaf,)


class PrivateHead(StartPosition):
    """Penelope: the private history above the leaf, front first."""

    name, from_head, makes_holes, reads_node_boundaries = "private-head", True, True, False
    release_order = penelope_free_order

    def chain(self, leaf: CacheNode, view: TreeView) -> list[CacheNode]:
        chain = [leaf]
        parent = leaf.parent
        # Pure reads, cheapest first: a locked parent is the common stop.
        while (parent is not None and parent.lock <= 0 and not view.is_root(parent)
               and view.live_children(parent) <= 1 and not view.is_hole(parent)):
            chain.append(parent)
            parent = parent.parent
        chain.reverse()
        return chain


TAIL, LEAF_HEAD, PRIVATE_HEAD = Tail(), LeafHead(), PrivateHead()
STARTS: Registry[StartPosition] = Registry("start position", PolicyError)
for _start in (TAIL, LEAF_HEAD, PRIVATE_HEAD):
    STARTS.register(_start.name, _start)


class WrappedStart(StartPosition):
    """A start strategy built on ``base``: same name and node semantics, and by default the
    same chains (subclasses change ``chain``)."""

    def __init__(self, base: StartPosition) -> None:
        self.base = base
        self.name = base.name  # type: ignore[misc]
        self.from_head = base.from_head  # type: ignore[misc]
        self.makes_holes = base.makes_holes  # type: ignore[misc]
        self.reads_node_boundaries = base.reads_node_boundaries  # type: ignore[misc]

    def chain(self, leaf: CacheNode, view: TreeView) -> Sequence[CacheNode]:
        return self.base.chain(leaf, view)


class KeepFront(WrappedStart):
    """``base``'s chains without their leading nodes that ``keep`` says to keep (never the
    victim leaf itself). Under ``private-head`` a shared prefix whose other histories are all
    gone is private to the last one, and its front is the cheapest place to free; a policy
    that knows better (the prefix is every session's) keeps it out of the chain: it then goes
    only as a victim leaf of its own, in key order."""

    def __init__(self, base: StartPosition, keep: Callable[[CacheNode], bool]) -> None:
        super().__init__(base)
        self.keep = keep

    def chain(self, leaf: CacheNode, view: TreeView) -> Sequence[CacheNode]:
        chain = self.base.chain(leaf, view)
        i = 0
        while i < len(chain) - 1 and self.keep(chain[i]):
            i += 1
        return chain[i:] if i else chain


class ObservedStart(WrappedStart):
    """``base``'s chains, reporting each victim leaf to ``observe`` first.

    The planner asks ``chain`` exactly once for every leaf it pops, in eviction order (the
    smallest key first), so a policy that must know its victims -- GreedyDual's inflation sets
    its clock to the priority of the last victim -- wraps its start in one. Freeing is
    ``base``'s: same chains, same name, same node semantics. (HiCache's device tier accepts
    only the plain ``TAIL`` object.)"""

    def __init__(self, base: StartPosition, observe: Callable[[CacheNode], None]) -> None:
        super().__init__(base)
        self.observe = observe

    def chain(self, leaf: CacheNode, view: TreeView) -> Sequence[CacheNode]:
        self.observe(leaf)
        return self.base.chain(leaf, view)


# ---------------------------------------------------------------------- granularities
class Granularity(ABC):
    """How much of a node one step frees. ``exact``: ``take`` is ``min(blocks, need)``;
    ``whole``: ``take`` is ``blocks``; the planner then computes it without calling it."""

    name: ClassVar[str]
    reads_node_boundaries: ClassVar[bool]
    exact: ClassVar[bool] = False
    whole: ClassVar[bool] = False

    @abstractmethod
    def take(self, blocks: int, need: int) -> int:
        """Blocks to free from a node of ``blocks`` blocks when ``need`` (>0) are wanted."""

    def __repr__(self) -> str:
        return self.name


class WholeNodes(Granularity):
    name, reads_node_boundaries, whole = "node", True, True

    def take(self, blocks: int, need: int) -> int:
        return blocks


class Blocks(Granularity):
    name, reads_node_boundaries, exact = "block", False, True

    def take(self, blocks: int, need: int) -> int:
        return min(blocks, need)


NODE, BLOCK = WholeNodes(), Blocks()
GRANULARITIES: Registry[Granularity] = Registry("granularity", PolicyError)
for _granularity in (NODE, BLOCK):
    GRANULARITIES.register(_granularity.name, _granularity)


def _component(value: Any, table: Registry[Any], base: type) -> Any:
    if isinstance(value, str):
        return table.get(value)
    if not isinstance(value, base):
        raise PolicyError(f"bad {table.kind}: {value!r}")
    return value


# ---------------------------------------------------------------------- the policy
# What a policy may listen to (``EvictionPolicy.events``).
EVENTS = frozenset({"arrival", "reply", "drop", "split"})
_RESERVED = frozenset({"name", "pins", "clairvoyant", "events", "order", "start",
                       "granularity", "sort_key", "context", "values", "entries",
                       "by_recency"})


class EvictionPolicy:
    """One eviction policy: order x start x granularity, plus optional pins and events.

    Subclass it to write a policy; override ``key`` (or set ``order``), set ``start`` and
    ``granularity`` as class attributes, declare parameters as annotated class attributes
    with defaults (``hold_s: float = 10.0``, as in a dataclass; read them as attributes), and
    opt in to what the planner and engine should ask:

    - ``pins = True``: the planner calls ``pinned_until(leaf)`` (simulated seconds). A pinned
      leaf is evicted only when every unpinned leaf is gone (memory pressure breaks pins, as in
      Continuum); pinned leaves then go in key order. Admission counts pinned KV as evictable.
    - ``events``, any of ``EVENTS``: the engine calls ``on_arrival``/``on_reply``/``on_drop``
      for each request that arrives, finishes or is refused; the cache calls ``on_split``
      when it cuts a node in two (state kept per node serial follows the split).
    - ``clairvoyant = True``: ``Reply.next_gap_s`` carries the trace's future (bounds only).
    - ``uses_seed = True``: it reads ``context.seed`` (random victims), so ``--repeats`` runs
      differ; a built-in policy without it repeats identically (sim/run/repeats.py).

    A policy instance belongs to one run (the engine ``bind``s it to the run's context);
    ``get_policy`` makes a fresh one each time.
    """

    name: ClassVar[str] = ""  # label of a subclass; the composed base class uses its spec
    pins: ClassVar[bool] = False
    clairvoyant: ClassVar[bool] = False
    uses_seed: ClassVar[bool] = False
    events: ClassVar[frozenset[str]] = frozenset()
    # The values each parameter may take (``Range``, ``OneOf``), checked when it is set.
    parameter_ranges: ClassVar[Mapping[str, Domain]] = {}

    order: str = "lru"
    start: StartPosition = TAIL
    granularity: Granularity = NODE

    def __init__(self, order: str | None = None, start: StartPosition | str | None = None,
                 granularity: Granularity | str | None = None, **params: Any) -> None:
        if order is not None:
            self.order = order
        self.start = _component(start if start is not None else self.start, STARTS,
                                StartPosition)
        self.granularity = _component(
            granularity if granularity is not None else self.granularity, GRANULARITIES,
            Granularity)
        self.values = set_parameters(self, params, "policy")
        if type(self).key is EvictionPolicy.key:
            self.sort_key = get_order(self.order)  # a registered order: no extra call
        else:
            self.sort_key = self.key
        # LRU's order, unpinned: the planner builds its entries from the node fields itself.
        self.by_recency = self.sort_key is lru and not self.pins
        unknown_events = set(self.events) - EVENTS
        if unknown_events:
            raise PolicyError(f"policy {self.label!r}: unknown events {sorted(unknown_events)}")
        self.context: PolicyContext = STANDALONE

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        """Declared parameters and their defaults: the annotated class attributes with a
        default that subclasses define (not ``ClassVar``s, not the policy's own choices)."""
        return declared_parameters(cls, EvictionPolicy, _RESERVED)

    def idle_parameters(self) -> dict[str, str]:
        """Parameters that do nothing under the others' values, each with the reason (a
        parameter given there is refused); none by default."""
        return {}

    # --- decisions ----------------------------------------------------------------------
    def key(self, node: CacheNode) -> Any:
        """Sort key of an evictable leaf; smallest is evicted first."""
        return get_order(self.order)(node)

    def pinned_until(self, node: CacheNode) -> float:
        """Simulated time until which ``node`` should not be evicted (only if ``pins``)."""
        return -math.inf

    def entries(self, leaves: Iterable[CacheNode]) -> list[tuple]:
        """The planner's heap entries of victim leaves, ``(key, serial, leaf)`` (with ``pins``,
        ``(pinned, key, serial, leaf)``: pinned ones after every unpinned one), smallest
        evicted first; asked once per plan and for each leaf a plan exposes. (Where
        ``by_recency`` is set, the key is LRU's ``(last_access, serial)`` and the planner
        builds ``(last_access, serial, leaf)``, the same order, without asking.)"""
        key = self.sort_key
        if self.pins:
            now, pinned = self.context.now(), self.pinned_until
            return [(pinned(n) > now, key(n), n.serial, n) for n in leaves]
        return [(key(n), n.serial, n) for n in leaves]

    # --- events -------------------------------------------------------------------------
    def bind(self, context: PolicyContext) -> None:
        """Called once by the engine before the run starts."""
        self.context = context

    def on_arrival(self, event: Arrival) -> None:
        """A request arrived (only if ``"arrival"`` in ``events``)."""

    def on_reply(self, event: Reply) -> None:
        """A request finished (only if ``"reply"`` in ``events``)."""

    def on_drop(self, event: Drop) -> None:
        """A request was refused and will never run (only if ``"drop"`` in ``events``): it
        arrived (``on_arrival``) but no reply will follow."""

    def on_split(self, prefix: CacheNode, node: CacheNode) -> None:
        """The cache cut ``node`` in two (only if ``"split"`` in ``events``): ``prefix`` is the
        new node holding its first blocks, ``node`` keeps its serial as the suffix. Every
        history through ``node`` runs through ``prefix``."""

    # --- derived properties ---------------------------------------------------------------
    @property
    def makes_holes(self) -> bool:
        """Freeing may start before the end of a history (leaves NONE nodes behind)."""
        return self.start.makes_holes

    @property
    def block_exact(self) -> bool:
        """Results do not depend on where node boundaries fall: neither the start nor the
        granularity reads them (block granularity from the tail or the private head). The
        cache then stamps exactly the matched blocks and merges single-child runs of equal
        state; otherwise it reproduces SGLang's node semantics exactly."""
        return not (self.start.reads_node_boundaries or self.granularity.reads_node_boundaries)

    @property
    def spec(self) -> str:
        """``order+start+granularity`` (e.g. ``lru+private-head+block``) or the class name."""
        if type(self) is EvictionPolicy:
            return f"{self.order}+{self.start.name}+{self.granularity.name}"
        return self.name or type(self).__name__

    @property
    def label(self) -> str:
        """The name shown in tables: a preset's name, the spec, or the subclass name with the
        parameters that differ from their defaults."""
        if type(self) is EvictionPolicy:
            for preset, parts in PRESETS.items():
                if parts == (self.order, self.start.name, self.granularity.name):
                    return preset
            return self.spec
        changed = [f"{k}={v}" for k, v in getattr(self, "values", {}).items()
                   if v != type(self).parameters()[k]]
        return f"{self.spec}({','.join(changed)})" if changed else self.spec

    def identity(self) -> tuple:
        return (type(self), self.order, self.start.name, self.granularity.name,
                tuple(sorted(getattr(self, "values", {}).items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EvictionPolicy) and self.identity() == other.identity()

    def __hash__(self) -> int:
        return hash(self.identity())

    def __repr__(self) -> str:
        return f"<policy {self.label}>"


def declared_parameters(cls: type, base: type, reserved: frozenset[str]) -> dict[str, Any]:
    """The typed parameters of a plug-in class (an eviction policy, a router): annotated
    class attributes with a default, defined by ``base``'s subclasses along ``cls``'s MRO,
    less ``ClassVar``s, private names and the ``reserved`` ones the base class owns."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not issubclass(klass, base) or klass is base:
            continue
        for k, ann in inspect.get_annotations(klass).items():
            if k in reserved or k.startswith("_") or "ClassVar" in str(ann):
                continue
            if k in klass.__dict__:
                out[k] = klass.__dict__[k]
    return out


@dataclass(frozen=True)
class Range:
    """The values a numeric parameter may take: from ``lo`` to ``hi``, each end included
    unless ``lo_open``/``hi_open``. NaN is in no range; an infinite end is open."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False

    def __contains__(self, v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(v):
            return False
        above = v > self.lo if self.lo_open or math.isinf(self.lo) else v >= self.lo
        below = v < self.hi if self.hi_open or math.isinf(self.hi) else v <= self.hi
        return above and below

    def __str__(self) -> str:
        lo_inf, hi_inf = math.isinf(self.lo), math.isinf(self.hi)
        if lo_inf and hi_inf:
            return "a finite number"
        if hi_inf:
            return f"finite and {'>' if self.lo_open else '>='} {self.lo:g}"
        if lo_inf:
            return f"finite and {'<' if self.hi_open else '<='} {self.hi:g}"
        return (f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}"
                f"{')' if self.hi_open else ']'}")


@dataclass(frozen=True)
class OneOf:
    """The values a text (or flag) parameter may take."""

    values: tuple[Any, ...]

    def __contains__(self, v: Any) -> bool:
        return any(v == x and type(v) is type(x) for x in self.values)

    def __str__(self) -> str:
        return "one of " + ", ".join(map(str, self.values))


# ``parameter_ranges`` of a plug-in class: one entry per declared parameter.
Domain = Range | OneOf


def ranges(**domains: Domain) -> Mapping[str, Domain]:
    """A class's ``parameter_ranges`` (read only): ``ranges(tau_s=Range(0.0), ...)``."""
    return MappingProxyType(domains)


def set_parameters(plugin: Any, params: Mapping[str, Any], what: str) -> dict[str, Any]:
    """Check ``params`` against ``plugin.parameters()``, coerce each to its default's type,
    check it against its declared range (``plugin.parameter_ranges``), set them as
    attributes and return them (every declared one, defaults included). An unknown name, a
    value outside its range, or a parameter given where the others' values make it do
    nothing (``plugin.idle_parameters()``) is refused naming the plug-in (``what``: policy,
    router)."""
    declared = plugin.parameters()
    unknown = sorted(set(params) - set(declared))
    if unknown:
        known = ", ".join(declared) or "none"
        raise PolicyError(f"{what} {plugin.label!r} has no parameter {unknown[0]!r} "
                          f"(parameters: {known})")
    ranges = type(plugin).parameter_ranges
    stray = sorted(set(ranges) - set(declared))
    if stray:
        raise PolicyError(f"{what} {plugin.label!r}: parameter_ranges names {stray[0]!r}, "
                          "which is not a parameter")
    try:
        values = {k: coerce_param(k, params.get(k, d), d) for k, d in declared.items()}
    except PolicyError as e:
        raise PolicyError(f"{what} {plugin.label!r}: {e}") from None
    for k, v in values.items():
        if k in ranges and v not in ranges[k]:
            raise PolicyError(f"{what} {plugin.label!r}: parameter {k!r} must be "
                              f"{ranges[k]}, got {v!r}")
    for k, v in values.items():
        setattr(plugin, k, v)
    idle = plugin.idle_parameters()
    given = [k for k in params if k in idle]
    if given:
        raise PolicyError(f"{what} {plugin.label!r}: parameter {given[0]!r} does nothing "
                          f"here: {idle[given[0]]}")
    return values


def coerce_param(name: str, value: Any, default: Any) -> Any:
    """A parameter value (text from the CLI, or a YAML scalar) as the type of its default.
    NaN is refused (it compares false with everything, so no rule can use it)."""
    if default is None:
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        low = str(value).strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
    elif not isinstance(value, bool):
        typed = value
        if isinstance(default, float) and isinstance(value, int | float):
            typed = float(value)
        elif not isinstance(value, type(default)):
            try:
                typed = type(default)(str(value).strip())
            except ValueError:
                typed = None
        if isinstance(typed, float) and math.isnan(typed):
            raise PolicyError(f"parameter {name!r}: {value!r} is not a number (NaN)")
        if typed is not None:
            return typed
    raise PolicyError(f"parameter {name!r}: {value!r} is not a {type(default).__name__}")


# The engines' own policies and the paper's: (order, start, granularity).
PRESETS: Registry[tuple[str, str, str]] = Registry("preset", PolicyError)
PRESETS.register("sglang", ("lru", "tail", "node"))
PRESETS.register("vllm", ("lru", "tail", "block"))
PRESETS.register("penelope", ("lru", "private-head", "block"))
