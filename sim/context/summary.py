"""Summarization (``summarize:T:S``): past T prompt tokens the client asks for an S-token
summary, then sends the session prefix, the summary and the last turn; the summary and
everything after it are new keys (a full re-prefill). A session's summary state is its own
object (``SessionSummary``), held by ``SessionState``."""

from __future__ import annotations

import numpy as np

from sim.kvcache.versions import VersionSpace, encode

from .strategies import Strategy
from .view import RequestView


class SessionSummary:
    """One session's summary: ``summary`` = (cut block, vid of the summary blocks, vid of
    the blocks after the cut, summary blocks), None before the first; ``summaries`` made."""

    def __init__(self, strategy: Strategy, space: VersionSpace, bs: int, sid: int) -> None:
        self.st, self.space, self.bs, self.sid = strategy, space, bs, sid
        self.summary: tuple[int, int, int, int] | None = None
        self.summaries = 0

    def layout(self, raw: np.ndarray, prefix_blocks: int) -> np.ndarray:
        """Keys of ``raw`` under the current summary: the session prefix, the summary's
        blocks, then the original blocks from the summary's cut on."""
        if self.summary is None:
            return raw
        c0, vs, vc, nb = self.summary
        return np.concatenate([raw[:prefix_blocks], encode(np.arange(nb, dtype=np.int64), vs),
                               encode(raw[c0:], vc)])

    def orig(self, n: int, prefix_blocks: int) -> np.ndarray:
        """Original index of each logical block (-1: a summary block)."""
        if self.summary is None:
            return np.arange(n, dtype=np.int64)
        c0, _, _, nb = self.summary
        return np.concatenate([np.arange(prefix_blocks, dtype=np.int64),
                               np.full(nb, -1, np.int64), np.arange(c0, n, dtype=np.int64)])

    def tokens(self, prompt_tokens: int, prefix_blocks: int) -> int:
        if self.summary is None:
            return prompt_tokens
        c0, _, _, nb = self.summary
        return (prefix_blocks + nb - c0) * self.bs + prompt_tokens

    def summarize(self, view: RequestView, raw: np.ndarray, regions: np.ndarray,
                  finish_raw: np.ndarray, k: int, lk: int, prefix_blocks: int,
                  prev_prompt_blocks: int) -> list[RequestView]:
        """Fill ``view`` under the session's summary; past the threshold, first a
        summarization call (returned) and a new summary: prefix + summary + the last turn
        (the previous reply and the new input, from the previous prompt's last full block,
        ``prev_prompt_blocks``)."""
        st, bs = self.st, self.bs
        p = view.prompt_tokens
        if self.summary is not None and k < self.summary[0]:
            self.summary = None  # the trace replaced the history the summary stood for
        pre: list[RequestView] = []
        cur = self.tokens(p, prefix_blocks)
        nb = -(-st.summary_tokens // bs)
        c0 = min(prev_prompt_blocks, len(raw))
        after = (prefix_blocks + nb - c0) * bs + p
        if cur > st.threshold and c0 > prefix_blocks and after < cur:
            ids = self.layout(raw, prefix_blocks)
            n_f = (cur + st.summary_tokens - 1) // bs
            out = encode(np.arange(n_f - len(ids), dtype=np.int64),
                         self.space.vid(("summary-call", self.sid, self.summaries)))
            call = RequestView("summary", view.rid, ids, cur, st.summary_tokens,
                               np.concatenate([ids, out]))
            call.regions = regions[:len(ids)] if self.summary is None else None
            pre.append(call)
            self.summaries += 1
            self.summary = (c0, self.space.vid(("summary", self.sid, self.summaries)),
                            self.space.vid(("summary-cont", self.sid, self.summaries)), nb)
            lo = prefix_blocks + nb
            view.reprefill_blocks = (lo, lo + max(0, lk - c0))
        view.ids = self.layout(raw, prefix_blocks)
        view.finish = self.layout(finish_raw, prefix_blocks)
        view.prompt_tokens = self.tokens(p, prefix_blocks)
        return pre
