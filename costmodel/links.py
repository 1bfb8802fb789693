"""Links between GPUs as data: what a KV transfer of a disaggregated fleet costs.

``costmodel/data/links.yaml`` holds each link's one-way bandwidth and per-transfer latency with
its source (datasheets; the latencies are assumptions the file says are). A transfer of ``B``
bytes occupies its link for ``B / bandwidth`` and arrives ``latency`` after that
(``Link.busy_seconds``, ``Link.latency_s``); the fleet (sim/fleet/pd.py) queues transfers on
a link first come, first served.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from .errors import ProfileError
from .registry import unknown
from .safeyaml import safe_load

CATALOG = "links.yaml"


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth_gb_s: float  # one direction, 1e9 bytes/s; inf: transfers take no time
    latency_us: float
    source: str

    def busy_seconds(self, nbytes: float) -> float:
        """Seconds a transfer of ``nbytes`` occupies the link."""
        if math.isinf(self.bandwidth_gb_s):
            return 0.0
        return nbytes / (self.bandwidth_gb_s * 1e9)

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


def _number(where: str, raw: dict[str, Any], key: str, positive: bool) -> float:
    v = raw.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) \
            or (v <= 0 if positive else v < 0) or (key == "latency_us" and math.isinf(v)):
        raise ProfileError(where, key, f"must be a number {'> 0' if positive else '>= 0'}"
                           f"{'' if key != 'latency_us' else ' and finite'}, got {v!r}")
    return float(v)


def parse_links(doc: Any, where: str) -> dict[str, Link]:
    """The links of a catalog document (``yaml.safe_load`` output), checked field by field."""
    if not isinstance(doc, dict) or not isinstance(doc.get("links"), dict):
        raise ProfileError(where, "links", "must be a mapping of link names")
    out = {}
    for name, raw in doc["links"].items():
        at = f"{where}: link {name!r}"
        if not isinstance(raw, dict):
            raise ProfileError(at, "<link>", "must be a mapping")
        source = raw.get("source")
        if not isinstance(source, str) or not source.strip():
            raise ProfileError(at, "source", "every link names its source")
        out[str(name)] = Link(str(name), _number(at, raw, "bandwidth_gb_s", True),
                              _number(at, raw, "latency_us", False), source)
    return out


@cache
def links() -> dict[str, Link]:
    """The shipped catalog."""
    text = resources.files("costmodel").joinpath("data", CATALOG).read_text()
    return parse_links(safe_load(text), f"costmodel/data/{CATALOG}")


def link_names() -> tuple[str, ...]:
    return tuple(links())


def get_link(name: str) -> Link:
    catalog = links()
    if name not in catalog:
        raise ProfileError("--pd-link", "pd_link", unknown("link", name, catalog))
    return catalog[name]
