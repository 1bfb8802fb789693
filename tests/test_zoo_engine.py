"""Engine tests of the zoo with hand-computed timelines: TTL pins that save a recompute or
expire, Continuum's program-level FCFS, and the clairvoyant oracle on a stream where LRU
misses every time."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.units import ranges_units
from policies import get_policy
from sim.config import RunConfig
from sim.run import run
from tests.enginekit import PROF, SPEC, KitTrace, prefill, same_summary


def zoo_cfg(**kw) -> RunConfig:
    base = dict(sessions=3, scheduler="lpm", max_new_tokens=64, debug_cache=True,
                profile=PROF.name)
    base.update(kw)
    return RunConfig.from_flat(**base)


def rows(res):
    return res.requests.set_index(["session", "turn"])


# ---------------------------------------------------------------------------- ttl
# s0's first reply ends in a tool call and it returns 10 s later; s1 ends after one request;
# s2 needs room for 5,000 tokens 1 s after the first batch. The first batch (4000 + 2000 +
# 100 tokens) runs at once; s0 keeps 62 blocks (3,968 tokens), s1 31, s2 1 of 160.
PIN_TRACE = KitTrace([[(4000, 1, 0.0), (6000, 1, 10.0)], [(2000, 1, 0.0)],
                      [(100, 1, 0.0), (5000, 1, 1.0)]])


def test_ttl_pin_saves_the_recompute_lru_pays() -> None:
    first = prefill((0, 4000), (0, 2000), (0, 100))  # one batch
    lru = rows(run(zoo_cfg(gpu_cache=10240).with_policy("vllm"), PIN_TRACE))
    ttl = rows(run(zoo_cfg(gpu_cache=10240).with_policy("ttl?tau_s=20"), PIN_TRACE))
    for r in (lru, ttl):
        assert r.loc[("s0", 0)].ttft_s == pytest.approx(first, rel=1e-12)
        assert r.loc[("s2", 1)].send_s == pytest.approx(first + 1.0)
        assert r.loc[("s0", 1)].send_s == pytest.approx(first + 10.0)
    # LRU (vLLM's order) frees the tail of s0's history, the least recent: 12 blocks.
    assert lru.loc[("s0", 1)].hit_gpu_tokens == 3200
    assert lru.loc[("s0", 1)].ttft_s == pytest.approx(prefill((3200, 6000)), rel=1e-12)
    # The pin (until first + 20 s) holds s0's history; s1's, unpinned, makes the room.
    assert ttl.loc[("s0", 1)].hit_gpu_tokens == 3968
    assert ttl.loc[("s0", 1)].ttft_s == pytest.approx(prefill((3968, 6000)), rel=1e-12)


def test_ttl_pin_that_expires_is_lru() -> None:
    # tau = 0.5 s: the pin is gone when s2 needs room at first + 1 s: exactly vLLM's run.
    lru = run(zoo_cfg(gpu_cache=10240).with_policy("vllm"), PIN_TRACE).requests
    ttl = run(zoo_cfg(gpu_cache=10240).with_policy("ttl?tau_s=0.5"), PIN_TRACE).requests
    assert ttl[["ttft_s", "hit_gpu_tokens"]].equals(lru[["ttft_s", "hit_gpu_tokens"]])


def test_ttl_learned_rule_cold_start_does_not_pin_a_cheap_history() -> None:
    # C = recompute of s0's 3,999 tokens ~ 0.15 s < mu = 1 s: tau = 0, no pin (the prior).
    made = []
    real = RunConfig.make_policy

    def spy(self):
        p = real(self)
        made.append(p)
        return p

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunConfig, "make_policy", spy)
        ttl = run(zoo_cfg(gpu_cache=10240).with_policy("ttl"), PIN_TRACE).requests
    policy = made[-1]
    assert policy.taus == [0.0, 0.0]  # the tool-call replies of s0 and s2
    lru = run(zoo_cfg(gpu_cache=10240).with_policy("vllm"), PIN_TRACE).requests
    assert ttl.ttft_s.tolist() == lru.ttft_s.tolist()
    # with mu below C the prior pins for mu * ln(C / mu)
    c = PROF.prefill_seconds(ranges_units(SPEC, [(0, 3999)])) - PROF.prefill_seconds(
        ranges_units(SPEC, []))
    p = get_policy("ttl?mu_s=0.01")
    from policies import PolicyContext

    p.bind(PolicyContext(now=lambda: 0.0, recompute_seconds=lambda a, b: c))
    assert p.tau(3999) == pytest.approx(0.01 * np.log(c / 0.01))


def test_ttl_pin_ends_when_the_request_it_holds_for_is_dropped() -> None:
    """s0's tool-call reply pins its history for 20 s; its next request arrives 1 s later
    (the pin now holds until admission) but can never fit, and is dropped: the pin must end
    then, not stay forever (no reply will ever come)."""
    made = []
    real = RunConfig.make_policy

    def spy(self):
        made.append(real(self))
        return made[-1]

    trace = KitTrace([[(4000, 1, 0.0), (20000, 1, 1.0)], [(2000, 1, 0.0), (3000, 1, 5.0)]])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunConfig, "make_policy", spy)
        res = run(zoo_cfg(gpu_cache=10240).with_policy("ttl?tau_s=20"), trace).requests
    assert res.sort_values("request").dropped.tolist() == [False, True, False, False]
    policy = made[-1]
    assert policy.until == {} and policy.pinned == {}


def test_ttl_drop_event_releases_the_pin() -> None:
    from policies import Drop, PolicyContext

    p = get_policy("ttl?tau_s=20")
    now = [0.0]
    p.bind(PolicyContext(now=lambda: now[0], recompute_seconds=lambda a, b: 1.0))

    class Leaf:
        serial = 7

    from policies import Arrival, Reply

    p.on_reply(Reply(0.0, 0, 0, 4000, Leaf(), "tool"))
    assert p.pinned_until(Leaf()) == 20.0
    p.on_arrival(Arrival(1.0, 0, 1, 20000, np.zeros(0, np.int64)))
    assert p.pinned_until(Leaf()) == np.inf  # held until admission
    p.on_drop(Drop(1.0, 0, 1, "cache"))
    assert p.pinned_until(Leaf()) == -np.inf


def _bound_ttl(now: list[float]):
    from policies import PolicyContext

    p = get_policy("ttl?tau_s=20")
    p.bind(PolicyContext(now=lambda: now[0], recompute_seconds=lambda a, b: 1.0))
    return p


class _Leaf:
    def __init__(self, serial: int) -> None:
        self.serial = serial


def test_ttl_open_loop_keeps_the_latest_replys_pin() -> None:
    # Under the open loop request 1 of session 0 arrives and replies before request 0: the
    # session keeps request 1's (longer) history pinned; request 0's late reply is stale
    # (before: it replaced the pin with its own shorter history).
    from policies import Arrival, Reply

    now = [0.0]
    p = _bound_ttl(now)
    p.on_arrival(Arrival(0.0, 0, 0, 4000, np.zeros(0, np.int64)))
    p.on_arrival(Arrival(0.1, 0, 1, 4100, np.zeros(0, np.int64)))
    p.on_reply(Reply(0.5, 0, 1, 4200, _Leaf(11), "tool"))
    p.on_reply(Reply(0.9, 0, 0, 4100, _Leaf(10), "tool"))
    assert p.pinned == {0: 11} and p.pinned_until(_Leaf(11)) == 20.5
    assert p.pinned_until(_Leaf(10)) == -np.inf
    assert len(p.taus) == 1 and p.turns == {0: 1}


def test_ttl_pin_set_while_a_later_request_is_in_the_server_holds_until_it_replies() -> None:
    from policies import Arrival, Drop, Reply

    now = [0.0]
    p = _bound_ttl(now)
    p.on_arrival(Arrival(0.0, 0, 0, 4000, np.zeros(0, np.int64)))
    p.on_arrival(Arrival(0.1, 0, 1, 4100, np.zeros(0, np.int64)))
    p.on_reply(Reply(0.5, 0, 0, 4100, _Leaf(10), "tool"))
    assert p.pinned_until(_Leaf(10)) == np.inf  # request 1 is in the server
    p.on_reply(Reply(30.0, 0, 1, 4200, _Leaf(11), "end"))
    assert p.pinned == {} and p.until == {}
    # a later request that is dropped first holds nothing
    p.on_arrival(Arrival(31.0, 1, 2, 4000, np.zeros(0, np.int64)))
    p.on_arrival(Arrival(31.1, 1, 3, 90000, np.zeros(0, np.int64)))
    p.on_drop(Drop(31.1, 1, 3, "cache"))
    p.on_reply(Reply(31.5, 1, 2, 4100, _Leaf(12), "tool"))
    assert p.pinned_until(_Leaf(12)) == 51.5
    assert p.in_server == {}


def test_ttl_open_loop_pins_only_the_latest_replies(monkeypatch) -> None:
    # 16 synthetic sessions at their recorded send times: requests of a session overlap and
    # some reply out of order. Whenever a reply is handled, a session's pin (if any) is the
    # history of its latest reply so far, never an older one.
    from policies.zoo.ttl import TTLPinning

    latest: dict[int, tuple[int, int]] = {}  # session -> (request, leaf serial)
    wrong = []
    on_reply = TTLPinning.on_reply

    def spy(self, event):
        on_reply(self, event)
        if event.leaf is not None and event.request > latest.get(event.session, (-1, 0))[0]:
            latest[event.session] = (event.request, event.leaf.serial)
        for s, serial in self.pinned.items():
            if serial != latest[s][1]:
                wrong.append((event.time, s))

    monkeypatch.setattr(TTLPinning, "on_reply", spy)
    res = run(RunConfig.from_flat(trace="synthetic:claude-code?sessions=16", policy="ttl?tau_s=5",
                                  scheduler="program-fcfs", replay="open", gpu_cache=65536,
                                  max_context=65536, debug_cache=True))
    assert res.summary["requests"] > 0
    assert wrong == []


def test_program_fcfs_serves_the_earlier_program_first() -> None:
    # s0 prefills 40,000 tokens (64 cached) from 0.51 s on: four passes of 8,192 (a chunked
    # prompt owns its pass), then [32832, 40000) with 1,024 tokens of budget to spare.
    # Meanwhile s3 (started at 0.008 s, when s2 ended) sends 6,000 tokens at 0.81 s and s1
    # (started at 0) 6,000 at 1.01 s, each with 64 cached. The first in the scheduler's order
    # starts in s0's last pass ([64, 1088)), the other one when it ends.
    trace = KitTrace([[(64, 1, 0.0), (40000, 1, 0.5)], [(64, 1, 0.0), (6000, 1, 1.0)],
                      [(64, 1, 0.0)], [(64, 1, 0.0), (6000, 1, 0.8)]])
    out = {}
    for sched in ("fcfs", "program-fcfs"):
        c = zoo_cfg(gpu_cache=1 << 20).with_policy("penelope").with_fields(scheduler=sched)
        out[sched] = rows(run(c, trace))
    f, p = out["fcfs"], out["program-fcfs"]
    assert f.loc[("s3", 1)].send_s < f.loc[("s1", 1)].send_s  # s3 arrived first ...
    assert p.loc[("s3", 0)].send_s > 0 == p.loc[("s1", 0)].send_s  # ... its program later
    last_pass = f.loc[("s0", 1)].end_s - prefill((32832, 40000), (64, 1088))
    assert f.loc[("s3", 1)].admit_s == pytest.approx(last_pass, rel=1e-12)
    assert f.loc[("s1", 1)].admit_s == pytest.approx(f.loc[("s0", 1)].end_s, rel=1e-12)
    # program-fcfs swaps them: s1's program arrived first
    assert p.loc[("s1", 1)].admit_s == pytest.approx(last_pass, rel=1e-12)
    assert p.loc[("s3", 1)].admit_s == pytest.approx(p.loc[("s0", 1)].end_s, rel=1e-12)


# ---------------------------------------------------------------------------- clairvoyant
# Three sessions of 2,560 tokens (+64 per turn) take turns every second in a fixed cycle:
# s0, s1, s2, s0, ... (first returns after 1, 2, 3 s, then every 3 s). The cache holds 100
# blocks: two histories, not three. LRU evicts exactly the history needed next.
def cycle(turns: int = 8) -> KitTrace:
    return KitTrace([[(2560 + 64 * k, 1, 0.0 if k == 0 else (s + 1.0 if k == 1 else 3.0))
                      for k in range(turns)] for s in range(3)])


def test_lru_misses_every_turn_of_the_cycle() -> None:
    res = rows(run(zoo_cfg(gpu_cache=6400).with_policy("sglang"), cycle()))
    later = res[res.index.get_level_values("turn") > 0]
    assert (later.hit_gpu_tokens == 0).all()  # every history was evicted before its turn
    for _, r in later.iterrows():
        assert r.ttft_s == pytest.approx(prefill((0, int(r.prompt_tokens))), rel=1e-12)


@pytest.mark.parametrize("rule", ["clairvoyant", "clairvoyant?cost_aware=false"])
def test_clairvoyant_beats_lru_on_the_cycle(rule: str) -> None:
    runs = {p: run(zoo_cfg(gpu_cache=6400).with_policy(p), cycle())
            for p in ("sglang", "penelope", rule)}
    oracle = rows(runs[rule])
    # At 1.13 s s0 finds its whole history: the oracle freed s1's front (next use 2.13 s)
    # for s2's first prompt, not s0's (next use 1.13 s).
    assert oracle.loc[("s0", 1)].hit_gpu_tokens == 2560
    assert oracle.loc[("s0", 1)].ttft_s == pytest.approx(prefill((2560, 2624)), rel=1e-12)
    assert oracle.loc[("s1", 1)].hole_tokens == 1280
    assert oracle.loc[("s1", 1)].ttft_s == pytest.approx(prefill((0, 1280), (2560, 2624)),
                                                         rel=1e-12)
    # Every later turn: the front of its history is a hole (refilled), the rest is reused.
    for _, r in oracle.iterrows():
        if r.name[1] == 0:
            continue
        hole, kept = int(r.hole_tokens), int(r.hit_gpu_tokens)
        assert hole + kept == int(r.prompt_tokens) - 64
        assert r.ttft_s == pytest.approx(prefill((0, hole), (hole + kept, int(r.prompt_tokens))),
                                         rel=1e-12)
    mean = {p: runs[p].summary["ttft_mean_s"] for p in runs}
    assert mean[rule] < mean["penelope"] < mean["sglang"]
    assert runs[rule].summary["hit_rate"] > 2 * runs["penelope"].summary["hit_rate"]


# ---------------------------------------------------------------------------- as users run it
def test_zoo_by_name_from_the_cli_and_a_sweep(tmp_path) -> None:
    import json

    import pandas as pd

    from tests.clikit import invoke
    from tests.test_policies_api import SYNTH

    code, out, err = invoke("run", *SYNTH, "--preset", "penelope", "--policy", "clairvoyant",
                            "--policy", "ttl?tau_s=5",
                            "--scheduler", "program-fcfs", "--json")
    assert code == 0, err
    runs = json.loads(out)["runs"]
    assert [r["policy"] for r in runs] == ["penelope", "clairvoyant-oracle", "ttl(tau_s=5.0)"]
    assert all(r["summary"]["scheduler"] == "program-fcfs" for r in runs)
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(
        "base:\n  trace: synthetic:claude-code?sessions=8\n  max_context: 32k\n"
        "  gpu_cache: 48k\n  gaps: tool\n  sessions: 4\n"
        'grid:\n  policy: [sglang, "tlru?xi=4096", memdecay, random]\n'
        "baseline: {policy: sglang}\n")
    code, _, err = invoke("sweep", cfg, "--out", tmp_path / "out")
    assert code == 0, err
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert sorted(df["policy"]) == ["memdecay", "random", "sglang", "tlru(xi=4096)"]


@pytest.mark.parametrize("spec", ["ttl", "tlru", "greedydual", "memdecay", "clairvoyant",
                                  "random", "ttl?start=private-head&granularity=block"])
def test_zoo_runs_are_reproducible_and_consistent(spec: str) -> None:
    trace = KitTrace([[(2000 + 900 * k, 300, 2.0) for k in range(8)] for _ in range(4)],
                     shared_blocks=16)
    c = zoo_cfg(gpu_cache=20000, sessions=3).with_policy(spec)
    a, b = run(c, trace), run(c, trace)
    assert a.requests.equals(b.requests) and same_summary(a.summary, b.summary)
    df = a.requests
    assert (df.hit_gpu_tokens + df.recomputed_tokens + df.new_tokens == df.prompt_tokens).all()
    assert np.isfinite(df.ttft_s).all() and a.summary["evicted_tokens"] > 0


def test_clairvoyant_reads_the_open_loop_future(monkeypatch) -> None:
    """Under ``--replay open`` a session's next request is sent at its recorded time, not a
    gap after the reply: the oracle's next use is that send time (before the fix it was the
    closed loop's reply + gap). One turn of s0 is still running when its next is sent."""
    from policies.zoo.clairvoyant import Clairvoyant

    seen: dict[int, float] = {}
    on_reply = Clairvoyant.on_reply

    def spy(self, event) -> None:
        on_reply(self, event)
        seen[event.request] = self.next_use[event.session]

    monkeypatch.setattr(Clairvoyant, "on_reply", spy)
    trace = KitTrace([[(2560, 64, 0.0), (2624, 1, 0.05), (2688, 1, 4.0)],
                      [(1280, 1, 1.0), (1344, 1, 2.0)]])
    res = run(zoo_cfg(gpu_cache=6400, replay="open", time_scale=1.0).with_policy("clairvoyant"),
              trace).requests.set_index("request")
    assert len(seen) == len(trace)
    for r, nxt in seen.items():
        s = int(trace.session[r])
        last = trace.sessions[s].first + trace.sessions[s].count - 1
        assert nxt == (np.inf if r == last else pytest.approx(res.loc[r + 1].send_s, abs=1e-12)), r
    assert res.loc[1].send_s < res.loc[0].end_s  # sent before the reply it follows


def test_open_loop_runs_until_the_last_reply() -> None:
    """The open loop ends when every request has its reply: the last request, sent alone,
    is mid-prefill (neither waiting nor running) when the sending ends, and used to be cut
    off unfinished."""
    trace = KitTrace([[(2560, 64, 0.0), (2624, 1, 0.05)], [(1280, 1, 1.0), (1344, 8, 2.0)]])
    for engine, preset in (("sglang", "sglang"), ("vllm", "vllm")):
        res = run(zoo_cfg(gpu_cache=6400, replay="open", engine=engine, scheduler="fcfs")
                  .with_policy(preset), trace)
        assert np.isfinite(res.requests.end_s).all(), engine
        assert res.summary["sim_end_s"] == res.requests.end_s.max()
        assert res.requests.decoded_tokens.tolist() == [63, 0, 0, 7]
