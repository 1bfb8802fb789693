"""Context strategies: how a client manages its session's history on purpose (decisions only).

A strategy looks at a request's prompt (its blocks' content regions, ``traces.REGION_NAMES``)
and decides what to take out of the history; ``sim.context.session`` carries that out on the
keys, the cache and the bill. Nothing here knows the cache.

    full            the prompt as recorded (default; results identical to no strategy)
    trim:K          context engineering by text: tool results older than the last K are
                    removed from the prompt; prefix caching recomputes everything after the
                    first removed span
    summarize:T:S   past T prompt tokens the client asks for an S-token summary (a decode of
                    S tokens, charged) and sends the session prefix + summary + the last turn
                    instead (a full re-prefill of everything after the prefix)
    drop:K          AKV's rolling drop: the text is unchanged; the KV of tool results older
                    than the last K is dropped (never attended again, memory freed)
    drop:K+repos    the same, and the retained keys after each drop are repositioned
                    (compacted): re-rotated in place, positions freed for the context limit
    splice:K        Leyline's in-place splice: the text edit of trim:K, served by removing the
                    spans' KV and re-rotating what follows instead of recomputing it
    budget:B        MemDecay / SparseEngine pruning: at most B tokens of a session's KV stay
                    visible, chosen by region priority with decay; system, tool definitions,
                    the session's shared prefix and the last turn are pinned; the rest is
                    dropped (the logical prefix, and matching, are kept)

A "tool result" is a maximal run of ``tool_result`` blocks: one tool response, or the
responses of parallel tool calls sent together. Only what the trace labels counts: blocks of
histories the trace does not describe (``unknown``: 31.5% of cc-traces prompt tokens, the
histories 144 sessions were recorded with) are never trimmed or dropped, so for those sessions
every strategy removes less than a real client would.

kvsim prices serving only: it does not model what trimming, summarizing or dropping does to
the agent's task accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from costmodel.detmath import exp2
from costmodel.registry import Registry
from traces.regions import (
    REGION_ASSISTANT,
    REGION_NAMES,
    REGION_SYSTEM,
    REGION_TOOL_RESULT,
    REGION_TOOLS,
    REGION_UNKNOWN,
    REGION_USER,
)

ACCURACY_NOTE = ("kvsim prices serving only: it does not model what trimming, summarizing, "
                 "dropping or pruning does to task accuracy")

# budget:B (MemDecay-like): base priority and half-life (tokens appended since the block) per
# region. Assumptions, not MemDecay's numbers (its paper gives none for these regions; it
# measured ~10x longer attention half-lives for system text than for scratchpad): user text
# outlives tool output, replies sit between, histories the trace does not describe (unknown)
# are treated like user text. System prompt and tool definitions are pinned.
BUDGET_PRIORITY = {REGION_USER: 1.0, REGION_ASSISTANT: 0.6, REGION_TOOL_RESULT: 0.5,
                   REGION_UNKNOWN: 0.8}
BUDGET_HALF_LIFE = {REGION_USER: 65536, REGION_ASSISTANT: 16384, REGION_TOOL_RESULT: 8192,
                    REGION_UNKNOWN: 32768}
PINNED_REGIONS = (REGION_SYSTEM, REGION_TOOLS)
# the same, indexed by region code (what ``budget_drops`` looks up per block)
_PRIORITY_BY_REGION = np.array([BUDGET_PRIORITY.get(g, 1.0) for g in range(len(REGION_NAMES))])
_HALF_LIFE_BY_REGION = np.array([BUDGET_HALF_LIFE.get(g, 32768)
                                 for g in range(len(REGION_NAMES))], dtype=np.float64)


class ContextError(ValueError):
    """A malformed ``--context`` value (bad user input: exit status 2)."""

    exit_code = 2


@dataclass(frozen=True)
class Strategy:
    """One parsed strategy. ``keep``: tool results kept (trim, drop, splice); ``threshold``
    and ``summary_tokens`` (summarize); ``budget`` tokens; ``repos`` (drop)."""

    kind: str = "full"
    keep: int = 0
    threshold: int = 0
    summary_tokens: int = 0
    budget: int = 0
    repos: bool = False

    @property
    def label(self) -> str:
        if self.kind == "full":
            return "full"
        if self.kind == "summarize":
            return f"summarize:{self.threshold}:{self.summary_tokens}"
        if self.kind == "budget":
            return f"budget:{self.budget}"
        return f"{self.kind}:{self.keep}{'+repos' if self.repos else ''}"

    @property
    def is_full(self) -> bool:
        return self.kind == "full"

    @property
    def edits_kv(self) -> bool:
        """Changes KV in the cache (drop, reposition, splice, prune)."""
        return self.kind in ("drop", "splice", "budget")

    @property
    def drops(self) -> bool:
        return self.kind in ("drop", "budget")

    @property
    def removes_text(self) -> bool:
        """The prompt text loses the stale tool results (trim, splice)."""
        return self.kind in ("trim", "splice")


def _int(text: str, what: str, spec: str, minimum: int) -> int:
    t = text.strip().lower()
    mult = 1
    if t.endswith("k"):
        t, mult = t[:-1], 1024
    try:
        v = float(t) * mult
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v != int(v) or v < minimum:
        raise ContextError(f"bad context strategy {spec!r}: {what} must be an integer >= "
                           f"{minimum}, got {text!r}")
    return int(v)


def _keep(kind: str) -> Callable[[str, str], Strategy]:
    """trim:K, splice:K: the K newest tool results stay."""
    return lambda rest, spec: Strategy(kind, keep=_int(rest, "K (tool results kept)", spec, 1))


def _drop(rest: str, spec: str) -> Strategy:
    arg, plus, extra = rest.partition("+")
    if plus and extra.strip().lower() != "repos":
        raise ContextError(f"bad context strategy {spec!r}: only '+repos' may follow drop:K")
    return Strategy("drop", keep=_int(arg, "K (tool results kept)", spec, 1), repos=bool(plus))


def _budget(rest: str, spec: str) -> Strategy:
    return Strategy("budget", budget=_int(rest, "B (tokens)", spec, 1))


def _summarize(rest: str, spec: str) -> Strategy:
    parts = rest.split(":")
    if len(parts) != 2:
        raise ContextError(f"bad context strategy {spec!r}: summarize takes T:S (threshold "
                           "and summary tokens)")
    t = _int(parts[0], "T (threshold tokens)", spec, 1)
    s = _int(parts[1], "S (summary tokens)", spec, 1)
    if s >= t:
        raise ContextError(f"bad context strategy {spec!r}: the summary (S = {s}) must be "
                           f"shorter than the threshold (T = {t})")
    return Strategy("summarize", threshold=t, summary_tokens=s)


# kind -> parser of what follows ``KIND:`` (``full`` takes nothing)
STRATEGIES: Registry[Callable[[str, str], Strategy]] = Registry("context strategy",
                                                               ContextError)
STRATEGIES.register("full", lambda rest, spec: Strategy())
STRATEGIES.register("trim", _keep("trim"))
STRATEGIES.register("summarize", _summarize)
STRATEGIES.register("drop", _drop)
STRATEGIES.register("splice", _keep("splice"))
STRATEGIES.register("budget", _budget)
KINDS = STRATEGIES.names()
USAGE = "expected full, trim:K, summarize:T:S, drop:K, drop:K+repos, splice:K or budget:B"


def parse_context(text: str | None) -> Strategy:
    """``full`` | ``trim:K`` | ``summarize:T:S`` | ``drop:K`` | ``drop:K+repos`` |
    ``splice:K`` | ``budget:B`` (sizes accept ``64k``); ContextError names what is wrong."""
    spec = "full" if text is None else str(text).strip()
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in STRATEGIES:
        raise ContextError(f"bad context strategy {spec!r}: {STRATEGIES.message(kind)} "
                           f"({USAGE})")
    if bool(rest) != (kind != "full"):  # full takes no argument, the others one
        raise ContextError(f"bad context strategy {spec!r}: {USAGE}")
    return STRATEGIES.get(kind)(rest, spec)


# --- decisions ----------------------------------------------------------------------------
def context_problem(cfg) -> tuple[str, str] | None:
    """``(field, why)`` when a run config's (``sim.config.RunConfig``) context strategy cannot
    run with the rest of it (its engine, CPU tier, replay); None when it can. The run's check
    (sim/run/check.py) turns the answer into a ConfigError (exit status 2)."""
    if not isinstance(cfg.context.strategy, str):
        return "context", f"must be a strategy name, got {cfg.context.strategy!r}"
    try:
        st = parse_context(cfg.context.strategy)
    except ContextError as e:
        return "context", str(e)
    if not st.is_full and cfg.engine.name != "sglang":
        return "context", (f"{st.label} runs on the sglang engine (its radix tree keeps "
                           "edited and dropped KV apart by history); use --engine sglang")
    if st.edits_kv and cfg.cache.cpu_cache and cfg.cache.tiering == "hicache":
        return "context", (f"{st.label} edits cached KV, which is not modelled with "
                           "HiCache host copies: use tiering unified or no CPU tier")
    if st.kind == "summarize" and cfg.traffic.replay == "open":
        return "context", ("summarize needs the closed loop (the turn waits for its "
                           "summarization call)")
    return None


def mask_runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[starts, ends) of the maximal runs of True in the bool array ``mask`` (int64)."""
    edge = np.diff(np.concatenate(([False], mask, [False])).astype(np.int8))
    return np.flatnonzero(edge == 1).astype(np.int64), np.flatnonzero(edge == -1).astype(
        np.int64)


def tool_spans(regions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block ranges [starts, ends) of the tool results (maximal ``tool_result`` runs)."""
    is_tool = np.asarray(regions) == REGION_TOOL_RESULT
    if not is_tool.any():
        empty = np.zeros(0, np.int64)
        return empty, empty
    return mask_runs(is_tool)


def stale_tool_mask(regions: np.ndarray, keep: int, limit: int,
                    spans: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Blocks of tool results older than the ``keep`` newest, among blocks ``< limit`` (the
    part of the prompt a strategy may touch); a bool mask over the prompt's blocks.
    ``spans``: ``tool_spans(regions)`` when the caller has it."""
    starts, ends = tool_spans(regions) if spans is None else spans
    if len(starts) <= keep:
        return np.zeros(len(regions), dtype=bool)
    edge = np.zeros(len(regions) + 1, dtype=np.int64)
    edge[starts[:-keep]] += 1  # tool results never touch: the indices are distinct
    edge[ends[:-keep]] -= 1
    mask = np.cumsum(edge[:-1]) > 0
    mask[limit:] = False
    return mask


def keep_removed(regions: np.ndarray, keep: int, limit: int,
                 spans: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Blocks an earlier removal may still hold out: all but the ``keep`` newest tool
    results (a bool mask; an edited prompt can make old removed text part of them).
    ``spans``: ``tool_spans(regions)`` when the caller has it."""
    starts, ends = tool_spans(regions) if spans is None else spans
    mask = np.ones(len(regions), dtype=bool)
    for s, e in zip(starts[-keep:].tolist(), ends[-keep:].tolist(), strict=True):
        mask[s:e] = False
    mask[limit:] = True
    return mask


def budget_drops(regions: np.ndarray, visible: np.ndarray, pinned: np.ndarray,
                 budget_blocks: int, block_end_tokens: np.ndarray, now_tokens: int
                 ) -> np.ndarray:
    """Blocks to drop now so that at most ``budget_blocks`` stay visible: the lowest scores
    among visible, unpinned blocks, score = priority(region) * 0.5 ** (age / half-life),
    age = tokens appended since the block ended; ties: the older block first. A bool mask."""
    out = np.zeros(len(regions), dtype=bool)
    excess = int(visible.sum()) - budget_blocks
    cand = np.flatnonzero(visible & ~pinned)
    if excess <= 0 or cand.size == 0:
        return out
    reg = regions[cand]
    age = np.maximum(0, now_tokens - block_end_tokens[cand]).astype(np.float64)
    decay = np.array([exp2(v) for v in (-age / _HALF_LIFE_BY_REGION[reg]).tolist()])
    score = _PRIORITY_BY_REGION[reg] * decay  # scalar exp2: the same bits on every CPU
    order = np.lexsort((cand, score))  # lowest score first, then position
    out[cand[order[:excess]]] = True
    return out
