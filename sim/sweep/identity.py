"""A sweep point: its identity, its label and its row, made here and nowhere else.

A point's id names its folder (``points/<id>``) and makes a sweep resumable: it is a hash of
the config that makes its results. One rule decides what the hash reads: **a field is left
out while it leaves the run as it was before the field existed**, so that a results folder
saved before a field was added keeps its ids (and a point whose results the field changes
gets a new one):

- the fields of ``ID_FIELDS`` are always read, whatever their values: the fields ids began
  with;
- a field added since is read only while it changes the run: for most, while it differs
  from its default (``context`` is ``full`` by default, ``vllm_patch`` ``none``, and so
  is every field to come, with no entry here); a feature whose fields count together is
  named in ``SINCE`` with the test that it is off (a fleet, a pool: their knobs do nothing
  without them), as is a field whose default is not the run from before it (vLLM's async
  scheduling became the default; the synchronous scheduler is what ran before);
- fields outside the config's equality (``compare=False``: scratch data) are never read.

The label of a point is its policy's; its row in the tidy table is its id, its label, the
grid's values as written, then every scalar of its summary.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sim.config import DEFAULTS, FLAT, RunConfig, idle_fields

# Read into every id, whatever their values (the module docstring): frozen, so that a field
# added to RunConfig falls under the rule without an entry here.
ID_FIELDS = frozenset({
    "trace", "trace_format", "select", "shared_prefix", "max_context", "block_size", "gaps",
    "lenient", "trace_cache_dir", "rebuild_sessions", "sessions", "replay", "time_scale",
    "model", "profile", "gpu_cache", "cpu_cache", "tiering", "swap_buffer",
    "hicache_write_policy", "hicache_load_threshold", "engine", "preset", "order", "evict",
    "granularity", "policy", "policy_params", "scheduler", "chunk_size", "checkpoint_chunks",
    "max_running", "max_new_tokens", "clip_max_new_tokens", "new_token_ratio",
    "new_token_ratio_min", "new_token_ratio_decay_steps", "seed", "debug_cache"})


@dataclass(frozen=True)
class Since:
    """Fields added since ids began that count together, and the test that the run is as it
    was before they existed (then none of them is read)."""

    fields: tuple[str, ...]
    as_before: Callable[[RunConfig], bool]


SINCE: tuple[Since, ...] = (
    Since(("replicas", "router", "router_params"), lambda c: not c.is_fleet),  # one server
    Since(("pool", "pool_bandwidth", "pool_latency_us", "pool_write", "pool_watermark",
           "pool_evict_fraction"), lambda c: not c.pool.size),  # no pool
    Since(("prefill_replicas", "decode_replicas", "pd_link", "pd_link_scope", "pd_streaming",
           "pd_local_threshold", "decode_cache", "pd_return", "pd_rule"),
          lambda c: not c.is_pd),  # aggregated
    Since(("pd_prealloc",), lambda c: not c.is_pd or c.pd.pd_prealloc == "off"),  # landed unpinned
    Since(("vllm_async",), lambda c: not c.value("vllm_async")  # the synchronous scheduler
          or bool(idle_fields(c, ["vllm_async"]))),  # or not the vllm engine
)
_SINCE = {name: s for s in SINCE for name in s.fields}

# Grid fields whose value is already the row's ``policy`` label (one policy column); a grid
# of ``policy`` specs keeps them as written in ``policy_spec`` (a file path is not a label).
POLICY_FIELDS = ("preset",)
COLUMN = {"policy": "policy_spec"}


# outside the config's equality (scratch data): never read
UNCOMPARED = frozenset({"extra"})


def _read(cfg: RunConfig, name: str) -> bool:
    """Whether ``cfg``'s id reads the flat field ``name`` (the module docstring's rule)."""
    if name in UNCOMPARED:
        return False
    if name in ID_FIELDS:
        return True
    since = _SINCE.get(name)
    if since is not None:
        return not since.as_before(cfg)
    return cfg.value(name) != DEFAULTS[name]


def identity(cfg: RunConfig) -> dict[str, Any]:
    """What a point's id hashes: ``cfg.to_dict()`` (its fields, the policy label, policy
    and router file digests) less the fields the rule leaves out."""
    d = cfg.to_dict()
    for name in FLAT:
        if not _read(cfg, name):
            d.pop(name, None)
    return d


def point_id(cfg: RunConfig) -> str:
    return hashlib.sha1(json.dumps(identity(cfg), sort_keys=True).encode()).hexdigest()[:12]


def grid_columns(keys: Iterable[str]) -> list[str]:
    """The table columns of the grid fields ``keys``: the policy fields are the ``policy``
    label, a ``policy`` spec is ``policy_spec``."""
    return [COLUMN.get(k, k) for k in keys if k not in POLICY_FIELDS]


@dataclass(frozen=True)
class Point:
    values: dict[str, Any]  # the grid's values for this point, as written
    cfg: RunConfig

    @property
    def id(self) -> str:
        return point_id(self.cfg)

    @property
    def label(self) -> str:
        return self.cfg.policy_label

    def record(self, baseline: Point | None = None) -> dict[str, Any]:
        """The point as sweep.json lists it."""
        return {"point": self.id, "values": self.values, "config": self.cfg.to_dict(),
                **({"baseline_point": baseline.id} if baseline is not None else {})}

    def row(self, summary: dict[str, Any]) -> dict[str, Any]:
        """Its row of the tidy table: id, label, the grid's values (as written), then every
        scalar of ``summary`` that is not one of those."""
        row: dict[str, Any] = {"point": self.id, "policy": self.label}
        row.update({COLUMN.get(k, k): str(v) for k, v in self.values.items()
                    if k not in POLICY_FIELDS})
        row.update({k: v for k, v in summary.items()
                    if k not in row and k not in POLICY_FIELDS
                    and not isinstance(v, dict | list)})
        return row
