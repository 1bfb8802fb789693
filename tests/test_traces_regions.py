"""Block regions: the layout rules against a token-level model, hand-built cc-traces sessions
with exact regions, alignment with ids on generated traces, the npz cache and trace stats."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli.main import cli
from tests import tracefixtures as F
from traces import REGION_NAMES, load_trace
from traces.builder import TraceBuilder, common_prefix
from traces.cache import read_parsed, save_parsed
from traces.errors import OptionError
from traces.load import read_trace_files
from traces.regions import RESENT, Layout, first_input_region, input_region
from traces.stats import region_stats

SYS, TOOLS, USER, ASSIST, RESULT, UNK = range(6)
assert REGION_NAMES == ("system", "tools", "user", "assistant", "tool_result", "unknown")


# -- the rules on a token-level model --------------------------------------------------------
class TokenModel:
    """The documented rules applied to one region code per token (brute force)."""

    def __init__(self, prefix):
        self.prefix = np.concatenate([np.full(n, g, np.uint8) for g, n in prefix] or
                                     [np.zeros(0, np.uint8)])
        self.cur = None
        self.out = 0

    def advance(self, p, o, k, bs, region):
        reg = UNK if region is None or region == RESENT else region
        reply = UNK if region is None else ASSIST
        if self.cur is None:
            pre = self.prefix[:p]
            cur = np.concatenate([pre, np.full(p - pre.shape[0], reg, np.uint8)])
        elif k < self.cur.shape[0] // bs and p < self.cur.shape[0]:
            if region == RESENT:
                cur = self.cur[:p]
            else:
                keep = self.cur[:k * bs]
                pre = self.prefix[k * bs:p]
                cur = np.concatenate([keep, pre, np.full(p - k * bs - pre.shape[0], reg,
                                                         np.uint8)])
        else:
            prev = self.cur.shape[0]
            a = min(self.out, max(0, p - prev))
            cur = np.concatenate([self.cur[:p], np.full(a, reply, np.uint8),
                                  np.full(max(0, p - prev - a), reg, np.uint8)])
        assert cur.shape[0] == p
        self.cur, self.out = cur, o
        return cur


def majority(tokens, bs):
    """Per full block: the region with most tokens; ties: the one whose tokens come first."""
    out = []
    for b in range(tokens.shape[0] // bs):
        blk = tokens[b * bs:(b + 1) * bs].tolist()
        counts = {g: blk.count(g) for g in dict.fromkeys(blk)}
        best = max(counts.values())
        out.append(next(g for g, n in counts.items() if n == best))
    return np.array(out, np.uint8)


def expand(vals, counts):
    return np.repeat(np.array(vals, np.uint8), np.array(counts, np.int64))


regions_st = st.one_of(st.none(), st.just(RESENT), st.sampled_from([USER, RESULT, UNK]))
request_st = st.tuples(st.integers(0, 120), st.integers(0, 40), st.floats(0, 1), regions_st)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([1, 4, 8, 16]), st.integers(0, 30), st.integers(0, 30),
       st.lists(request_st, min_size=1, max_size=10))
def test_layout_matches_the_token_model(bs, n_tools, n_sys, reqs):
    prefix = ((TOOLS, n_tools), (SYS, n_sys))
    lay, ref = Layout(prefix), TokenModel(prefix)
    prev_n = 0
    for first, (p, o, frac, region) in enumerate(reqs):
        k = 0 if first == 0 else int(frac * min(p // bs, prev_n))
        vals, counts = lay.advance(p, o, k, bs, region)
        tokens = ref.advance(p, o, k, bs, region)
        assert np.array_equal(expand(vals, counts), majority(tokens, bs)[k:])
        # runs: non-empty, neighbours differ, cover exactly the prompt
        assert all(a < b for a, b in zip([0, *lay.ends], lay.ends, strict=False))
        assert all(a != b for a, b in zip(lay.regs, lay.regs[1:], strict=False))
        assert (lay.ends[-1] if lay.ends else 0) == p
        lo = int(frac * (p // bs))  # any block range of the current prompt
        assert np.array_equal(expand(*lay.block_runs(lo, p // bs, bs)),
                              majority(tokens, bs)[lo:])
        prev_n = p // bs


def test_input_region_from_content_kinds():
    assert input_region(["tool_result"]) == RESULT
    assert input_region(["text"]) == USER
    assert input_region(["text", "tool_result"]) == RESULT
    assert input_region(["text", "tool_result", "tool_use"]) == RESENT
    assert input_region(["text", "thinking"]) == RESENT
    assert input_region([]) == UNK
    assert first_input_region(160 + 16384, 160, USER) == USER
    assert first_input_region(160 + 16385, 160, USER) == RESENT


# -- builder: regions stored beside ids, equal ids -> equal regions ---------------------------
@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.data())
def test_builder_regions_equal_the_token_model_with_first_addition_winning(n_sessions, data):
    bs = 4
    b = TraceBuilder("t", "test", "mem", bs)
    expect: list[tuple[np.ndarray, np.ndarray, int]] = []  # ids, model regions, session
    for s in range(n_sessions):
        prefix = ((TOOLS, data.draw(st.integers(0, 12))), (SYS, data.draw(st.integers(0, 12))))
        h = b.open_session(f"s{s}", scope=s, prefix_regions=prefix)
        ref = TokenModel(prefix)
        prompts: list[list[int]] = []
        fresh = 0
        for _ in range(data.draw(st.integers(1, 6))):
            keep = []
            if prompts and data.draw(st.booleans()):
                base = data.draw(st.sampled_from(prompts))  # may branch back: ids re-added
                keep = base[:data.draw(st.integers(0, len(base)))]
            n_new = data.draw(st.integers(0, 6))
            ids = keep + [(tuple(keep), fresh + i) for i in range(n_new)]
            fresh += n_new
            # chained: an id is (its prefix); intern per session as ints
            chained = [hash((s, tuple(ids[:j + 1]))) for j in range(len(ids))]
            prompts.append(ids)
            p = len(ids) * bs + data.draw(st.integers(0, bs - 1))
            o = data.draw(st.integers(0, 12))
            region = data.draw(regions_st)
            arr = np.array(chained, np.int64)
            k = 0 if not expect or expect[-1][2] != s else common_prefix(expect[-1][0], arr)
            b.add(h, prompt=p, output=o, ids=arr, send_time_s=0.0, gap_s=0.0, gap_kind=1,
                  input_region=region)
            expect.append((arr, majority(ref.advance(p, o, k, bs, region), bs), s))
        b.close(h)
    t = b.build()
    first: dict[int, int] = {}
    for r, (ids, model, _s) in enumerate(expect):  # pool order = session, then request order
        got = t.block_regions(r)
        assert got.dtype == np.uint8 and got.shape == t.block_ids(r).shape
        for j, bid in enumerate(ids.tolist()):
            first.setdefault(bid, int(model[j]))
    for r, (ids, _model, _s) in enumerate(expect):
        want = [first[bid] for bid in ids.tolist()]
        assert t.block_regions(r).tolist() == want


def test_an_id_added_twice_keeps_its_first_region():
    b = TraceBuilder("t", "test", "mem", 4)
    h = b.open_session("a", prefix_regions=((TOOLS, 4),))
    b.add(h, prompt=12, output=4, ids=np.array([1, 2, 3]), send_time_s=0, gap_s=0, gap_kind=0,
          input_region=USER)  # T U U
    b.add(h, prompt=8, output=4, ids=np.array([1, 2]), send_time_s=1, gap_s=1, gap_kind=1,
          input_region=USER)  # a shrink
    b.add(h, prompt=20, output=4, ids=np.array([1, 2, 3, 6, 7]), send_time_s=2, gap_s=1,
          gap_kind=1, input_region=RESULT)  # block 2 is the reply now: assistant
    t = b.build()
    assert t.block_regions(0).tolist() == [TOOLS, USER, USER]
    assert t.block_regions(2).tolist() == [TOOLS, USER, USER, RESULT, RESULT]


# -- hand-built cc-traces sessions ----------------------------------------------------------------
def _cc_req(t, p, o, ids, types):
    return {"t": t, "type": "n", "model": "m", "in": p, "out": o, "hash_ids": ids,
            "input_types": types, "output_types": ["text"], "stop": "tool_use",
            "api_time": 1.0, "think_time": 1.0}


def _session_a():
    """tool_tokens 100, system_tokens 60; see the expected regions in the test."""
    sub = {"t": 20.0, "type": "subagent", "agent_id": "x", "subagent_type": "Explore",
           "duration_ms": 5000, "total_tokens": 1, "tool_use_count": 1, "status": "done",
           "models": ["m"], "tool_tokens": "0", "system_tokens": "70",
           "requests": [_cc_req(0.0, 150, 10, [100, 101], ["text"])]}
    R = [_cc_req(0.0, 200, 50, [1, 2, 3], ["text"]),
         _cc_req(3.0, 300, 40, [1, 2, 3, 4], ["tool_result"]),
         sub,
         _cc_req(30.0, 420, 30, [1, 2, 3, 4, 5, 6], ["text"]),
         _cc_req(40.0, 460, 20, [1, 2, 3, 4, 50, 51, 52], ["tool_result"]),  # edit in place
         _cc_req(50.0, 250, 20, [1, 2, 60], ["text"]),  # compaction: system block changed
         _cc_req(60.0, 400, 20, [1, 2, 60, 61, 62, 63], ["tool_result"]),
         _cc_req(70.0, 380, 30, [1, 2, 60, 61, 70], ["text", "tool_result", "tool_use"]),
         _cc_req(80.0, 500, 10, [1, 2, 60, 61, 70, 71, 72],
              ["text", "thinking", "tool_result", "tool_use"])]
    return {"id": "a", "block_size": 64, "tool_tokens": 100, "system_tokens": 60,
            "requests": R}


def _session_b():
    """A first prompt that carries a history: 20,000 tokens beyond the 160-token prefix."""
    n = (160 + 20000) // 64
    return {"id": "b", "block_size": 64, "tool_tokens": 100, "system_tokens": 60,
            "requests": [_cc_req(0.0, 160 + 20000, 40, list(range(1, n + 1)), ["text"]),
                         _cc_req(5.0, 160 + 20000 + 100, 10, list(range(1, n + 2)),
                              ["tool_result"])]}


@pytest.fixture
def hand(tmp_path):
    d = tmp_path / "cc"
    d.mkdir()
    (d / "a.json").write_text(json.dumps(_session_a()))
    (d / "b.json").write_text(json.dumps(_session_b()))
    return d


def test_cc_traces_exact_regions(hand):
    t = load_trace(str(hand))
    T, S, U, A, R, X = TOOLS, SYS, USER, ASSIST, RESULT, UNK
    want = [
        [T, T, S],  # tools [0,100), system [100,160), user [160,200): block 2 ties 32/32
        [T, T, S, A],  # + reply [200,250), tool result [250,300): block 3 = 8 U, 50 A, 6 R
        [T, T, S, A, R, U],  # + reply [300,340), user [340,420)
        [T, T, S, A, R, U, U],  # edit from block 4: kept in place; reply from 420
        [T, T, S],  # compaction (shrink, text): prefix again, then user
        [T, T, S, U, R, R],  # + reply [250,270), tool result [270,400)
        [T, T, S, U, R],  # re-sent history (shrink): regions kept by position
        [T, T, S, U, R, R, X],  # re-sent, grows: kept, reply [380,410), then unknown
    ]
    a = t.sessions[0]
    assert a.count == len(want)
    for j, w in enumerate(want):
        assert t.block_regions(a.first + j).tolist() == w, j
    b = t.sessions[1]
    first = t.block_regions(b.first).tolist()
    assert first[:3] == [T, T, S] and set(first[3:]) == {X}  # an undescribed history
    assert t.block_regions(b.first + 1).tolist()[-2:] == [X, A]
    sub = t.sessions[2]  # sub-agent: its own system (70 tokens), same id space
    assert sub.parent == 0 and t.block_regions(sub.first).tolist() == [S, U]
    # finish regions: the next prompt's for repeated output blocks, assistant for fresh ones
    for r in range(len(t)):
        fr, fi = t.finish_block_regions(r), t.finish_block_ids(r)
        assert fr.shape == fi.shape and fr.dtype == np.uint8
        assert (fr[fi >= t._fresh_base] == A).all()


def test_cc_traces_shared_prefix_counts_as_system_and_tools(hand):
    t = load_trace(str(hand), shared_prefix="auto")  # 160 tokens: 2 shared blocks
    a, b = (t.sessions[i].first for i in (0, 1))
    assert t.block_ids(a)[:2].tolist() == t.block_ids(b)[:2].tolist() == [0, 1]
    assert t.block_regions(a)[:2].tolist() == t.block_regions(b)[:2].tolist() == [TOOLS, TOOLS]
    t = load_trace(str(hand), shared_prefix=256)  # a: 3 blocks, b: 4 (its 4th: unknown)
    assert [s.shared_prefix_blocks for s in t.sessions[:2]] == [3, 4]
    assert t.block_regions(b)[:4].tolist() == [TOOLS, TOOLS, SYS, SYS]
    assert t.block_regions(a)[:3].tolist() == [TOOLS, TOOLS, SYS]


# -- generated traces: aligned with ids, a function of the id, prefix first -------------------
def _check_aligned(t):
    all_ids, all_regs = [], []
    for r in range(len(t)):
        ids, regs = t.block_ids(r), t.block_regions(r)
        assert regs.shape == ids.shape and regs.dtype == np.uint8
        assert regs.size == 0 or int(regs.max()) < len(REGION_NAMES)
        fi, fr = t.finish_block_ids(r), t.finish_block_regions(r)
        assert fr.shape == fi.shape and np.array_equal(fr[:ids.shape[0]], regs)
        all_ids.append(fi)
        all_regs.append(fr)
    ids, regs = np.concatenate(all_ids), np.concatenate(all_regs)
    order = np.argsort(ids, kind="stable")
    same = ids[order][1:] == ids[order][:-1]
    assert (regs[order][1:][same] == regs[order][:-1][same]).all()  # a function of the id


@pytest.mark.parametrize("spec", ["synthetic:claude-code?sessions=12&seed=3",
                                  "synthetic:codex?sessions=6", "synthetic:chat?sessions=4"])
def test_generated_regions_are_aligned_and_prefix_first(spec):
    for shared in (None, "auto"):
        t = load_trace(spec, shared_prefix=shared)
        _check_aligned(t)
        for r in range(len(t)):
            regs = t.block_regions(r)
            st_ = (regs == SYS) | (regs == TOOLS)
            n = int(st_.sum())
            assert st_[:n].all()  # system and tool blocks form a prefix of every prompt
            if shared is None:
                assert (np.diff(regs[:n].astype(int)) <= 0).all()  # tools, then system
        if spec.startswith("synthetic:chat"):
            assert t.region_blocks()[1][TOOLS] == 0


def test_every_format_has_aligned_regions(tmp_path):
    S = F.make_sessions(seed=3)
    F.write_fx_cc_traces(tmp_path / "cc", S)
    F.write_jsonl(tmp_path / "mc.jsonl", F.mooncake_records(S))
    F.write_jsonl(tmp_path / "tl.jsonl", F.tracelab_records(S))
    F.write_freeinference_jsonl(tmp_path / "fi", S)
    for name in ("cc", "mc.jsonl", "tl.jsonl", "fi"):
        t = load_trace(str(tmp_path / name))
        _check_aligned(t)
        shares = region_stats(t)["prompt_share"]
        if name == "mc.jsonl":
            assert shares["unknown"] == 1.0  # Mooncake cannot tell
        else:
            assert shares["unknown"] == 0.0 and shares["assistant"] > 0
    fi = load_trace(str(tmp_path / "fi"))  # claude-code harness: 400 tool tokens, then system
    assert fi.block_regions(0)[:8].tolist() == [TOOLS] * 6 + [SYS] * 2
    tl = load_trace(str(tmp_path / "tl.jsonl"))  # no cached prefix at round 0: user
    assert set(tl.block_regions(0).tolist()) == {USER}


# -- npz cache and stats ----------------------------------------------------------------------
def test_npz_round_trip_keeps_regions_and_refuses_old_files(hand, tmp_path):
    parsed = read_trace_files(str(hand))
    t = parsed.build(shared_prefix="auto")
    path = tmp_path / "t.npz"
    save_parsed(parsed, path)
    back = read_parsed(path)
    assert back is not None
    u = back.build(shared_prefix="auto")
    assert np.array_equal(u._pool_region, t._pool_region)
    for r in range(len(t)):
        assert np.array_equal(u.block_regions(r), t.block_regions(r))
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays["meta"]).decode())
    for change in ("v2", "short"):
        a = dict(arrays)
        if change == "v2":  # a version-2 file holds a built trace: never served
            a["meta"] = np.frombuffer(json.dumps({**meta, "v": 2}).encode(), np.uint8)
        else:
            a["reg_counts"] = a["reg_counts"][:-1]
        np.savez(tmp_path / f"{change}.npz", **a)
        assert read_parsed(tmp_path / f"{change}.npz") is None


def test_region_stats_equal_brute_force_and_the_cli(hand):
    t = load_trace(str(hand))
    prompts = np.zeros(len(REGION_NAMES), np.int64)
    distinct: dict[int, int] = {}
    for r in range(len(t)):
        prompts += np.bincount(t.block_regions(r), minlength=len(REGION_NAMES))
        distinct.update(zip(t.block_ids(r).tolist(), t.block_regions(r).tolist(), strict=True))
    d = np.bincount(list(distinct.values()), minlength=len(REGION_NAMES))
    s = region_stats(t)
    assert [s["prompt_tokens"][n] for n in REGION_NAMES] == (prompts * 64).tolist()
    assert [s["distinct_tokens"][n] for n in REGION_NAMES] == (d * 64).tolist()
    for key in ("prompt_share", "distinct_share"):
        assert sum(s[key].values()) == pytest.approx(1.0)
    r = CliRunner().invoke(cli, ["trace", "stats", str(hand), "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["regions"] == s
    r = CliRunner().invoke(cli, ["trace", "stats", str(hand)])
    line = next(x for x in r.stdout.splitlines() if "region tool_result" in x)
    share = s["prompt_share"]["tool_result"], s["distinct_share"]["tool_result"]
    assert f"{share[0]:.3f} / {share[1]:.3f}" in line



@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(0, 3), st.sampled_from([None, 8, 16, 1000]), st.data())
def test_sub_agents_and_a_cut_keep_first_regions_and_one_id_per_scope(n_tops, n_subs, cut,
                                                                       data):
    """Sub-agents share their parent's scope but follow every top-level session in the pool,
    so a scope's ids lie in several ranges of it; a context cut keeps a session's requests
    before its first prompt over the cut. Brute force: each kept block takes the region its
    id was first added with (pool order: top-level sessions, then sub-agents), and equal ids
    of one scope, and only those, share one global id."""
    bs = 4
    b = TraceBuilder("t", "test", "mem", bs)
    sessions = []  # (scope, parent, [(ids, modelled block regions, prompt)])
    for s in range(n_tops + n_subs):
        parent = -1 if s < n_tops else data.draw(st.integers(0, n_tops - 1))
        scope = s if parent < 0 else parent
        prefix = ((TOOLS, data.draw(st.integers(0, 8))), (SYS, data.draw(st.integers(0, 8))))
        h = b.open_session(f"s{s}", scope=scope, parent=parent,
                           after_local=-1 if parent < 0 else 0, prefix_regions=prefix)
        ref = TokenModel(prefix)
        rows: list[tuple[list[int], list[int], int]] = []
        prev: list[int] = []
        for _ in range(data.draw(st.integers(1, 4))):
            keep = prev[:data.draw(st.integers(0, len(prev)))]
            ids = keep + [data.draw(st.integers(0, 5)) for _ in range(data.draw(st.integers(0, 4)))]
            p = len(ids) * bs + data.draw(st.integers(0, bs - 1))
            o = data.draw(st.integers(0, 6))
            region = data.draw(regions_st)
            arr = np.array(ids, np.int64)
            k = common_prefix(np.array(prev, np.int64), arr) if rows else 0
            b.add(h, prompt=p, output=o, ids=arr, send_time_s=0.0, gap_s=0.0, gap_kind=1,
                  input_region=region)
            rows.append((ids, majority(ref.advance(p, o, k, bs, region), bs).tolist(), p))
            prev = ids
        b.close(h)
        sessions.append((scope, parent, rows))
    kept = [len(rows) if cut is None else next((j for j, r in enumerate(rows) if r[2] > cut),
                                               len(rows)) for _, _, rows in sessions]
    if not any(kept[:n_tops]):  # every first prompt over the cut: refused, by name
        with pytest.raises(OptionError, match="no request is left"):
            b.build(max_context=cut)
        return
    t = b.build(max_context=cut)
    alive = [kept[s] > 0 and (par < 0 or kept[par] > 0)
             for s, (_, par, _) in enumerate(sessions)]
    order = [s for s in range(n_tops) if alive[s]] + \
        [s for s in range(n_tops, len(sessions)) if alive[s]]
    first: dict[tuple[int, int], int] = {}
    for s in order:  # pool order; a request's new ids are those after its common prefix
        prev = []
        for ids, regions, _p in sessions[s][2][:kept[s]]:
            k = common_prefix(np.array(prev, np.int64), np.array(ids, np.int64))
            for bid, reg in zip(ids[k:], regions[k:], strict=True):
                first.setdefault((sessions[s][0], bid), reg)
            prev = ids
    assert [x.id for x in t.sessions] == [f"s{s}" for s in order]
    by_global: dict[int, tuple[int, int]] = {}
    for j, s in enumerate(order):
        scope, _, rows = sessions[s]
        for r, (ids, _regions, _p) in zip(range(t.sessions[j].first, t.sessions[j].first
                                                + t.sessions[j].count), rows, strict=False):
            assert t.block_regions(r).tolist() == [first[(scope, i)] for i in ids]
            for g, i in zip(t.block_ids(r).tolist(), ids, strict=True):
                assert by_global.setdefault(g, (scope, i)) == (scope, i)
    assert len(set(by_global.values())) == len(by_global)
