"""``synthetic:prefix-groups``: shared-prefix groups, the workload cache-aware routers are
benchmarked on (SGLang's ``generated-shared-prefix`` dataset of ``bench_serving``).

``synthetic:prefix-groups?groups=G&prefix=P&users=U&question=Q&qps=A..B[&turns=T&output=O&order=R&mode=M&seed=S]``

- G groups, each with its own P-token shared prefix (a system prompt); P, Q and O are sizes
  as the CLI writes them (``prefix=2k`` = 2,048 tokens);
- U users per group; each user is a session of T turns (default 1). ``mode=chat`` (default):
  turn k's prompt is the group's prefix, then the user's earlier questions and answers, then a
  fresh Q-token question (the chat history a multi-turn client resends); ``mode=resend``: every
  turn is turn 0's prompt again, verbatim (prefix + the same question: inference-perf's
  ``shared_prefix`` data without ``enable_multi_turn_chat``, which cycles its prompts); every
  answer is O tokens;
- the G * U * T requests arrive as a Poisson process whose rate ramps linearly from A to B
  requests per second (``qps=A`` for a constant rate): given the count N, the arrival times
  are N independent draws from the ramp's density, sorted (the conditional law of a Poisson
  process), over ``T_end = 2 N / (A + B)`` seconds;
- which user sends the next request (``order``): ``shuffle`` (default) a seeded shuffle of
  every user's turns (each user's turns stay in order), as SGLang's benchmark shuffles its
  prompts; ``grouped`` group by group, user by user, turn by turn (``bench_serving
  --gsp-ordered``); ``rounds`` every user's first turn, then every user's second turn, ...,
  the users in one seeded random order (inference-perf's shared-prefix data: request i goes to
  user i mod U at round i div U).
inference-perf's names are accepted as aliases (``ALIASES``: ``num_groups``,
``system_prompt_len``, ``num_prompts_per_group``, ``question_len``, ``output_len``,
``enable_multi_turn_chat=true|false`` for ``mode=chat|resend``); a key given twice is refused.
The trace is replayed open loop (``--replay open``, its default): every request is sent at its
time, except that under ``mode=chat`` a user's later turn, which holds the previous answer,
waits for that reply (it goes at max(its time, the previous reply), as inference-perf's user
sessions and any chat client do; trace option ``AFTER_REPLY``, sim/replay.py).
Defaults are SGLang 0.5.23 ``bench_serving``'s ``--gsp-*`` defaults (64 groups, 2,048-token
system prompts, 16 prompts per group, 128-token questions, 256-token outputs, one turn); the
rate ramp ``qps=1..16`` is kvsim's own choice.
Ids: the prefix's full blocks are one chain per group; every other block is fresh (the block
that straddles the prefix and a question is the user's own, as its tokens differ).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .builder import TraceBuilder
from .errors import OptionError
from .kinds import GAP_HUMAN, kinds_mask
from .regions import REGION_SYSTEM, REGION_USER
from .spec import query_items, size_value

NAME = "prefix-groups"
ORDERS = ("shuffle", "grouped", "rounds")
MODES = ("chat", "resend")
_COUNTS = {"groups": (1, 100_000), "users": (1, 1_000_000), "turns": (1, 10_000)}
_SIZES = {"prefix": (0, 10_000_000), "question": (1, 10_000_000), "output": (1, 10_000_000)}
# inference-perf's ``shared_prefix`` data names (docs/traces.md), accepted as they are written
ALIASES = {"num_groups": "groups", "system_prompt_len": "prefix",
           "num_prompts_per_group": "users", "question_len": "question",
           "output_len": "output", "enable_multi_turn_chat": "mode"}
_BOOL = {"true": "chat", "1": "chat", "false": "resend", "0": "resend"}
MAX_REQUESTS = 10_000_000
# Trace option the replay reads (sim/replay.py): in the open loop a session's next request
# goes only after its previous reply, as a chat client that resends the answer must.
AFTER_REPLY = "open_loop_after_reply"


@dataclass(frozen=True)
class PrefixGroups:
    groups: int = 64
    prefix: int = 2048
    users: int = 16
    question: int = 128
    turns: int = 1
    output: int = 256
    qps_start: float = 1.0
    qps_end: float = 16.0
    order: str = "shuffle"
    mode: str = "chat"
    seed: int = 0

    @property
    def requests(self) -> int:
        return self.groups * self.users * self.turns

    @property
    def duration_s(self) -> float:
        """The ramp's length: the expected count (A + B) / 2 * T_end equals the request count."""
        return 2.0 * self.requests / (self.qps_start + self.qps_end)


def _rate(spec: str, val: str) -> tuple[float, float]:
    lo, sep, hi = val.partition("..")
    try:
        a = float(lo)
        b = float(hi) if sep else a
    except ValueError:
        raise OptionError(f"{spec}: parameter 'qps' must be A..B or A (requests/s), "
                          f"got {val!r}") from None
    if not (np.isfinite(a) and np.isfinite(b) and a > 0 and b > 0):
        raise OptionError(f"{spec}: parameter 'qps' must be positive finite rates, got {val!r}")
    return a, b


def is_spec(trace: str) -> bool:
    """Whether ``trace`` names this generator (``synthetic:prefix-groups[?...]``)."""
    return trace.partition("?")[0].strip() == f"synthetic:{NAME}"


def sets_rates(trace: str) -> bool:
    """Whether ``trace`` is this generator with its arrival rates given (``qps``): a closed
    loop would ignore them, so the run refuses that pairing (sim/config.py)."""
    return is_spec(trace) and any(k == "qps" for k, _ in query_items(trace, ALIASES))


def parse_spec(spec: str, seed: int) -> PrefixGroups:
    """The parameters of ``synthetic:prefix-groups?...`` (OptionError names the bad one)."""
    vals: dict = {"seed": seed}
    for key, val in query_items(spec, ALIASES):
        if key == "qps":
            vals["qps_start"], vals["qps_end"] = _rate(spec, val)
        elif key == "order":
            if val not in ORDERS:
                raise OptionError(f"{spec}: parameter 'order' must be one of "
                                  f"{', '.join(ORDERS)}, got {val!r}")
            vals["order"] = val
        elif key == "mode":
            mode = _BOOL.get(val.lower()) if val not in MODES else val
            if mode is None:
                raise OptionError(f"{spec}: parameter 'mode' must be chat or resend "
                                  f"(enable_multi_turn_chat: true or false), got {val!r}")
            vals["mode"] = mode
        elif key in _SIZES:
            v = size_value(spec, key, val)
            lo, hi = _SIZES[key]
            if not lo <= v <= hi:
                raise OptionError(f"{spec}: parameter {key!r} must be in [{lo}, {hi}] tokens, "
                                  f"got {v}")
            vals[key] = v
        elif key in _COUNTS or key == "seed":
            if not val.lstrip("-").isdigit():
                raise OptionError(f"{spec}: parameter {key!r} must be an integer, got {val!r}")
            v = int(val)
            lo, hi = _COUNTS.get(key, (0, 2**63 - 1))
            if not lo <= v <= hi:
                raise OptionError(f"{spec}: parameter {key!r} must be in [{lo}, {hi}], got {v}")
            vals[key] = v
        else:
            raise OptionError(f"{spec}: unknown parameter {key!r} (known: groups, prefix, users, "
                              "question, qps=A..B, turns, output, order, mode, seed; "
                              "inference-perf's names: " + ", ".join(ALIASES) + ")")
    p = PrefixGroups(**vals)
    if p.requests > MAX_REQUESTS:
        raise OptionError(f"{spec}: groups * users * turns = {p.requests} requests; at most "
                          f"{MAX_REQUESTS}")
    return p


def ramp_arrivals(rng: np.random.Generator, n: int, qps_start: float,
                  qps_end: float) -> np.ndarray:
    """n sorted arrival times of a Poisson process whose rate goes linearly from qps_start to
    qps_end over 2 n / (qps_start + qps_end) seconds, conditioned on n arrivals.

    Inverse of the cumulative intensity A t + (B - A) t^2 / (2 T_end) = u n, in the form that
    is stable when A == B: t = 2 u n / (A + sqrt(A^2 + (B^2 - A^2) u))."""
    a, b = float(qps_start), float(qps_end)
    u = np.sort(rng.random(n))
    return 2.0 * u * n / (a + np.sqrt(a * a + (b * b - a * a) * u))


def _senders(p: PrefixGroups, rng: np.random.Generator) -> np.ndarray:
    """The user of each arrival slot, in slot order (``order``; users are numbered group by
    group)."""
    n_users = p.groups * p.users
    if p.order == "shuffle":
        return rng.permutation(np.repeat(np.arange(n_users, dtype=np.int64), p.turns))
    if p.order == "rounds":
        return np.tile(rng.permutation(n_users).astype(np.int64), p.turns)
    return np.repeat(np.arange(n_users, dtype=np.int64), p.turns)


def generate(spec: str, block_size: int = 64, seed: int = 0, build: dict | None = None):
    """The Trace of ``synthetic:prefix-groups?...`` (see the module docstring)."""
    p = parse_spec(spec, seed)
    rng = np.random.default_rng(p.seed)
    n_users = p.groups * p.users
    times = ramp_arrivals(rng, p.requests, p.qps_start, p.qps_end)
    sender = _senders(p, rng)
    # the k-th request of user j takes the k-th time among the slots the shuffle gave j
    slot_order = np.argsort(sender, kind="stable")
    send = times[slot_order].reshape(n_users, p.turns)

    bs = block_size
    prefix_blocks = p.prefix // bs
    b = TraceBuilder(name=f"synthetic:{NAME}", format="synthetic", source=spec, block_size=bs)
    # ids: G prefix chains first, then fresh ids for everything else
    next_id = p.groups * prefix_blocks
    mask = kinds_mask(["text"])
    for j in range(n_users):
        g = j // p.users
        h = b.open_session(f"{NAME}-g{g:04d}-u{j % p.users:05d}", scope=0,
                           prefix_hint_tokens=p.prefix,
                           prefix_regions=((REGION_SYSTEM, p.prefix),) if p.prefix else ())
        hist = np.arange(g * prefix_blocks, (g + 1) * prefix_blocks, dtype=np.int64)
        prompt = p.prefix
        prev_send = float(send[j, 0])
        for k in range(p.turns):
            if k == 0 or p.mode == "chat":  # resend: every turn is turn 0's prompt again
                keep = prompt // bs  # full blocks of the previous prompt (the prefix at turn 0)
                prompt = prompt + (p.output if k else 0) + p.question
                n = prompt // bs
                hist = np.concatenate([hist[:keep], np.arange(next_id, next_id + n - keep,
                                                              dtype=np.int64)])
                next_id += n - keep
            t = float(send[j, k])
            b.add(h, prompt=prompt, output=p.output, ids=hist, send_time_s=t,
                  gap_s=t - prev_send, gap_kind=GAP_HUMAN, model=f"synthetic-{NAME}",
                  kinds=mask, input_region=REGION_USER)
            prev_send = t
        b.close(h)
    options = {
        "format": "synthetic", "seed": p.seed, "generator": NAME, "groups": p.groups,
        "prefix": p.prefix, "users": p.users, "question": p.question, "turns": p.turns,
        "output": p.output, "qps": [p.qps_start, p.qps_end], "duration_s": p.duration_s}
    if p.order != "shuffle":
        options["order"] = p.order
    if p.mode != "chat":
        options["mode"] = p.mode
    elif p.turns > 1:  # a later turn holds the previous answer: it waits for it (D13)
        options[AFTER_REPLY] = True
    return b.build(**(build or {}), options=options)
