"""`kvsim trace stats`: kvsim's infinite-cache figure (full blocks: what an engine can cache)
beside the trace file's own (every hash id it lists, a partial last block's included, as
Mooncake and Dynamo count), so a trace can be checked against its publisher."""

from __future__ import annotations

import gzip
import json
from fractions import Fraction

import pytest
from click.testing import CliRunner
from conftest import SHARED_DATA
from tracefixtures import make_sessions, write_fx_cc_traces

from sim.cli.main import cli
from traces import load_trace

MOONCAKE = SHARED_DATA / "mooncake" / "synthetic_trace.jsonl.gz"

# Three 512-token-block requests: r1 repeats r0 (a retry), r2 shares r0's two full blocks.
#   r0: 1,124 tokens, ids [1, 2, 3]  (3: a 100-token partial block)
#   r1: 1,124 tokens, ids [1, 2, 3]
#   r2: 1,536 tokens, ids [1, 2, 4]
# The file's ids: 9 references, 4 distinct, 5 hits: 5/9, at any --block-size.
# kvsim at 512: full blocks [1, 2], [1, 2], [1, 2, 4]: 7 references, 3 distinct: 4/7.
# kvsim at 64: 17, 17 and 24 full blocks (r0's and r1's 17th lies in the partial block 3,
# the same in both), 17 + 8 distinct: (58 - 25) / 58 = 33/58.
RECORDS = [(0, 1124, [1, 2, 3]), (10, 1124, [1, 2, 3]), (20, 1536, [1, 2, 4])]


def tiny_mooncake(path):
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": n,
                                        "output_length": 5, "hash_ids": ids}) + "\n"
                            for t, n, ids in RECORDS))
    return str(path)


def stats(path: str, *args: str) -> dict:
    res = CliRunner().invoke(cli, ["trace", "stats", path, "--cache-dir", "off", "--json",
                                   *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("block_size, full_blocks", [(512, Fraction(4, 7)),
                                                     (64, Fraction(33, 58))])
def test_both_figures_hand_computed(tmp_path, block_size, full_blocks):
    d = stats(tiny_mooncake(tmp_path / "t.jsonl"), "--block-size", str(block_size))
    assert d["hash_id_hit_rate"] == pytest.approx(float(Fraction(5, 9)), abs=1e-15)
    assert d["hash_id_references"] == 9
    assert d["infinite_cache_block_hit_rate"] == pytest.approx(float(full_blocks), abs=1e-15)


def test_the_figure_counts_the_requests_kept(tmp_path):
    """--select first:2 keeps r0 and r1: 6 references, 3 distinct ids."""
    d = stats(tiny_mooncake(tmp_path / "t.jsonl"), "--select", "first:2")
    assert (d["hash_id_hit_rate"], d["hash_id_references"]) == (0.5, 6)


def test_the_table_labels_both_figures(tmp_path):
    res = CliRunner().invoke(cli, ["trace", "stats", tiny_mooncake(tmp_path / "t.jsonl"),
                                   "--cache-dir", "off"])
    assert res.exit_code == 0, res.output
    assert "infinite-cache hit, full blocks (kvsim)" in res.stdout
    assert "infinite-cache hit, file's hash ids" in res.stdout and "0.5556" in res.stdout


def test_the_counts_survive_the_trace_cache(tmp_path):
    path = tiny_mooncake(tmp_path / "t.jsonl")
    first = load_trace(path, cache_dir=str(tmp_path / "cache"))
    again = load_trace(path, cache_dir=str(tmp_path / "cache"))
    assert list((tmp_path / "cache").iterdir())
    assert (again.hash_id_refs, again.hash_id_distinct) == (first.hash_id_refs,
                                                            first.hash_id_distinct) == (9, 4)


def test_cc_traces_list_full_blocks_only(tmp_path):
    """cc-traces' hash ids are one per full 64-token block: at --block-size 64 the file's
    figure is kvsim's over every request's blocks."""
    write_fx_cc_traces(tmp_path, make_sessions(n_sessions=3))
    trace = load_trace(str(tmp_path), block_size=64, cache_dir=None)
    blocks = int((trace.prompt_tokens // 64).sum())
    assert trace.hash_id_refs == blocks
    assert trace.hash_id_hits() == int(trace.infinite_cache_hits().sum())
    assert trace.hash_id_hits() < blocks


def test_synthetic_traces_have_no_hash_ids():
    d = stats("synthetic:chat?sessions=2")
    assert (d["hash_id_hit_rate"], d["hash_id_references"]) == (None, 0)


@pytest.mark.shared_data
@pytest.mark.skipif(not MOONCAKE.is_file(), reason="../shared/data absent")
def test_the_mooncake_trace_against_its_own_ids():
    """Every hash id of the file, in file order, against the set of those seen before."""
    seen: set[int] = set()
    hits = refs = 0
    with gzip.open(MOONCAKE, "rt") as f:
        for line in f:
            ids = json.loads(line)["hash_ids"]
            hits += sum(i in seen for i in ids)
            refs += len(ids)
            seen.update(ids)
    d = stats(str(MOONCAKE))
    assert d["hash_id_references"] == refs == 121_877
    assert d["hash_id_hit_rate"] == hits / refs
    assert round(d["hash_id_hit_rate"], 4) == 0.6396
    assert round(d["infinite_cache_block_hit_rate"], 4) == 0.6524  # full 64-token blocks
    assert stats(str(MOONCAKE), "--block-size", "512")["hash_id_hit_rate"] == hits / refs
