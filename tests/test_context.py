"""Context strategies end to end: parsing, decisions, runs under every strategy (debug cache
recounts after every operation), the CLI and sweep contracts, and the experiment."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import CC_TRACES, needs_cc_traces

from sim.config import ConfigError, RunConfig
from sim.context.strategies import (
    ACCURACY_NOTE,
    ContextError,
    budget_drops,
    keep_removed,
    parse_context,
    stale_tool_mask,
    tool_spans,
)
from sim.run import check, run
from sim.sweep import point_id
from tests.clikit import invoke

SYN = dict(trace="synthetic:claude-code?sessions=6", max_context=65536, gaps="tool",
           gpu_cache=98304, sessions=3, model="qwen3-8b", profile="derived-h100-qwen3-8b")
STRATEGIES = ["trim:4", "summarize:32k:1024", "drop:4", "drop:4+repos", "splice:4",
              "budget:16k"]
U, A, T = 2, 3, 4  # user, assistant, tool_result


# --- parsing and decisions ------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "label"), [
    ("full", "full"), (None, "full"), ("trim:4", "trim:4"), ("drop:12", "drop:12"),
    ("drop:4+repos", "drop:4+repos"), ("splice:2", "splice:2"), ("budget:32k", "budget:32768"),
    ("summarize:64k:2048", "summarize:65536:2048"), (" DROP:3 ", "drop:3"),
])
def test_parse_context(text, label) -> None:
    assert parse_context(text).label == label


@pytest.mark.parametrize(("text", "says"), [
    ("drop", "expected full"), ("drop:0", "integer >= 1"), ("drop:x", "integer"),
    ("drop:4+reps", r"\+repos"), ("summarize:10", "T:S"), ("summarize:100:200", "shorter"),
    ("budget:-3", "integer"), ("evict:3", "expected full"), ("trim:2.5", "integer"),
])
def test_parse_context_rejects(text, says) -> None:
    with pytest.raises(ContextError, match=says):
        parse_context(text)


def test_tool_results_are_maximal_tool_runs() -> None:
    reg = np.array([1, 0, U, T, T, A, T, A, A, T], np.uint8)
    s, e = tool_spans(reg)
    assert (s.tolist(), e.tolist()) == ([3, 6, 9], [5, 7, 10])
    assert stale_tool_mask(reg, 1, 10).tolist() == [False] * 3 + [True] * 2 + [False, True] \
        + [False] * 3
    assert stale_tool_mask(reg, 3, 10).sum() == 0
    assert stale_tool_mask(reg, 1, 4).tolist() == [False] * 3 + [True] + [False] * 6
    assert keep_removed(reg, 1, 10).tolist() == [True] * 9 + [False]


def test_budget_keeps_the_highest_scores_and_the_pins() -> None:
    # 8 blocks of 64 tokens; blocks 0-1 pinned; user text outlives tool output of the same age
    reg = np.array([0, 1, U, T, T, A, U, T], np.uint8)
    pinned = np.zeros(8, bool)
    pinned[:2] = True
    pinned[7] = True  # the last turn
    ends = (np.arange(8) + 1) * 64
    drop = budget_drops(reg, np.ones(8, bool), pinned, 5, ends, 512)
    assert drop.sum() == 3 and not (drop & pinned).any()
    assert drop[3] and drop[4]  # the older tool results go first
    assert not drop[2] and not drop[6]  # user text stays


# --- runs ----------------------------------------------------------------------------------------
def synthetic(context: str, preset: str = "penelope", **kw) -> RunConfig:
    return RunConfig.from_flat(**SYN, context=context, debug_cache=True, **kw).with_preset(preset)


def test_full_adds_nothing_to_the_summary() -> None:
    s = run(synthetic("full")).summary
    assert not [k for k in s if k.startswith("context")]
    assert "request_latency_mean_s" not in s


@pytest.mark.parametrize("preset", ["sglang", "penelope"])
@pytest.mark.parametrize("context", STRATEGIES)
def test_every_strategy_runs_with_invariants_checked(context: str, preset: str) -> None:
    full = run(synthetic("full", preset)).summary
    res = run(synthetic(context, preset))
    s = res.summary
    assert s["context"] == parse_context(context).label
    assert s["context_note"] == ACCURACY_NOTE
    assert s["requests"] >= full["requests"]
    t = res.requests
    assert (t["prompt_tokens"] == t["hit_gpu_tokens"] + t["loaded_cpu_tokens"]
            + t["recomputed_tokens"] + t["new_tokens"] + t["dropped_tokens"]).all()
    kind = parse_context(context).kind
    if kind in ("trim", "splice", "summarize"):
        assert s["prompt_tokens"] < full["prompt_tokens"]  # the text got shorter
    if kind in ("drop", "budget"):
        assert s["prompt_tokens"] == full["prompt_tokens"]  # the text did not
        assert s["context_dropped_tokens"] > 0
    assert (s["rerotated_tokens"] > 0) == (context in ("drop:4+repos", "splice:4"))
    assert (s["summary_calls"] > 0) == (kind == "summarize")
    assert (s["reprefill_tokens"] > 0) == (kind in ("trim", "summarize"))


@pytest.mark.parametrize("context", ["drop:4", "budget:16k"])
def test_dropped_keys_are_not_attended(context: str) -> None:
    """Without eviction nothing is restored: every prompt computes the same tokens under both
    strategies, attending fewer keys, and decode reads fewer keys."""
    big = dict(gpu_cache=1 << 21)
    full = run(synthetic("full").with_fields(**big)).summary
    s = run(synthetic(context).with_fields(**big)).summary
    assert full["recomputed_tokens"] == s["recomputed_tokens"] == 0
    assert s["new_tokens"] == full["new_tokens"]
    assert s["prefill_units"] < full["prefill_units"]
    assert s["decode_busy_s"] < full["decode_busy_s"]


def test_runs_are_deterministic() -> None:
    a = run(synthetic("drop:4+repos")).summary
    b = run(synthetic("drop:4+repos")).summary
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True,
                                                                    default=str)


def test_drop_and_splice_never_block_on_locks_here() -> None:
    for c in ("drop:4", "splice:4"):
        assert run(synthetic(c)).summary["context_edits_blocked"] == 0


def test_config_refuses_what_is_not_modelled() -> None:
    with pytest.raises(ConfigError, match="HiCache"):
        check(RunConfig.from_flat(**SYN, context="drop:4", cpu_cache=32768,
                                  tiering="hicache").with_fields(preset="sglang"))
    with pytest.raises(ConfigError, match="closed loop"):
        check(RunConfig.from_flat(**SYN, context="summarize:32k:1k", replay="open"))
    with pytest.raises(ConfigError, match="context"):
        check(RunConfig.from_flat(**SYN, context="drop:zero"))
    with pytest.raises(ConfigError, match="sglang engine"):
        check(RunConfig.from_flat(**SYN, context="drop:4", engine="vllm").with_preset("vllm"))
    check(RunConfig.from_flat(**SYN, context="drop:4", cpu_cache=32768, tiering="unified"))


def test_unified_tiers_with_drops() -> None:
    s = run(synthetic("drop:4").with_fields(gpu_cache=65536, cpu_cache=32768,
                                            tiering="unified")).summary
    assert s["context_dropped_tokens"] > 0 and s["requests"] > 0


# --- CLI and sweeps ------------------------------------------------------------------------------
def test_cli_context_option_and_table_caveat() -> None:
    code, out, err = invoke("run", "--trace", "synthetic:claude-code?sessions=4",
                            "--max-context", "64k", "--gpu-cache", "96k", "-n", "2",
                            "--preset", "sglang,penelope", "--context", "drop:4")
    assert code == 0, err
    flat = " ".join(out.split())  # the table title wraps
    assert "context drop:4" in flat and "task accuracy not modelled" in flat
    assert "kv_peak_tokens" in out and "context_dropped_tokens" in out


def test_cli_bad_context_is_one_line_exit_2() -> None:
    code, _out, err = invoke("run", "--trace", "synthetic:claude-code?sessions=2",
                            "--preset", "sglang", "--context", "drop:-1")
    assert code == 2
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "context" in lines[0] and "drop:-1" in lines[0]


def test_sweep_grid_over_context_keeps_full_point_ids() -> None:
    cfg = RunConfig.from_flat(**SYN)
    d = cfg.to_dict()
    assert d["context"] == "full"
    # the id a point had before the field existed
    import hashlib

    d.pop("extra", None)
    d.pop("context")
    # fields that came later still: the fleet's, the vLLM patch's, the pool's, vLLM's async
    # switch, a deployment in GPUs, the trace seed, repeats, SLOs; max_concurrency at its
    # default (left out of ids, sim/sweep/identity.py)
    for later in ("replicas", "router", "router_params", "vllm_patch", "pool",
                  "pool_bandwidth", "pool_latency_us", "pool_write", "pool_watermark",
                  "pool_evict_fraction", "vllm_async", "gpu", "tp", "mem_fraction",
                  "gpu_cache_bytes", "trace_seed", "repeats", "slo", "max_concurrency",
                  "vllm_version", "vllm_cache_aware_window", "vllm_cache_aware_threshold",
                  "kv_dtype", "hybrid_swa_memory"):
        d.pop(later)
    old = hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]
    assert point_id(cfg) == old
    assert point_id(cfg.with_fields(context="drop:4")) != old


def test_sweep_yaml_takes_context(tmp_path) -> None:
    (tmp_path / "s.yaml").write_text(
        "base:\n  trace: synthetic:claude-code?sessions=3\n  max_context: 32768\n"
        "  gpu_cache: 65536\n  sessions: 2\n  preset: penelope\n"
        "grid:\n  context: [full, drop:4]\n")
    code, out, err = invoke("sweep", tmp_path / "s.yaml", "--out", tmp_path / "o", "--json")
    assert code == 0, err
    doc = json.loads(out)
    rows = doc.get("rows") or doc.get("points")
    assert len(rows) == 2


# --- on the shared Claude Code traces ----------------------------------------------------------
@needs_cc_traces
@pytest.mark.parametrize("context", ["full", *STRATEGIES])
def test_each_strategy_on_the_shared_traces(context: str) -> None:
    code, out, err = invoke("run", "--trace", CC_TRACES, "--select", "top-requests:6",
                            "--max-context", "64k", "--shared-prefix", "15.6k",
                            "--gaps", "tool", "--model", "gpt-oss-120b", "--gpu-cache", "96k",
                            "-n", "3", "--preset", "sglang,penelope", "--context", context,
                            "--hybrid-swa-memory", "off", "--json")  # the study's one pool
    assert code == 0, err
    runs = json.loads(out)["runs"]
    assert [r["policy"] for r in runs] == ["sglang", "penelope"]
    for r in runs:
        s = r["summary"]
        assert s["requests"] > 0
        assert ("context" in s) == (context != "full")


@pytest.mark.parametrize("context", ["trim:4", "summarize:16k:512"])
def test_text_strategies_run_on_the_hybrid_tree(context: str) -> None:
    """trim and summarize change only the tokens a turn sends: gpt-oss-120b runs them on
    SGLang's hybrid radix tree (sim/engines/sglang_hybrid.py), the tree recounted after every
    op, with the strategy's re-prefill and working peak counted as on one pool."""
    from sim.engines import SGLangHybridServer, engine_class

    for preset in ("sglang", "penelope"):
        cfg = RunConfig.from_flat(**{**SYN, "model": "gpt-oss-120b", "profile": None,
                                     "max_context": 32768, "gpu_cache": 49152},
                                  context=context, debug_cache=True).with_preset(preset)
        assert engine_class(cfg) is SGLangHybridServer
        s = run(cfg).summary
        assert s["requests"] > 0 and s["dropped_requests"] == 0, s
        assert s["context"] == parse_context(context).label
        assert s["reprefill_tokens"] > 0  # a text edit changed the keys after it
        assert 0 < s["kv_working_peak_tokens"] <= 49152


# --- the experiment -----------------------------------------------------------------------------
def test_reproduce_cache_engineering_quick_json_rows() -> None:
    code, out, err = invoke("reproduce", "cache-engineering", "--quick", "--json",
                            "--trace", "synthetic:claude-code?sessions=4")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["note"] == ACCURACY_NOTE
    keys = ["strategy", "eviction", "model", "concurrency", "request_latency_mean_s",
            "request_latency_p95_s", "ttft_mean_s", "input_tokens_per_s",
            "output_tokens_per_s", "kv_peak_tokens", "recomputed_tokens", "api_cost_usd"]
    assert all(list(r) == keys for r in doc["rows"])
    assert {r["strategy"] for r in doc["rows"]} == {
        "full", "trim", "summarize", "drop", "drop+repos", "splice", "budget"}
    assert {r["eviction"] for r in doc["rows"]} == {"sglang", "penelope"}
    # every strategy on one layout: SGLang's one pool of every layer (the study's docstring)
    from sim.studies.cache_engineering import configs
    from sim.studies.study import StudySetup

    assert {c.value("hybrid_swa_memory") for _, c in configs(StudySetup(
        trace="synthetic:claude-code?sessions=4", quick=True))} == {False}
    assert doc["prices_usd_per_million"]["gpt-oss-120b"]["cache_miss"] == 0.15
    assert [r["method"] for r in doc["akv_table2"]][:3] == ["Standard", "Text Engineering",
                                                            "AKV"]
    code, out, err = invoke("reproduce", "cache-engineering", "--quick",
                            "--trace", "synthetic:claude-code?sessions=4")
    assert code == 0 and "task" in out and "AKV Table 2" in out


def test_incremental_tool_results_match_a_full_rescan() -> None:
    """drop:K keeps the previous prompt's tool results and scans only the new part: the
    drops are those of a full rescan (``stale_tool_mask``) of every prompt."""
    from sim.context.session import SessionState
    from sim.kvcache.versions import VersionSpace
    from sim.run import load_run_trace

    class Rescan(SessionState):
        def _new_drops(self, regions, prompt_tokens, k, prefix_blocks):
            n = len(regions)
            return stale_tool_mask(regions, self.st.keep, n) & ~self._grow(
                self.dropped, n, False)[:n]

    tr = load_run_trace(RunConfig.from_flat(**SYN))
    for spec in ("drop:1", "drop:2+repos"):
        st_ = parse_context(spec)
        for i, sess in enumerate(tr.sessions):
            a = SessionState(st_, VersionSpace(), 64, i)
            b = Rescan(st_, VersionSpace(), 64, i)
            for r in range(sess.first, sess.first + sess.count):
                args = (r, tr.block_ids(r), tr.block_regions(r), tr.finish_block_ids(r),
                        tr.finish_block_regions(r), int(tr.prompt_tokens[r]), 1, 0)
                (va,), (vb,) = a.turn(*args), b.turn(*args)
                assert np.array_equal(va.ids, vb.ids) and np.array_equal(va.finish, vb.finish)


def test_a_drop_blocked_by_another_running_request_keeps_the_cache_sound() -> None:
    """Two sessions start with the same 40 user blocks (shared in the tree, not a shared
    prefix: like identical sub-agents). Under a small budget the first to finish drops some
    of them while the other still runs: the edit cannot touch a path another request holds,
    so it is blocked, the finish inserts nothing more, and every count stays exact."""
    from tests.enginekit import KitTrace

    class Shared(KitTrace):
        def __init__(self) -> None:
            super().__init__([[(40 * 64 + 10, 50, 0.0), (40 * 64 + 600, 5, 1.0)],
                              [(40 * 64 + 10, 400, 0.0), (40 * 64 + 900, 5, 1.0)]],
                             shared_blocks=40)
            for sess in self.sessions:
                sess.shared_prefix_blocks = 0  # shared content, not the system prompt

        def block_regions(self, r: int) -> np.ndarray:
            return np.full(int(self.prompt_tokens[r]) // 64, U, np.uint8)

        def finish_block_regions(self, r: int) -> np.ndarray:
            return np.full(len(self.finish_block_ids(r)), U, np.uint8)

    cfg = RunConfig.from_flat(gpu_cache=1 << 16, sessions=2, max_new_tokens=64, debug_cache=True,
                              context="budget:1024").with_preset("penelope")
    s = run(cfg, Shared()).summary
    assert s["requests"] == 4 and s["context_edits_blocked"] >= 1
