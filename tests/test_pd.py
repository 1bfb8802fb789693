"""Disaggregated fleets (sim/fleet/pd.py): hand-computed timelines on 1P:1D, conditional
local prefill, a decode worker that retracts, the ideal-link equivalence with one aggregated
server, and properties of every run (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel.links import get_link
from sim.config import ConfigError, RunConfig
from sim.run import check, run
from tests.enginekit import DEFAULT_PROF, KVB, SPEC, KitTrace, prefill_s, same_summary


def pd_cfg(**kw) -> RunConfig:
    base = dict(trace="kit", gpu_cache=16384, sessions=1, prefill_replicas=1,
                decode_replicas=1, preset="sglang")
    base.update(kw)
    return RunConfig.from_flat(**base)


def test_one_request_timeline_by_hand():
    """Prefill on P, transfer over rdma-400, the first forward on D, then 4 decode steps."""
    res = run(pd_cfg(), KitTrace([[(1000, 5, 0.0)]]))
    row = res.requests.iloc[0]
    link = get_link("rdma-400")
    prefill = prefill_s(0, 1000)
    transfer = 1000 * KVB / 50e9 + 5e-6
    # the decode worker holds the 15 full blocks that landed; it computes [960, 1000)
    first = prefill_s(960, 1000)
    assert link.bandwidth_gb_s == 50.0 and link.latency_us == 5.0
    assert row["prefill_s"] == pytest.approx(prefill, rel=1e-12)
    assert row["transfer_queue_s"] == 0.0
    assert row["transfer_s"] == pytest.approx(transfer, rel=1e-12)
    assert row["transfer_bytes"] == 1000 * KVB
    assert row["first_decode_s"] == pytest.approx(first, rel=1e-9)
    assert row["ttft_s"] == pytest.approx(prefill + transfer + first, rel=1e-12)
    assert row["end_s"] == pytest.approx(prefill + transfer + first
                                         + DEFAULT_PROF.decode_run_seconds(1, 1000, 4), rel=1e-12)
    assert (row["pd_prefill_worker"], row["pd_decode_worker"]) == (0, 0)
    assert not row["prefilled_locally"] and row["decoded_tokens"] == 4
    # the prefill side's cache accounting: nothing cached before, all 1000 computed
    assert row["hit_gpu_tokens"] == 0 and row["new_tokens"] == 1000
    s = res.summary
    assert s["transfer_bytes"] == 1000 * KVB and s["prefill_pool_requests"] == 1
    assert s["link_busy_share_max"] == pytest.approx(1000 * KVB / 50e9 / s["sim_end_s"])


def test_streaming_ends_one_layer_after_the_prefill():
    """Layer streaming: the transfer starts with the prefill; on rdma-100 the prefill of
    qwen3-8b (22 us a token on an H100) is slower than the link (11.8 us a token), so the
    transfer ends one layer's share after the prefill ends."""
    res = run(pd_cfg(pd_link="rdma-100", pd_streaming="layer"), KitTrace([[(1000, 2, 0.0)]]))
    row = res.requests.iloc[0]
    busy = 1000 * KVB / 12.5e9
    prefill = prefill_s(0, 1000)
    assert busy < prefill
    assert row["transfer_queue_s"] == pytest.approx(-prefill, rel=1e-12)
    assert row["prefill_s"] + row["transfer_queue_s"] + row["transfer_s"] == \
        pytest.approx(prefill + busy / SPEC.layers + 5e-6, rel=1e-12)
    off = run(pd_cfg(pd_link="rdma-100"), KitTrace([[(1000, 2, 0.0)]])).requests.iloc[0]
    assert off["transfer_s"] == pytest.approx(busy + 5e-6, rel=1e-12)
    assert off["ttft_s"] - row["ttft_s"] == pytest.approx(busy - busy / SPEC.layers, rel=1e-9)


TWO_TURNS = [[(1000, 65, 0.0), (1200, 2, 1.0)]]


def test_second_turn_prefilled_locally_on_the_decode_cache():
    """Turn 1's prompt + output (16 full blocks) stay on the decode worker; turn 2 has 176
    uncached tokens there, below the 512 threshold: prefilled locally, nothing shipped."""
    res = run(pd_cfg(pd_local_threshold=512), KitTrace(TWO_TURNS))
    t = res.requests
    assert t["prefilled_locally"].tolist() == [False, True]
    assert t["transfer_bytes"].tolist() == [1000 * KVB, 0]
    assert t["pd_prefill_worker"].tolist() == [0, -1]
    second = t.iloc[1]
    assert second["hit_gpu_tokens"] == 1024
    assert second["ttft_s"] == pytest.approx(prefill_s(1024, 1200), rel=1e-9)
    assert res.summary["prefill_pool_requests"] == 1
    assert res.summary["recomputed_output_tokens"] == 0


def test_without_decode_cache_the_output_is_recomputed_on_prefill():
    """Decode cache off: turn 2 goes to the prefill worker, which holds turn 1's prompt (15
    blocks) but not its output block: those 64 tokens are recomputed only because of the
    split. With --pd-return output the output block travels back and turn 2 hits it."""
    off = run(pd_cfg(pd_local_threshold=512, decode_cache="off"), KitTrace(TWO_TURNS))
    t = off.requests
    assert t["prefilled_locally"].tolist() == [False, False]
    assert t["hit_gpu_tokens"].tolist() == [0, 960]
    assert t["recomputed_output_tokens"].tolist() == [0, 64]
    assert off.summary["recomputed_output_tokens_share"] == pytest.approx(64 / 2200)
    back = run(pd_cfg(decode_cache="off", pd_return="output"), KitTrace(TWO_TURNS))
    t = back.requests
    assert t["hit_gpu_tokens"].tolist() == [0, 1024]
    assert t["recomputed_output_tokens"].tolist() == [0, 0]
    assert t["returned_bytes"].tolist() == [64 * KVB, 0]


def test_a_decode_worker_retracts_under_memory_pressure():
    """Two sessions decode 2,000 tokens each on a 4,096-token decode worker that reserves
    16 (--max-new-tokens 16): it runs out and retracts (SGLang), the retracted request
    re-prefills what it had (redone work counted) and both finish."""
    trace = KitTrace([[(1000, 2000, 0.0)], [(1000, 2000, 0.0)]])
    res = run(pd_cfg(gpu_cache=4096, sessions=2, max_new_tokens=16), trace)
    s, t = res.summary, res.requests
    assert s["decode_retractions"] >= 1
    assert s["decode_preempted_recompute_tokens"] > 0
    assert (t["decoded_tokens"] == 1999).all() and not t["dropped"].any()
    assert t["retractions"].sum() == s["decode_retractions"]


def test_ideal_link_equals_one_aggregated_server_within_the_first_forward():
    """1P:1D over the ideal link with the output returned: the prefill worker's cache is
    the aggregated server's, so its prefill time is the aggregated TTFT exactly, and the PD
    TTFT exceeds it by the decode worker's first forward (at most one block computed)."""
    trace = KitTrace([[(3000, 300, 0.0), (3500, 100, 2.0), (9000, 50, 1.0)],
                      [(700, 40, 0.0), (5000, 10, 3.0)]])
    pd = run(pd_cfg(gpu_cache=65536, pd_link="ideal", pd_return="output"), trace).requests
    agg = run(RunConfig.from_flat(trace="kit", gpu_cache=65536, sessions=1, preset="sglang"),
              trace).requests
    assert pd["request"].tolist() == agg["request"].tolist()
    np.testing.assert_allclose(pd["prefill_s"], agg["ttft_s"], rtol=1e-12)
    assert (pd["transfer_s"] == 0).all()
    extra = (pd["ttft_s"] - agg["ttft_s"]).to_numpy()
    np.testing.assert_allclose(extra, pd["first_decode_s"], rtol=1e-9, atol=1e-12)
    bound = np.asarray([prefill_s(p - 64, p) for p in pd["prompt_tokens"]])
    assert (extra > 0).all() and (extra <= bound * (1 + 1e-9)).all()


def test_refusals():
    with pytest.raises(ConfigError, match="both pools"):
        check(pd_cfg(decode_replicas=0))
    vllm = dict(engine="vllm", preset="vllm")
    check(pd_cfg(**vllm))  # vLLM pools run (its KV connector path)
    for field, value in (("pd_prealloc", "off"), ("pd_streaming", "layer"),
                         ("pd_return", "output"), ("vllm_patch", "continuum")):
        with pytest.raises(ConfigError, match=field):
            check(pd_cfg(**vllm, **{field: value}))
    check(pd_cfg(engine="vllm", vllm_patch="penelope", preset="penelope"))
    with pytest.raises(ConfigError, match="pd_link"):
        check(pd_cfg(pd_link="carrier-pigeon"))
    with pytest.raises(ConfigError, match="pd_rule"):
        check(pd_cfg(pd_rule="nope"))
    with pytest.raises(ConfigError, match="--replicas"):
        check(pd_cfg(replicas=2))


def test_aggregated_config_json_has_no_pd_fields():
    assert "prefill_replicas" not in RunConfig().to_dict()
    assert pd_cfg().to_dict()["prefill_replicas"] == 1


turns = st.tuples(st.integers(100, 2500), st.integers(1, 200), st.floats(0.0, 2.0))


@st.composite
def pd_runs(draw, engine: str = "sglang"):
    sessions = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 3))
        prompt, reqs = 0, []
        for _k in range(n):
            add, out, gap = draw(turns)
            prompt += add
            reqs.append((prompt, out, gap))
            prompt += out
        sessions.append(reqs)
    cfg = pd_cfg(
        gpu_cache=draw(st.sampled_from([8192, 16384])),
        sessions=draw(st.integers(1, 3)),
        # a pool is at most the trace's requests (more is refused: check_fleet_size)
        prefill_replicas=draw(st.integers(1, min(3, sum(map(len, sessions))))),
        decode_replicas=draw(st.integers(1, min(3, sum(map(len, sessions))))),
        router=draw(st.sampled_from([None, "least-load"])),
        pd_link=draw(st.sampled_from(["rdma-100", "nvlink4", "ideal"])),
        pd_link_scope=draw(st.sampled_from(["nic", "pair"])),
        pd_local_threshold=draw(st.sampled_from([0, 512])),
        decode_cache=draw(st.sampled_from(["on", "off"])),
        pd_return=draw(st.sampled_from(["none", "output"])),
        pd_rule=draw(st.sampled_from(["disagg", "dynamo", "llm-d"])),
        max_new_tokens=draw(st.sampled_from([None, 32])),
        pd_prealloc=draw(st.sampled_from(["on", "off"])))
    if engine == "vllm":  # what vLLM's connector path does (the rest is refused)
        return cfg.with_fields(engine="vllm", preset="vllm", pd_prealloc="on", pd_return="none",
                               vllm_async=draw(st.booleans())), KitTrace(sessions)
    streaming = draw(st.booleans()) and cfg.pd.pd_link != "ideal"
    return cfg.with_fields(pd_streaming="layer" if streaming else "off"), KitTrace(sessions)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pd_runs())
def test_every_request_prefilled_once_decoded_once_links_never_overbooked(case):
    check_pd_run(*case)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pd_runs("vllm"))
def test_every_request_prefilled_once_decoded_once_on_vllm_pools(case):
    check_pd_run(*case)


def check_pd_run(cfg: RunConfig, trace) -> None:
    res = run(cfg, trace)
    t, s = res.requests, res.summary
    assert sorted(t["request"].tolist()) == list(range(len(trace)))  # one row each
    ok = t[~t["dropped"]]
    assert (ok["decoded_tokens"] == ok["output_tokens"] - 1).all()  # decoded once, whole
    remote = t[~t["prefilled_locally"]]
    # one prefill per remote request, unless its decode worker refused it first (never fits)
    sent = remote["pd_prefill_worker"] >= 0
    assert s["prefill_pool_requests"] == int(sent.sum())
    assert remote["dropped"][~sent].all()
    if cfg.pd.pd_prealloc == "on":
        assert s["landed_lost_tokens"] == 0
        assert (remote["prealloc_wait_s"][sent] >= 0).all()
    else:
        assert remote["prealloc_wait_s"].isna().all()
    prefilled = remote["prefill_s"].notna()  # its prefill ran (not refused by the worker)
    assert (remote["transfer_bytes"][prefilled] == remote["prompt_tokens"][prefilled] * KVB).all()
    assert (remote["transfer_bytes"][~prefilled] == 0).all()
    assert (t["transfer_bytes"][t["prefilled_locally"]] == 0).all()
    xfer = res.tables["pd_transfers"]
    forward = xfer[~xfer["link"].str.startswith("('back'")]
    assert int(forward["bytes"].sum()) == int(t["transfer_bytes"].sum())
    for _link, g in xfer.groupby("link"):
        start, end = g["start_s"].to_numpy(), g["end_s"].to_numpy()
        assert (end >= start).all()
        assert (start[1:] >= end[:-1] - 1e-12).all()  # FIFO: never two at once
        assert (end - start).sum() <= s["sim_end_s"] + 1e-9
    assert 0.0 <= s["link_busy_share_max"] <= 1.0 + 1e-12
    if cfg.pd.pd_streaming == "off":
        parts = remote["prealloc_wait_s"].fillna(0.0) + remote["prefill_s"] \
            + remote["transfer_queue_s"] + remote["transfer_s"] + remote["first_decode_s"]
        r_ok = ~remote["dropped"] & remote["prefill_s"].notna()
        np.testing.assert_allclose(parts[r_ok], remote["ttft_s"][r_ok], rtol=1e-9, atol=1e-9)


def test_a_pd_run_is_a_pure_function_of_its_inputs():
    trace = KitTrace([[(3000, 300, 0.0), (3500, 100, 2.0)], [(700, 40, 0.0), (5000, 10, 3.0)]])
    cfg = pd_cfg(sessions=2, prefill_replicas=2, decode_replicas=2, router="random",
                 pd_rule="sglang-pd", pd_link="rdma-100")
    a, b = run(cfg, trace), run(cfg, trace)
    assert a.requests.equals(b.requests) and same_summary(a.summary, b.summary)
    assert a.tables["pd_transfers"].equals(b.tables["pd_transfers"])


def test_sweep_ids_read_pd_fields_only_for_pd_points():
    from sim.sweep.identity import identity, point_id

    agg = RunConfig()
    assert not {"prefill_replicas", "pd_link", "pd_rule"} & set(identity(agg))
    pd = RunConfig.from_dict({"prefill_replicas": 1, "decode_replicas": 3,
                              "pd_link": "nvlink4"}, "sweep.yaml")
    assert identity(pd)["pd_link"] == "nvlink4" and point_id(pd) != point_id(agg)
    # pre-allocation is read into a PD point's id unless off (then it ran as before it existed)
    off = pd.with_fields(pd_prealloc="off")
    assert identity(pd)["pd_prealloc"] == "on" and "pd_prealloc" not in identity(off)
    assert point_id(off) != point_id(pd)


@pytest.mark.parametrize(("engine", "prealloc"), [("sglang", "off"), ("sglang", "on"),
                                                ("vllm", "on")])
def test_a_decode_worker_short_of_memory_never_idles_with_work(engine, prealloc):
    """A decode worker full of landed prompts still finishes its chunked prefills
    (``debug_cache`` checks the server never idles with work queued). Without
    pre-allocation the landed KV is not pinned outside the engine's admission control and
    the worker evicts some before admitting its request (``landed_lost_tokens``); with it
    (the default) the landing is admission-controlled up front: nothing landed is lost, and
    requests wait in the prealloc queue instead."""
    cfg = RunConfig.from_flat(trace="synthetic:claude-code?sessions=8", max_context=65536,
                              gaps="tool",
                              gpu_cache=98304, sessions=3, prefill_replicas=2, decode_replicas=1,
                              engine=engine, preset=engine, debug_cache=True, pd_prealloc=prealloc)
    res = run(cfg)
    s = res.summary
    assert s["requests"] == len(res.requests) > 0
    if prealloc == "off":
        assert s["landed_lost_tokens"] > 0  # the pressure this test is about
        assert res.requests["prealloc_wait_s"].isna().all()
    else:
        assert s["landed_lost_tokens"] == 0 and s["prealloc_waited"] > 0


@pytest.mark.parametrize("scope", ["nic", "pair"])
def test_two_transfers_from_one_prefill_worker_queue_on_its_nic(scope):
    """Two prompts prefilled in one batch on the one prefill worker go to the two decode
    workers (least in flight): on one NIC the second waits for the first; per pair it
    does not."""
    trace = KitTrace([[(1000, 2, 0.0)], [(1000, 2, 0.0)]])
    res = run(pd_cfg(sessions=2, decode_replicas=2, pd_link="rdma-100", pd_link_scope=scope),
              trace)
    t = res.requests.sort_values("request")
    busy = 1000 * KVB / 12.5e9
    assert t["pd_decode_worker"].tolist() == [0, 1]
    assert t["prefill_s"].iloc[0] == t["prefill_s"].iloc[1]  # one batch
    waits = sorted(t["transfer_queue_s"].tolist())
    assert waits == ([0.0, pytest.approx(busy, rel=1e-12)] if scope == "nic" else [0.0, 0.0])
    assert res.summary["link_busy_share_max"] == pytest.approx(
        (2 if scope == "nic" else 1) * busy / res.summary["sim_end_s"], rel=1e-9)


def test_a_cache_aware_router_sees_the_prefill_pools_caches():
    """The prefill worker is the router's choice over the prefill pool: dynamo-kv, fed by the
    prefill workers' KV events, keeps sessions where their prefixes are; round-robin
    scatters them and loses most of the reuse."""
    cfg = RunConfig.from_flat(trace="synthetic:claude-code?sessions=8", max_context=32768,
                              gaps="tool",
                              gpu_cache=65536, sessions=4, prefill_replicas=2, decode_replicas=1,
                              preset="sglang")
    rr = run(cfg.with_fields(router="round-robin")).summary
    kv = run(cfg.with_fields(router="dynamo-kv")).summary
    assert kv["hit_rate"] > rr["hit_rate"] + 0.2
    assert kv["ttft_mean_s"] < rr["ttft_mean_s"]


@pytest.mark.parametrize("tp", [1, 2])
def test_tp_ranks_ship_their_kv_heads_each_over_its_own_nic(tp):
    """With --gpu H100 --tp t each rank holds 8 / t of qwen3-8b's 8 KV heads and ships
    them through its own 400 Gb/s NIC (links.yaml: one NIC per GPU), all at once: the
    transfer takes bytes / (t x 50 GB/s) + 5 us; ``pd_gpus`` counts (P + D) x t GPUs, as
    ``gpus`` does (sim/deploy.py ``gpus_per_replica``)."""
    cfg = RunConfig.from_flat(trace="kit", sessions=1, prefill_replicas=1, decode_replicas=1,
                              preset="sglang", gpu="H100", tp=tp)
    res = run(cfg, KitTrace([[(1000, 5, 0.0)]]))
    row = res.requests.iloc[0]
    assert SPEC.kv_heads % tp == 0
    assert row["transfer_bytes"] == 1000 * KVB
    assert row["transfer_s"] == pytest.approx(1000 * KVB / (tp * 50e9) + 5e-6, rel=1e-12)
    assert res.summary["pd_gpus"] == res.summary["gpus"] == 2 * tp


def test_pd_pools_are_sized_against_the_trace_as_replicas_are():
    """A pool larger than the trace's requests has workers that could never serve one: it is
    refused, naming its option, like --replicas; workers of either pool left without a
    request are counted in ``idle_replicas`` (kvsim run warns)."""
    from sim.fleet.results import FleetSizeError

    one = KitTrace([[(1000, 5, 0.0)]])
    with pytest.raises(FleetSizeError, match=r"^--decode-replicas 2: the trace has 1 requests"):
        run(pd_cfg(decode_replicas=2), one)
    two = KitTrace([[(1000, 5, 0.0)], [(1000, 5, 0.0)]])
    res = run(pd_cfg(prefill_replicas=2, decode_replicas=2, sessions=2, router="round-robin",
                     pd_rule="sglang-pd"), two)
    prefill = set(res.requests["pd_prefill_worker"])
    decode = set(res.requests["pd_decode_worker"])
    assert res.summary["idle_replicas"] == 4 - len(prefill) - len(decode)
    with pytest.raises(FleetSizeError, match=r"^--prefill-replicas 2: "):
        run(pd_cfg(prefill_replicas=2), one)


def test_a_pd_runs_text_table_shows_its_pd_rows_within_100_columns():
    """``kvsim run``'s table of a PD run has the TTFT's parts, what moved and how busy the
    links and pools were (sim/report/runs.py PD_ROWS), beside an aggregated run without
    them, in 100 columns."""
    from rich.console import Console

    from sim.report.runs import PD_ROWS, compare_runs, run_tables

    trace = KitTrace([[(1000, 5, 0.0)], [(1500, 5, 0.0)]])
    runs = [run(pd_cfg(sessions=2, prefill_replicas=2, decode_replicas=2), trace),
            run(pd_cfg(sessions=2, prefill_replicas=0, decode_replicas=0, replicas=2), trace)]
    console = Console(width=100, record=True)
    for table in run_tables(compare_runs(runs), "pd", 100):
        console.print(table)
    text = console.export_text()
    rows = {line.split("│")[1].strip() for line in text.splitlines() if line.count("│") > 2}
    assert set(PD_ROWS) <= rows
    assert {"prealloc_wait_s_mean", "transfer_s_mean", "link_busy_share_max"} <= rows
    assert max(map(len, text.splitlines())) <= 100


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_each_kv_group_ships_its_own_heads_share(tp):
    """Gemma 4 31B (models.yaml: five sliding layers of 16 KV heads x 256, then one global
    layer of its own 4 heads x 512, ten times): a rank holds, layer by layer, max(1, heads //
    tp) of that layer's heads, so at TP 8 every rank holds one of the 4 global heads (the
    model's 16 // 8 = 2 of 16 undercounted the global layers' share 2x). The link moves one
    rank's bytes, counted here layer by layer; an MLA model's latent is whole on every rank."""
    from costmodel.gpus import shipped_kv_bytes
    from costmodel.specs import AttentionKind, get_spec

    spec = get_spec("gemma-4-31b")
    layers = [AttentionKind.SLIDING] * 5 + [AttentionKind.FULL]
    assert list(spec.kinds) == layers * 10
    shape = {AttentionKind.SLIDING: (16, 256), AttentionKind.FULL: (4, 512)}
    every = sum(2 * shape[k][0] * shape[k][1] * 2 for k in spec.kinds)  # bf16 K and V
    rank = sum(2 * max(1, shape[k][0] // tp) * shape[k][1] * 2 for k in spec.kinds)
    assert spec.kv_bytes_per_token == every
    assert shipped_kv_bytes(spec, tp, 1) == (every, rank)
    kimi = get_spec("kimi-k2.5")
    assert shipped_kv_bytes(kimi, tp, 1000)[1] == shipped_kv_bytes(kimi, tp, 1000)[0]
    if tp == 8:  # the run: one prompt over the H100's 400 Gb/s NIC per rank
        cfg = RunConfig.from_flat(trace="kit", sessions=1, prefill_replicas=1,
                                  decode_replicas=1, preset="sglang", gpu="H100", tp=tp,
                                  model="gemma-4-31b")
        row = run(cfg, KitTrace([[(1000, 5, 0.0)]])).requests.iloc[0]
        assert row["transfer_bytes"] == 1000 * every
        assert row["transfer_s"] == pytest.approx(1000 * rank / 50e9 + 5e-6, rel=1e-12)


@pytest.mark.parametrize("model", ["gpt-oss-120b", "deepseek-v4-flash", "gemma-4-31b"])
@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_window_model_ships_what_its_groups_hold(model, engine):
    """A disaggregated prompt moves what the request holds in each KV group
    (``ModelSpec.kv_bytes``, held to an entry-by-entry count in tests/test_hybrid_models.py):
    a sliding group's last window, a compressed group's entries, every token of a full one;
    not every layer's KV for every token (gpt-oss-120b's 18 sliding layers keep 128 tokens,
    DeepSeek-V4's every layer its 128-token window beside the compressed entries)."""
    from costmodel.specs import get_spec

    spec = get_spec(model)
    prompt, output = 6000, 2
    cfg = RunConfig.from_flat(trace="kit", sessions=1, prefill_replicas=1, decode_replicas=1,
                              engine=engine, preset=engine, gpu_cache=65536, model=model,
                              pd_link="rdma-100")
    row = run(cfg, KitTrace([[(prompt, output, 0.0)]])).requests.iloc[0]
    held = spec.kv_bytes(prompt, state=False)
    assert row["transfer_bytes"] == held < prompt * spec.kv_bytes_per_token
    link = get_link("rdma-100")
    assert row["transfer_s"] == pytest.approx(link.busy_seconds(held) + link.latency_s,
                                              rel=1e-12)
