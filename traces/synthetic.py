"""Synthetic agent traces, deterministic by seed: ``synthetic:NAME[?key=value&...]``.

NAME: ``claude-code`` (fitted to the published cc-traces, docs/traces.md), ``codex`` and
``chat`` (assumed shapes, see their profiles); ``prefix-groups`` is an open-loop shared-prefix
workload with its own parameters (traces.prefix_groups). Keys: ``sessions`` (default 16, the
``make demo`` size), ``seed`` (overrides the seed argument), ``max_requests`` (cap per
session), ``subagents`` (0 disables sub-agents); a key given twice is refused. Example:
``synthetic:claude-code?sessions=360&seed=3``.

Model of one session (per request, never per token):
- requests per session, the first prompt (system + tool definitions + first message), outputs
  and gaps are lognormal (median, sigma of the log) fitted on the real set;
- each next request is an append (prompt = previous prompt + previous output + new content;
  with probability ``p_no_output`` only part of the output comes back, as when thinking is
  stripped), an edit (the last few blocks of the previous prompt change, then new content),
  or, above ``compact_above`` tokens, a compaction (keep the system + tool prefix, replace the
  history by a summary);
- the gap before a request is a tool wait (probability ``p_tool``) or a human wait;
- sub-agents (claude-code) are spawned after a reply with probability ``p_subagent`` and run
  their own shorter sessions; the parent's next request waits for them.
Ids are fresh per block and chained, local to the session (its sub-agents share its scope);
``--shared-prefix auto`` shares each session's system + tool prefix across sessions.
Regions (traces.regions) follow the same structure: the prefix is tool definitions then the
system prompt (``system_share`` of it), the first message (above 16K tokens: an undescribed
history, ``unknown``, as in cc-traces) and human turns are ``user``, tool
waits bring ``tool_result``, a compaction summary is ``user``, replies come back as
``assistant``. They draw no random numbers: ids and times are the same with or without them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from costmodel import detmath
from costmodel.registry import Registry, unknown

from . import prefix_groups
from .builder import TraceBuilder
from .errors import OptionError
from .kinds import GAP_HUMAN, GAP_TOOL, kinds_mask
from .regions import (
    REGION_SYSTEM,
    REGION_TOOL_RESULT,
    REGION_TOOLS,
    REGION_USER,
    first_input_region,
)
from .spec import query_items


@dataclass(frozen=True)
class Profile:
    """Lognormal parameters are (median, sigma of log)."""

    requests: tuple[float, float]
    prefix: tuple[float, float]  # system + tool-definition tokens
    first_message: tuple[float, float]  # first prompt minus the prefix
    output: tuple[float, float]
    append: tuple[float, float]  # new tokens beyond the previous output
    tool_gap: tuple[float, float]
    human_gap: tuple[float, float]
    p_tool: float  # share of requests that follow a tool result
    p_edit: float  # share of requests that rewrite the tail of the previous prompt
    edit_drop_blocks: tuple[int, int]  # blocks of the previous prompt an edit changes
    p_no_output: float  # share of appends that carry only part of the previous output
    compact_above: int  # tokens above which compaction may happen
    p_compact: float  # per-request compaction probability above that size
    summary: tuple[float, float]  # tokens after a compaction, beyond the prefix
    max_requests: int = 2000
    hard_limit: int = 10**9  # a compaction always happens before a prompt exceeds this
    p_subagent: float = 0.0
    system_share: float = 0.186  # of the prefix: the system prompt (after the tool definitions)
    sub_system_share: float = 0.11
    sub_requests: tuple[float, float] = (11.0, 0.52)
    sub_prefix: tuple[float, float] = (8684.0, 0.2)
    sub_first_message: tuple[float, float] = (1800.0, 0.6)
    sub_offset_s: float = 0.47
    api_s_per_output_token: float = 0.02  # only for the synthetic send times (closed-loop
    api_fixed_s: float = 2.0  # replays ignore them)
    model: str = "synthetic"


# Fitted on the published cc-traces (360 sessions, 23,669 main-agent requests) with
# ``kvsim trace stats`` and the per-transition measurements in docs/traces.md:
# requests/session median 41 (log sd 1.19); system+tool tokens median 14,893 (0.16); first
# prompt minus that median 7,809 (2.0); output median 214 (0.88); append beyond the previous
# output median 355 (1.77), 10% of appends carry less than the whole output; tool gap median
# 9 s (1.30), human gap 131.5 s (1.79), 87.7% tool; 6.3% edits that change the last 1-3 blocks;
# 0.39% compactions at a median 150K tokens down to ~31K (summary ~18.6K beyond the prefix);
# the largest prompt is 894K tokens (hard limit 880K), the longest session 439 requests;
# 38 sub-agents per 23,669 requests, median 11 requests, spawned ~0.47 s after the reply;
# system_tokens / (system + tool tokens): median 0.186 (sessions), ~0.11 (sub-agents).
CLAUDE_CODE = Profile(
    requests=(41.0, 1.19), prefix=(14893.0, 0.16), first_message=(7809.0, 2.0),
    output=(214.0, 0.88), append=(355.0, 1.77), tool_gap=(9.0, 1.30), human_gap=(131.5, 1.79),
    p_tool=0.877, p_edit=0.063, edit_drop_blocks=(1, 3), p_no_output=0.10,
    compact_above=75_000, p_compact=0.0055, summary=(18_600.0, 0.45),
    hard_limit=880_000, max_requests=440, p_subagent=38 / 23669, model="synthetic-claude-code")

# Codex CLI: NOT fitted to a large real set (none is available here). Assumed from the two
# TraceLab example sessions (~7K-token prefix, appends of a
# few hundred tokens, outputs ~200, sub-second to few-second tool runs) and Codex's smaller
# default context; treat its numbers as illustrative.
CODEX = Profile(
    requests=(30.0, 1.0), prefix=(6900.0, 0.1), first_message=(2400.0, 1.0),
    output=(200.0, 0.8), append=(450.0, 1.5), tool_gap=(3.0, 1.2), human_gap=(60.0, 1.6),
    p_tool=0.85, p_edit=0.03, edit_drop_blocks=(1, 2), p_no_output=0.05,
    compact_above=150_000, p_compact=0.01, summary=(8000.0, 0.4), system_share=0.5,
    sub_system_share=0.5, model="synthetic-codex")

# Plain chat: no tools, human waits only, short sessions, a small shared system prompt.
# Assumed shapes (illustrative), not fitted.
CHAT = Profile(
    requests=(6.0, 0.8), prefix=(1000.0, 0.3), first_message=(150.0, 1.0),
    output=(400.0, 0.9), append=(120.0, 1.0), tool_gap=(1.0, 0.5), human_gap=(45.0, 1.2),
    p_tool=0.0, p_edit=0.0, edit_drop_blocks=(1, 1), p_no_output=0.0,
    compact_above=10**9, p_compact=0.0, summary=(1000.0, 0.5), system_share=1.0,
    sub_system_share=1.0, model="synthetic-chat")

PROFILES: Registry[Profile] = Registry("synthetic trace", OptionError)
PROFILES.register("claude-code", CLAUDE_CODE)
PROFILES.register("codex", CODEX)
PROFILES.register("chat", CHAT)
DEFAULT_SESSIONS = 16


def parse_spec(spec: str, seed: int) -> tuple[str, Profile, int, int, bool]:
    body = spec.split(":", 1)[1]
    name = body.partition("?")[0]
    if name not in PROFILES:
        raise OptionError(unknown(PROFILES.kind, name, [*PROFILES, prefix_groups.NAME]))
    prof = PROFILES.get(name)
    sessions, subagents = DEFAULT_SESSIONS, True
    for key, val in query_items(spec):  # a key given twice is refused (traces/spec.py)
        if not val.lstrip("-").isdigit():
            raise OptionError(f"{spec}: parameter {key!r} must be an integer, got {val!r}")
        v = int(val)
        if key == "sessions" and 1 <= v <= 1_000_000:
            sessions = v
        elif key == "seed" and v >= 0:
            seed = v
        elif key == "max_requests" and v >= 1:
            prof = replace(prof, max_requests=v)
        elif key == "subagents" and v in (0, 1):
            subagents = bool(v)
        else:
            raise OptionError(f"{spec}: bad parameter {key}={val} (known: sessions>=1, seed>=0, "
                              "max_requests>=1, subagents=0|1)")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise OptionError(f"{spec}: seed must be an integer >= 0, got {seed!r}")
    return name, prof, sessions, seed, subagents


def _stratified(rng: np.random.Generator, p: tuple[float, float], n: int) -> np.ndarray:
    """n lognormal draws by stratified sampling (one per quantile stratum, shuffled): the
    sample median matches the fitted median closely even for a few hundred sessions.
    Scalar ``detmath`` functions: the same bits on every CPU (costmodel/detmath.py)."""
    u = (np.arange(n) + rng.random(n)) / n
    return np.array([p[0] * detmath.exp(p[1] * detmath.ndtri(v))
                     for v in u[rng.permutation(n)].tolist()], dtype=np.float64)


def _ln(rng: np.random.Generator, p: tuple[float, float]) -> float:
    """One lognormal draw: the normal from 52 uniform bits through ``detmath.ndtri``."""
    z = detmath.normal_from_bits(int(rng.integers(0, 1 << detmath.NORMAL_BITS)))
    return p[0] * detmath.exp(p[1] * z)


class _Ids:
    def __init__(self) -> None:
        self.next = 0

    def fresh(self, n: int) -> np.ndarray:
        a = np.arange(self.next, self.next + n, dtype=np.int64)
        self.next += n
        return a


def prefix_regions(prefix: int, system_share: float) -> tuple[tuple[int, int], ...]:
    """Tool definitions, then the system prompt (``system_share`` of the prefix)."""
    system = round(prefix * system_share)
    return ((REGION_TOOLS, prefix - system), (REGION_SYSTEM, system))


def _run_session(b: TraceBuilder, rng: np.random.Generator, prof: Profile, h: int, ids: _Ids,
                 n_req: int, prefix: int, first_msg: int, spawn: bool, sid: str,
                 scope: int, t0: float) -> float:
    """Generate one session's requests; returns the send time of its last request."""
    bs = b.block_size
    prompt = prefix + first_msg
    hist = ids.fresh(prompt // bs)  # ids of the current prompt's full blocks
    t = t0
    out_prev = 0
    for k in range(n_req):
        gap, kind = 0.0, GAP_HUMAN
        sub_end = None
        compacted = False
        if k > 0:
            kind = GAP_TOOL if rng.random() < prof.p_tool else GAP_HUMAN
            gap = _ln(rng, prof.tool_gap if kind == GAP_TOOL else prof.human_gap)
            u = rng.random()
            if prompt > prof.compact_above and (u < prof.p_compact or prompt > prof.hard_limit):
                keep = prefix // bs
                prompt = prefix + int(_ln(rng, prof.summary))
                compacted = True
            elif u < prof.p_compact + prof.p_edit:
                lo, hi = prof.edit_drop_blocks
                keep = max(0, hist.shape[0] - int(rng.integers(lo, hi + 1)))
                prompt = max(keep * bs, prompt - (hist.shape[0] - keep) * bs) + out_prev + int(
                    _ln(rng, prof.append))
            else:
                keep = hist.shape[0]
                back = out_prev if rng.random() >= prof.p_no_output else int(
                    rng.integers(0, out_prev + 1))
                prompt = prompt + back + int(_ln(rng, prof.append))
            if prompt > prof.hard_limit:  # the client compacts rather than overflow
                keep = prefix // bs
                prompt = prefix + int(_ln(rng, prof.summary))
                compacted = True
            n = prompt // bs
            keep = min(keep, n)
            hist = np.concatenate([hist[:keep], ids.fresh(n - keep)])
        out = max(1, int(_ln(rng, prof.output)))
        t += gap
        last_send = t
        b.add(h, prompt=prompt, output=out, ids=hist, send_time_s=t, gap_s=gap, gap_kind=kind,
              model=prof.model, kinds=kinds_mask(["tool_result"] if kind == GAP_TOOL
                                                 else ["text"]),
              input_region=first_input_region(prompt, prefix, REGION_USER) if k == 0
              else REGION_TOOL_RESULT if kind == GAP_TOOL and not compacted else REGION_USER)
        t += prof.api_fixed_s + prof.api_s_per_output_token * out
        out_prev = out
        if spawn and k < n_req - 1 and rng.random() < prof.p_subagent:
            sub_prefix = int(_ln(rng, prof.sub_prefix))
            sh = b.open_session(f"{sid}/sub{k}", scope=scope, parent=h, after_local=k,
                                start_offset_s=prof.sub_offset_s, agent_type="Explore",
                                prefix_hint_tokens=sub_prefix,
                                prefix_regions=prefix_regions(sub_prefix,
                                                              prof.sub_system_share))
            sub_last = _run_session(
                b, rng, prof, sh, ids, max(1, int(_ln(rng, prof.sub_requests))), sub_prefix,
                int(_ln(rng, prof.sub_first_message)), False, sid, scope, t + prof.sub_offset_s)
            b.close(sh)
            sub_end = sub_last + prof.api_fixed_s
            t = max(t, sub_end)
    return last_send


def generate(spec: str, block_size: int = 64, seed: int = 0, build: dict | None = None):
    """The Trace of ``synthetic:NAME[?...]`` (see the module docstring)."""
    if spec.split(":", 1)[1].partition("?")[0] == prefix_groups.NAME:
        return prefix_groups.generate(spec, block_size=block_size, seed=seed, build=build)
    name, prof, sessions, seed, subagents = parse_spec(spec, seed)
    rng = np.random.default_rng(seed)
    b = TraceBuilder(name=f"synthetic:{name}", format="synthetic", source=spec,
                     block_size=block_size, keep_within=(build or {}).get("max_context"))
    n_reqs = _stratified(rng, prof.requests, sessions)
    firsts = _stratified(rng, prof.first_message, sessions)
    for i in range(sessions):
        n_req = int(min(prof.max_requests, max(1, round(float(n_reqs[i])))))
        prefix = int(_ln(rng, prof.prefix))
        first = max(1, min(int(firsts[i]), prof.hard_limit - prefix))
        h = b.open_session(f"{name}-{i:05d}", scope=i, prefix_hint_tokens=prefix,
                           prefix_regions=prefix_regions(prefix, prof.system_share))
        _run_session(b, rng, prof, h, _Ids(), n_req, prefix, first, subagents, f"{name}-{i:05d}",
                     i, 0.0)
        b.close(h)
    return b.build(**(build or {}), options={"format": "synthetic", "seed": seed,
                                             "generator": name, "sessions": sessions})
