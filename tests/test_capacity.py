"""``kvsim capacity``: the cache-only replay against an independent brute-force LRU.

The brute force is an ordered dict over the trace file's own block ids (no kvsim code): a
request reuses its leading cached blocks (at most ``(prompt - 1) // block`` of them: an engine
computes one token at least), makes them most recent, evicts the least recent blocks until
the blocks it caches fit (its prompt's, then its decoded output's, as the engines insert a
finished request; a sequence longer than the cache keeps its longest prefix that fits), and
uses its blocks from the tail to the head, so a history is evicted from its end, oldest
request first.
"""

from __future__ import annotations

import gzip
import json
from collections import OrderedDict
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from chained import Universe
from click.testing import CliRunner
from conftest import SHARED_DATA
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli.main import cli
from sim.studies.capacity import (
    CacheReplay,
    LruReplay,
    _earlier_greater_sums,
    arrival_order,
    capacity_curve,
    ideal_hits,
    lru_hits_all_sizes,
    replay_hits,
)
from traces import load_trace

MOONCAKE = SHARED_DATA / "mooncake" / "synthetic_trace.jsonl.gz"
BS = 512  # Mooncake's block size: kvsim's blocks are then the file's hash ids


class Req(NamedTuple):
    """One request as the brute force sees it."""

    prompt: list  # its full blocks
    cached: list  # what it leaves in the cache: the prompt's blocks, then its output's
    usable: int  # the most blocks it can reuse


def brute_force_lru(requests: list[Req], capacity: int) -> list[int]:
    """Hits (blocks) per request, in the given order."""
    cache: OrderedDict = OrderedDict()
    hits = []
    for req in requests:
        ids = req.cached
        h = 0
        while h < len(ids) and ids[h] in cache:
            h += 1
        hits.append(min(h, len(req.prompt), req.usable))
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


def mooncake_request(i: int, rec: dict) -> Req:
    """A Mooncake record: every request is its own session, so its output blocks (the full
    blocks of prompt + output - 1 tokens past the prompt's) are new to the trace."""
    p, o = rec["input_length"], rec["output_length"]
    prompt = rec["hash_ids"][:p // BS]
    out = [("out", i, j) for j in range(max(0, (p + o - 1) // BS - p // BS))]
    return Req(prompt, prompt + out, max(0, (p - 1) // BS))


def read_mooncake(path: Path) -> tuple[list[Req], int]:
    """The file's requests in timestamp order (stable), and prompt tokens."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    order = sorted(range(len(recs)), key=lambda i: (recs[i]["timestamp"], i))
    return [mooncake_request(i, recs[i]) for i in order], sum(r["input_length"] for r in recs)


def trace_requests(trace) -> list[Req]:
    """A kvsim trace's requests in arrival order (what each caches: ``finish_block_ids``)."""
    return [Req(trace.block_ids(int(r)).tolist(), trace.finish_block_ids(int(r)).tolist(),
                max(0, (int(trace.prompt_tokens[r]) - 1) // trace.block_size))
            for r in arrival_order(trace)]


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
    """(timestamp ms, hash ids, input tokens, output tokens) records: agentic prompts over
    chained ids."""
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
        out = draw(st.sampled_from([1, 1, 0, BS // 2, 3 * BS]))
        records.append((t, [int(x) for x in universe.prompt(choices)], tokens, out))
    return records


def write_records(path: Path, records) -> Path:
    lines = [json.dumps({"timestamp": t, "input_length": n, "output_length": o,
                         "hash_ids": [*ids, 10_000 + i] if n % BS else ids})  # + partial
             for i, (t, ids, n, o) in enumerate(records)]
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
    reqs = [(trace.block_ids(int(r)), trace.finish_block_ids(int(r))) for r in order]
    a = [fast.request(ids, finish) for ids, finish in reqs]
    b = [tree.request(ids, finish) for ids, finish in reqs]
    assert a == b


def check_one_pass(trace, blocks: list[int]) -> None:
    """Every size from the one pass equals its own replay and the brute force, request by
    request; the unlimited replay beside them is ``ideal_hits``."""
    order = arrival_order(trace)
    hits, ideal = lru_hits_all_sizes(trace, blocks, order)
    assert hits.shape == (len(blocks), len(trace))
    assert ideal.tolist() == ideal_hits(trace, order).tolist()
    reqs = trace_requests(trace)
    for b, row in zip(blocks, hits, strict=True):
        assert row.tolist() == replay_hits(trace, b * trace.block_size, "vllm", order).tolist()
        assert row[order].tolist() == brute_force_lru(reqs, b)


@settings(max_examples=60, deadline=None)
@given(records=chained_trace(), blocks=st.lists(st.integers(0, 60), min_size=1, max_size=6))
def test_one_pass_equals_every_size_replayed_on_random_traces(tmp_path_factory, records,
                                                              blocks):
    """LRU stack distances (one replay for all sizes) are exact: per request, the same hits
    as a replay per size and as the ordered-dict LRU, for sizes from 0 blocks to past the
    footprint, repeated and unsorted ones included."""
    path = write_records(tmp_path_factory.mktemp("cap") / "t.jsonl", records)
    check_one_pass(load_trace(str(path), block_size=BS, cache_dir=None), blocks)


def test_one_pass_equals_every_size_replayed_on_agentic_sessions():
    """Sessions whose next prompt repeats the reply, sub-agents, a shared prefix: 64-token
    blocks, sizes where the cache holds a few prompts up to all of them."""
    trace = load_trace("synthetic:claude-code?sessions=12", block_size=64, max_context=65536,
                       shared_prefix="auto", cache_dir=None)
    assert (trace.finish_blocks() > trace.prompt_tokens // 64).any()
    check_one_pass(trace, [0, 1, 200, 1000, 5000, 20000, 10**7])


@settings(max_examples=100, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 70), st.integers(1, 9)), max_size=40))
def test_earlier_greater_sums_is_the_quadratic_count(pairs):
    keys = np.array([k for k, _ in pairs], np.int64)
    weights = np.array([w for _, w in pairs], np.int64)
    want = [sum(w for k2, w in pairs[:i] if k2 > k) for i, (k, _) in enumerate(pairs)]
    assert _earlier_greater_sums(keys, weights).tolist() == want


@pytest.mark.shared_data
@pytest.mark.skipif(not MOONCAKE.is_file(), reason="../shared/data absent")
def test_one_pass_equals_every_size_replayed_on_the_mooncake_trace():
    trace = load_trace(str(MOONCAKE), format="mooncake", block_size=BS, cache_dir=None)
    check_one_pass(trace, [512, 2048, 9000, 30000, 131072])


@pytest.mark.shared_data
@pytest.mark.skipif(not MOONCAKE.is_file(), reason="../shared/data absent")
def test_capacity_equals_brute_force_lru_on_the_mooncake_trace():
    check_against_brute_force(MOONCAKE, [300 * 1024, 3 * 1024 * 1024, 50 * 1024 * 1024])


def test_ideal_hit_rate_is_the_unlimited_replay_and_at_least_the_prompt_only_figure():
    """The ideal is the same replay with an unlimited cache: above `kvsim trace stats`'s
    prompt-only infinite cache by the output blocks the next turns reuse."""
    spec = "synthetic:claude-code?sessions=6"
    rows = capacity_json(spec, "64k,1m")
    res = CliRunner().invoke(cli, ["trace", "stats", spec, "--cache-dir", "off",
                                   "--block-size", str(BS), "--json"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.stdout)
    trace = load_trace(spec, block_size=BS, cache_dir=None)
    prompt = int(trace.prompt_tokens.sum())
    assert rows[0]["ideal_hit_rate"] == int(ideal_hits(trace).sum()) * BS / prompt
    assert rows[0]["ideal_hit_rate"] > stats["infinite_cache_hit_rate"]
    assert rows[0]["hit_rate"] < rows[1]["hit_rate"] <= rows[1]["ideal_hit_rate"]


def two_turns(output_tokens: int):
    """One session, 64-token blocks: a 2-block prompt [1, 2] answered with
    ``output_tokens``, then a 328-token prompt [1, 2, 3, 4, 5] that repeats the first prompt
    and its reply (blocks 3 and 4 hold the reply's tokens when it is 130 long)."""
    from traces.builder import TraceBuilder
    from traces.kinds import GAP_HUMAN

    b = TraceBuilder("two-turns", "test", "test", 64)
    h = b.open_session("s")
    b.add(h, prompt=128, output=output_tokens, ids=np.array([1, 2]), send_time_s=0.0,
          gap_s=0.0, gap_kind=GAP_HUMAN)
    b.add(h, prompt=328, output=1, ids=np.array([1, 2, 3, 4, 5]), send_time_s=60.0,
          gap_s=30.0, gap_kind=GAP_HUMAN)
    return b.build()


def engine_hits(trace, engine: str) -> list[int]:
    """Per request, the GPU hit (tokens) of a timed run whose cache never fills."""
    from sim.config import RunConfig
    from sim.run import run

    cfg = RunConfig.from_flat(trace="two-turns", gpu_cache=1 << 26, sessions=8, engine=engine,
                              max_context=131072).with_preset("vllm")
    res = run(cfg, trace)
    return res.requests.sort_values("request")["hit_gpu_tokens"].tolist()


def test_the_next_turn_reuses_the_blocks_of_the_reply_hand_computed():
    """Turn 1 caches [1, 2] and the 2 full blocks its 130-token reply completes
    ((128 + 130 - 1) // 64 = 4 blocks); turn 2 reuses all 4 (256 tokens), as the engines do.
    A 60-token reply completes no block: turn 2 reuses the prompt's 2 (128 tokens)."""
    for out, want in ((130, [0, 4]), (60, [0, 2])):
        trace = two_turns(out)
        assert ideal_hits(trace).tolist() == want
        assert capacity_curve(trace, [64 * 64])[0].hit_tokens == want[1] * 64
        for engine in ("sglang", "vllm"):
            assert engine_hits(trace, engine) == [64 * w for w in want]


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_unlimited_cache_equals_the_engine_without_pressure_request_by_request(engine):
    """Sessions with replies that the next prompt repeats, prompts of whole blocks included
    (the engine computes one token of a fully cached prompt: the replay counts the same)."""
    trace = load_trace("synthetic:claude-code?sessions=30", max_context=131072,
                       cache_dir=None)
    assert (trace.prompt_tokens % 64 == 0).any()
    assert (trace.finish_blocks() > trace.prompt_tokens // 64).any()
    want = engine_hits(trace, engine)
    got = (ideal_hits(trace) * 64).tolist()
    assert got == want


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


def test_the_capacity_command_loads_no_other_command_study_fleet_or_table_library():
    """``kvsim capacity`` takes what a one-cache curve uses: not the other commands (the
    timed run, sweeps, plots), the study registry (every study, SimPy), the fleet view,
    pandas or matplotlib (start-up, issue 55)."""
    import subprocess
    import sys

    code = ("import sys\nfrom sim.cli.main import cli\n"
            "cli(['capacity', 'synthetic:chat?sessions=2', '--cache', '64k,1m', '--cache-dir', "
            "'off', '--json'], standalone_mode=False)\n"
            "print([m for m in ('sim.cli.run', 'sim.cli.sweep', 'sim.cli.plan', 'sim.cli.plot', "
            "'sim.cli.reproduce', 'sim.cli.calibrate', 'simpy', 'sim.studies.study', "
            "'sim.studies.capacity_fleet', 'sim.fleet', 'pandas', 'matplotlib', 'pyarrow') "
            "if m in sys.modules])")
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                         text=True, check=True)
    assert res.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("fleet", [[], ["--replicas", "2"]])
def test_progress_is_shown_in_a_log(fleet):
    """stderr is not a terminal here: the progress facility prints plain lines (the first
    report, each replay as it starts, the end), and stdout stays one JSON document."""
    res = CliRunner().invoke(cli, ["capacity", "synthetic:claude-code?sessions=4", "--cache",
                                   "64k,1m", "--cache-dir", "off", "--json", *fleet])
    assert res.exit_code == 0, res.output
    json.loads(res.stdout)
    lines = [x for x in res.stderr.splitlines() if x.startswith("kvsim capacity:")]
    if fleet:
        assert lines[0].startswith("kvsim capacity: unlimited cache: 0/")
        assert any("vllm, 65,536-token cache" in x for x in lines)
        assert any("vllm, 1,048,576-token cache" in x for x in lines)
    else:  # one replay for both sizes (LRU stack distances)
        assert lines[0].startswith("kvsim capacity: unlimited cache (LRU: all 2 sizes from "
                                   "its stack): 0/")
        assert not any("-token cache" in x for x in lines)
    assert "requests (100%)" in lines[-1]
