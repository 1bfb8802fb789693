"""Request streams for the differential router tests (tests/test_routers_real_*.py) and the
chained ids kvsim sees for them.

A stream is a list of operations: ``("send", rid, tokens)`` routes a prompt and holds it in
flight, ``("release", rid)`` ends it, ``("tick",)`` lets one eviction interval pass. Streams
are seeded and bounded (a few hundred decisions each).
"""

from __future__ import annotations

import numpy as np


class ChainIds:
    """Chained ids of ``block``-token blocks: equal ids at a position mean an equal prefix up
    to there (the block hashes a real router computes)."""

    def __init__(self, block: int) -> None:
        self.block = block
        self.ids: dict[tuple[int, tuple[int, ...]], int] = {}

    def __call__(self, tokens) -> np.ndarray:
        out, parent = [], -1
        for i in range(len(tokens) // self.block):
            key = (parent, tuple(tokens[i * self.block:(i + 1) * self.block]))
            parent = self.ids.setdefault(key, len(self.ids))
            out.append(parent)
        return np.asarray(out, dtype=np.int64)


FILLER = 60_000


class Tokens:
    """Fresh token ids (below the renderer's limit)."""

    def __init__(self, start: int = 1) -> None:
        self.next = start

    def take(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        if self.next > FILLER:
            raise ValueError("stream uses too many distinct tokens for the renderer")
        return out

    def tail(self, n: int) -> list[int]:
        """``n`` tokens no other prompt has after the same prefix: one fresh token, then
        filler (text after a difference never matches anyway)."""
        return self.take(1) + [FILLER + i % 997 for i in range(n - 1)] if n else []


def agent_sessions(seed: int = 0, sessions: int = 12, active: int = 5, turns: int = 8):
    """Multi-turn agent sessions sharing a system prompt, closed loop: at most ``active``
    sessions run at once; at each step a random running session either ends its request in
    flight or sends its next turn (its history plus a tool result and a question of random
    length), so several requests overlap but a session waits for its own reply."""
    rng = np.random.default_rng(seed)
    tok = Tokens()
    system = tok.take(1500)
    ops, hist, left, flying, live = [], {}, {}, {}, []
    queue = list(range(sessions))
    rid = 0
    while queue or live:
        while queue and len(live) < active:
            s = queue.pop(0)
            hist[s] = system + tok.take(int(rng.integers(50, 400)))
            left[s] = turns
            live.append(s)
        s = live[int(rng.integers(len(live)))]
        if s in flying:
            ops.append(("release", flying.pop(s)))
            if left[s] == 0:
                live.remove(s)
            else:
                hist[s] = hist[s] + tok.tail(int(rng.integers(20, 600)))
            continue
        key = f"a{rid}"
        rid += 1
        ops.append(("send", key, list(hist[s])))
        flying[s] = key
        left[s] -= 1
    return ops


def many_in_flight(seed: int = 1, sessions: int = 48, rounds: int = 4):
    """Many sessions in flight at once: every session sends, all stay held, then random
    releases and next turns (loads in the tens: the count-pressure gate's ground)."""
    rng = np.random.default_rng(seed)
    tok = Tokens()
    system = tok.take(800)
    docs = [tok.take(1200) for _ in range(3)]
    hist = {s: system + docs[s % 3] + tok.take(int(rng.integers(10, 200)))
            for s in range(sessions)}
    ops, live, rid = [], {}, 0
    for s in range(sessions):
        key = f"m{rid}"
        rid += 1
        ops.append(("send", key, list(hist[s])))
        live[s] = key
    for _ in range(rounds):
        order = rng.permutation(sessions).tolist()
        for s in order:
            ops.append(("release", live[s]))
            hist[s] = hist[s] + tok.tail(int(rng.integers(10, 300)))
            key = f"m{rid}"
            rid += 1
            ops.append(("send", key, list(hist[s])))
            live[s] = key
    ops.extend(("release", k) for k in live.values())
    return ops


def shared_document(seed: int = 2, requests: int = 160, doc: int = 600):
    """Prompts sharing about 30% of their length with one of a few documents: the hit/miss
    threshold decides, and whole blocks versus exact characters flip it near 0.3."""
    rng = np.random.default_rng(seed)
    tok = Tokens()
    docs = [tok.take(doc) for _ in range(4)]
    ops, held = [], []
    for i in range(requests):
        d = docs[int(rng.integers(len(docs)))]
        rest = int(doc * float(rng.uniform(1.9, 2.5)))  # doc share 0.29..0.34
        key = f"d{i}"
        ops.append(("send", key, d + tok.tail(rest)))
        held.append(key)
        if len(held) > 6:
            ops.append(("release", held.pop(int(rng.integers(len(held))))))
    ops.extend(("release", k) for k in held)
    return ops


def burst(seed: int = 3, requests: int = 150, doc: int = 6000):
    """A burst on one document: ``requests`` prompts, the document and a short question of
    its own each, all in flight at once."""
    rng = np.random.default_rng(seed)
    tok = Tokens()
    d = tok.take(doc)
    return [("send", f"b{i}", d + tok.tail(int(rng.integers(8, 40))))
            for i in range(requests)]


def evicting(seed: int = 4, docs: int = 10, block: int = 64, phases: int = 3):
    """A fleet whose router tree evicts: documents of whole blocks (so characters and
    blocks count alike), re-asked in later phases after the tree was trimmed."""
    rng = np.random.default_rng(seed)
    tok = Tokens()
    pages = [tok.take(block * int(rng.integers(4, 9))) for _ in range(docs)]
    ops, rid = [], 0
    for _ in range(phases):
        for d in rng.permutation(docs).tolist():
            key = f"e{rid}"
            rid += 1
            ops.append(("send", key, pages[d] + tok.take(block)))
            ops.append(("release", key))
        ops.append(("tick",))
    return ops
