"""Context edits on a cached path: drop, reposition and splice, planned then applied.

A history that edits its KV (``versions``: AKV's drop and repos, Leyline's splice) tells the
cache how its previous keys map onto its new ones: ``old[i]`` (the keys it cached) becomes
``new[dest[i]]``, or is removed from the logical prefix when ``dest[i] < 0`` (a splice). Each
old block is then one of::

    kept      dest[i] == i and new[i] == old[i]        nothing to do
    dropped   new[dest[i]] < 0 <= old[i]               DROPPED: keys negated, KV freed
    rekeyed   any other new key or position            keys (and start) replaced; KV the
                                                       caller says moved (``rotates``)
                                                       is re-rotated
    removed   dest[i] < 0                              KV freed, out of the logical prefix

The plan (``plan_edit``, read only) finds the cached part of ``old`` and its kinds; the
apply (``apply_edit``) splits nodes where the kind or the shift changes and calls the tree's
``drop`` / ``rekey`` / ``remove_subtree``, which keep every counter. Branches hanging off a
changed node (or beyond the old path's end) hold keys no history can produce again (keys
name the drops and positions before them), so they are removed.

Nothing happens (``EditResult.applied`` False) when a running request holds any node the
edit would change: that request's keys must keep working. The history then misses at its new
keys and computes its KV again, which is always correct.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from .node import Node, Tier
from .paths import WalkHint
from .results import EvictResult
from .tree import RadixTree

KEPT, DROPPED, REKEYED, REMOVED = 0, 1, 2, 3


@dataclass
class EditResult:
    """What an edit did (sizes in blocks). ``freed`` holds every KV release (drops, spliced
    spans, unreachable branches): ``freed.freed_blocks`` GPU blocks, ``deleted_blocks`` in
    either tier."""

    applied: bool = True
    complete: bool = True  # the whole cached part of ``old`` now holds its new keys
    matched_blocks: int = 0  # blocks of ``old`` found in the tree
    dropped_blocks: int = 0  # blocks that became DROPPED
    rotated_blocks: int = 0  # blocks with KV (GPU or CPU) re-keyed to new positions
    removed_blocks: int = 0  # blocks taken out of the logical prefix (splice)
    freed: EvictResult = field(default_factory=lambda: EvictResult(ok=True))
    last: Node | None = None  # the deepest node of the edited path still in the tree


@dataclass(frozen=True)
class EditPlan:
    path: list[Node]  # nodes covering old[:matched], root-ward first
    partial: Node | None  # the node the match ends inside (split at ``matched``)
    partial_blocks: int
    matched: int
    kinds: np.ndarray  # per old block in [0, matched)
    first: int  # first block that changes (== matched: nothing to do)


def kinds_of(old: np.ndarray, new: np.ndarray, dest: np.ndarray) -> np.ndarray:
    """Per old block: KEPT, DROPPED, REKEYED or REMOVED (module docstring)."""
    n = len(old)
    kinds = np.full(n, REKEYED, dtype=np.int8)
    removed = dest < 0
    d = np.where(removed, 0, dest)
    target = new[d] if len(new) else np.zeros(n, np.int64)
    same = (~removed) & (d == np.arange(n)) & (target == old)
    kinds[same] = KEPT
    kinds[(~removed) & (target < 0) & (old >= 0)] = DROPPED
    kinds[removed] = REMOVED
    return kinds


def plan_edit(tree: RadixTree, old: np.ndarray, new: np.ndarray, dest: np.ndarray,
              hint: WalkHint | None = None) -> EditPlan:
    """Read-only: the cached part of ``old`` and what each of its blocks becomes."""
    path, partial, k, matched = tree.walk(old, stop_at_holes=False, hint=hint)
    # A history that no longer drops a block needs its KV: DROPPED nodes are never refilled,
    # so the edit stops there (the history misses and computes it again).
    d = dest[:matched]
    undrop = (old[:matched] < 0) & (d >= 0) & (new[np.maximum(d, 0)] >= 0)
    if undrop.any():
        matched = int(undrop.argmax())
        path, partial, k = _cut_path(path, partial, k, matched)
    kinds = kinds_of(old[:matched], new, dest[:matched])
    first = int(np.argmax(kinds != KEPT)) if matched else 0
    if matched and kinds[first] == KEPT:
        first = matched
    return EditPlan(path, partial, k, matched, kinds, first)


def _cut_path(path: list[Node], partial: Node | None, k: int, cut: int
              ) -> tuple[list[Node], Node | None, int]:
    """A walk result (whole nodes, the node it ends inside, blocks matched there) shortened
    to its first ``cut`` blocks (``cut`` below the matched length)."""
    whole: list[Node] = []
    for nd in [*path, partial] if partial is not None else path:
        end = nd.start + (k if nd is partial else len(nd.ids))
        if end <= cut:
            whole.append(nd)
        elif nd.start < cut:
            return whole, nd, cut - nd.start
        else:
            break
    return whole, None, 0


def _cuts(kinds: np.ndarray, dest: np.ndarray, rotates: np.ndarray, first: int) -> list[int]:
    """Block positions where a node must be cut, sorted: the first change, kind changes,
    shift changes (each node moves as one piece) and where re-rotation starts or stops
    (blocks before ``first`` are all kept: nothing to cut there)."""
    n = len(kinds)
    kd = kinds[first:n]
    shift = np.where(dest[first:n] < 0, -1, dest[first:n] - np.arange(first, n))
    rot = rotates[first:n]
    edge = (kd[1:] != kd[:-1]) | (shift[1:] != shift[:-1]) | (rot[1:] != rot[:-1])
    return [first, *(np.flatnonzero(edge) + (first + 1)).tolist()]


def apply_edit(tree: RadixTree, plan: EditPlan, new: np.ndarray, dest: np.ndarray,
               rotates: np.ndarray) -> EditResult:
    """Carry out ``plan`` (module docstring). The tree's counters change only in its own
    ``drop``/``rekey``/``remove_subtree``."""
    res = EditResult(matched_blocks=plan.matched)
    if plan.first >= plan.matched:
        res.last = plan.path[-1] if plan.path else None
        return res
    path = list(plan.path)
    if plan.partial is not None:
        path.append(plan.partial if plan.partial_blocks == len(plan.partial.ids)
                    else tree.split(plan.partial, plan.partial_blocks))
    first = plan.first
    h = 0  # the first node holding a block that changes: the nodes before it are kept
    while path[h].start + len(path[h].ids) <= first:
        h += 1
    if path[h].lock:
        res.applied = res.complete = False
        return res
    kinds = plan.kinds.tolist()
    cuts = _cuts(plan.kinds, dest, rotates, first)
    nodes: list[Node] = []
    for nd in path[h:]:
        end = nd.start + len(nd.ids)
        i = bisect_right(cuts, nd.start)
        while i < len(cuts) and cuts[i] < end:
            nodes.append(tree.split(nd, cuts[i] - nd.start))
            i += 1
        nodes.append(nd)
    parent: Node = path[h - 1] if h else tree.root
    res.last = path[h - 1] if h else None
    removed_top: Node | None = None
    for i, nd in enumerate(nodes):
        s = nd.start
        kind = kinds[s]
        nxt = nodes[i + 1] if i + 1 < len(nodes) else None
        if kind == KEPT:
            parent = res.last = nd
            continue
        if kind == REMOVED:
            removed_top = removed_top or nd
            res.removed_blocks += len(nd.ids)
            continue
        d = int(dest[s])
        ids = new[d : d + len(nd.ids)]
        clash = parent.children.get(ids.item(0))
        if d != parent.start + len(parent.ids):
            # New blocks come before it that the old path lacks (text that came back): it
            # cannot be placed; keys no history reaches any more, so it goes.
            _remove(tree, nd if removed_top is None else removed_top, res.freed)
            res.complete = False
            return res
        if clash is not None and clash is not nd:
            # The new version is cached already (made while this edit could not be
            # applied): the old copy can never be reached again.
            _remove(tree, nd if removed_top is None else removed_top, res.freed)
            res.complete = False
            return res
        if kind == REKEYED or nd.parent is not parent:
            if kind == REKEYED and nd.has_kv and rotates[s]:
                res.rotated_blocks += len(nd.ids)
            tree.rekey(nd, ids, d, parent)
        if removed_top is not None:
            _remove(tree, removed_top, res.freed)
            removed_top = None
        for child in [c for c in nd.children.values() if c is not nxt]:
            tree.remove_subtree(child, res.freed)  # keys no history can produce again
        if kind == DROPPED:
            res.dropped_blocks += len(nd.ids)
            tree.drop(nd, ids, res.freed)
        parent = nd
        if nd.parent is not None:
            res.last = nd
    if removed_top is not None:
        _remove(tree, removed_top, res.freed)
    return res


def _remove(tree: RadixTree, node: Node, result: EvictResult) -> None:
    """Remove a subtree unless moving its last child away already pruned it (KV-less)."""
    if node.parent is not None:
        tree.remove_subtree(node, result)


def edit_path(tree: RadixTree, old: np.ndarray, new: np.ndarray, dest: np.ndarray,
              rotates: np.ndarray | None = None, hint: WalkHint | None = None) -> EditResult:
    """Plan and apply one history's edit of its cached path (module docstring).
    ``rotates``: per old block, its position moves (its KV is re-rotated when re-keyed;
    default none). ``hint``: where the history's last walk of ``old`` ended; afterwards, the
    end of its new path."""
    old = np.asarray(old, dtype=np.int64)
    dest = np.asarray(dest, dtype=np.int64)
    rot = np.zeros(len(old), bool) if rotates is None else np.asarray(rotates, bool)
    if len(dest) != len(old) or len(rot) != len(old):
        raise ValueError(f"dest and rotates need {len(old)} entries, one per old key")
    plan = plan_edit(tree, old, new, dest, hint)
    res = apply_edit(tree, plan, np.asarray(new, np.int64), dest, rot)
    if plan.matched < len(old):
        res.complete = False
    if hint is not None:
        hint.point_at(res.last, tree.epoch)
    return res


__all__ = ["DROPPED", "KEPT", "REKEYED", "REMOVED", "EditPlan", "EditResult", "Tier",
           "apply_edit", "edit_path", "kinds_of", "plan_edit"]
