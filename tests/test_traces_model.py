"""The canonical Trace: compact id store vs a brute-force model, options, gap models."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import traces.model
from tests.tracefixtures import TokenWorld
from traces import GAP_KINDS, OptionError, parse_gap_model
from traces.blocks import UniqueIds, map_block_ids
from traces.builder import TraceBuilder, common_prefix
from traces.kinds import GAP_HUMAN, GAP_TOOL


def _chained_sessions(draw_ops, n_sessions: int) -> list[list[list[int]]]:
    """Sessions of prompts built by append / truncate / branch-back operations on a chained
    id model (ids are (parent id, fresh) pairs interned in one dict per session)."""
    out = []
    for s in range(n_sessions):
        ops = draw_ops[s]
        counter = [0]
        prompts: list[list[int]] = []
        cur: list[int] = []
        for kind, n in ops:
            if kind == "append":
                cur = cur + [counter[0] + i for i in range(n)]
                counter[0] += n
            elif kind == "cut":
                cur = cur[: max(0, len(cur) - n)] + [counter[0] + i for i in range(2)]
                counter[0] += 2
            elif kind == "back" and prompts:
                cur = list(prompts[n % len(prompts)])  # branch back to an older prompt
            prompts.append(cur)
        out.append(prompts)
    return out


ops_strategy = st.lists(st.tuples(st.sampled_from(["append", "cut", "back"]),
                                  st.integers(0, 12)), min_size=1, max_size=12)


def _build(sessions, bs=4, **build):
    b = TraceBuilder("t", "test", "mem", bs)
    for i, prompts in enumerate(sessions):
        h = b.open_session(f"s{i}", scope=i, prefix_hint_tokens=3 * bs)
        for k, ids in enumerate(prompts):
            b.add(h, prompt=len(ids) * bs + (k % bs), output=5 + k, ids=np.array(ids, np.int64),
                  send_time_s=float(k), gap_s=float(k), gap_kind=GAP_TOOL if k % 2 else GAP_HUMAN)
        b.close(h)
    return b.build(**build)


@settings(max_examples=60, deadline=None)
@given(st.lists(ops_strategy, min_size=1, max_size=4))
def test_block_ids_match_brute_force(ops):
    sessions = _chained_sessions(ops, len(ops))
    t = _build(sessions)
    flat = [(s, p) for s, prompts in enumerate(sessions) for p in prompts]
    assert len(t) == len(flat)
    for r, (s, ids) in enumerate(flat):
        got = t.block_ids(r)
        assert got.shape[0] == len(ids) == t.n_blocks(r)
        assert t.session[r] == s
    # equal ids <=> equal prefix, within a session; never across sessions (no shared prefix)
    for r1, (s1, a) in enumerate(flat):
        for r2, (s2, b) in enumerate(flat):
            want = common_prefix(np.array(a), np.array(b)) if s1 == s2 else 0
            assert common_prefix(t.block_ids(r1), t.block_ids(r2)) == want
    # memory scales with distinct blocks: the pool holds just the ids each request adds
    added = sum(len(p) - common_prefix(np.array(p), np.array(q))
                for prompts in sessions for q, p in zip([[], *prompts[:-1]], prompts, strict=True))
    assert t._pool.shape[0] == added


@settings(max_examples=80, deadline=None)
@given(st.lists(ops_strategy, min_size=1, max_size=4),
       st.lists(st.tuples(st.sampled_from(["finish", "prompt", "replay"]),
                          st.integers(0, 10_000)), max_size=60),
       st.integers(1, 3))
@example(ops=[[("append", 6), ("cut", 2), ("append", 3), ("append", 2)]],
         reads=[("replay", 1), ("replay", 2), ("prompt", 3), ("finish", 1), ("prompt", 2)],
         kept=1)
@example(ops=[[("append", 6), ("cut", 2), ("append", 3), ("append", 2)]],
         reads=[("finish", 1), ("finish", 2), ("prompt", 2), ("prompt", 3)], kept=1)
def test_reads_in_any_order_equal_a_fresh_traces(ops, reads, kept):
    """A finish keeps the next prompt's gathered ids for its send (``Trace._gather_ahead``):
    whatever the order of reads (``replay``: a finish, then the next prompt, as the replay
    reads them), each returns what an untouched trace returns, and at most ``AHEAD_KEPT``
    wait (made tiny here so the bound is reached)."""
    sessions = _chained_sessions(ops, len(ops))
    t, fresh = _build(sessions), _build(sessions)
    n = len(t)

    def same(read: np.ndarray, want: np.ndarray) -> None:
        fresh._ahead.clear()  # the reference keeps nothing ahead: every read gathers anew
        assert np.array_equal(read, want) and read.dtype == want.dtype

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(traces.model, "AHEAD_KEPT", kept)
        for kind, r in reads:
            r %= n
            if kind != "prompt":
                same(t.finish_block_ids(r), fresh.finish_block_ids(r))
            if kind != "finish":
                r = r + 1 if kind == "replay" and r + 1 < n else r
                same(t.block_ids(r), fresh.block_ids(r))
            assert len(t._ahead) <= kept
    for r in range(n):
        same(t.block_ids(r), fresh.block_ids(r))
        same(t.finish_block_ids(r), fresh.finish_block_ids(r))


@settings(max_examples=40, deadline=None)
@given(st.lists(ops_strategy, min_size=2, max_size=4), st.integers(0, 6))
def test_shared_prefix_shares_exactly_the_first_blocks(ops, blocks):
    sessions = _chained_sessions(ops, len(ops))
    t = _build(sessions, shared_prefix=blocks * 4)
    firsts = [s.first for s in t.sessions]
    for i, a in enumerate(firsts):
        for j, b in enumerate(firsts):
            if i != j:
                na, nb = t.n_blocks(a), t.n_blocks(b)
                assert common_prefix(t.block_ids(a), t.block_ids(b)) == min(blocks, na, nb)
        assert t.sessions[i].shared_prefix_blocks == min(blocks, t.n_blocks(a))
        assert np.array_equal(t.block_ids(a)[: min(blocks, t.n_blocks(a))],
                              np.arange(min(blocks, t.n_blocks(a))))


def test_finish_block_ids_uses_next_prompt_then_fresh_ids():
    bs = 4
    b = TraceBuilder("t", "test", "mem", bs)
    h = b.open_session("a")
    # r0: 10 tokens (2 blocks) + 9 output -> (19-1)//4 = 4 blocks; r1 extends it with 5 blocks
    b.add(h, prompt=10, output=9, ids=np.array([1, 2]), send_time_s=0, gap_s=0, gap_kind=0)
    b.add(h, prompt=22, output=3, ids=np.array([1, 2, 3, 4, 5]), send_time_s=1, gap_s=1,
          gap_kind=GAP_TOOL)
    # r2 does not extend r1 (edit): r1's output blocks are fresh
    b.add(h, prompt=16, output=8, ids=np.array([1, 2, 3, 9]), send_time_s=2, gap_s=1,
          gap_kind=GAP_TOOL)
    t = b.build()
    f0, f1, f2 = (t.finish_block_ids(r) for r in range(3))
    assert np.array_equal(f0, np.concatenate([t.block_ids(1)[:4]]))
    assert f1.shape[0] == (22 + 3 - 1) // bs == 6
    assert np.array_equal(f1[:5], t.block_ids(1)) and f1[5] >= t._fresh_base
    assert f2.shape[0] == (16 + 8 - 1) // bs == 5 and f2[4] >= t._fresh_base
    every_prompt_id = set(np.concatenate([t.block_ids(r) for r in range(3)]).tolist())
    assert f1[5] != f2[4] and f1[5] not in every_prompt_id and f2[4] not in every_prompt_id


def test_max_context_select_and_subagents():
    b = TraceBuilder("t", "test", "mem", 4)
    sizes = {"a": [8, 12, 40, 16], "b": [8, 9, 10, 11, 12], "c": [50, 8], "d": [8, 9, 10, 11, 13]}
    handles = {}
    for sid, ps in sizes.items():
        h = handles[sid] = b.open_session(sid)
        for k, p in enumerate(ps):
            ids = np.arange(p // 4, dtype=np.int64) + 100 * len(handles)
            b.add(h, prompt=p, output=1, ids=ids, send_time_s=k, gap_s=1, gap_kind=GAP_TOOL)
    early = b.open_session("a/sub0", parent=handles["a"], after_local=0)
    late = b.open_session("a/sub2", parent=handles["a"], after_local=2)
    for h in (early, late):
        b.add(h, prompt=8, output=1, ids=np.arange(2), send_time_s=0, gap_s=0, gap_kind=0)
    t = b.build(max_context=32)  # a ends before its 40-token request, c is gone
    assert [s.id for s in t.sessions] == ["a", "b", "d", "a/sub0"]
    assert [s.count for s in t.sessions] == [2, 5, 5, 1]
    assert t.sessions[3].parent == 0 and t.sessions[3].after_request == 0
    t = b.build(max_context=32, select="top-requests:1")  # b and d tie: trace order
    assert [s.id for s in t.sessions] == ["b"]
    t = b.build(select="top-requests:2")
    assert [s.id for s in t.sessions] == ["b", "d"]
    t = b.build(select="first:1")
    assert [s.id for s in t.sessions] == ["a", "a/sub0", "a/sub2"]
    assert t.sessions[2].after_request == 2
    with pytest.raises(OptionError):
        b.build(select="top:3")


def test_gap_models():
    b = TraceBuilder("t", "test", "mem", 4)
    h = b.open_session("a")
    for k, (g, kind) in enumerate([(0, 0), (5.0, GAP_TOOL), (100.0, GAP_HUMAN), (30, GAP_TOOL)]):
        b.add(h, prompt=4, output=1, ids=np.array([1]), send_time_s=k, gap_s=g, gap_kind=kind)
    t = b.build()
    assert GAP_KINDS == ("first", "tool", "human")
    assert t.gaps("recorded").tolist() == [0, 5, 100, 30]
    assert t.gaps("tool").tolist() == [0, 5, 0, 30]
    assert t.gaps("cap:10").tolist() == [0, 5, 10, 10]
    assert t.gaps("scale:0.5").tolist() == [0, 2.5, 50, 15]
    for bad in ["", "cap", "cap:-1", "scale:x", "cap:nan", "median", "tool:3"]:
        with pytest.raises(ValueError) as e:
            t.gaps(bad)
        assert e.value.exit_code == 2
    assert parse_gap_model("cap:2.5") == ("cap", 2.5)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([(16, 64), (512, 64), (64, 64), (64, 32), (64, 128), (48, 64)]),
       st.lists(st.integers(0, 3), min_size=2, max_size=6), st.integers(0, 10**6))
def test_block_size_mapping_vs_token_truth(sizes, script, seed):
    """Map trace ids at one block size onto another; compare with ids computed from the
    tokens at the cache block size: never a false share, exact when sizes divide."""
    bt, bc = sizes
    rng = np.random.default_rng(seed)
    tw, cw = TokenWorld(bt), TokenWorld(bc)
    prompts, cur = [], rng.integers(0, 5, 300)
    for op in script:
        if op == 0:
            cur = np.concatenate([cur, rng.integers(0, 5, int(rng.integers(1, 400)))])
        elif op == 1:
            cur = cur[: int(rng.integers(0, len(cur) + 1))]
        prompts.append(cur)
    unique = UniqueIds()
    mapped = [map_block_ids(np.array(tw.ids(p, ceil=bt > bc), np.int64), bt, len(p), bc,
                            unique) for p in prompts]
    truth = [np.array(cw.ids(p), np.int64) for p in prompts]
    exact = bc % bt == 0 or bt % bc == 0
    for i in range(len(prompts)):
        assert mapped[i].shape[0] == len(prompts[i]) // bc
        for j in range(len(prompts)):
            got = common_prefix(mapped[i], mapped[j])
            want = common_prefix(truth[i], truth[j])
            if i == j:
                continue
            assert got <= want
            if exact and bt <= bc:
                assert got == want


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62), max_size=8),
       st.lists(st.sampled_from([",", ", ", " , ", ",,", " ", "-", ".5", "", "\n,"]),
                min_size=8, max_size=8),
       st.sampled_from(["hash_ids", "block_ids", "other"]))
def test_fast_id_list_parsing_equals_json(ids, seps, key):
    """The numpy id-list fast path accepts exactly what json accepts, with the same values."""
    import json

    from traces.blocks import id_array, parse_json_with_id_lists
    from traces.errors import RecordReader, TraceFormatError

    body = "".join(f"{x}{seps[i]}" for i, x in enumerate(ids))
    text = f'{{"{key}": [{body}], "n": 1}}'.encode()
    try:
        want = json.loads(text)
    except json.JSONDecodeError:
        with pytest.raises(json.JSONDecodeError):
            parse_json_with_id_lists(text)
        return
    got, table = parse_json_with_id_lists(text)
    assert got["n"] == 1
    rec = RecordReader("f", 0, got)
    try:
        ref = id_array(RecordReader("f", 0, want), key).tolist()
    except TraceFormatError:
        with pytest.raises(TraceFormatError):
            id_array(rec, key, table)
        return
    assert id_array(rec, key, table).tolist() == ref


@settings(max_examples=40, deadline=None)
@given(st.lists(ops_strategy, min_size=1, max_size=4), st.integers(0, 4))
def test_infinite_cache_hits_vectorized_equals_reference(ops, shared):

    t = _build(_chained_sessions(ops, len(ops)), shared_prefix=shared * 4)
    assert np.array_equal(t.infinite_cache_hits(), t.infinite_cache_hits_reference())
