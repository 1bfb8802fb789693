"""Content regions of prompt blocks: what kind of text each cache block holds.

Every block of a prompt belongs to one region (``REGION_NAMES``, stored as uint8 codes):

- ``system``: the system prompt;
- ``tools``: the tool definitions (JSON schemas of the tools the agent may call);
- ``user``: text the user (or the client on the user's behalf) sent: messages, reminders,
  a compaction summary;
- ``assistant``: what the model emitted and the client sent back: text, thinking, tool calls;
- ``tool_result``: the output of a tool the client ran;
- ``unknown``: the format does not tell (Mooncake), or the trace does not say what the new
  content is (a re-sent history's new tail, a first request that re-sends a history).

Loaders describe a session in tokens; ``Layout`` turns that into block regions:

- the session prefix (``prefix``): runs of (region, tokens) at the start of every prompt, e.g.
  cc-traces' tool definitions then system prompt;
- per request, the region of its new input (``input_region``): a region code, ``RESENT`` when
  the input re-sends an edited history (its content kinds include what the model emits), or
  None when the format cannot tell (then the request's new blocks are all ``unknown``).

Rules, for request r of a session (p = prompt tokens, k = leading full blocks shared with the
previous request, p' and o' = the previous prompt and output):

1. first request: the prefix runs (clipped to p), then the input region up to p (``unknown``
   for ``RESENT``: a history; see ``first_input_region``);
2. append or in-place edit (not a shrink): tokens below min(p, p') keep the regions they had
   in the previous prompt (an edit rewrites them in place); then the previous reply,
   ``assistant`` for min(o', p - p') tokens, then the input region up to p;
3. shrink (p < p' and k below the previous prompt's full blocks):
   - a re-sent history (``RESENT``: cleared tool results, dropped turns) keeps the regions of
     the previous prompt by position up to p. Approximate: content after a removed span
     shifts, but the mixture of user text, tool results and replies is kept;
   - otherwise (a compaction: the history replaced by a summary) tokens below k blocks keep
     their regions, the session prefix is laid again by position, and the rest of the prompt
     takes the input region.

A block takes the region holding most of its tokens; a tie goes to the region whose tokens
come first in the block. Only the blocks a request adds (from block k on) are computed: work
per request is proportional to the runs it touches, never to tokens or to the prompt length.
"""

from __future__ import annotations

from bisect import bisect_right

REGION_NAMES: tuple[str, ...] = ("system", "tools", "user", "assistant", "tool_result", "unknown")
(REGION_SYSTEM, REGION_TOOLS, REGION_USER, REGION_ASSISTANT, REGION_TOOL_RESULT,
 REGION_UNKNOWN) = range(len(REGION_NAMES))

# ``input_region`` value (never stored): the new input re-sends an edited history; on a first
# request, a history the trace does not describe
RESENT = -1

# A first prompt with more than this beyond its session prefix carries a history: cc-traces
# first prompts beyond system + tools are bimodal, 60% under 10K tokens (median ~4K: one first
# message with CLAUDE.md and reminders) and 40% over 30K (144 of 360 over 50K: sessions
# recorded mid-conversation), yet every first request lists input_types ["text"] only.
FIRST_MESSAGE_MAX_TOKENS = 16384

# content kinds (traces.model.KIND_NAMES) the model emits: when a request's new input lists one
# of them, the client re-sent history, not one new message
_ASSISTANT_KINDS = ("tool_use", "thinking")


def first_input_region(prompt: int, prefix_tokens: int, region: int) -> int:
    """A first request's input region: ``RESENT`` (an undescribed history) when its prompt
    carries more than FIRST_MESSAGE_MAX_TOKENS beyond the session prefix."""
    return RESENT if prompt - prefix_tokens > FIRST_MESSAGE_MAX_TOKENS else region


def input_region(kinds: list[str] | tuple[str, ...]) -> int:
    """Region of a request's new input from its content kinds (cc-traces ``input_types``).

    Kinds the model emits (tool_use, thinking) mean a re-sent history: ``RESENT``. Otherwise a
    tool result makes it ``tool_result`` (a tool-result turn may carry short text), any other
    kind ``user``; no kinds at all: ``unknown``."""
    if not kinds:
        return REGION_UNKNOWN
    if any(k in _ASSISTANT_KINDS for k in kinds):
        return RESENT
    return REGION_TOOL_RESULT if "tool_result" in kinds else REGION_USER


class Layout:
    """Token-level regions of one session's current prompt, as runs.

    Run i covers tokens ``[ends[i-1], ends[i])`` (``ends[-1]`` = the prompt's length) with
    region ``regs[i]``; runs are non-empty and neighbours differ in region."""

    def __init__(self, prefix: tuple[tuple[int, int], ...] = ()):
        self.prefix = tuple((int(g), int(n)) for g, n in prefix if int(n) > 0)
        if any(not 0 <= g < len(REGION_NAMES) for g, _ in self.prefix):
            raise ValueError(f"bad region code in the prefix {prefix!r}")
        self.ends: list[int] = []
        self.regs: list[int] = []
        self.started = False
        self.prompt = 0
        self.output = 0

    # -- runs -------------------------------------------------------------------------------
    def _end(self) -> int:
        return self.ends[-1] if self.ends else 0

    def _push(self, end: int, reg: int) -> None:
        if end <= self._end():
            return
        if self.regs and self.regs[-1] == reg:
            self.ends[-1] = end
        else:
            self.ends.append(end)
            self.regs.append(reg)

    def _truncate(self, x: int) -> None:
        if x >= self._end():
            return
        if x <= 0:
            self.ends.clear()
            self.regs.clear()
            return
        i = bisect_right(self.ends, x)  # run holding token x (x < end: it exists)
        if i > 0 and self.ends[i - 1] == x:
            i -= 1  # x is a run boundary: run i-1 ends exactly there
            del self.ends[i + 1:], self.regs[i + 1:]
            return
        del self.ends[i + 1:], self.regs[i + 1:]
        self.ends[i] = x

    def _lay_prefix(self, lo: int, hi: int) -> None:
        """The session prefix's runs over tokens [lo, hi)."""
        pos = 0
        for reg, n in self.prefix:
            a, b = max(pos, lo), min(pos + n, hi)
            if a < b:
                self._push(b, reg)
            pos += n

    # -- one request -------------------------------------------------------------------------
    def advance(self, prompt: int, output: int, keep_blocks: int, block_size: int,
                region: int | None) -> tuple[list[int], list[int]]:
        """Lay out the next request's prompt; return the regions of its blocks from
        ``keep_blocks`` on, run-length encoded as (regions, counts).

        ``region``: the new input's region, ``RESENT``, or None when the format cannot tell,
        which makes the previous reply ``unknown`` too (the format may not send it back)."""
        bs = block_size
        known = region is not None
        reg = REGION_UNKNOWN if region is None or region == RESENT else int(region)
        if not 0 <= reg < len(REGION_NAMES):
            raise ValueError(f"bad region code {region!r}")
        if not self.started:
            self._lay_prefix(0, prompt)
            self._push(prompt, reg)
            self.started = True
        elif keep_blocks < self.prompt // bs and prompt < self.prompt:  # shrink
            if region == RESENT:
                self._truncate(prompt)
            else:
                keep = keep_blocks * bs
                self._truncate(keep)
                self._lay_prefix(keep, prompt)
                self._push(prompt, reg)
        else:  # append, or an edit in place
            prev = self.prompt
            if prompt <= prev:
                self._truncate(prompt)
            else:
                self._push(prev + min(self.output, prompt - prev),
                           REGION_ASSISTANT if known else REGION_UNKNOWN)
                self._push(prompt, reg)
        self.prompt, self.output = prompt, output
        return self.block_runs(keep_blocks, prompt // bs, bs)

    def block_runs(self, first: int, stop: int, bs: int) -> tuple[list[int], list[int]]:
        """Regions of blocks [first, stop) (majority of tokens; ties: the region that comes
        first in the block), run-length encoded; python work per run touched, not per block."""
        vals: list[int] = []
        counts: list[int] = []

        def emit(g: int, n: int) -> None:
            if vals and vals[-1] == g:
                counts[-1] += n
            else:
                vals.append(g)
                counts.append(n)

        ends, regs = self.ends, self.regs
        b = first
        i = bisect_right(ends, b * bs)  # run holding the block's first token
        while b < stop:
            lo, hi = b * bs, (b + 1) * bs
            e = ends[i]
            if e >= hi:  # blocks b .. inside run i entirely
                m = min(stop, e // bs)
                emit(regs[i], m - b)
                b = m
                if e == b * bs:
                    i += 1
                continue
            b += 1
            j = i + 1
            if ends[j] >= hi:  # the common straddle: two runs (neighbours differ)
                emit(regs[i] if e - lo >= hi - e else regs[j], 1)
                i = j + 1 if ends[j] == hi else j  # the run holding token hi
                continue
            tally: dict[int, int] = {}  # region -> tokens, in order of first token
            pos, j = lo, i
            while pos < hi:
                e = min(ends[j], hi)
                tally[regs[j]] = tally.get(regs[j], 0) + e - pos
                pos = e
                if ends[j] <= hi:
                    j += 1
            best = max(tally.values())
            emit(next(g for g, n in tally.items() if n == best), 1)
            i = j  # the run holding token hi
        return vals, counts
