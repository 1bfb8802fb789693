"""``kvsim run --timeline``: Chrome trace-event JSON that parses back with the run's slices."""

from __future__ import annotations

import json
from collections import Counter
from itertools import pairwise

import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import RunConfig
from sim.run import run
from sim.timeline import Timeline

BASE = dict(trace="synthetic:claude-code?sessions=8", max_context=65536, gaps="tool",
            sessions=3, gpu_cache=49152)


def events_of(cfg: RunConfig):
    tl = Timeline(lambda: 0.0)
    res = run(cfg, None, tl)
    doc = json.loads(tl.to_json())  # what the file holds
    return res, doc["traceEvents"]


@pytest.mark.parametrize("kw", [dict(preset="sglang"), dict(preset="penelope", cpu_cache=32768),
                                dict(engine="vllm", preset="vllm"),
                                dict(engine="vllm", preset="vllm", vllm_async=False)])
def test_slices_equal_the_runs_batches_decode_events_and_evictions(kw) -> None:
    res, events = events_of(RunConfig.from_flat(**BASE, **kw))
    s = res.summary
    count = Counter((e["ph"], e["name"]) for e in events)
    assert count[("X", "prefill")] == s["prefill_batches"] > 0
    assert count[("X", "decode")] == s["decode_events"] > 0
    assert count[("i", "evict")] == s["evictions"] > 0
    assert count[("i", "cpu load")] == s["cpu_loads"]
    # one GPU stream per replica: its slices never overlap, and they sum to its busy time
    slices = sorted((e for e in events if e["ph"] == "X"), key=lambda e: e["ts"])
    for a, b in pairwise(slices):
        assert b["ts"] >= a["ts"] + a["dur"] - 5e-3  # (microseconds, rounded to 1e-3)
    busy = sum(e["dur"] for e in slices) / 1e6
    assert busy == pytest.approx(s["prefill_busy_s"] + s["decode_busy_s"], rel=1e-9)


def test_a_fleet_has_one_track_per_replica() -> None:
    res, events = events_of(RunConfig.from_flat(**BASE, preset="sglang", replicas=2,
                                                router="round-robin"))
    per = res.summary["replica_summaries"]
    for i, rs in enumerate(per):
        mine = [e for e in events if e.get("pid") == i]
        assert sum(e["name"] == "prefill" for e in mine) == rs["prefill_batches"]
        assert sum(e["name"] == "evict" for e in mine) == rs["evictions"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] ==
             "process_name"}
    assert names == {"replica 0", "replica 1"}


def test_the_timeline_changes_no_result(tmp_path) -> None:
    cfg = RunConfig.from_flat(**BASE, preset="sglang")
    assert events_of(cfg)[0].summary == run(cfg).summary
    path = tmp_path / "t.json"
    res = CliRunner().invoke(cli, ["run", "--trace", BASE["trace"], "--max-context", "64k",
                                   "--gaps", "tool", "--sessions", "3", "--gpu-cache", "48k",
                                   "--preset", "sglang,penelope", "--timeline", str(path)])
    assert res.exit_code == 0, res.output
    for policy in ("sglang", "penelope"):
        doc = json.loads((tmp_path / f"t-{policy}.json").read_text())
        assert any(e["name"] == "prefill" for e in doc["traceEvents"])


def test_a_shared_pools_fetches_are_a_process_of_their_own() -> None:
    res, events = events_of(RunConfig.from_flat(**BASE, preset="penelope", replicas=2,
                                                router="round-robin", pool=1 << 20))
    fetches = [e for e in events if e["name"] == "pool fetch"]
    assert len(fetches) == len(res.tables["pool_transfers"]) > 0
    assert {e["pid"] for e in fetches} == {2}
    assert sum(e["args"]["bytes"] for e in fetches) == int(
        res.tables["pool_transfers"]["bytes"].sum())


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_disaggregated_fleet_has_a_track_per_worker_and_per_link(engine) -> None:
    """Prefill workers, then decode workers, then one process per link: every batch and
    decode event of both pools is a slice of its worker, every transfer a slice of its link
    (start and length as ``pd_transfers`` has them; a FIFO: none overlaps the next)."""
    res, events = events_of(RunConfig.from_flat(**BASE, engine=engine, preset=engine,
                                                prefill_replicas=2, decode_replicas=2,
                                                pd_link="rdma-100", pd_link_scope="pair"))
    s, xfer = res.summary, res.tables["pd_transfers"]
    links = sorted(xfer["link"].unique())
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "prefill 0", 1: "prefill 1", 2: "decode 0", 3: "decode 1",
                     **{4 + k: f"link {key}" for k, key in enumerate(links)}}
    count = Counter((e["ph"], e["name"]) for e in events)
    assert count[("X", "prefill")] == s["prefill_batches"] > 0
    assert count[("X", "decode")] == s["decode_events"] > 0
    assert {e["pid"] for e in events if e["name"] == "prefill"} == {0, 1, 2, 3}
    assert {e["pid"] for e in events if e["name"] == "decode"} <= {2, 3}
    assert count[("X", "transfer")] == len(xfer) == s["transfers"] > 0
    for k, key in enumerate(links):
        mine = sorted((e for e in events if e["pid"] == 4 + k and e["ph"] == "X"),
                      key=lambda e: e["ts"])
        rows = xfer[xfer["link"] == key].sort_values("start_s")
        assert [e["args"]["bytes"] for e in mine] == rows["bytes"].tolist()
        assert [e["ts"] for e in mine] == pytest.approx((rows["start_s"] * 1e6).tolist(),
                                                         abs=1e-3)
        assert [e["dur"] for e in mine] == pytest.approx(
            ((rows["end_s"] - rows["start_s"]) * 1e6).tolist(), abs=2e-3)
        for a, b in pairwise(mine):
            assert b["ts"] >= a["ts"] + a["dur"] - 5e-3
