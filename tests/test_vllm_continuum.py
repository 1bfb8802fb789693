"""Continuum's patches of the vLLM engine (sim/engines/vllm_continuum.py) on tiny hand-built
traces (tests/enginekit.KitTrace; blocks of 64 tokens, physical blocks numbered from 1 in
the order the free queue first hands them out).

``continuum-fixed`` pins for the public code's 2 s while no tool duration is known, so the
timelines below are exact. Sessions (all start at t = 0, admitted in order in one step):
A (s0): 640 tokens (10 full blocks), 1 output token, a tool call, then 704 tokens;
C (s1): 640 tokens, 1 output token, the end of its program;
B (s2): 10 tokens (one partial block), a human turn 0.5 s later of 1280 tokens (20 blocks).
In a 30-block pool step 1 gives A blocks 1-10, C 11-20 and B 21; at its end A1, C1 and B1
finish. B2's 20 blocks need 10 more than the free queue's 10 unhashed ones: stock vLLM takes
them from A's history (freed before C's, so popped first), Continuum's pin takes C's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.config import ConfigError, RunConfig
from sim.engines.vllm_continuum import PinningPool
from sim.run import check, run
from tests.enginekit import PROF, KitTrace, prefill, row

BS = 64
HUMAN = 2  # traces.GAP_KINDS


def continuum_cfg(patch: str, **kw) -> RunConfig:
    base = dict(engine="vllm", gpu_cache=30 * BS, sessions=3, debug_cache=True,
                profile=PROF.name, vllm_patch=patch)
    base.update(kw)
    return RunConfig.from_flat(**base).with_preset("vllm")


def abc_trace(a_gap: float, d_session: bool = False) -> KitTrace:
    sessions = [[(640, 1, 0.0), (704, 1, a_gap)], [(640, 1, 0.0)],
                [(10, 1, 0.0), (1280, 1, 0.5)]]
    if d_session:  # a second tool-calling program D instead of C
        sessions[1] = [(640, 1, 0.0), (704, 1, a_gap)]
    t = KitTrace(sessions)
    t.gap_kind[t.sessions[2].first + 1] = HUMAN
    return t


@pytest.fixture
def frees(monkeypatch) -> list[tuple[int, list[int]]]:
    """(request id, free queue after) of every ``free`` of a Continuum pool."""
    seen: list[tuple[int, list[int]]] = []
    free = PinningPool.free

    def spy(self, rid):
        free(self, rid)
        seen.append((rid, self.free_queue().tolist()))

    monkeypatch.setattr(PinningPool, "free", spy)
    return seen


@pytest.mark.parametrize("sync", [False, True])
def test_a_pinned_history_survives_the_tool_call_and_is_handed_to_the_next_turn(frees, sync):
    # (async scheduling changes no timeline here: no step runs while another is in flight)
    t1 = prefill((0, 640), (0, 640), (0, 10))  # step 1: A1, C1, B1
    stock = run(continuum_cfg("none", vllm_async=not sync), abc_trace(1.0))
    pinned = run(continuum_cfg("continuum-fixed", vllm_async=not sync), abc_trace(1.0))
    # B2 (t1 + 0.5) pops the 10 unhashed blocks, then 10 hashed ones: A's without the pin
    assert row(stock, "s0", 1).hit_gpu_tokens == 0
    assert row(stock, "s0", 1).ttft_s == pytest.approx(prefill((0, 704)), rel=1e-12)
    # ... C's with it (C's program ended: not pinned); A2 arrives at t1 + 1 < t1 + 2, hits
    # its whole history and computes one block
    a2 = row(pinned, "s0", 1)
    assert a2.hit_gpu_tokens == 640
    assert a2.send_s == pytest.approx(t1 + 1.0, rel=1e-12)
    assert a2.ttft_s == pytest.approx(prefill((640, 704)), rel=1e-12)
    assert row(pinned, "s2", 1).hit_gpu_tokens == 0
    assert pinned.summary["continuum_pins"] == {"pins": 1, "handed_over": 1, "expired": 0,
                                                "pressure": 0, "dropped": 0,
                                                "superseded": 0}
    # The handover: A1 (request 0) is freed right after A2's admission (which popped the
    # queue's front block for its 11th block), and every one of A1's blocks is held by A2
    # then, so nothing joins the free queue. B2 (blocks 21-30, then C's 20-11) was freed
    # in vLLM's reversed order before.
    ids = [rid for rid, _q in frees]
    # request ids are trace rows: A1 0, A2 1, C1 2, B1 3, B2 4
    assert ids == [2, 3, 4, 0, 1]  # C1, B1, B2 (finish), A1 (handover), A2 (end)
    before, after = frees[2][1], frees[3][1]
    assert before == list(range(11, 21)) + list(range(30, 20, -1))
    assert after == before[1:]


@pytest.mark.parametrize("sync", [False, True])
def test_an_expired_pin_returns_its_blocks_to_the_free_queue_in_vllm_order(frees, sync):
    t1 = prefill((0, 640), (0, 640), (0, 10))
    # A2 arrives 3 s after A1: the pin is gone
    res = run(continuum_cfg("continuum-fixed", vllm_async=not sync), abc_trace(3.0))
    assert res.summary["continuum_pins"]["expired"] == 1
    # The scheduler step at A2's arrival (t1 + 3 > t1 + 2) lets the pin expire first: A1's
    # 10 hashed blocks join the tail of the queue tail first, as vLLM frees a request
    ids = [rid for rid, _q in frees]
    assert ids == [2, 3, 4, 0, 1]  # C1, B1, B2, A1 (expired), A2
    assert frees[3][1] == (list(range(11, 21)) + list(range(30, 20, -1))
                           + list(range(10, 0, -1)))
    assert frees[4][1] == (list(range(12, 21)) + list(range(30, 20, -1))
                           + list(range(11, 0, -1)))  # A2 took 1-10 back and popped 11
    # ... still cached (vLLM evicts lazily), so A2 hits them all
    a2 = row(res, "s0", 1)
    assert a2.hit_gpu_tokens == 640
    assert a2.ttft_s == pytest.approx(prefill((640, 704)), rel=1e-12)
    assert a2.send_s == pytest.approx(t1 + 3.0, rel=1e-12)


@pytest.mark.parametrize("sync", [False, True])
def test_memory_pressure_unpins_the_latest_program_first(frees, sync):
    # A (s0) and D (s1) both pin at t1; B2 needs 10 blocks more than the free queue has:
    # D's program is the later one (same start, larger session), so D is unpinned, its
    # blocks freed in vLLM's order and popped by B2; A keeps its history.
    res = run(continuum_cfg("continuum-fixed", vllm_async=not sync), abc_trace(1.0, d_session=True))
    assert res.summary["continuum_pins"] == {"pins": 2, "handed_over": 1, "expired": 0,
                                             "pressure": 1, "dropped": 0,
                                             "superseded": 0}
    assert row(res, "s0", 1).hit_gpu_tokens == 640
    assert row(res, "s1", 1).hit_gpu_tokens == 0
    # request ids: A1 0, A2 1, D1 2, D2 3, B1 4, B2 5; B1 finished, then D1 unpinned by
    # B2's admission: its blocks join the queue tail first, behind the unhashed ones
    ids = [rid for rid, _q in frees]
    assert ids[:2] == [4, 2]
    assert frees[1][1] == list(range(21, 31)) + list(range(20, 10, -1))


def test_program_order_puts_an_older_programs_turn_first():
    # Open loop, one running slot (max_num_seqs 1): A1 (200 output tokens, about 1.7 s)
    # runs from t = 0; B1 arrives at 0.5, C1 at 0.6, A2 at 0.7, and all wait. vLLM's FCFS
    # serves them in arrival order; program FCFS serves A2 first (its program started at 0).
    t = KitTrace([[(640, 200, 0.0), (704, 1, 0.0)], [(640, 1, 0.0)], [(640, 1, 0.0)]])
    t.send_time_s = np.array([0.0, 0.7, 0.5, 0.6])  # rows: A1, A2, B1, C1
    order = {}
    for patch in ("none", "continuum-fcfs"):
        res = run(continuum_cfg(patch, gpu_cache=1 << 16, max_running=1, replay="open"), t)
        df = res.requests.sort_values("admit_s", kind="stable")
        order[patch] = [(r.session, r.turn) for r in df.itertuples()]
    assert order["none"] == [("s0", 0), ("s1", 0), ("s2", 0), ("s0", 1)]
    assert order["continuum-fcfs"] == [("s0", 0), ("s0", 1), ("s1", 0), ("s2", 0)]


@pytest.fixture
def at_close(monkeypatch) -> list[dict]:
    """Per Continuum server, at the end of its run (after ``BlockPool.check``): the
    requests still holding blocks, the pinned ones, and the free and total blocks."""
    from sim.engines.vllm_continuum import ContinuumVllmServer

    seen: list[dict] = []
    close = ContinuumVllmServer.close

    def spy(self):
        close(self)
        self.pool.check()
        seen.append({"running": sorted(self.pool.running()),
                     "pinned": sorted(p.rid for p in self.pins.pins.values()),
                     "free": self.pool.free_blocks, "blocks": self.pool.capacity_blocks})

    monkeypatch.setattr(ContinuumVllmServer, "close", spy)
    return seen


def open_loop_program(outputs: tuple[int, int]) -> KitTrace:
    """One program, open loop: turn 1 (640 tokens) at 0, turn 2 (704) at 0.05 while turn 1
    still runs, turn 3 (768) at 1.5; ``outputs``: the output tokens of turns 1 and 2."""
    t = KitTrace([[(640, outputs[0], 0.0), (704, outputs[1], 0.0), (768, 1, 0.0)]])
    t.send_time_s = np.array([0.0, 0.05, 1.5])
    return t


@pytest.mark.parametrize("sync", [False, True])
def test_open_loop_a_later_turn_finishing_first_keeps_the_programs_pin(at_close, sync):
    # Turn 1 decodes 100 tokens (to about 0.83 s); turn 2 (1 token) finishes at about
    # 0.07 s and pins its 11 blocks for 2 s. Turn 1's finish is stale: it pins nothing
    # (before: "session 0 pinned twice"; under python -O its blocks were never freed).
    res = run(continuum_cfg("continuum-fixed", gpu_cache=1 << 14, sessions=1, replay="open",
                  vllm_async=not sync), open_loop_program((100, 1)))
    df = res.requests
    assert df.end_s[1] < df.end_s[0] < df.send_s[2]
    assert row(res, "s0", 2).hit_gpu_tokens == 704  # turn 2's history, handed over
    assert res.summary["continuum_pins"] == {"pins": 1, "handed_over": 1, "expired": 0,
                                             "pressure": 0, "dropped": 0,
                                             "superseded": 0}
    assert at_close == [{"running": [], "pinned": [], "free": 256, "blocks": 256}]


@pytest.mark.parametrize("sync", [False, True])
def test_open_loop_a_later_turn_supersedes_an_earlier_turns_pin(at_close, sync):
    # Turn 1 (20 tokens) finishes first and pins; turn 2 (100 tokens) finishes later and
    # ends turn 1's pin before pinning its own history, which turn 3 takes over.
    res = run(continuum_cfg("continuum-fixed", gpu_cache=1 << 14, sessions=1, replay="open",
                  vllm_async=not sync), open_loop_program((20, 100)))
    df = res.requests
    assert df.end_s[0] < df.end_s[1] < df.send_s[2]
    assert row(res, "s0", 2).hit_gpu_tokens == 704
    assert res.summary["continuum_pins"] == {"pins": 2, "handed_over": 1, "expired": 0,
                                             "pressure": 0, "dropped": 0,
                                             "superseded": 1}
    assert at_close == [{"running": [], "pinned": [], "free": 256, "blocks": 256}]


def test_a_pin_set_while_the_programs_next_turn_waits_is_held_until_its_admission():
    # One running slot. B0 (t = 0, a human turn follows) starts program B first; A1 runs
    # from 0.1; B1 (600 output tokens) and A2 arrive while it runs and wait, B1 first
    # (program order). A1 pins for 2 s at about 0.12 while A2 waits: the pin is held
    # through B1's 5 s decode and handed to A2 (before: it expired at about 2.12 s).
    t = KitTrace([[(640, 1, 0.0), (704, 1, 0.0)], [(64, 1, 0.0), (640, 600, 0.0)]])
    t.gap_kind[t.sessions[1].first + 1] = HUMAN
    t.send_time_s = np.array([0.1, 0.11, 0.0, 0.105])  # rows: A1, A2, B0, B1
    res = run(continuum_cfg("continuum-fixed", gpu_cache=1 << 14, replay="open", max_running=1), t)
    a2, b1 = row(res, "s0", 1), row(res, "s1", 1)
    assert a2.admit_s == b1.end_s and a2.admit_s - row(res, "s0", 0).end_s > 4.0
    assert a2.hit_gpu_tokens == 640
    assert res.summary["continuum_pins"] == {"pins": 1, "handed_over": 1, "expired": 0,
                                             "pressure": 0, "dropped": 0,
                                             "superseded": 0}


@pytest.mark.parametrize("patch", ["continuum", "continuum-fixed", "continuum-pins"])
def test_open_loop_pins_leak_no_blocks(at_close, patch):
    # 16 synthetic programs replayed at their recorded send times on a small cache: turns
    # overlap, pins are superseded, handed over, expired and broken by pressure. At the end
    # every block is free or held by a pin still standing, and the pins add up.
    base = dict(trace="synthetic:claude-code?sessions=16", engine="vllm", replay="open",
                gpu_cache=65536, max_context=65536, debug_cache=True)
    stock = run(RunConfig.from_flat(**base).with_preset("vllm"))
    res = run(RunConfig.from_flat(**base, vllm_patch=patch).with_preset("vllm"))
    assert res.summary["requests"] == stock.summary["requests"]
    (end,) = at_close
    assert end["running"] == end["pinned"]
    pins = res.summary["continuum_pins"]
    assert pins["pins"] > 0
    assert pins["pins"] == sum(v for k, v in pins.items() if k != "pins") + len(end["pinned"])
    if not end["pinned"]:
        assert end["free"] == end["blocks"]


def test_unpatched_vllm_has_no_continuum_fields_and_patches_need_the_vllm_engine():
    res = run(continuum_cfg("none"), abc_trace(1.0))
    assert "continuum_pins" not in res.summary and "vllm_patch" not in res.summary
    fcfs = run(continuum_cfg("continuum-fcfs"), abc_trace(1.0))
    assert "continuum_pins" not in fcfs.summary and fcfs.summary["vllm_patch"] == (
        "continuum-fcfs")
    with pytest.raises(ConfigError, match="vllm_patch"):
        RunConfig.from_flat(engine="sglang", vllm_patch="continuum").validate()


def test_learned_ttl_on_the_engine_is_the_cold_start_rule():
    # Cold start: tau = mu ln(B / mu), B = T_q + C, T_q = 0, C = the marginal prefill
    # seconds of A1's 640-token context (mu = 1 s): below 1 s here, so no pin at all.
    res = run(continuum_cfg("continuum"), abc_trace(1.0))
    c = prefill((0, 640)) - prefill()
    expected = math.log(c) if c > 1 else 0.0
    assert res.summary["continuum_tau_mean_s"] == pytest.approx(expected)
    assert res.summary["continuum_pins"]["pins"] == int(expected > 0)
    assert np.isfinite(res.summary["ttft_mean_s"])


# --- kvsim reproduce policies --engine vllm -------------------------------------------------
def test_reproduce_policies_on_vllm_rows_per_load_and_variant():
    from sim.studies import reproduce
    from sim.studies.continuum import QUICK_LOADS, VARIANTS, job_times

    doc = reproduce("policies", trace="synthetic:claude-code", quick=True, engine="vllm")
    assert doc["engine"] == "vllm" and doc["prompt_nodes"] == "chunked"
    rows = doc["rows"]
    assert [(r["sessions"], r["policy"]) for r in rows] == [
        (n, label) for n in QUICK_LOADS for label, _patch in VARIANTS]
    for r in rows:
        if r["policy"] == "vllm":
            assert r["jct_change"] == 0 and r["recomputed_saved_tokens"] == 0
            assert "pins" not in r
        assert r["jct_p90_s"] >= r["jct_mean_s"] * 0.5 and r["ttft_p90_s"] >= 0
        assert ("pins" in r) == (r["policy"] in ("continuum", "continuum-fixed", "pins"))
    # the p90 is taken over the same jobs as the summary's mean
    cfg = RunConfig.from_flat(trace="synthetic:claude-code?sessions=6", engine="vllm", sessions=4,
                              gpu_cache=98304, max_context=65536).with_preset("vllm")
    res = run(cfg)
    assert job_times(res.requests).mean() == pytest.approx(res.summary["jct_mean_s"])


def test_reproduce_engine_vllm_is_for_policies_only():
    from click.testing import CliRunner

    from sim.cli.main import cli

    r = CliRunner().invoke(cli, ["reproduce", "ablation", "--engine", "vllm", "--quick"])
    assert r.exit_code == 2 and "policies experiment only" in r.output


def test_reproduce_vllm_tables_fit_100_columns():
    from rich.console import Console
    from rich.table import Table

    from sim.studies import reproduce
    from sim.studies.continuum import continuum_tables

    doc = reproduce("policies", trace="synthetic:claude-code?sessions=2", quick=True,
                    engine="vllm")
    items = continuum_tables(doc["rows"])
    assert sum(isinstance(t, Table) for t in items) == 2
    for item in items:
        con = Console(width=100, record=True, color_system=None,
                      file=open("/dev/null", "w"))  # noqa: SIM115
        con.print(item)
        text = con.export_text()
        assert "…" not in text and max(len(ln.rstrip()) for ln in text.splitlines()) <= 100


@pytest.mark.parametrize("sync", [False, True])
@pytest.mark.parametrize("patch", ["continuum", "continuum-fixed", "continuum-pins",
                                   "continuum-fcfs"])
def test_patched_runs_under_pressure_keep_the_pool_invariants_and_serve_everyone(patch, sync):
    # A small cache and short tool waits: pins are set, handed over, expire and are broken
    # by pressure; every pool operation is checked (debug_cache) and every request served.
    base = dict(trace="synthetic:claude-code?sessions=8", engine="vllm", sessions=6,
                gpu_cache=65536, max_context=32768, gaps="cap:1", debug_cache=True,
                vllm_async=not sync)
    stock = run(RunConfig.from_flat(**base).with_preset("vllm"))
    res = run(RunConfig.from_flat(**base, vllm_patch=patch).with_preset("vllm"))
    assert res.summary["requests"] == stock.summary["requests"]
    assert res.summary["dropped_requests"] == stock.summary["dropped_requests"]
    assert res.summary["decoded_tokens"] == stock.summary["decoded_tokens"]
    if patch != "continuum-fcfs":
        pins = res.summary["continuum_pins"]
        assert pins["pins"] > 0
        assert pins["pins"] >= pins["handed_over"] + pins["expired"] + pins["pressure"]


def test_ttl_on_stock_vllm_points_to_the_patch():
    with pytest.raises(ConfigError, match="--vllm-patch continuum"):
        check(RunConfig.from_flat(engine="vllm", policy="ttl"))


@pytest.mark.parametrize("sync", [False, True])
@pytest.mark.parametrize("patch", ["continuum-fixed", "continuum"])
def test_decode_runs_change_nothing(monkeypatch, patch, sync):
    # One event per decode run (cut by a finish, memory and arrivals, never at a pin
    # deadline) gives the same run as one event per V1 step, where every step's scheduler
    # lets pins expire: nothing inside a run sees an expiry.
    from sim.engines.vllm import VllmServer

    trace = KitTrace([[(1500 + 700 * k, 400 + 150 * k, 1.0 + 0.3 * k) for k in range(6)]
                      for _ in range(4)], shared_blocks=12)
    c = continuum_cfg(patch, gpu_cache=9000, debug_cache=False, vllm_async=not sync)
    fast = run(c, trace)
    monkeypatch.setattr(VllmServer, "decode_runs", False)
    slow = run(c, trace)
    monkeypatch.undo()
    pins = fast.summary["continuum_pins"]
    assert pins["expired"] > 0 and pins["pressure"] + pins["handed_over"] > 0
    assert pins == slow.summary["continuum_pins"]
    assert fast.summary["decode_events"] < slow.summary["decode_events"] / 10
    for col in ("hit_gpu_tokens", "recomputed_tokens", "retractions", "decoded_tokens"):
        assert fast.requests[col].tolist() == slow.requests[col].tolist(), col
    for col in ("ttft_s", "end_s", "admit_s"):
        np.testing.assert_allclose(fast.requests[col], slow.requests[col], rtol=1e-9)


@pytest.mark.parametrize("sync", [False, True])
def test_a_pin_expires_inside_a_decode_run(monkeypatch, sync):
    # A1 (10 blocks) pins for 2 s at t1 while B (640 + 1200 tokens: 29 blocks at its end)
    # decodes alone and outgrows the 9 unpinned free blocks at about the deadline. With one
    # event per step the pin expires at the first step after its deadline; with decode runs
    # the run is cut by memory and the step that ends it lets the pin expire first: the
    # same timeline, and the pin ends by its deadline in both, not by B's pressure.
    from sim.engines.vllm import VllmServer

    trace = KitTrace([[(640, 1, 0.0), (704, 1, 9.0)], [(640, 1200, 0.0)]])
    c = continuum_cfg("continuum-fixed", sessions=2, vllm_async=not sync)
    fast = run(c, trace)
    monkeypatch.setattr(VllmServer, "decode_runs", False)
    slow = run(c.with_fields(debug_cache=False), trace)
    monkeypatch.undo()
    for res in (fast, slow):
        assert res.summary["continuum_pins"] == {"pins": 1, "handed_over": 0, "expired": 1,
                                                 "pressure": 0, "dropped": 0,
                                                "superseded": 0}
    assert fast.summary["decode_events"] < slow.summary["decode_events"] / 10
    for col in ("ttft_s", "end_s", "admit_s"):
        np.testing.assert_allclose(fast.requests[col], slow.requests[col], rtol=1e-9)
