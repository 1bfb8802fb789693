"""Tail-optimized LRU (T-LRU; Zhang, Li, Moallemi, Peng, arXiv 2510.15152), as the
reference's two-line rule (SGLang ``TLRUStrategy``, python/sglang/srt/mem_cache/evict_policy.py).

A conversation of history length L whose next turn adds about ``q_hat`` tokens keeps its next
prefill under ``xi`` uncached tokens as long as its first ``B = max(0, L + q_hat - xi)`` tokens
stay cached. A node whose first token sits at a position >= B is *TEL-safe* (tail-excess-
latency safe): evicting it cannot push the next turn over ``xi``. The rule:

1. report TEL-safe nodes as infinitely old, so they go first (in LRU order among them);
2. everything else in plain LRU order.

L is the branch's *high-water* length (tokens): the longest history that ever ran through the
node, learned from replies (``Reply.context_tokens`` stamped on every node of the reply's
path), so it does not shrink as the tail is trimmed -- T-LRU stops after trimming a
conversation to B instead of walking it down to nothing. A split copies it to the new prefix
node (``on_split``), as SGLang's ``_split_node`` does. A node never on a reply path counts
its own end as L. Positions count holes as cached (SGLang has none).

Defaults: ``q_hat = 200`` tokens (vLLM PR #37825's ``--tlru-qhat-tokens``). The sources give
no default for ``xi`` (vLLM: off); kvsim assumes ``xi = 8192`` tokens, one SGLang prefill
chunk: a next turn that recomputes at most one chunk. Start and granularity are SGLang's
(tail, whole nodes): the rule judges whole nodes.
"""

from __future__ import annotations

from ..context import CacheNode, Reply
from ..eviction import NODE, TAIL
from ..registry import register_policy
from .common import ZooPolicy


@register_policy
class TailOptimizedLRU(ZooPolicy):
    """T-LRU: TEL-safe nodes first, then LRU (see module doc)."""

    name = "tlru"
    start, granularity = TAIL, NODE
    events = frozenset({"reply", "split"})
    xi: int = 8192  # tokens a next turn may recompute (the tail-latency threshold)
    q_hat: int = 200  # expected tokens a next turn adds

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.high_water: dict[int, int] = {}  # node serial -> longest history through it

    def on_reply(self, event: Reply) -> None:
        length, hw = event.context_tokens, self.high_water
        nd = event.leaf
        while nd is not None and nd.parent is not None:
            if hw.get(nd.serial, 0) < length:
                hw[nd.serial] = length
            nd = nd.parent

    def on_split(self, prefix: CacheNode, node: CacheNode) -> None:
        """SGLang's split copies the node's high water to the new prefix node."""
        hw = self.high_water.get(node.serial)
        if hw is not None:
            self.high_water[prefix.serial] = hw

    def budget(self, node: CacheNode) -> int:
        """B: the tokens of the node's branch to keep cached."""
        bs = self.context.block_size
        length = self.high_water.get(node.serial, node.end * bs)
        return max(0, length + self.q_hat - self.xi)

    def key(self, node: CacheNode) -> tuple[int, int]:
        tel_safe = node.start * self.context.block_size >= self.budget(node)
        return (0 if tel_safe else 1, node.last_access)
