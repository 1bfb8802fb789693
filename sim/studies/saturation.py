"""Is an open-loop run saturated? Offered load against what the server served.

In the open loop requests arrive at their recorded send times whatever the server does. When
the trace offers more than the server can serve, the queue grows for as long as the trace lasts
and every latency measures that backlog (a 628 s mean TTFT on the Mooncake sample), not the
cache. A run is called saturated when the server needed more than ``DRAIN_SHARE`` of the
trace's span again after the last arrival to finish, and the median queue wait of the last
quarter of requests (by send time) is above the first quarter's by at least ``GROWTH_SHARE`` of
the span (a backlog that grows for as long as the trace lasts gains a visible share of it; a
few milliseconds more is batching noise, and the last reply's decode alone can make the drain
long). Read from the per-request table only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sim.engines.columns import ColumnTable

if TYPE_CHECKING:  # a run's table may come as columns: no pandas for this check (issue 55)
    import pandas as pd

DRAIN_SHARE = 0.1
MIN_REQUESTS = 8
GROWTH_SHARE = 0.01


@dataclass(frozen=True)
class Saturation:
    requests: int
    span_s: float  # first to last send
    drain_s: float  # last send to last end
    offered_per_s: float  # requests sent per second of the trace
    served_per_s: float  # requests finished per second, first send to last end
    offered_tokens_per_s: float  # prompt tokens sent per second
    wait_first_s: float  # median queue wait, first quarter of sends
    wait_last_s: float  # ... last quarter

    def message(self) -> str:
        return (f"the server is saturated: the trace offers {self.offered_per_s:,.2f} "
                f"requests/s ({self.offered_tokens_per_s:,.0f} prompt tokens/s) and it served "
                f"{self.served_per_s:,.2f} requests/s; the median queue wait grew from "
                f"{_secs(self.wait_first_s)} (first quarter of requests) to "
                f"{_secs(self.wait_last_s)} (last quarter), so TTFT measures the backlog; "
                f"slow arrivals (--time-scale "
                f"{self.offered_per_s / max(self.served_per_s, 1e-12):.1f} or more) or add "
                "capacity")


def _secs(x: float) -> str:
    """Seconds with three significant digits (0.00389 s, 12.3 s, 1,234 s): a small wait is
    not printed as 0.0."""
    return f"{x:,.0f} s" if x >= 1000 else f"{x:.3g} s"


def _median(values: np.ndarray) -> float:
    """The median with NaN skipped (pandas' ``Series.median``); NaN when none is left."""
    v = values.astype(float)
    v = v[~np.isnan(v)]
    return float(np.median(v)) if v.size else math.nan


def open_loop_saturation(table: ColumnTable | pd.DataFrame) -> Saturation | None:
    """The saturation of an open-loop run from its request table, or None when it kept up."""
    t = ColumnTable.of(table)
    if "dropped" in t:
        t = t.rows(~t["dropped"].astype(bool))
    if len(t) < MIN_REQUESTS:
        return None
    t = t.rows(np.lexsort((t["request"], t["send_s"])))  # stable: ties in table order
    send = t["send_s"].astype(float)
    first, last = float(send[0]), float(send[-1])
    span = last - first
    ends = t["end_s"].astype(float)
    ends = ends[~np.isnan(ends)]  # (pandas' ``max`` skips NaN too)
    end = float(ends.max()) if ends.size else math.nan
    drain = end - last
    q = max(1, len(t) // 4)
    wait = t["queue_wait_s"]
    wait_first, wait_last = _median(wait[:q]), _median(wait[-q:])
    if span <= 0 or drain <= DRAIN_SHARE * span or wait_last - wait_first < GROWTH_SHARE * span:
        return None
    return Saturation(requests=len(t), span_s=span, drain_s=drain,
                      offered_per_s=len(t) / span, served_per_s=len(t) / (end - first),
                      offered_tokens_per_s=float(t["prompt_tokens"].sum()) / span,
                      wait_first_s=wait_first, wait_last_s=wait_last)
