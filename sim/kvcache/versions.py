"""The versioned key space: how KV made under different edit histories stays apart.

Cache engineering (AKV's ``drop``/``repos``, Leyline's splice) changes KV without changing
the text, and the KV a token gets depends on what it could attend to when it was computed
(AKV's history dependence, its Figure 5). kvsim keeps versions apart in the KEY of every
block, as AKV does with drop/repos records in its radix key:

    key = raw                        no edit before the block: the trace's own id
    key = raw + (vid << RAW_BITS)    an edited history: vid names it (``VersionSpace``)
    ~key = -1 - key                  the block's KV was DROPPED by its history (negative)

``vid`` names everything that decided the block's KV: the edits that took effect before the
block was computed (a drop's trigger at or before it), and, for repositioned or spliced KV, the
position its keys are rotated to now. Raw ids are chained (an id implies its prefix), vids are
chained in the edit history, so equal keys mean equal KV. A dropped block's key carries the
drop itself: only a history that dropped it reaches its DROPPED node, which holds no KV and is
never refilled; a history that did not drop it misses there and computes its own copy.

AKV's three trajectories (Figure 5), raw blocks A B C D, each one block::

    (1) A B C, then drop A after C, then D     keys  ~A  B  C      D@v1
    (2) A B, drop A after B, then C            keys  ~A  B  C@v2
    (3) B alone, then C                        keys  B'  C'       (B at position 0: another
                                                                   raw id, the chain differs)
    root
     |-- ~A                DROPPED: (1) and (2) both dropped A; no KV
     |    `-- B            made with A visible, before either drop: shared by (1) and (2)
     |         |-- C       (1): made before its drop, A visible: the plain key
     |         |    `-- D@v1   (1): made after "drop A after C": a new version
     |         `-- C@v2    (2): made after "drop A after B": never saw A
     `-- B'                (3): a different prefix, nothing shared
          `-- C'

A history's edit is applied to the tree before its request is matched (``edits``): the path
it cached is re-keyed in place (a drop frees the dropped node's KV and negates its keys; a
reposition or splice re-keys, and re-rotates, the retained KV that moved), so the next
request of that history finds its KV under the new keys.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from .node import Node
from .tree import RadixTree

RAW_BITS = 40  # raw trace ids stay below 2**40 (cc-traces: under 2**20)
RAW_LIMIT = 1 << RAW_BITS
VID_LIMIT = 1 << (62 - RAW_BITS)


class VersionSpace:
    """Names edit histories with small ints (vid 0: no edit), in first-use order, so a run
    stays a pure function of its inputs. One space per run."""

    def __init__(self) -> None:
        self._vids: dict[Hashable, int] = {}

    def vid(self, desc: Hashable) -> int:
        """The vid of a version description (any hashable, e.g. (parent vid, edit))."""
        v = self._vids.get(desc)
        if v is None:
            v = len(self._vids) + 1
            if v >= VID_LIMIT:
                raise OverflowError("more edit versions than the key space holds")
            self._vids[desc] = v
        return v

    def __len__(self) -> int:
        return len(self._vids)


def encode(raw: np.ndarray, vid: np.ndarray | int, dropped: np.ndarray | bool = False,
           check: bool = True) -> np.ndarray:
    """Keys of blocks with raw ids ``raw`` under versions ``vid`` (per block or one for all),
    negated where ``dropped``. ``check=False``: the caller knows the raw ids are in range."""
    raw = np.asarray(raw, dtype=np.int64)
    if check and raw.size and (int(raw.min()) < 0 or int(raw.max()) >= RAW_LIMIT):
        raise ValueError(f"raw block ids must lie in [0, 2**{RAW_BITS})")
    keys = raw + (np.asarray(vid, dtype=np.int64) << RAW_BITS)
    if dropped is False:
        return keys
    return np.where(dropped, -1 - keys, keys)


def is_dropped(keys: np.ndarray) -> np.ndarray:
    return keys < 0


def raw_of(keys: np.ndarray) -> np.ndarray:
    """The raw trace ids under ``keys`` (dropped or not)."""
    keys = np.asarray(keys, dtype=np.int64)
    plain = np.where(keys < 0, -1 - keys, keys)
    return plain & (RAW_LIMIT - 1)


def add_versioned(tree: RadixTree, parent: Node, ids: np.ndarray, pos: int, tick: int,
                  path: list[Node]) -> Node:
    """Insert ``ids[pos:]`` below ``parent`` as alternating runs: dropped keys become
    DROPPED nodes (no KV), the others GPU leaves. A trailing dropped run is not inserted
    (nothing after it needs it). New nodes are appended to ``path``; returns the deepest."""
    tail = ids[pos:]
    neg = tail < 0
    if not neg.any():
        node = tree.add_leaf(parent, tail, pos, tick)
        path.append(node)
        return node
    cuts = np.flatnonzero(neg[1:] != neg[:-1]) + 1
    starts = [0, *cuts.tolist()]
    ends = [*cuts.tolist(), len(tail)]
    node = parent
    for a, b in zip(starts, ends, strict=True):
        run = tail[a:b]
        if neg[a]:
            if b == len(tail):
                break
            node = tree.add_dropped(node, run, pos + a, tick)
        else:
            node = tree.add_leaf(node, run, pos + a, tick)
        path.append(node)
    return node
