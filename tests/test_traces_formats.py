"""Every loader on fixtures written from one token-level model (tests/tracefixtures.py)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests import tracefixtures as F
from traces import detect_format, load_trace
from traces.builder import common_prefix

HAS_DUCKDB = importlib.util.find_spec("duckdb") is not None


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    d = tmp_path_factory.mktemp("fx")
    S = F.make_sessions(seed=7)
    F.write_fx_cc_traces(d / "cc", S)
    F.write_fx_cc_traces(d / "cc_plain", S[:1], gz=False)
    F.write_jsonl(d / "cc.jsonl", [F.cc_session_doc(s) for s in S])
    F.write_jsonl(d / "mc.jsonl.gz", F.mooncake_records(S))
    F.write_jsonl(d / "tl.jsonl", F.tracelab_records(S))
    F.write_freeinference_jsonl(d / "fij", S)
    F.write_freeinference_parquet(d / "fip", S)
    if HAS_DUCKDB:
        F.write_tracelab_duckdb(d / "tl.duckdb", F.tracelab_records(S))
    return d, S


def _truth_blocks(S, bs=64):
    """Per request (main sessions in order, then sub-agents), ids from the tokens."""
    w = F.TokenWorld(bs)
    main = [w.ids(r.tokens) for s in S for r in s.requests]
    subs = [w.ids(r.tokens) for s in S for _, sub, _ in s.subagents for r in sub.requests]
    return main + subs


def test_detect(fx):
    d, _ = fx
    assert detect_format([str(d / "cc")]) == "cc-traces"
    assert detect_format([str(d / "cc.jsonl")]) == "cc-traces"
    assert detect_format([str(d / "mc.jsonl.gz")]) == "mooncake"
    assert detect_format([str(d / "tl.jsonl")]) == "tracelab"
    assert detect_format([str(d / "fij")]) == "freeinference"
    assert detect_format([str(d / "fij" / "traces" / "2026-06-01.jsonl")]) == "freeinference"
    assert detect_format([str(d / "fip")]) == "freeinference"
    if HAS_DUCKDB:
        assert detect_format([str(d / "tl.duckdb")]) == "tracelab-duckdb"


@pytest.mark.parametrize("name", ["cc", "cc.jsonl", "fij", "fip"])
def test_session_formats_agree_with_the_tokens(fx, name):
    d, S = fx
    t = load_trace(str(d / name))
    assert [s.count for s in t.sessions] == [7, 7, 7, 2]
    sub = t.sessions[3]
    assert sub.parent == 0 and sub.after_request == 1
    assert sub.start_offset_s == pytest.approx(0.5, abs=2e-3)
    truth = _truth_blocks(S)
    flat = [r for s in S for r in s.requests] + [r for s in S for _, x, _ in s.subagents
                                                 for r in x.requests]
    assert t.prompt_tokens.tolist() == [len(r.tokens) for r in flat]
    assert t.output_tokens.tolist() == [r.output for r in flat]
    # recorded gaps: think times, except after the sub-agent: 3 s from its completion
    want_gaps = [0.0 if k == 0 else (3.0 if (i == 0 and k == 2) else r.think)
                 for i, s in enumerate(S) for k, r in enumerate(s.requests)] + [0.0, 2.0 + 1]
    assert np.allclose(t.gap_s, want_gaps, atol=2e-3)
    assert t.gap_kind[:7].tolist() == [0, 1, 1, 2, 1, 1, 2]
    for r in range(len(t)):  # same prefix structure as the tokens
        assert t.block_ids(r).shape[0] == len(truth[r])
        if r and t.session[r] == t.session[r - 1]:
            assert t.prefix_blocks[r] == common_prefix(np.array(truth[r]),
                                                       np.array(truth[r - 1]))
    # golden: append, append, edit (the tail changed), append, compaction, append
    assert t.prefix_blocks[:7].tolist() == [0, 30, 35, 38, 42, 25, 35]
    # cross-session sharing: cc-traces ids are per session; FreeInference ids are global
    shared = common_prefix(t.block_ids(0), t.block_ids(7))
    assert shared == (0 if name.startswith("cc") else 1600 // 64)


def test_mooncake(fx):
    d, S = fx
    t = load_trace(str(d / "mc.jsonl.gz"))
    assert len(t) == 21 and len(t.sessions) == 21  # one request per session: open loop
    assert np.all(np.diff(t.send_time_s) >= 0)
    assert t.send_time_s[0] == 0.0
    # 512-token ids shared across users: the 1,600-token system prompt has 3 full 512 blocks
    firsts = [r for r in range(len(t)) if t.prompt_tokens[r] < 2600]
    assert common_prefix(t.block_ids(firsts[0]), t.block_ids(firsts[1])) == 3 * 512 // 64
    r = load_trace(str(d / "mc.jsonl.gz"), rebuild_sessions=True)
    # a first prompt made of the shared system prompt only cannot be told from another user's:
    # it stays alone; appends (and the tail edit, below 512-token resolution) continue; the
    # compaction starts a new session. No session mixes users.
    assert [s.count for s in r.sessions] == [1, 1, 1, 4, 4, 4, 2, 2, 2]
    user = {(len(q.tokens), q.output): i for i, s in enumerate(S) for q in s.requests}
    for i in range(len(r.sessions)):
        owners = {user[(int(r.prompt_tokens[j]), int(r.output_tokens[j]))]
                  for j in r.session_requests(i)}
        assert len(owners) == 1


def _tracelab_checks(t, S):
    assert [s.count for s in t.sessions] == [7, 7, 7]
    assert t.prompt_tokens[:7].tolist() == [len(r.tokens) for r in S[0].requests]
    # synthesized ids: growth shares previous input + output; a shrink shares prefix_tokens
    rs = S[0].requests
    for k in range(1, 7):
        if len(rs[k].tokens) >= len(rs[k - 1].tokens):
            want = min(len(rs[k - 1].tokens) + rs[k - 1].output, len(rs[k].tokens)) // 64
        else:
            want = 1600 // 64  # the compaction keeps the system prompt
        # prefix_blocks counts blocks of the previous PROMPT (the rest came from its output)
        assert t.prefix_blocks[k] == min(want, len(rs[k - 1].tokens) // 64)
        # ... and the previous reply's blocks are the ones this prompt reuses
        nxt = t.block_ids(k)
        fin = t.finish_block_ids(k - 1)
        assert common_prefix(fin, nxt) == min(want, fin.shape[0])
    # TraceLab cannot see the edit at request 3 (the prompt grew): it shares 39 blocks
    assert t.prefix_blocks[:7].tolist() == [0, 30, 35, 39, 42, 25, 35]
    assert np.allclose(t.gap_s[1:7], [r.think for r in rs[1:]], atol=2e-3)
    assert t.gap_kind[:7].tolist() == [0, 1, 1, 2, 1, 1, 2]


def test_tracelab_jsonl(fx):
    d, S = fx
    _tracelab_checks(load_trace(str(d / "tl.jsonl")), S)


@pytest.mark.skipif(not HAS_DUCKDB, reason="duckdb not installed (optional extra)")
def test_tracelab_duckdb_matches_jsonl(fx):
    d, S = fx
    a = load_trace(str(d / "tl.duckdb"))
    b = load_trace(str(d / "tl.jsonl"))
    _tracelab_checks(a, S)
    for col in ("prompt_tokens", "output_tokens", "gap_s", "gap_kind", "prefix_blocks",
                "send_time_s"):
        assert np.allclose(getattr(a, col), getattr(b, col))


def test_stats_on_every_format(fx):
    d, _ = fx
    for name in ["cc", "mc.jsonl.gz", "tl.jsonl", "fij", "fip"]:
        s = load_trace(str(d / name)).stats()
        assert s["requests"] > 0 and s["prompt_tokens"]["median"] > 0
        assert 0 <= s["infinite_cache_block_hit_rate"] <= 1
    s = load_trace(str(d / "cc")).stats()
    assert (s["sessions"], s["requests"], s["subagent_sessions"], s["subagent_requests"]) == (
        3, 21, 1, 2)
    assert s["append_only_fraction"] == pytest.approx(12 / 18)  # 2 edits + 1 compaction/session
    # tool gaps 2 + k at k = 1, 2, 4, 5, but 3 s after the sub-agent: median of
    # [3, 3, 6, 7, 3, 4, 6, 7, 3, 4, 6, 7] = 5
    assert s["gap_s"]["tool_median"] == pytest.approx(5.0, abs=0.01)


def test_block_size_and_shared_prefix_options(fx):
    d, S = fx
    t32 = load_trace(str(d / "cc"), block_size=32)
    t64 = load_trace(str(d / "cc"))
    assert t32.block_ids(0).shape[0] == len(S[0].requests[0].tokens) // 32
    assert t32.prefix_blocks[1] == 2 * t64.prefix_blocks[1]
    sp = load_trace(str(d / "cc"), shared_prefix="auto")  # system + tool = 1,600 tokens
    assert common_prefix(sp.block_ids(0), sp.block_ids(7)) == 1600 // 64
    assert [s.shared_prefix_blocks for s in sp.sessions] == [25, 25, 25, 0]
    sp = load_trace(str(d / "cc"), shared_prefix=640)
    assert common_prefix(sp.block_ids(0), sp.block_ids(14)) == 10
    # the sub-agent keeps its own ids
    assert common_prefix(sp.block_ids(21), sp.block_ids(0)) == 0


def test_cache_roundtrip(fx, tmp_path):
    d, _ = fx
    a = load_trace(str(d / "cc"), cache_dir=str(tmp_path), shared_prefix="auto")
    files = list(tmp_path.glob("parsed-*.npz"))
    assert len(files) == 1 and len(list(tmp_path.glob("built-*.npz"))) == 1
    b = load_trace(str(d / "cc"), cache_dir=str(tmp_path), shared_prefix="auto")
    assert a.sessions == b.sessions and a.stats() == b.stats()
    for r in range(len(a)):
        assert np.array_equal(a.block_ids(r), b.block_ids(r))
        assert np.array_equal(a.finish_block_ids(r), b.finish_block_ids(r))
    for f in tmp_path.glob("*.npz"):
        f.write_bytes(b"garbage")  # unusable cache files are rebuilt
    c = load_trace(str(d / "cc"), cache_dir=str(tmp_path), shared_prefix="auto")
    assert c.stats() == a.stats()


def test_freeinference_tool_latency_when_reply_end_is_missing(tmp_path):
    S = F.make_sessions(seed=7, n_sessions=1, subagent=False)
    docs = F.freeinference_sessions(S)
    docs[0]["requests"][0]["end_ms"] = None
    docs[0]["requests"][0]["tool_calls"] = [{"call_index": 0, "name": "Bash",
                                             "latency_ms": 4200},
                                            {"call_index": 1, "name": "Read", "latency_ms": 800}]
    (tmp_path / "traces").mkdir()
    F.write_jsonl(tmp_path / "traces" / "w.jsonl", docs)
    t = load_trace(str(tmp_path), format="freeinference")
    assert t.gap_s[1] == pytest.approx(4.2)
    assert t.gap_s[2] == pytest.approx(S[0].requests[2].think, abs=2e-3)
