"""``kvsim run --timeline``: Chrome trace-event JSON that parses back with the run's slices."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from itertools import pairwise

import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import RunConfig
from sim.run import run
from sim.timeline import Timeline, link_name
from tests.enginekit import same_summary

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
    assert same_summary(events_of(cfg)[0].summary, run(cfg).summary)
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
                     4: "link: prefill 0 -> decode 0", 5: "link: prefill 0 -> decode 1",
                     6: "link: prefill 1 -> decode 0", 7: "link: prefill 1 -> decode 1"}
    assert len(links) == 4
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


def partial_overlaps(events) -> list[tuple]:
    """Complete events on one track (pid, tid) that overlap without nesting, in whole
    nanoseconds as a viewer reads them: the trace-event format requires the slices of one
    thread to nest or be disjoint (Perfetto misdraws the rest)."""
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            a = round(e["ts"] * 1000)
            tracks[(e["pid"], e["tid"])].append((a, a + round(e["dur"] * 1000)))
    bad = []
    for key, spans in tracks.items():
        open_ends: list[int] = []  # ends of the slices that enclose the current one
        for a, b in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= a:
                open_ends.pop()
            if open_ends and b > open_ends[-1]:
                bad.append((key, a, b, open_ends[-1]))
            open_ends.append(b)
    return bad


def test_the_overlap_check_finds_what_it_must() -> None:
    x = [{"ph": "X", "pid": 0, "tid": 1, "ts": ts, "dur": dur}
         for ts, dur in ((0.0, 2.0), (0.5, 1.0), (2.0, 1.0), (2.999, 1.0))]
    assert partial_overlaps(x[:3]) == []  # nested, then touching
    assert partial_overlaps(x) == [((0, 1), 2999, 3999, 3000)]  # 1 ns into its predecessor
    x[3]["tid"] = 2
    assert partial_overlaps(x) == []


POOL = dict(trace="synthetic:claude-code?sessions=16", max_context=32768, gaps="tool",
            sessions=12, gpu_cache=32768, preset="sglang", replicas=3, router="round-robin",
            pool=1 << 19, pool_bandwidth=5.0)


@pytest.mark.parametrize("kw", [
    dict(BASE, preset="sglang"),
    dict(BASE, engine="vllm", preset="vllm"),
    dict(BASE, engine="vllm", preset="vllm", vllm_async=False),
    dict(BASE, preset="penelope", cpu_cache=32768),
    POOL,
    dict(BASE, preset="sglang", prefill_replicas=1, decode_replicas=1),
    dict(BASE, preset="sglang", prefill_replicas=1, decode_replicas=2, pd_link_scope="pair"),
], ids=["sglang", "vllm-async", "vllm-sync", "penelope-cpu", "fleet3-pool", "pd-1p1d",
        "pd-1p2d-pair"])
def test_no_track_has_partially_overlapping_slices(kw) -> None:
    """Issue 51 D6 (a pool's fetches all on one thread overlapped by up to 666 ms) and D10
    (ts and dur rounded apart: 1 ns overlaps between consecutive slices)."""
    res, events = events_of(RunConfig.from_flat(**kw))
    assert sum(e["ph"] == "X" for e in events) > 0
    assert partial_overlaps(events) == []
    if "pool" in kw:  # one track per replica's pool link, as many fetches as transfers
        fetches = [e for e in events if e["name"] == "pool fetch"]
        assert len({e["tid"] for e in fetches}) > 1
        assert len(fetches) == len(res.tables["pool_transfers"]) > 0


def test_counters_have_a_thread_and_links_human_names() -> None:
    """Issue 51: the ``queue`` counters had no tid; links were named ``link ('nic', 0)``."""
    _, events = events_of(RunConfig.from_flat(**BASE, preset="sglang", prefill_replicas=1,
                                              decode_replicas=1))
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all(e["tid"] == 1 for e in counters)
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"prefill 0", "decode 0", "link: prefill 0 NIC"}
    assert link_name(("back", "nic", 1)) == "link: prefill 1 NIC, return"
    assert link_name(("back", "pair", 0, 2)) == "link: decode 2 -> prefill 0"
    _, events = events_of(RunConfig.from_flat(**BASE, preset="sglang", replicas=2,
                                              router="round-robin", pool=1 << 20))
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name" and e["pid"] == 2}
    assert set(threads.values()) <= {"replica 0 link", "replica 1 link"}
    assert {e["tid"] for e in events if e["name"] == "pool fetch"} <= {1, 2}


RUN = ["run", "--trace", BASE["trace"], "--max-context", "64k", "--gaps", "tool",
       "--sessions", "3", "--gpu-cache", "48k"]


@pytest.mark.parametrize("where, why", [
    ("{dir}", "is a folder, not a file"),
    ("", "empty file name"),
    ("/proc/t.json", "under /proc"),
    ("{dir}/out/sglang", "--out's folder for sglang is written there"),
    ("{dir}/out/runs.json", "--out's runs.json is written there"),
])
def test_timeline_paths_are_checked_before_any_run(tmp_path, where, why) -> None:
    """Issue 51 cause TL: these ran the whole simulation, then failed naming a temp file."""
    path = where.format(dir=tmp_path)
    res = CliRunner().invoke(cli, [*RUN, "--preset", "sglang", "--out", str(tmp_path / "out"),
                                   "--timeline", path])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2, res.stderr
    assert len(lines) == 1, res.stderr  # nothing loaded, nothing ran
    assert lines[0].startswith(f"kvsim: error: --timeline {path}") and why in lines[0], lines
    assert not (tmp_path / "out" / "sglang").exists()


def test_stderr_says_which_timeline_is_written(tmp_path) -> None:
    """Issue 51 T03/T04: with repeats only the first repeat records one; several policies
    write FILE-POLICY.json (no FILE): both were silent."""
    path = tmp_path / "t.json"
    # a random router draws from the seed, so the repeats run (identical ones would not)
    res = CliRunner().invoke(cli, [*RUN, "--preset", "sglang,penelope", "--repeats", "2",
                                   "--replicas", "2", "--router", "random", "--seed", "7",
                                   "--timeline", str(path)])
    assert res.exit_code == 0, res.output
    assert not path.exists()
    for policy in ("sglang", "penelope"):
        assert (f"timeline of {policy}, repeat 0 of 2 (seed 7; the others record none): "
                f"{tmp_path / f't-{policy}.json'}") in res.stderr
