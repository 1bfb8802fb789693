"""Refactor guard: outputs saved before the eviction planner refactor (issue 11) must not move.

Two kinds of goldens under ``tests/goldens/``:
- ``runs_synthetic.json``: full run summaries of a grid of configurations (GPU only with all six
  start x granularity variants, unified and HiCache tiers, fcfs / lpm / lpm-cpu) on the embedded
  synthetic trace: runs everywhere, CI included.
- ``reproduce_*.json``: ``kvsim reproduce ablation``, ``gpu-only --quick`` and
  ``two-tier --quick`` on the shared cc-traces, as the issue asks (skipped without the data).

Regenerate with ``KVSIM_REGEN_GOLDENS=1 pytest tests/test_refactor_goldens.py`` only when a
change is meant, and record in ``tests/goldens/CHANGES.md`` which fields moved and why (the
goldens saved before the refactor are in git history: commit c9547e1).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import needs_cc_traces

from sim.cli.main import cli
from sim.config import RunConfig
from sim.run import run

GOLDENS = Path(__file__).parent / "goldens"
REGEN = os.environ.get("KVSIM_REGEN_GOLDENS") == "1"

# Fields ignored in every comparison (none: regenerate and record in CHANGES.md instead).
CHANGED: dict[str, str] = {}

# Priced with the derived H100 profile the goldens were first saved with (the default
# profile changed since: a profile change is not a refactor).
# The grid's scheduler is lpm, the default when they were saved (fcfs since issue 12).
SYNTH = dict(trace="synthetic:claude-code?sessions=12", max_context=65536, gaps="tool",
             gpu_cache=98304, sessions=4, model="qwen3-8b", profile="derived-h100-qwen3-8b",
             scheduler="lpm")


def _grid() -> dict[str, RunConfig]:
    out: dict[str, RunConfig] = {}
    for start in ("tail", "leaf-head", "private-head"):
        for gran in ("node", "block"):
            out[f"gpu/{start}/{gran}"] = RunConfig.from_flat(**SYNTH, preset=None, evict=start,
                                                             granularity=gran)
    fcfs = dict(SYNTH, scheduler="fcfs")
    out["gpu/penelope/fcfs"] = RunConfig.from_flat(**fcfs).with_preset("penelope")
    out["gpu/sglang/fcfs"] = RunConfig.from_flat(**fcfs).with_preset("sglang")
    out["gpu/sglang/whole"] = RunConfig.from_flat(**SYNTH,
                                                  checkpoint_chunks=False).with_preset("sglang")
    out["gpu/penelope/whole"] = RunConfig.from_flat(**SYNTH, checkpoint_chunks=False).with_preset(
        "penelope")
    tier = dict(SYNTH, gpu_cache=73728, cpu_cache=49152, scheduler="lpm-cpu")
    for p in ("sglang", "vllm", "penelope"):
        out[f"unified/{p}"] = RunConfig.from_flat(**tier, tiering="unified").with_preset(p)
    for wp in ("write_through", "write_through_selective", "write_back"):
        for p in ("sglang", "vllm"):
            out[f"hicache/{wp}/{p}"] = RunConfig.from_flat(**tier, tiering="hicache",
                                                           hicache_write_policy=wp).with_preset(p)
    # vLLM engine (fcfs, its only order) on traffic that preempts: the synchronous Scheduler
    # (saved as main computed it before async scheduling existed) and the async default.
    vllm = dict(SYNTH, trace="synthetic:claude-code?sessions=16&seed=3", gaps="cap:10",
                gpu_cache=40960, sessions=8, engine="vllm", scheduler="fcfs")
    for p in ("vllm", "penelope"):
        out[f"vllm/{p}/sync"] = RunConfig.from_flat(**vllm, vllm_async=False).with_preset(p)
        out[f"vllm/{p}/async"] = RunConfig.from_flat(**vllm).with_preset(p)
    return out


def _clean(doc):
    """JSON round trip (NaN -> None) so goldens compare as stored."""
    return json.loads(json.dumps(doc, default=str).replace("NaN", "null"))


def _diff(want, got, path: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            key = k if not path else f"{path}.{k}"
            if k not in want:
                continue  # a field added since the golden was saved: it pins what it holds
            if k not in got:
                if k not in CHANGED:
                    out.append(f"{key}: only in golden")
                continue
            if k in CHANGED:
                continue
            out += _diff(want[k], got[k], key)
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: length {len(want)} != {len(got)}"]
        out = []
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            out += _diff(a, b, f"{path}[{i}]")
        return out
    if isinstance(want, float) and isinstance(got, float):
        if math.isclose(want, got, rel_tol=1e-12, abs_tol=1e-12):
            return []
    elif want == got:
        return []
    return [f"{path}: golden {want!r} != now {got!r}"]


def _check_golden(name: str, doc) -> None:
    path = GOLDENS / name
    doc = _clean(doc)
    if REGEN or not path.exists():
        path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        if not REGEN:
            pytest.fail(f"golden {name} was missing and has been written: rerun")
        return
    want = json.loads(path.read_text())
    diffs = _diff(want, doc)
    assert not diffs, f"{name}: {len(diffs)} fields moved:\n" + "\n".join(diffs[:40])


def test_synthetic_run_grid_matches_goldens() -> None:
    summaries = {}
    for name, cfg in _grid().items():
        s = run(cfg).summary
        s.pop("profile_provenance", None)
        summaries[name] = s
    _check_golden("runs_synthetic.json", summaries)


@needs_cc_traces
@pytest.mark.slow
@pytest.mark.parametrize("args", [["ablation"], ["gpu-only", "--quick"],
                                  ["two-tier", "--quick"]])
def test_reproduce_matches_goldens(args: list[str]) -> None:
    res = CliRunner().invoke(cli, ["reproduce", *args, "--json", "-j", "2",
                                   "--profiles", "derived"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    doc.pop("trace", None)  # an absolute path: differs per checkout
    doc.pop("profiles", None)
    _check_golden(f"reproduce_{'_'.join(a.strip('-') for a in args)}.json", doc)
