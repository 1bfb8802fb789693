"""The eviction planner: ONE walk over a read-only tree that turns a policy's decisions into an
ordered plan of steps. The cache's appliers (``RadixTree.apply_*``) carry plans out; nothing
here changes the tree.

    policy.entries(leaves) --> heap of victim leaves (pinned ones after every unpinned one)
    policy.start.chain ------> nodes to free for the popped leaf, in order
    policy.granularity.take -> blocks to take from each node
                               => Step(node, blocks, head)  head: free the node's first blocks

Each part is asked through its one method, built-in or the user's alike; a part that
declares a capability is served without the call: a granularity's ``exact`` (``min(blocks,
need)``) or ``whole`` (``blocks``), a start's ``leaf_only`` (the chain is the victim leaf:
tail, leaf-head), a policy's ``by_recency`` (LRU's entries from the node fields).

While planning, the view tracks what the steps planned so far WILL do (``TreeView``): freed
nodes become holes or leave the tree, parents lose children and become victims themselves, so
the plan is exactly what in-place eviction would do, step for step. A partial step (fewer
blocks than the node holds) is always the last step of a plan: the need is met there.

Views (which nodes are victims, which children count):

    HistoryView  the whole tree (GPU only, and Penelope's unified tiers: every KV-holding
                 node, either tier). A freed node with children becomes a hole; a freed
                 childless node leaves the tree with its childless, unlocked hole ancestors.
    DeviceView   SGLang HiCache's device tier: victims are device nodes whose children are all
                 host-only; a freed node (demoted or deleted) just leaves the device.

``plan(..., counts=...)`` plans over a view but emits steps only for nodes ``counts`` accepts
(unified demotion: GPU nodes; CPU nodes on the way are passed over as if deleted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from heapq import heapify, heappop, heappush  # (module globals: no attribute lookups)
from itertools import pairwise
from operator import index
from typing import Any, Final, NamedTuple, cast

from policies import EvictionPolicy, Granularity, StartPosition

from .node import Node, Tier

_GPU: Final = Tier.GPU
_NONE: Final = Tier.NONE
_DROPPED: Final = Tier.DROPPED
# The heap's functions as constants of this module (every eviction plans: no lookup in the
# module's namespace per use).
_heapify: Final = heapify
_heappop: Final = heappop
_heappush: Final = heappush
# No room bound: more blocks than any cache holds (an int, so that a step's size stays one).
_UNBOUNDED: Final = 1 << 62


class Step(NamedTuple):
    """Free ``blocks`` blocks of ``node``: its first ones (``head``) or its last ones. (A named
    tuple: plans are made at every eviction, and a tuple is the cheapest record to build.)"""

    node: Node
    blocks: int
    head: bool


class HistoryView:
    """Virtual state of the whole tree during planning (implements ``policies.TreeView``)."""

    __slots__ = ("gone", "kids", "root")

    def __init__(self, root: Node) -> None:
        self.root = root
        self.gone: set[Node] = set()  # nodes freed by planned steps
        self.kids: dict[Node, int] = {}  # live child counts that planned steps changed

    def is_root(self, node: Node) -> bool:
        return node is self.root

    def live_children(self, node: Node) -> int:
        return self.kids.get(node, len(node.children))

    def is_hole(self, node: Node) -> bool:
        return node.tier is _NONE or node.tier is _DROPPED or node in self.gone

    def release(self, node: Node) -> Node | None:
        """Plan ``node`` freed whole; return the ancestor that becomes a victim leaf, if any
        (``RadixTree.delete``'s rule on the planned state: with live children it stays, a
        hole; childless, it leaves with its KV-less childless unlocked ancestors, and the
        ancestor that stays is returned if it just became a victim leaf)."""
        gone, kids, root = self.gone, self.kids, self.root
        gone.add(node)
        # The view's reads inlined (is_hole, live_children): a planned leaf takes the chain
        # of holes in front of it along.
        if kids.get(node, len(node.children)):
            return None
        cur = node
        while cur is not root:
            tier = cur.tier
            if not (tier is _NONE or tier is _DROPPED or cur in gone) \
                    or kids.get(cur, len(cur.children)):
                break
            if cur.lock:
                return None
            parent = cast(Node, cur.parent)  # (below the root: never None)
            kids[parent] = kids.get(parent, len(parent.children)) - 1  # it left the tree
            cur = parent
        tier = cur.tier
        if cur is root or cur.lock or tier is _NONE or tier is _DROPPED or cur in gone \
                or kids.get(cur, len(cur.children)):
            return None
        return cur


class DeviceView:
    """Virtual state of HiCache's device tier: children count only while on the device."""

    __slots__ = ("gone", "kids", "root")

    def __init__(self, root: Node) -> None:
        self.root = root
        self.gone: set[Node] = set()
        self.kids: dict[Node, int] = {}

    def is_root(self, node: Node) -> bool:
        return node is self.root

    def live_children(self, node: Node) -> int:
        n = self.kids.get(node)
        if n is None:
            n = sum(1 for c in node.children.values() if c.tier is _GPU)
        return n

    def is_hole(self, node: Node) -> bool:
        return node.tier is not _GPU or node in self.gone

    def release(self, node: Node) -> Node | None:
        self.gone.add(node)
        parent = node.parent
        assert parent is not None
        left = self.live_children(parent) - 1
        self.kids[parent] = left
        if parent is not self.root and left == 0 and parent.lock == 0 \
                and parent.tier is _GPU:
            return parent
        return None

    def leaves(self) -> list[Node]:
        """Device leaves now: unlocked device nodes without device children (device nodes
        are prefix-closed, so only the device part of the tree is walked)."""
        out = []
        stack = [self.root]
        while stack:
            nd = stack.pop()
            device_children = False
            for c in nd.children.values():
                if c.tier is _GPU:
                    device_children = True
                    stack.append(c)
            if nd is not self.root and nd.lock == 0 and not device_children:
                out.append(nd)
        return out


View = HistoryView | DeviceView


_new: Final = tuple.__new__


def plan(
    policy: EvictionPolicy,
    view: View,
    victims: Iterable[Node],
    need: int,
    *,
    counts: Callable[[Node], bool] | None = None,
    eligible: Callable[[Node], bool] | None = None,
    room: int | None = None,
    start: StartPosition | None = None,
    granularity: Granularity | None = None,
    debug: bool = False,
) -> list[Step]:
    """Steps that free at least ``need`` blocks (exactly ``need`` at block granularity) from
    ``victims`` (evictable leaves) and the leaves their freeing exposes, in policy order.

    ``counts``: which nodes produce steps and count toward ``need`` (default: all).
    ``eligible``: which exposed leaves may become victims (default: all).
    ``room``: an upper bound on the blocks the plan may take (a demotion's free CPU room).
    ``start``/``granularity`` override the policy's (HiCache's host tier frees whole nodes).
    Fewer blocks are planned when the victims run out.
    """
    # LRU's order, unpinned, declared (``by_recency``): the entries are built here from the
    # node fields, compiled, without a call per leaf.
    entries = None if policy.by_recency else policy.entries
    start = start or policy.start
    granularity = granularity or policy.granularity
    # Declared parts are served without their calls: a leaf-only start's chain is the leaf,
    # a whole-node granularity takes the node's size, an exact one min(size, need).
    whole: bool = granularity.whole
    chain_of = None if start.leaf_only else start.chain
    take = None if granularity.exact or whole else granularity.take
    head: bool = start.from_head
    # The whole-tree view, where planning runs on it, is called directly (not through a
    # bound method of either view).
    history: HistoryView | None = None
    if type(view) is HistoryView:
        history = view
    release = view.release if history is None else None
    # (key..., serial, node): serials are unique, so nodes are never compared
    heap: list[Any] = [(n.last_access, n.serial, n) for n in victims] if entries is None \
        else entries(victims)
    if len(heap) > 1:
        _heapify(heap)
    steps: list[Step] = []
    left: int = _UNBOUNDED if room is None else room
    while need > 0 and left > 0 and heap:
        leaf: Node = _heappop(heap)[-1]
        chain: Sequence[Node] = (leaf,) if chain_of is None \
            else chain_of(leaf, view)  # type: ignore[assignment,arg-type]
        if debug:
            _check_chain(chain, leaf, view)
        survivor: Node | None = None
        for nd in chain:
            if need <= 0:
                break
            size = len(nd.ids)
            if counts is None or counts(nd):
                # (a granularity's take may answer a numpy integer: index() takes any int)
                k: int
                if whole:
                    k = size
                elif take is None:
                    k = size if size < need else need
                else:
                    k = index(take(size, need))
                if k > left:
                    k = left
                if k <= 0:
                    break
                steps.append(_new(Step, (nd, k, head)))  # Step(nd, k, head), no __new__ frame
                need -= k
                left -= k
                if k < size:
                    break  # a partial step: the need (or the room) is used up here
            if history is not None:
                survivor = history.release(nd)
            else:
                assert release is not None
                survivor = release(nd)
        if survivor is not None and need > 0 and (eligible is None or eligible(survivor)):
            _heappush(heap, (survivor.last_access, survivor.serial, survivor)
                      if entries is None else entries((survivor,))[0])
    return steps


def _check_chain(chain, leaf: Node, view: View) -> None:
    """A start strategy's chain must end at the leaf and climb one private node at a time."""
    assert chain and chain[-1] is leaf, f"chain must end with the victim leaf {leaf!r}"
    for upper, lower in pairwise(chain):
        assert lower.parent is upper, f"chain is not a path: {upper!r} -> {lower!r}"
        assert view.live_children(upper) == 1, f"chain node is shared: {upper!r}"
    for nd in chain:
        assert nd.lock == 0 and not view.is_hole(nd), f"chain node locked or empty: {nd!r}"
