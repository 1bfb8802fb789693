"""Metric fixes (issue 11), each pinned by a test that failed before its fix."""

from __future__ import annotations

import pytest

from sim.config import RunConfig
from sim.kvcache.tree import RadixTree
from sim.run import run

SYNTH = dict(trace="synthetic:claude-code?sessions=12", max_context=65536, gaps="tool",
             sessions=4, model="qwen3-8b")


class DeletionSpy:
    """Counts every block whose last copy leaves the cache, at the one place it happens."""

    def __init__(self, monkeypatch) -> None:
        self.blocks = 0
        real_delete, real_truncate = RadixTree.delete, RadixTree.truncate_tail

        def delete(tree, node, result):
            self.blocks += len(node.ids)
            return real_delete(tree, node, result)

        def truncate(tree, leaf, k, result):
            self.blocks += k
            return real_truncate(tree, leaf, k, result)

        monkeypatch.setattr(RadixTree, "delete", delete)
        monkeypatch.setattr(RadixTree, "truncate_tail", truncate)


@pytest.mark.parametrize("tiers", [
    dict(gpu_cache=98304),
    dict(gpu_cache=73728, cpu_cache=49152, tiering="unified"),
    dict(gpu_cache=73728, cpu_cache=49152, tiering="hicache"),
    dict(gpu_cache=73728, cpu_cache=49152, tiering="hicache",
         hicache_write_policy="write_back"),
    dict(gpu_cache=73728, cpu_cache=24576, tiering="hicache",
         hicache_write_policy="write_through_selective"),
], ids=["gpu", "unified", "hicache-wt", "hicache-wb", "hicache-wts"])
@pytest.mark.pure_path("spies on RadixTree's methods, which compiled callers do not look up")
def test_evicted_tokens_count_every_deletion(monkeypatch, tiers: dict) -> None:
    """HiCache deletes host copies while backing up (write-through) and while loading; every
    deletion, wherever it happens, is in evicted_tokens."""
    preset = "sglang" if tiers.get("tiering") == "hicache" else "penelope"
    spy = DeletionSpy(monkeypatch)
    s = run(RunConfig.from_flat(**SYNTH, **tiers, scheduler="lpm-cpu" if "cpu_cache" in tiers
                                else "lpm").with_preset(preset)).summary
    assert spy.blocks > 0
    assert s["evicted_tokens"] == spy.blocks * 64


@pytest.mark.parametrize("tiering", ["unified", "hicache"])
def test_a_resent_prompt_loads_only_what_it_reuses(tiering: str) -> None:
    """The match is capped at (prompt - 1) // block blocks (one token is always computed), so a
    resent block-aligned 6,400-token prompt whose history went to the CPU loads 99 blocks and
    computes the last 64 tokens (it reported 6,400 loaded and 0 new)."""
    from tests.enginekit import KitTrace

    trace = KitTrace([[(6400, 1, 0.0), (6400, 1, 30.0)], [(6400, 1, 0.0)]])
    cfg = RunConfig.from_flat(gpu_cache=8192, cpu_cache=16384, tiering=tiering, sessions=2,
                              max_new_tokens=16, scheduler="lpm-cpu").with_preset("sglang")
    res = run(cfg, trace)
    resend = res.requests.set_index("request").loc[1]
    assert resend.hit_gpu_tokens == 0
    assert resend.loaded_cpu_tokens == 99 * 64
    assert resend.new_tokens == 64 and resend.recomputed_tokens == 0
    kv = 147456  # qwen3-8b KV bytes per token
    assert res.summary["bytes_h2d"] == 99 * 64 * kv


def test_jobs_are_top_level_sessions() -> None:
    """A sub-agent runs inside its parent's job: JCT and completed sessions count top-level
    jobs only; sub-agents get their own fields (it counted 2 jobs and averaged both)."""
    from tests.enginekit import KitTrace

    trace = KitTrace([[(2000, 10, 0.0), (3000, 10, 5.0)], [(1000, 10, 0.0), (1500, 10, 1.0)]])
    sub = trace.sessions[1]
    sub.parent, sub.after_request, sub.start_offset_s = 0, 0, 0.5
    res = run(RunConfig.from_flat(sessions=1, gpu_cache=65536, max_new_tokens=16), trace)
    s, df = res.summary, res.requests
    assert s["sessions_completed"] == 1 and s["subagents_completed"] == 1
    top_end = df[df.session_index == 0].end_s.max()
    sub_rows = df[df.session_index == 1]
    assert s["jct_mean_s"] == pytest.approx(top_end - 0.0)
    assert s["subagent_jct_mean_s"] == pytest.approx(sub_rows.end_s.max() - sub_rows.send_s.min())
    assert sub_rows.send_s.min() > df.loc[df.request == 0, "end_s"].iloc[0]  # after its parent


def test_decode_copies_delay_the_decode_run_not_the_next_batch() -> None:
    """A decode run that needs room demotes another history to the CPU: its tokens complete
    after those d2h copies. They were charged to whatever batch came next, here a request
    100 s later, contradicting docs/engine.md."""
    from costmodel.profile import load_profile
    from costmodel.specs import get_spec
    from costmodel.units import range_units
    from tests.enginekit import KitTrace

    # B fills most of the GPU; A then decodes 1,999 tokens and pushes the front 16 blocks of
    # B's history to the CPU tier. B's next turn, 100 s later, loads them back (16 h2d) after
    # pushing 16 of A's blocks out (16 d2h), and computes one new block.
    trace = KitTrace([[(4096, 1, 0.0), (4160, 1, 100.0)], [(1024, 2000, 0.0)]])
    cfg = RunConfig.from_flat(gpu_cache=6144, cpu_cache=8192, tiering="unified", sessions=2,
                              max_new_tokens=16, scheduler="lpm-cpu").with_preset("penelope")
    res = run(cfg, trace)
    req = res.requests.set_index("request")
    a, b1 = req.loc[2], req.loc[1]
    profile = load_profile(None, "qwen3-8b")
    block = 64 * get_spec("qwen3-8b").kv_bytes_per_token
    assert res.summary["bytes_d2h"] == 32 * block and res.summary["bytes_h2d"] == 16 * block
    pause = profile.transfer_seconds(16 * block, "d2h")
    decode = profile.decode_run_seconds(1, 1024, 1999)
    assert a.end_s - a.first_token_s == pytest.approx(pause + decode, rel=1e-9)
    assert b1.loaded_cpu_tokens == 16 * 64 and b1.new_tokens == 64
    own = (profile.prefill_seconds(range_units(get_spec("qwen3-8b"), 4096, 4160))
           + profile.transfer_seconds(16 * block, "h2d") + pause)  # its own moves only
    assert b1.ttft_s == pytest.approx(own, rel=1e-9)
