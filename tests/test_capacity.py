"""``kvsim capacity``: the cache-only replay against an independent brute-force LRU.

The brute force is an ordered dict over the trace file's own block ids (no kvsim code): a
request reuses its leading cached blocks, makes them most recent, evicts the least recent
blocks until its missing ones fit (a prompt longer than the cache keeps its longest prefix
that fits), and uses its blocks from the tail to the head, so a history is evicted from its
end, oldest request first.
"""

from __future__ import annotations

import gzip
import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
from chained import Universe
from click.testing import CliRunner
from conftest import SHARED_DATA
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.capacity import CacheReplay, LruReplay, arrival_order, capacity_curve
from sim.cli.main import cli
from traces import load_trace

MOONCAKE = SHARED_DATA / "mooncake" / "synthetic_trace.jsonl.gz"
BS = 512  # Mooncake's block size: kvsim's blocks are then the file's hash ids


def brute_force_lru(prompts: list[list[int]], capacity: int) -> list[int]:
    """Hits (blocks) per request, in the given order."""
    cache: OrderedDict[int, None] = OrderedDict()
    hits = []
    for ids in prompts:
        h = 0
        while h < len(ids) and ids[h] in cache:
            h += 1
        hits.append(h)
        for b in ids[:h]:
            cache.move_to_end(b)
        need = len(ids) - h
        while len(cache) + need > capacity and len(cache) > h:
            cache.popitem(last=False)
        fit = min(need, capacity - len(cache))
        for b in ids[h:h + fit]:
            cache[b] = None
        for b in reversed(ids[:h + fit]):
            cache.move_to_end(b)
    return hits


def read_mooncake(path: Path) -> tuple[list[list[int]], int]:
    """The file's full blocks per request in timestamp order (stable), and prompt tokens."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    order = sorted(range(len(recs)), key=lambda i: (recs[i]["timestamp"], i))
    prompts = [recs[i]["hash_ids"][:recs[i]["input_length"] // BS] for i in order]
    return prompts, sum(r["input_length"] for r in recs)


def capacity_json(path: Path, caches: str, *extra: str) -> list[dict]:
    res = CliRunner().invoke(cli, ["capacity", str(path), "--block-size", str(BS),
                                   "--cache", caches, "--cache-dir", "off", "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def check_against_brute_force(path: Path, caches: list[int]) -> None:
    prompts, prompt_tokens = read_mooncake(path)
    rows = capacity_json(path, ",".join(str(c) for c in caches))
    assert [r["cache_tokens"] for r in rows] == sorted(caches)
    for row in rows:
        hits = sum(brute_force_lru(prompts, row["cache_tokens"] // BS))
        assert row["hit_tokens"] == hits * BS
        assert row["hit_rate"] == pytest.approx(hits * BS / prompt_tokens, rel=1e-12)
        assert (row["replicas"], row["router"], row["policy"], row["pool_tokens"]) == \
            (1, "none", "vllm", 0)


@st.composite
def chained_trace(draw) -> list[tuple[int, list[int], int]]:
    """(timestamp ms, hash ids, input tokens) records: agentic prompts over chained ids."""
    universe, history = Universe(), []
    records, t = [], 0
    for _ in range(draw(st.integers(1, 30))):
        choices: list[int] = []
        if history and draw(st.integers(0, 3)):
            base = draw(st.sampled_from(history))
            choices = base[:draw(st.integers(0, len(base)))]
        choices = (choices + draw(st.lists(st.integers(0, 3), max_size=8)))[:14] or [0]
        history.append(choices)
        t += draw(st.sampled_from([0, 0, 1, 5]))  # equal timestamps keep file order
        tokens = len(choices) * BS + draw(st.integers(0, BS - 1))
        records.append((t, [int(x) for x in universe.prompt(choices)], tokens))
    return records


def write_records(path: Path, records) -> Path:
    lines = [json.dumps({"timestamp": t, "input_length": n, "output_length": 1,
                         "hash_ids": [*ids, 10_000 + i] if n % BS else ids})  # + partial
             for i, (t, ids, n) in enumerate(records)]
    path.write_text("\n".join(lines) + "\n")
    return path


@settings(max_examples=40, deadline=None)
@given(records=chained_trace(), caches=st.lists(st.integers(1, 40), min_size=1, max_size=3,
                                                 unique=True))
def test_capacity_equals_brute_force_lru_on_random_traces(tmp_path_factory, records, caches):
    path = write_records(tmp_path_factory.mktemp("cap") / "t.jsonl", records)
    check_against_brute_force(path, [c * BS for c in caches])


@settings(max_examples=40, deadline=None)
@given(records=chained_trace(), blocks=st.integers(1, 40))
def test_fast_lru_equals_the_radix_cache_replay(tmp_path_factory, records, blocks):
    """The range replay is the radix cache under the vllm preset, request by request."""
    path = write_records(tmp_path_factory.mktemp("cap") / "t.jsonl", records)
    trace = load_trace(str(path), block_size=BS, cache_dir=None)
    fast, tree = LruReplay(blocks), CacheReplay(blocks, "vllm")
    order = arrival_order(trace)
    a = [fast.request(trace.block_ids(int(r))) for r in order]
    b = [tree.request(trace.block_ids(int(r))) for r in order]
    assert a == b


@pytest.mark.shared_data
@pytest.mark.skipif(not MOONCAKE.is_file(), reason="../shared/data absent")
def test_capacity_equals_brute_force_lru_on_the_mooncake_trace():
    check_against_brute_force(MOONCAKE, [300 * 1024, 3 * 1024 * 1024, 50 * 1024 * 1024])


def test_ideal_hit_rate_is_the_trace_stats_value():
    spec = "synthetic:claude-code?sessions=6"
    rows = capacity_json(spec, "64k,1m")
    res = CliRunner().invoke(cli, ["trace", "stats", spec, "--cache-dir", "off",
                                   "--block-size", str(BS), "--json"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.stdout)
    assert rows[0]["ideal_hit_rate"] == stats["infinite_cache_hit_rate"]
    assert rows[0]["hit_rate"] < rows[1]["hit_rate"] <= rows[1]["ideal_hit_rate"]


def test_penelope_keeps_a_history_tail_that_a_new_prompt_cannot_reuse():
    """Hand-computed: a 2-block cache holds [1, 2]; a request for [3] evicts one block. LRU
    frees the tail (block 2) and [1] hits again; Penelope frees the front (block 1: a hole)
    and [1] misses (it refills the hole)."""
    prompts = [np.array(p, np.int64) for p in ([1, 2], [3], [1])]
    lru, penelope = CacheReplay(2, "vllm"), CacheReplay(2, "penelope")
    assert [lru.request(p) for p in prompts] == [0, 0, 1]
    assert [penelope.request(p) for p in prompts] == [0, 0, 0]


def test_infinite_cache_replay_reaches_the_ideal_hit_rate():
    trace = load_trace("synthetic:claude-code?sessions=5", block_size=64, cache_dir=None)
    huge = int(trace.prompt_tokens.sum()) + 64
    row = capacity_curve(trace, [huge])[0]
    assert row.hit_rate == pytest.approx(row.ideal_hit_rate, rel=1e-12)


def test_arrival_order_follows_send_times_then_cumulative_gaps():
    trace = load_trace("synthetic:claude-code?sessions=4", block_size=64, cache_dir=None)
    order = arrival_order(trace)
    assert sorted(order.tolist()) == list(range(len(trace)))
    t = trace.send_time_s[order]
    if np.isfinite(t).all():
        assert (np.diff(t) >= 0).all()


def test_capacity_writes_json_and_png(tmp_path):
    out = tmp_path / "cap"
    res = CliRunner().invoke(cli, ["capacity", "synthetic:claude-code?sessions=4",
                                   "--cache", "64k..1m:3", "--policy", "vllm", "--policy",
                                   "penelope", "--out", str(out), "--cache-dir", "off"])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "capacity.json").read_text())
    assert len(doc["rows"]) == 6
    assert {r["policy"] for r in doc["rows"]} == {"vllm", "penelope"}
    assert (out / "capacity.png").stat().st_size > 10_000
    assert "infinite cache" in res.stdout


@pytest.mark.parametrize("args, words", [
    (["--cache", "1m..256k"], "--cache"),
    (["--cache", "0"], "--cache"),
    (["--cache", "lots"], "--cache"),
    (["--policy", "ttl"], "needs pins"),
    (["--policy", "clairvoyant"], "needs"),
    (["--policy", "nope"], "unknown eviction policy"),
])
def test_bad_capacity_options_fail_in_one_line(args, words):
    res = CliRunner().invoke(cli, ["capacity", "synthetic:chat?sessions=2", *args])
    assert res.exit_code == 2
    assert words in res.output
    assert "Traceback" not in res.output
