"""The state of a router's exact KV-event index (``beliefs.EventBelief``): per replica, the
blocks its events left GPU-resident. With ``drop_orphans`` (Dynamo 1.6's radix index) a store
whose parent the replica lacks is dropped, and a removal takes the block's subtree with it.

Two representations with the same answers (tests/test_belief_fastpaths.py holds both to a
block-by-block model):

- ``LinkedIndex``, block by block: per replica a set of held blocks and, with
  ``drop_orphans``, the child links each store made, which a removal follows. It takes any
  stream.
- ``ChainIndex``, run by run: one tree of the chained ids the replicas stored (a node is a
  run of ids, each the only stored child of the one before, as ``sim.kvcache.tree`` keeps a
  path) and per replica how deep into each node it holds. A store or a removal costs per node
  it touches, not per block: under pressure the engines report about a thousand blocks per
  request, mostly a history's front evicted and later restored. It applies while the stream
  is chained (traces/model.py: an id has one parent) and every store names its parent; at the
  first event outside that (a CPU load's ``parent=None``, an id under a second parent, a
  repeated id) ``store`` refuses it unchanged and ``linked()`` hands the same state over to a
  ``LinkedIndex``, links included, where the stream goes on.
"""

from __future__ import annotations

import sys
from functools import partial
from itertools import accumulate, islice, repeat, takewhile
from operator import is_not
from typing import Final

import numpy as np

_is_block: Final = partial(is_not, None)  # a child link's target (None: no child)

# ChainIndex forgets the runs no replica holds once its tree holds this many ids and four
# times what the replicas hold: a history evicted and restored soon after finds its run still
# there, and memory stays within a few times the caches'.
COLLECT_FLOOR: Final = 1 << 17
# ``RunMap`` lists a run of consecutive ids under each bucket of this many ids (a power of 2)
# it reaches; ``Run.first`` of a run that is not consecutive.
SPAN_BITS: Final = 6
DENSE_NONE: Final = -(1 << 63)


def _link(first: dict[int, int], more: dict[int, set[int]], parent: int, b: int) -> None:
    """Record ``b`` as a child of ``parent`` (``LinkedIndex``'s child links)."""
    kid = first.get(parent)
    if kid is None:
        first[parent] = b
    elif kid != b:
        kids = more.get(parent)
        if kids is None:
            more[parent] = {b}
        else:
            kids.add(b)


class BlockIndex:
    """What ``EventBelief`` asks of its index over ``n`` replicas."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.dropped = 0  # blocks whose store was skipped (their parent was gone)

    def store(self, r: int, ids: np.ndarray, parent: int | None) -> bool:
        """Replica ``r`` made the chain ``ids`` GPU-resident after ``parent`` (-1: the root;
        None: not said). False: this representation cannot take the event (nothing
        changed; go on in ``linked()``)."""
        raise NotImplementedError

    def remove(self, r: int, ids: np.ndarray) -> None:
        """Replica ``r`` removed the last GPU copy of ``ids``."""
        raise NotImplementedError

    def overlaps(self, xs: np.ndarray) -> list[int]:
        """Per replica, how many leading ``xs`` it holds."""
        raise NotImplementedError

    def sizes(self) -> list[int]:
        raise NotImplementedError

    def held(self, r: int) -> set[int]:
        """The blocks replica ``r`` holds."""
        raise NotImplementedError

    def linked(self) -> LinkedIndex:
        """The same state block by block."""
        raise NotImplementedError


class LinkedIndex(BlockIndex):
    """Block by block (see the module docstring). An event changes one replica, so each
    replica's blocks are a set of its own: an event is a set operation in C, and an overlap
    scan per replica stops at its first miss. With ``orphans``, per replica block -> the first
    block stored right after it, and the others when a block has more than one (a branch):
    most blocks have one child."""

    def __init__(self, n: int, orphans: bool) -> None:
        super().__init__(n)
        self.orphans = orphans
        self.blocks: list[set[int]] = [set() for _ in range(n)]
        self.first_child: list[dict[int, int]] = [{} for _ in range(n)]
        self.more_children: list[dict[int, set[int]]] = [{} for _ in range(n)]

    def store(self, r: int, ids: np.ndarray, parent: int | None) -> bool:
        if not self.orphans:
            self.blocks[r].update(ids.tolist())
        else:
            self._store_linked(r, ids.tolist(), parent)
        return True

    def remove(self, r: int, ids: np.ndarray) -> None:
        if not self.orphans:
            self.blocks[r].difference_update(ids.tolist())
        else:
            self._forget_subtrees(r, ids.tolist())

    def overlaps(self, ids: np.ndarray) -> list[int]:
        xs: list[int] = ids.tolist()
        out = []
        for h in self.blocks:  # each replica's held prefix: the scan stops at its first miss
            k = 0
            for b in xs:
                if b not in h:
                    break
                k += 1
            out.append(k)
        return out

    def sizes(self) -> list[int]:
        return [len(h) for h in self.blocks]

    def held(self, r: int) -> set[int]:
        return set(self.blocks[r])

    def linked(self) -> LinkedIndex:
        return self

    def _store_linked(self, r: int, ids: list[int], parent: int | None) -> None:
        """Store the chain ``ids`` after ``parent`` unless the index lacks that parent (then
        the whole chain is dropped: each block's own parent is the one stored before it, so
        only the first can be missing). Every block is linked from the one before it, held
        before or not."""
        held, first, more = self.blocks[r], self.first_child[r], self.more_children[r]
        if parent is not None and parent >= 0:
            if parent not in held:
                self.dropped += len(ids)
                return
            prev = parent
        else:
            prev = -1
        size = len(held)
        held.update(ids)
        if len(held) - size == len(ids):
            # distinct and all new (the engines report only changes): a block r did not
            # hold has no links (only held blocks have), so the chain's links are set in C
            first.update(zip(ids, islice(ids, 1, None), strict=False))
            if prev >= 0:
                _link(first, more, prev, ids[0])
            return
        for b in ids:
            if prev >= 0:
                _link(first, more, prev, b)
            prev = b

    def _forget_subtrees(self, r: int, ids: list[int]) -> None:
        """Remove ``ids`` and every block stored below them for ``r``. The blocks removed are
        those reachable from ``ids`` over the child links, whatever the visiting order. Only
        a held block has links (``_store_linked`` links from the parent it checked and the
        blocks it stores; a removal takes the block's links with it), so a block ``r`` does
        not hold ends its branch of the walk."""
        held, first_pop, more = self.blocks[r], self.first_child[r].pop, self.more_children[r]
        more_pop = more.pop
        # The held ids go first, in C (a block r does not hold has no links: it adds
        # nothing); the walk goes on from their children outside them (a removed block's
        # chain child is usually the next id, already gone)
        if held.isdisjoint(ids):  # most removals: the blocks went with an earlier subtree
            return
        hit = list(filter(held.__contains__, ids))
        kids = list(map(first_pop, hit, repeat(None)))
        held.difference_update(hit)
        if kids[:-1] == hit[1:]:
            stack = [] if kids[-1] is None else [kids[-1]]
        else:
            stack = [k for k in kids if k is not None]
        if more and any(map(more.__contains__, hit)):
            for x in hit:
                extra = more_pop(x, None)
                if extra:
                    stack.extend(extra)
        # Below them the subtrees are mostly long single chains, each followed in C:
        # ``accumulate`` pops each block's first child (a link is followed once, so the walk
        # ends) until one has none; only a held block has links, so the chain is held blocks
        # and at most one last block that is not (removing it is a no-op). The branches
        # (``more``, whose keys are held blocks too) go on the stack: those of the chain are
        # the keys no longer held, found from the smaller of the two.
        while stack:
            x = stack.pop()
            if x not in held:
                continue
            run = list(takewhile(_is_block, accumulate(repeat(None), first_pop,  # type: ignore[misc]
                                                       initial=x)))
            held.difference_update(run)
            if more:
                if len(more) < len(run):
                    gone = [k for k in more if k not in held]
                else:
                    gone = list(filter(more.__contains__, run))
                for k in gone:  # a repeated id may list its block twice
                    extra = more_pop(k, None)
                    if extra:
                        stack.extend(extra)


class Run:
    """A node of ``ChainIndex``'s tree: ``ids`` at depths ``[start, start + len(ids))`` from
    the root, each the only stored child of the one before (``raw``: their int64 bytes, which
    a chain is compared against with one ``memcmp``); ``children`` by first id."""

    def __init__(self, ids: list[int], raw: bytes, start: int, parent: Run | None,
                 first: int = DENSE_NONE) -> None:
        self.ids = ids
        self.raw = raw
        self.start = start
        self.parent = parent
        self.children: dict[int, Run] = {}
        # ``ids[0]`` when the ids are consecutive (``ids[k] == first + k``; any part of such a
        # run is too), else DENSE_NONE: such a run is found by its span (``RunMap``) and an
        # id's place in it is a subtraction
        self.first = first

    @property
    def end(self) -> int:
        return self.start + len(self.ids)

    def last(self) -> int:
        """The id before this run's first (-1: the root's child)."""
        p = self.parent
        return p.ids[-1] if p is not None and p.ids else -1

    def offset(self, b: int) -> int:
        """Where id ``b`` (one of this run's) lies in it: for consecutive ids a subtraction,
        else its bytes found from the end (the ids asked most are a run's last: the parent of
        a chain that extends it, a tail removed); a match across two ids is skipped."""
        if self.first != DENSE_NONE:
            return b - self.first
        key = b.to_bytes(8, sys.byteorder, signed=True)
        raw = self.raw
        at = raw.rfind(key)
        while at % 8:
            at = raw.rfind(key, 0, at + 7)
        return at // 8

    def agree(self, off: int, buf: bytes, i: int, m: int) -> int:
        """How many of the ``m`` ids from ``off`` on equal those of the int64 bytes ``buf``
        from id ``i`` on (one ``memcmp`` when all do, else a bisection of them)."""
        raw = self.raw
        if buf.startswith(raw[8 * off:8 * (off + m)], 8 * i):
            return m
        lo, hi = 0, m - 1  # the answer lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if buf.startswith(raw[8 * off:8 * (off + mid)], 8 * i):
                lo = mid
            else:
                hi = mid - 1
        return lo


def _back_up(raw: bytes, off: int, ids: np.ndarray, i: int) -> int:
    """How many ids from ``ids[i]`` on are those of a run (``raw``: its int64 bytes) read
    backwards from its id at ``off`` (``ids[i]`` is that id): compared in one array
    operation, however long the removal walks back up the run."""
    span = min(len(ids) - i, off + 1)
    back = np.frombuffer(raw, np.int64, span, 8 * (off + 1 - span))[::-1]
    same = ids[i:i + span] == back
    k = int(same.argmin())  # the first id off the run (0 when there is none: ids[i] is on it)
    return k if k else span


def _int64(ids: np.ndarray) -> np.ndarray:
    return ids if ids.dtype == np.int64 else ids.astype(np.int64)


def _dense_first(ids: np.ndarray, buf: bytes) -> int:
    """``ids[0]`` when ``ids`` (int64, not empty; ``buf`` its bytes) are consecutive
    ascending ids, else ``DENSE_NONE``: trace ids mostly are (traces/model.py numbers blocks
    in the order they first appear)."""
    first = ids.item(0)
    n = len(ids)
    if ids.item(n - 1) != first + n - 1 or first == DENSE_NONE:
        return DENSE_NONE
    if n > 2 and np.arange(first, first + n, dtype=np.int64).tobytes() != buf:
        return DENSE_NONE
    return first


class RunMap:
    """Every id in ``ChainIndex``'s tree -> its run. A run of consecutive ids (``Run.first``)
    is kept as a span, listed under each bucket of ``2**SPAN_BITS`` ids it reaches, so that a
    store of new ids costs per bucket, not per id; the ids of any other run are kept one by
    one. A run only shrinks (a split, a collection) while it is listed: a lookup tests the
    span as it stands, and a collection lists every run afresh."""

    def __init__(self) -> None:
        self.one: dict[int, Run] = {}  # the ids of runs that are not consecutive
        self.spans: dict[int, list[Run]] = {}  # bucket -> consecutive runs reaching it
        self.size = 0  # ids mapped

    def get(self, b: int) -> Run | None:
        run = self.one.get(b)
        if run is not None:
            return run
        runs = self.spans.get(b >> SPAN_BITS)
        if runs is not None:
            for run in runs:
                if run.first <= b < run.first + len(run.ids):
                    return run
        return None

    def add(self, run: Run) -> None:
        """Map every id of ``run`` (ids not mapped: ``disjoint`` said so) to it."""
        n = len(run.ids)
        self.size += n
        self.relist(run)

    def relist(self, run: Run) -> None:
        """Map ``run``'s ids to it (ids another run held before a split)."""
        first = run.first
        if first == DENSE_NONE:
            self.one.update(zip(run.ids, repeat(run)))
            return
        spans = self.spans
        for bucket in range(first >> SPAN_BITS, (first + len(run.ids) - 1 >> SPAN_BITS) + 1):
            runs = spans.get(bucket)
            if runs is None:
                spans[bucket] = [run]
            else:
                runs.append(run)

    def disjoint(self, ids: list[int], first: int) -> bool:
        """Whether no id of ``ids`` is mapped (``first``: their ``_dense_first``)."""
        if self.one and not self.one.keys().isdisjoint(ids):
            return False
        if not self.spans:
            return True
        if first == DENSE_NONE:
            return not any(self.get(b) is not None for b in ids
                           if (b >> SPAN_BITS) in self.spans)
        last = first + len(ids) - 1
        for bucket in range(first >> SPAN_BITS, (last >> SPAN_BITS) + 1):
            for run in self.spans.get(bucket, ()):
                if run.first <= last and first < run.first + len(run.ids):
                    return False
        return True


class ChainIndex(BlockIndex):
    """Run by run (see the module docstring), ``drop_orphans`` only. Per replica r,
    ``depth[r][run]`` is the depth up to which r holds ``run`` (absent: none of it): a
    replica's blocks are closed under parents while the stream is chained and every store
    names its parent, so they are a prefix of each run, and r holds a run's children only
    where it holds the run whole. An event is walked along the tree a run at a time, its ids
    compared as bytes: its cost is per run, bar the ids the tree has not seen.

    ``stale[r]``: parent -> children whose removal left the parent's link to them in the
    block-by-block index (the top of each removed subtree whose parent stayed), which a later
    load without a parent would follow: ``linked()`` restores them."""

    def __init__(self, n: int, collect_floor: int = COLLECT_FLOOR) -> None:
        super().__init__(n)
        self.root = Run([], b"", 0, None)
        # every id in the tree -> its run (its depth from the root: the run's start plus its
        # offset there, ``Run.offset``; 0 is the first block)
        self.run_of = RunMap()
        self.depth: list[dict[Run, int]] = [{} for _ in range(n)]
        self.count = [0] * n
        self.stale: list[dict[int, set[int]]] = [{} for _ in range(n)]
        self.collect_floor = collect_floor
        self.collect_at = collect_floor

    def store(self, r: int, ids: np.ndarray, parent: int | None) -> bool:
        if parent is None:
            return False
        if parent >= 0:
            # the parent's run and depth, found once: held by r, or the chain is dropped
            held = self.run_of.get(parent)
            at = held.start + held.offset(parent) + 1 if held is not None else 0
            if held is None or self.depth[r].get(held, 0) < at:
                self.dropped += len(ids)
                return True
            run = held
        else:
            run, at = self.root, 0
        ids = _int64(ids)
        buf = ids.tobytes()
        # Follow the tree from the parent as far as it has ``ids``; the rest must be new
        # (each id has one parent) and distinct, else the event is not chained.
        spans: list[tuple[Run, int]] = []  # (run, depth held to) the chain covers
        i, n = 0, len(ids)
        while i < n:
            off = at - run.start
            if off == len(run.ids):
                child = run.children.get(ids.item(i))
                if child is None:
                    break
                run, off = child, 0
            m = min(n - i, len(run.ids) - off)
            k = run.agree(off, buf, i, m)
            if k:
                spans.append((run, at + k))
                i, at = i + k, at + k
            if k < m:
                break  # the chain leaves the run inside it
        if i < n:
            rest = ids[i:]
            raw = buf[8 * i:]
            tail: list[int] = rest.tolist()
            first = _dense_first(rest, raw)
            run_of = self.run_of
            if not run_of.disjoint(tail, first):
                return False
            if first == DENSE_NONE and len(set(tail)) != len(tail):  # an id twice in it
                return False
            new = Run(tail, raw, at, run, first)
            run_of.add(new)
            off = at - run.start
            if off < len(run.ids):
                self._split(run, off)
            run.children[tail[0]] = new
            spans.append((new, new.end))
        depth, count = self.depth[r], self.count
        for run, to in spans:
            was = depth.get(run, run.start)
            if to > was:
                depth[run] = to
                count[r] += to - was
        if self.run_of.size > self.collect_at:
            self._collect()
        return True

    def _split(self, run: Run, off: int) -> None:
        """Cut ``run`` after its first ``off`` ids: the rest becomes its only child."""
        rest = Run(run.ids[off:], run.raw[8 * off:], run.start + off, run,
                   run.first + off if run.first != DENSE_NONE else DENSE_NONE)
        rest.children = run.children
        for child in rest.children.values():
            child.parent = rest
        run.ids = run.ids[:off]
        run.raw = run.raw[:8 * off]
        run.children = {rest.ids[0]: rest}
        self.run_of.relist(rest)
        cut = rest.start
        for depth in self.depth:
            to = depth.get(run)
            if to is not None and to > cut:
                depth[run] = cut
                depth[rest] = to

    def remove(self, r: int, ids: np.ndarray) -> None:
        run_of, depth = self.run_of, self.depth[r]
        if not depth:
            return
        ids = _int64(ids)
        buf = ids.tobytes()
        i, n = 0, len(ids)
        while i < n:
            b = ids.item(i)
            run = run_of.get(b)
            if run is None:
                i += 1
                continue
            off = run.offset(b)
            at = run.start + off
            m = run.agree(off, buf, i, min(n - i, len(run.ids) - off))
            if m == 1 and i + 1 < n and off and ids.item(i + 1) == run.ids[off - 1]:
                # ids going back up the run (vLLM frees a request tail first and evicts in
                # that order): ids[i:i + m] lie at depths at, at - 1, ..., at - m + 1; their
                # cuts one by one leave what one cut at the shallowest leaves
                m = _back_up(run.raw, off, ids, i)
                at -= m - 1
            # ids[i:i + m] lie at depths [at, at + m) of run: r holds the first of them
            # or none (its blocks of a run are a prefix)
            if depth.get(run, 0) > at:
                self._cut(r, run, at)
            i += m

    def _cut(self, r: int, run: Run, at: int) -> None:
        """Replica ``r`` loses ``run`` from depth ``at`` and every run below it."""
        depth, stale = self.depth[r], self.stale[r]
        top = run.ids[at - run.start]
        parent = run.ids[at - run.start - 1] if at > run.start else run.last()
        gone: list[tuple[Run, int, int]] = []  # (run, from, to) of depths removed
        to = depth[run]
        if at > run.start:
            depth[run] = at
        else:
            del depth[run]
        gone.append((run, at, to))
        stack = [run] if to == run.end else []
        while stack:
            x = stack.pop()
            for child in x.children.values():
                held = depth.pop(child, None)
                if held is not None:
                    gone.append((child, child.start, held))
                    if held == child.end:
                        stack.append(child)
        lost = 0
        for x, a, b in gone:
            lost += b - a
            if stale:  # links from removed blocks go with them
                if len(stale) < b - a:
                    for p in [p for p in stale if self.run_of.get(p) is x
                              and a <= x.start + x.offset(p) < b]:
                        del stale[p]
                else:
                    for p in x.ids[a - x.start:b - x.start]:
                        stale.pop(p, None)
        self.count[r] -= lost
        if parent >= 0:
            kids = stale.get(parent)
            if kids is None:
                stale[parent] = {top}
            else:
                kids.add(top)

    def overlaps(self, xs: np.ndarray) -> list[int]:
        out = [0] * self.n
        alive = list(range(self.n))
        run_of, depth = self.run_of, self.depth
        xs = _int64(xs)
        buf = xs.tobytes()
        i, n = 0, len(xs)
        while i < n and alive:
            b = xs.item(i)
            run = run_of.get(b)
            if run is None:
                break
            off = run.offset(b)
            at = run.start + off
            m = run.agree(off, buf, i, min(n - i, len(run.ids) - off))
            going = []
            for r in alive:
                k = depth[r].get(run, 0) - at
                if k >= m:
                    going.append(r)
                else:
                    out[r] = i + max(0, k)
            alive = going
            i += m
        for r in alive:
            out[r] = i
        return out

    def sizes(self) -> list[int]:
        return list(self.count)

    def held(self, r: int) -> set[int]:
        out: set[int] = set()
        for run, to in self.depth[r].items():
            out.update(run.ids[:to - run.start])
        return out

    def linked(self) -> LinkedIndex:
        """The same state block by block: each replica's blocks, a link from every held
        block to each held child (a replica's blocks are closed under parents here) and the
        links removals left behind (``stale``)."""
        out = LinkedIndex(self.n, orphans=True)
        out.dropped = self.dropped
        for r in range(self.n):
            held, first, more = out.blocks[r], out.first_child[r], out.more_children[r]
            for run, to in self.depth[r].items():
                ids = run.ids[:to - run.start]
                held.update(ids)
                for a, b in zip(ids, islice(ids, 1, None), strict=False):
                    _link(first, more, a, b)
                p = run.last()
                if p >= 0:
                    _link(first, more, p, ids[0])
            for p, kids in self.stale[r].items():
                for b in kids:
                    if b not in held:
                        _link(first, more, p, b)
        return out

    def _collect(self) -> None:
        """Forget the runs, and the tails of runs, that no replica holds: the tree is trimmed
        and ``run_of`` rebuilt from the runs that stay (a collection runs when the ids no
        replica holds outnumber the held about three to one: keeping these costs less than
        deleting those)."""
        depth = self.depth
        run_of = RunMap()
        stack = [self.root]
        while stack:
            run = stack.pop()
            for key, child in list(run.children.items()):
                to = child.start
                for d in depth:
                    to = max(to, d.get(child, 0))
                if to < child.end:  # (no replica holds its children either: they go)
                    child.children = {}
                    if to == child.start:
                        del run.children[key]
                        continue
                    child.ids = child.ids[:to - child.start]
                    child.raw = child.raw[:8 * (to - child.start)]
                run_of.add(child)
                stack.append(child)
        self.run_of = run_of
        self.collect_at = max(self.collect_floor, 4 * run_of.size)
