"""Service-level objectives and goodput (docs/engine.md, Metrics).

An SLO text is comma-separated ``KEY=VALUE`` items::

    ttft=2s,tpot=50ms          per request: a request meets the SLO when its TTFT, TPOT,
                               longest inter-token gap (itl) and end-to-end latency (e2e)
                               are at most the thresholds given (vllm bench serve --goodput)
    ttft_p90=1s,itl_p99=80ms   per run: the run's percentile (p50, p90, p99) or mean
    attain=0.95                per run: the share of requests meeting the per-request
                               thresholds must be at least this (default 0.9 when any
                               per-request threshold is given)

Times take ``s`` or ``ms`` (a bare number is seconds). Goodput is the number of requests
(and of completed sessions whose every request met) meeting the per-request thresholds, per
second of the run and per GPU; ``slo_met`` says whether the run met every run-level target
and the attainment, and dropped no request (its percentiles leave dropped ones out).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

KEYS = ("ttft", "tpot", "itl", "e2e")
STATS = ("mean", "p50", "p90", "p99")
DEFAULT_ATTAIN = 0.9
_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE]-?\d+)?)\s*(ms|s)?\s*$")
# per-request column of each key in the requests table
COLUMNS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_max_s"}  # e2e: end_s - send_s


class SLOError(ValueError):
    exit_code = 2


@dataclass(frozen=True)
class SLO:
    thresholds: dict[str, float] = field(default_factory=dict)  # key -> seconds
    targets: dict[str, float] = field(default_factory=dict)  # summary field -> seconds
    attain: float = math.nan

    @property
    def text(self) -> str:
        parts = [f"{k}={_fmt(v)}" for k, v in self.thresholds.items()]
        parts += [f"{k.removesuffix('_s')}={_fmt(v)}" for k, v in self.targets.items()]
        if self.thresholds:
            parts.append(f"attain={self.attain:g}")
        return ",".join(parts)


def _fmt(seconds: float) -> str:
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


def _seconds(key: str, text: str) -> float:
    m = _TIME.match(text)
    if m is None:
        raise SLOError(f"{key}={text!r}: expected a time like 2s or 50ms")
    value = float(m.group(1)) * (1e-3 if m.group(2) == "ms" else 1.0)
    if not value > 0:
        raise SLOError(f"{key}={text!r}: must be > 0")
    return value


def parse_slo(text: str) -> SLO:
    """``ttft=2s,tpot=50ms,ttft_p90=1s,attain=0.95`` (module docstring); SLOError otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise SLOError("expected KEY=VALUE items like ttft=2s,tpot=50ms")
    thresholds: dict[str, float] = {}
    targets: dict[str, float] = {}
    attain = math.nan
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep:
            raise SLOError(f"{item!r} is not KEY=VALUE")
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
        seconds = _seconds(key, value)
        if stat:
            targets[f"{base}_{stat}_s"] = seconds
        else:
            thresholds[base] = seconds
    if thresholds and math.isnan(attain):
        attain = DEFAULT_ATTAIN
    if not thresholds and not math.isnan(attain):
        raise SLOError("attain needs a per-request threshold (ttft=, tpot=, itl=, e2e=)")
    return SLO(thresholds, targets, attain)


def met_mask(table: pd.DataFrame, slo: SLO) -> np.ndarray:
    """Per request: served and within every per-request threshold (a dropped request, or
    one without a first token, misses; a one-token reply has no TPOT or gap and meets those
    two)."""
    ok = ~table["dropped"].astype(bool).to_numpy()
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


def slo_fields(slo_text: str, table: pd.DataFrame, summary: dict[str, Any],
               completed_sessions: set[int], gpus: int) -> dict[str, Any]:
    """Goodput and SLO attainment of one run (module docstring)."""
    slo = parse_slo(slo_text)
    duration = float(summary["sim_end_s"])
    n = len(table)
    met = met_mask(table, slo) if n else np.zeros(0, dtype=bool)
    n_met = int(met.sum())
    if n:
        sess = table["session_index"].to_numpy()
        missed = set(sess[~met].tolist())
        sessions_met = len({s for s in set(sess.tolist()) if s in completed_sessions}
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
    run-level targets and attainment. A run that dropped requests does not: its latency
    percentiles leave them out."""
    holds = [values.get(k, math.nan) <= v for k, v in slo.targets.items()]
    if slo.thresholds:
        holds.append(values.get("slo_attainment", math.nan) >= slo.attain)
    holds.append(not values.get("dropped_requests"))
    return bool(all(holds))
