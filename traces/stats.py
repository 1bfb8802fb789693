"""Trace characterization (``kvsim trace stats``).

Request-level figures are over MAIN-agent requests (top-level sessions); sub-agent sessions and
requests are counted in their own fields. Definitions:
- append-only fraction: among main requests that have a previous request in their session, the
  share whose prompt starts with ALL full blocks of the previous prompt;
- infinite-cache block hit rate (kvsim's, as the engines cache): an unbounded cache that keeps
  every FULL prompt block ever sent (in trace order, all sessions, sub-agents included) hits
  this share of main-agent prompt blocks; a prompt's partial last block is never cached, and
  the blocks of decoded output are not counted (``kvsim capacity``'s ideal adds them); with
  chained ids a prompt's cached blocks form a prefix, found by binary search;
- hash-id hit rate (the publisher's): the same unbounded cache over the ids the trace file
  lists, in its own block size, a partial last block's included, over every request: each
  distinct id misses once. Mooncake's and Dynamo's docs quote this figure for their traces;
  None for a format without ids (synthetic, TraceLab);
- gap medians: recorded waits before main requests, by gap kind (tool result / human message);
- shared prefix: per top-level session, the blocks of its first prompt in the global shared
  prefix (0 unless loaded with --shared-prefix); ``prefix_hint_tokens`` is system + tool tokens
  where the trace records them;
- regions (traces.regions): tokens of each region over every prompt block of the trace
  (main agents and sub-agents, each request's full blocks, so a block held by k prompts counts
  k times) and over distinct blocks (each block id once), as block counts x block size, with
  their shares (each set sums to 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .kinds import GAP_HUMAN, GAP_TOOL
from .regions import REGION_NAMES

if TYPE_CHECKING:
    from .model import Trace


def _q(a: np.ndarray, q: float) -> float | None:
    return float(np.percentile(a, q)) if a.size else None


def _median(a: np.ndarray) -> float | None:
    return float(np.median(a)) if a.size else None


def region_stats(trace: Trace) -> dict[str, Any]:
    """Tokens (blocks x block size) and shares per region, over prompts and distinct blocks."""
    prompts, distinct = trace.region_blocks()
    bs = trace.block_size

    def shares(a: np.ndarray) -> dict[str, float | None]:
        tot = int(a.sum())
        return {n: (float(a[g] / tot) if tot else None) for g, n in enumerate(REGION_NAMES)}

    return {
        "prompt_tokens": {n: int(prompts[g]) * bs for g, n in enumerate(REGION_NAMES)},
        "prompt_share": shares(prompts),
        "distinct_tokens": {n: int(distinct[g]) * bs for g, n in enumerate(REGION_NAMES)},
        "distinct_share": shares(distinct),
    }


def trace_stats(trace: Trace, gap_model: str = "recorded") -> dict[str, Any]:
    """The stats document; gap figures are under ``gap_model`` (recorded by default)."""
    main = trace.main_mask()
    top = [s for s in trace.sessions if s.parent < 0]
    subs = [s for s in trace.sessions if s.parent >= 0]
    p = trace.prompt_tokens[main]
    o = trace.output_tokens[main]
    bs = trace.block_size
    n_blocks = trace.prompt_tokens // bs
    # append-only: previous request of the same session, main agent
    has_prev = np.zeros(len(trace), bool)
    has_prev[1:] = trace.session[1:] == trace.session[:-1]
    idx = np.flatnonzero(has_prev & main)
    append = trace.prefix_blocks[idx] >= n_blocks[idx - 1]
    shrink = trace.prompt_tokens[idx] < trace.prompt_tokens[idx - 1]
    grow = trace.prompt_tokens[idx] - trace.prompt_tokens[idx - 1] - trace.output_tokens[idx - 1]
    hits = trace.infinite_cache_hits()
    tot_blocks = int(n_blocks[main].sum())
    gaps = trace.gaps(gap_model)[main]
    kinds = trace.gap_kind[main]
    per_session = np.array([s.count for s in top], np.int64)
    first_prompt = np.array([trace.prompt_tokens[s.first] for s in top], np.int64)
    shared = np.array([s.shared_prefix_blocks * bs for s in top], np.int64)
    hints = np.array([s.prefix_hint_tokens for s in top], np.int64)
    dur = np.array([trace.send_time_s[s.first + s.count - 1] - trace.send_time_s[s.first]
                    for s in top], np.float64)
    return {
        "name": trace.name,
        "format": trace.format,
        "block_size": bs,
        "sessions": len(top),
        "requests": int(main.sum()),
        "subagent_sessions": len(subs),
        "subagent_requests": int((~main).sum()),
        "skipped": trace.skipped,
        "prompt_tokens": {"median": _median(p), "p90": _q(p, 90),
                          "max": int(p.max()) if p.size else None,
                          "mean": float(p.mean()) if p.size else None},
        "first_prompt_tokens_median": _median(first_prompt),
        "output_tokens": {"median": _median(o), "p90": _q(o, 90),
                          "mean": float(o.mean()) if o.size else None},
        "append_only_fraction": float(append.mean()) if append.size else None,
        "shrink_fraction": float(shrink.mean()) if shrink.size else None,
        "append_tokens_median": _median(grow[append]) if append.size else None,
        "infinite_cache_block_hit_rate": (float(hits[main].sum() / tot_blocks)
                                          if tot_blocks else None),
        "hash_id_hit_rate": (float(trace.hash_id_hits() / trace.hash_id_refs)
                             if trace.hash_id_refs else None),
        "hash_id_references": trace.hash_id_refs,
        # every request (sub-agents too), over prompt tokens: `kvsim capacity`'s ideal
        "infinite_cache_hit_rate": (float(int(hits.sum()) * bs / int(trace.prompt_tokens.sum()))
                                    if int(trace.prompt_tokens.sum()) else None),
        "shared_prefix": {"tokens_median": _median(shared),
                          "sessions_sharing": int((shared > 0).sum()),
                          "prefix_hint_tokens_median": _median(hints)},
        "gap_model": gap_model,
        "gap_s": {"tool_median": _median(gaps[kinds == GAP_TOOL]),
                  "human_median": _median(gaps[kinds == GAP_HUMAN]),
                  "tool_fraction": (float((kinds == GAP_TOOL).sum() / max(1, (kinds > 0).sum())))
                  if kinds.size else None},
        "requests_per_session": {"median": _median(per_session),
                                 "mean": float(per_session.mean()) if per_session.size else None,
                                 "max": int(per_session.max()) if per_session.size else None},
        "session_duration_s_median": _median(dur[np.isfinite(dur)]),
        "distinct_blocks": trace.distinct_blocks,
        "block_references": int(n_blocks.sum()),
        "regions": region_stats(trace),
        "models": trace.models,
        "options": trace.options,
    }
