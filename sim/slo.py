"""Service-level objectives and goodput (docs/engine.md, Metrics).

An SLO text is comma-separated ``KEY=VALUE`` items::

    ttft=2s,tpot=50ms          per request: a request meets the SLO when its TTFT, TPOT,
                               longest inter-token gap (itl) and end-to-end latency (e2e)
                               are at most the thresholds given (vllm bench serve --goodput)
    ttft_p90=1s,itl_p99=80ms   per run: the run's percentile (p50, p90, p99) or mean
    attain=0.95                per run: the share of requests meeting the per-request
                               thresholds must be at least this (default 0.9 when any
                               per-request threshold is given)

Times take ``s`` or ``ms``; a bare number is milliseconds, as ``vllm bench serve --goodput
tpot:50`` reads it (``SLO.describe`` says how a text was read; the CLI prints it). Each key
is given once (keys ignore case). Goodput is the number of requests (and of completed jobs:
top-level sessions whose every request, their sub-agents' included, met) meeting the
per-request thresholds, per second of the run and per GPU; a request that was dropped or
aborted (its reply cut short: ``aborted`` in the requests table) never meets. ``slo_met``
says whether the run met every run-level target and the attainment, and dropped or aborted no
request (its percentiles leave those out).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pandas where a table is made: none before a run's first request (issue 55)
    import pandas as pd

KEYS = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p90", "p99")
DEFAULT_ATTAIN = 0.9
_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(ms|s)?\s*$")
# per-request column of each key in the requests table
COLUMNS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_max_s"}  # e2e: end_s - send_s


class SLOError(ValueError):
    exit_code = 2


@dataclass(frozen=True)
class SLO:
    thresholds: dict[str, float] = field(default_factory=dict)  # key -> seconds
    targets: dict[str, float] = field(default_factory=dict)  # summary field -> seconds
    attain: float = math.nan
    # items given as a bare number (read as milliseconds), as written: for ``describe``
    bare: tuple[str, ...] = field(default=(), compare=False)

    def describe(self) -> str:
        """How the text was read, in one line (``kvsim run`` / ``kvsim plan`` print it)."""
        parts = [f"{k} <= {_human(v)}" for k, v in self.thresholds.items()]
        if self.thresholds:
            parts.append(f"attainment >= {self.attain:.0%}")
        parts += [f"{k.removesuffix('_s')} <= {_human(v)}" for k, v in self.targets.items()]
        line = "SLO: " + ", ".join(parts)
        if self.bare:
            line += (f" (read {', '.join(self.bare)} as milliseconds, as vllm bench serve "
                     "--goodput does; write 2s for seconds)")
        return line

    @property
    def text(self) -> str:
        parts = [f"{k}={_fmt(v)}" for k, v in self.thresholds.items()]
        parts += [f"{k.removesuffix('_s')}={_fmt(v)}" for k, v in self.targets.items()]
        if self.thresholds:
            parts.append(f"attain={self.attain:g}")
        return ",".join(parts)


def _fmt(seconds: float) -> str:
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def _human(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def _seconds(key: str, text: str) -> tuple[float, bool]:
    """``text`` in seconds, and whether it was a bare number (milliseconds, as vLLM's
    ``--goodput`` reads one)."""
    m = _TIME.match(text)
    if m is None:
        raise SLOError(f"{key}={text!r}: expected a time like 2s or 50ms")
    value = float(m.group(1)) * (1.0 if m.group(2) == "s" else 1e-3)
    if not value > 0:
        raise SLOError(f"{key}={text!r}: must be > 0")
    return value, m.group(2) is None


def parse_slo(text: str) -> SLO:
    """``ttft=2s,tpot=50ms,ttft_p90=1s,attain=0.95`` (module docstring); SLOError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise SLOError("expected KEY=VALUE items like ttft=2s,tpot=50ms")
    thresholds: dict[str, float] = {}
    targets: dict[str, float] = {}
    attain = math.nan
    seen: set[str] = set()
    bare: list[str] = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep:
            raise SLOError(f"{item!r} is not KEY=VALUE")
        if key in seen:  # (as a repeated option: the last would win silently)
            raise SLOError(f"{key!r} is given twice (keys ignore case): give each key once")
        seen.add(key)
        if key == "attain":
            try:
                attain = float(value)
            except ValueError:
                attain = math.nan
            if not 0 < attain <= 1:
                raise SLOError(f"attain={value!r}: must be a share in (0, 1]")
            continue
        base, _, stat = key.partition("_")
        if base not in KEYS or (stat and stat not in STATS):
            raise SLOError(f"unknown SLO key {key!r}: use {', '.join(KEYS)} (per request) "
                           f"or KEY_STAT with STAT one of {', '.join(STATS)} (per run), "
                           "or attain")
        seconds, unitless = _seconds(key, value)
        if unitless:
            bare.append(f"{key}={value.strip()}")
        if stat:
            targets[f"{base}_{stat}_s"] = seconds
        else:
            thresholds[base] = seconds
    if thresholds and math.isnan(attain):
        attain = DEFAULT_ATTAIN
    if not thresholds and not math.isnan(attain):
        raise SLOError("attain needs a per-request threshold (ttft=, tpot=, itl=, e2e=)")
    return SLO(thresholds, targets, attain, tuple(bare))


def met_mask(table: pd.DataFrame, slo: SLO) -> np.ndarray:
    """Per request: served and within every per-request threshold (a dropped or aborted
    request, or one without a first token, misses; a one-token reply has no TPOT or gap and
    meets those two)."""
    ok = ~(table["dropped"].astype(bool).to_numpy() | table["aborted"].astype(bool).to_numpy())
    for key, limit in slo.thresholds.items():
        if key == "e2e":
            v = (table["end_s"] - table["send_s"]).to_numpy(dtype=float)
        else:
            v = table[COLUMNS[key]].to_numpy(dtype=float)
        within = v <= limit
        if key in ("tpot", "itl"):
            within |= np.isnan(v)
        ok &= within
    ok &= np.isfinite(table["first_token_s"].to_numpy(dtype=float))
    return ok


def job_of(parents: Sequence[int]) -> np.ndarray:
    """Per session, its job: the top-level session above it (itself when top-level);
    ``parents[s]`` is session ``s``'s parent (-1: top level; traces/model.py)."""
    job = np.arange(len(parents), dtype=np.int64)
    for s in range(len(parents)):
        j = s
        while parents[j] >= 0:  # (a sub-agent of a sub-agent: up to the top)
            j = parents[j]
        job[s] = j
    return job


def slo_fields(slo_text: str, table: pd.DataFrame, summary: dict[str, Any],
               completed_sessions: set[int], gpus: int,
               parents: Sequence[int]) -> dict[str, Any]:
    """Goodput and SLO attainment of one run (module docstring). Sessions are counted as
    ``sessions_completed`` counts them: jobs (``parents[s] < 0``); a completed job meets
    when every request of it and of its sub-agents met."""
    slo = parse_slo(slo_text)
    duration = float(summary["sim_end_s"])
    n = len(table)
    met = met_mask(table, slo) if n else np.zeros(0, dtype=bool)
    n_met = int(met.sum())
    if n:
        job = job_of(parents)[table["session_index"].to_numpy()]
        missed = set(job[~met].tolist())
        sessions_met = len({j for j in set(job.tolist()) if j in completed_sessions}
                           - missed)
    else:
        sessions_met = 0
    attainment = n_met / n if n else math.nan
    out: dict[str, Any] = {"slo": slo.text, "slo_requests_met": n_met,
                           "slo_attainment": attainment}
    rate = (lambda x: x / duration) if duration > 0 else (lambda x: math.nan)
    out["goodput_rps"] = rate(n_met)
    out["goodput_rps_per_gpu"] = out["goodput_rps"] / gpus
    out["slo_sessions_met"] = sessions_met
    out["goodput_sessions_per_h"] = rate(sessions_met) * 3600
    out["goodput_sessions_per_h_per_gpu"] = out["goodput_sessions_per_h"] / gpus
    out["slo_met"] = meets(slo, {**summary, "slo_attainment": attainment})
    return out


def meets(slo: SLO, values: dict[str, Any]) -> bool:
    """Whether summary ``values`` (e.g. an interval's pessimistic ends) meet ``slo``'s
    run-level targets and attainment. A run that dropped or aborted requests does not: its
    latency percentiles leave them out."""
    holds = [values.get(k, math.nan) <= v for k, v in slo.targets.items()]
    if slo.thresholds:
        holds.append(values.get("slo_attainment", math.nan) >= slo.attain)
    holds.append(not values.get("dropped_requests") and not values.get("aborted"))
    return bool(all(holds))


def worst_end(summary: dict[str, Any], key: str, sign: float = 1.0) -> float:
    """``key`` of a summary with repeats at its 95% interval's worse end: ``sign`` +1 where
    higher is worse (latencies), -1 where lower is (attainment); the value itself where it has
    no interval, NaN where the summary lacks it (sim/run/repeats.py)."""
    v = summary.get(key)
    if v is None:
        return math.nan
    ci = summary.get(f"{key}_ci95")
    return v + (0.0 if ci is None or ci != ci or not sign else sign * ci)


def pessimistic(summary: dict[str, Any], slo: SLO) -> dict[str, float]:
    """The values ``meets`` reads, each at its interval's worse end: latencies high,
    attainment low, drops and aborts high (a plan's verdict; sim/sweep/plan.py)."""
    values = {k: worst_end(summary, k) for k in slo.targets}
    values["slo_attainment"] = worst_end(summary, "slo_attainment", -1)
    values["dropped_requests"] = worst_end(summary, "dropped_requests")
    values["aborted"] = worst_end(summary, "aborted")
    return values
