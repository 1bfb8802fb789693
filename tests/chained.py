"""Chained block ids for the cache state machines, and agentic prompt drawing."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st


class Universe:
    """Chained block ids: the id of (path prefix) is unique, so ids agree iff prefixes do."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, ...], int] = {}
        self.parent: dict[int, int | None] = {}
        self.pos: dict[int, int] = {}

    def prompt(self, choices: list[int]) -> np.ndarray:
        out = []
        for i in range(len(choices)):
            key = tuple(choices[: i + 1])
            if key not in self.ids:
                bid = len(self.ids) + 1
                self.ids[key] = bid
                self.parent[bid] = out[-1] if out else None
                self.pos[bid] = i
            out.append(self.ids[key])
        return np.array(out, dtype=np.int64)


def draw_prompt(data, universe: Universe, history: list[list[int]], more: st.SearchStrategy,
                max_len: int) -> np.ndarray:
    """Agentic traffic: usually a previous prompt (cut somewhere) plus new blocks."""
    choices: list[int] = []
    if history and data.draw(st.integers(0, 3)) > 0:
        base = data.draw(st.sampled_from(history))
        choices = base[: data.draw(st.integers(0, len(base)))]
    choices = (choices + data.draw(more))[:max_len] or [0]
    history.append(choices)
    return universe.prompt(choices)


def ids(*xs: int) -> np.ndarray:
    """Block ids as the cache takes them: an int64 array."""
    return np.array(xs, dtype=np.int64)


def joined(*parts) -> np.ndarray:
    """The block ids of ``parts`` (lists of ids) one after the other, as one int64 array."""
    return np.array([x for part in parts for x in part], dtype=np.int64)


def runs(parts: list[np.ndarray]) -> list[list[int]]:
    """Runs of block ids as lists, to compare."""
    return [p.tolist() for p in parts]


def freed(result) -> list[list[int]]:
    """The runs an eviction (or an insert that made room) freed, as lists."""
    return runs(result.freed)
