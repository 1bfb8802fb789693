"""Server terms (costmodel/profile.py ``ServerCoeffs``), their fit from measured runs
(calibration/measured.py, ``kvsim calibrate --from-measurements``) and the accuracy study
(sim/studies/accuracy.py; issue 53 items 5 and 6): neutral terms change nothing, the CPU
terms are summed or overlapped as the server schedules, the fit recovers terms kvsim itself
was run with, leave-one-out never reads the scored run, the study's rows are validate's."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from calibration.measured import (
    TARGETS,
    Calibration,
    Case,
    Replays,
    drive,
    fit,
    fit_steps,
    leave_one_out,
    load_calibration,
    metrics_of,
    together,
)
from costmodel.errors import ProfileError
from costmodel.profile import NEUTRAL_SERVER, ServerCoeffs, load_profile, profile_from_dict
from sim.cli.main import cli
from sim.config import ConfigError
from sim.studies.validate import replay, setup
from tests.measuredkit import write_vllm_bench
from traces.measured import read_measurement

BASE = "kernels-h100_sxm-llama-3.1-8b"


# --- the profile's terms -----------------------------------------------------------------------
def test_a_neutral_server_section_changes_nothing():
    p = load_profile(BASE)
    assert p.server == NEUTRAL_SERVER and "server" not in p.to_dict()
    raw = p.to_dict() | {"server": {}}
    q = profile_from_dict(raw)
    for b, c in ((1, 100), (64, 90_000), (256, 1_000_000)):
        assert q.decode_step_seconds(b, c) == p.decode_step_seconds(b, c)
        assert q.decode_run_seconds(b, c, 37) == p.decode_run_seconds(b, c, 37)
    assert q.for_server(True) is q  # nothing to overlap: the same profile


def test_server_section_round_trips_and_bad_terms_are_refused(tmp_path):
    p = load_profile(BASE).with_server(ServerCoeffs(cpu_step_s=0.002, decode_scale=1.2,
                                                    mixed_interference=0.5), "test")
    p.dump(tmp_path / "p.yaml")
    back = load_profile(tmp_path / "p.yaml")
    assert back.server == p.server and back.details["server"] == "test"
    for bad, field in (({"decode_scale": 0}, "decode_scale"),
                       ({"mixed_interference": 1.5}, "mixed_interference"),
                       ({"cpu_step_s": -1}, "cpu_step_s"), ({"overlapped": True}, "overlapped"),
                       ({"typo_s": 1}, "typo_s")):
        with pytest.raises(ProfileError, match=rf"server\.{field}"):
            profile_from_dict(load_profile(BASE).to_dict() | {"server": bad})


def test_cpu_time_is_summed_synchronously_and_overlapped_asynchronously():
    srv = ServerCoeffs(cpu_step_s=0.004, cpu_per_seq_s=0.0001)
    sync = load_profile(BASE).with_server(srv, "t").for_server(False)
    over = sync.for_server(True)
    kern = load_profile(BASE)
    for batch, ctx, steps in ((1, 10, 50), (8, 4_000, 200), (200, 400_000, 40),
                              (32, 1_000, 3_000)):
        gpu = [kern.decode_step_seconds(batch, ctx + k * batch) for k in range(steps)]
        cpu = 0.004 + 0.0001 * batch
        assert sync.decode_run_seconds(batch, ctx, steps) == pytest.approx(
            sum(g + cpu for g in gpu), rel=1e-9)
        assert over.decode_run_seconds(batch, ctx, steps) == pytest.approx(
            sum(max(g, cpu) for g in gpu), rel=1e-9)
        total = over.decode_run_seconds(batch, ctx, steps)
        for frac in (0.01, 0.5, 0.99):
            k = over.decode_steps_within(batch, ctx, frac * total, steps)
            assert over.decode_run_seconds(batch, ctx, k) >= frac * total
            assert k == 1 or over.decode_run_seconds(batch, ctx, k - 1) < frac * total
    assert over.step_seconds(0.001, 1, 1) == pytest.approx(0.0041)
    assert over.step_seconds(0.010, 1, 1) == 0.010
    assert sync.step_seconds(0.010, 1, 1) == pytest.approx(0.0141)


def test_mixed_interference_and_scales():
    p = load_profile(BASE).with_server(ServerCoeffs(mixed_interference=0.25, decode_scale=2.0,
                                                    prefill_scale=1.5), "t")
    k = load_profile(BASE)
    assert p.mixed_seconds(0.04, 0.01, 1) == pytest.approx(0.0425)
    assert k.mixed_seconds(0.04, 0.01, 1) == 0.04
    assert p.decode_step_seconds(16, 5000) == pytest.approx(2 * k.decode_step_seconds(16, 5000))
    from costmodel.units import range_units

    u = range_units(k.spec, 0, 2048)
    assert p.prefill_seconds(u) == pytest.approx(1.5 * k.prefill_seconds(u))


# --- the engines pay them --------------------------------------------------------------------
def _bench_case(tmp_path: Path, seed: int, seqs: int, async_: bool = True) -> Case:
    path = tmp_path / f"bench-{seed}-{seqs}.json"
    write_vllm_bench(path, n=24, seed=seed)
    m, = read_measurement(path)
    s = setup(m, gpu="H100", max_num_seqs=seqs)
    return Case(m, dataclasses.replace(s, config=s.config.with_fields(vllm_async=async_)))


def test_vllm_sync_pays_cpu_time_async_hides_it(tmp_path):
    c = _bench_case(tmp_path, 1, 8)
    srv = ServerCoeffs(cpu_step_s=0.005)
    prof = load_profile(BASE).with_server(srv, "t")
    prof.dump(tmp_path / "p.yaml")
    lat = {}
    for name, async_ in (("sync", False), ("async", True)):
        for p in (BASE, str(tmp_path / "p.yaml")):
            cfg = c.setup.config.with_fields(profile=p, vllm_async=async_)
            s = dataclasses.replace(c.setup, config=cfg)
            lat[name, p == BASE] = replay(c.run, s).metrics["tpot_mean"]
    assert lat["sync", False] > lat["sync", True] * 1.1  # 5 ms after every ~10 ms step
    assert lat["async", False] < lat["sync", False]
    assert lat["async", False] == pytest.approx(lat["async", True], rel=0.05)


# --- the fit -----------------------------------------------------------------------------------
KNOWN = {"decode_scale": 1.3, "prefill_scale": 1.6}


def _synthetic(tmp_path: Path, specs, known=KNOWN, async_: bool = True) -> list[Case]:
    """Measured runs made by kvsim itself with ``known`` terms: their means are the
    replay's at those terms."""
    cases = [_bench_case(tmp_path, seed, seqs, async_) for seed, seqs in specs]
    truth = Replays(cases)
    try:
        made = truth.metrics([(c.name, known) for c in cases])
    finally:
        truth.close()
    for c, met in zip(cases, made, strict=True):
        c.run.metrics = {k: met[k] for k in TARGETS}
    return cases


def test_fit_recovers_the_terms_kvsim_ran_with(tmp_path):
    cases = _synthetic(tmp_path, ((1, 4), (2, 16)))
    rp = Replays(cases)
    try:
        res = fit(rp, [c.name for c in cases], tuple(KNOWN), iterations=4)
    finally:
        rp.close()
    got = res.calibration.scales["kernel tables"]
    assert res.calibration.terms == {}
    assert got["decode_scale"] == pytest.approx(KNOWN["decode_scale"], rel=0.03)
    assert got["prefill_scale"] == pytest.approx(KNOWN["prefill_scale"], rel=0.06)
    assert res.history[-1] < res.history[0] / 20
    assert res.calibration.fitted_on == tuple(c.name for c in cases)


def test_fit_recovers_cpu_time_from_synchronous_runs(tmp_path):
    """A synchronous server pays its CPU time after every step, so the runs measure it."""
    known = {"cpu_step_s": 0.004}
    cases = _synthetic(tmp_path, ((1, 4), (2, 16)), known, async_=False)
    rp = Replays(cases)
    try:
        res = fit(rp, [c.name for c in cases], ("cpu_step_s",), iterations=3)
    finally:
        rp.close()
    assert res.calibration.terms["cpu_step_s"] == pytest.approx(0.004, rel=0.05)


def test_leave_one_out_never_reads_the_scored_run(tmp_path):
    cases = _synthetic(tmp_path, ((1, 4), (2, 16), (3, 8)))
    names = [c.name for c in cases]

    def folds(cs):
        rp = Replays(cs)
        try:
            return {f.scored: f for f in leave_one_out(rp, names, None, ("decode_scale",),
                                                       iterations=1)}
        finally:
            rp.close()

    honest = folds(cases)
    for f in honest.values():
        assert f.scored not in f.calibration.fitted_on
        assert len(f.calibration.fitted_on) == 2
    # the scored run's measurement made absurd: its own fold must not move, the others must
    bad = names[0]
    cases[0].run.metrics = {k: v * 50 for k, v in cases[0].run.metrics.items()}
    corrupt = folds(cases)
    assert corrupt[bad].calibration.scales == honest[bad].calibration.scales
    assert corrupt[bad].metrics == honest[bad].metrics
    for n in names[1:]:
        assert corrupt[n].calibration.scales != honest[n].calibration.scales


def test_a_twin_never_trains_the_fold_of_the_run_it_replays(tmp_path):
    """A training twin (the same measurement under another profile, ``Case.of``;
    sim/studies/accuracy.py ``roofline_twins``) is the scored run's own data: its fold must
    not fit on it, the other folds may."""
    cases = _synthetic(tmp_path, ((1, 4), (2, 16)))
    a, b = (c.name for c in cases)
    twin = Case(dataclasses.replace(cases[0].run, name=f"{a} [twin]"), cases[0].setup, of=a)
    rp = Replays([*cases, twin])
    try:
        folds = {f.scored: f for f in leave_one_out(rp, [a, b, twin.name], [a, b],
                                                    ("decode_scale",), iterations=1)}
    finally:
        rp.close()
    assert folds[a].calibration.fitted_on == (b,)
    assert folds[b].calibration.fitted_on == (a, twin.name)


class _Counted(Replays):
    """Replays that count the rounds (``metrics`` calls) asked of them."""

    rounds = 0

    def metrics(self, wanted):
        self.rounds += 1
        return super().metrics(wanted)


def test_folds_fit_in_lockstep_exactly_as_each_fits_alone(tmp_path):
    """``leave_one_out`` runs its folds' fits in lockstep (one batch of replays a round, for
    the process pool): each fold's calibration and replay are what its fit gives alone, in
    the rounds of one fit (plus the scored replays), not of every fold one after another."""
    cases = _synthetic(tmp_path, ((1, 4), (2, 16), (3, 8)))
    names = [c.name for c in cases]
    rp = _Counted(cases)
    try:
        folds = leave_one_out(rp, names, None, ("decode_scale",), iterations=2)
    finally:
        rp.close()
    alone = _Counted(cases)
    try:
        for f in folds:
            train = [n for n in names if n != f.scored]
            before = alone.rounds
            cal = fit(alone, train, ("decode_scale",), iterations=2).calibration
            one_fit = alone.rounds - before
            assert cal == f.calibration
            assert alone.metrics([(f.scored, cal.scales["kernel tables"])])[0] == f.metrics
    finally:
        alone.close()
    assert rp.rounds == one_fit + 1 < len(folds) * one_fit


def test_rounds_together_are_answered_in_order_and_pooled_alike(tmp_path):
    """``together`` hands each computation its own answers; a pool of workers replays
    exactly what one process does."""
    cases = _synthetic(tmp_path, ((1, 4), (2, 16)))
    a, b = (c.name for c in cases)
    wanted = [(a, {"decode_scale": 1.2}), (b, {}), (a, {})]
    serial, pooled = Replays(cases), Replays(cases, workers=2)
    try:
        one = drive(serial, metrics_of(wanted))
        got = drive(pooled, together([metrics_of(wanted[:1]), metrics_of([]),
                                      metrics_of(wanted[1:]),
                                      fit_steps(pooled, [a], ("decode_scale",), iterations=1)]))
        assert got[:3] == [one[:1], [], one[1:]]
        assert got[3].calibration == fit(serial, [a], ("decode_scale",),
                                         iterations=1).calibration
        assert pooled.count == serial.count
    finally:
        serial.close()
        pooled.close()


def test_calibration_file_round_trips_and_bad_files_are_one_line(tmp_path):
    cal = Calibration({"mixed_interference": 0.3}, ("a", "b"),
                      {"kernel tables": {"decode_scale": 1.2}}, training_rms=0.01,
                      evaluations=9)
    cal.dump(tmp_path / "c.yaml")
    assert load_calibration(tmp_path / "c.yaml") == cal
    for doc, field in (({"kvsim_calibration": 2}, "kvsim_calibration"),
                       ({"kvsim_calibration": 1, "terms": {},
                         "scales": {"kernel tables": {"decode_scale": 9.0}},
                         "fitted_on": []}, "scales.kernel tables.decode_scale"),
                       ({"kvsim_calibration": 1, "terms": {"decode_scale": 1.0},
                         "fitted_on": []}, "terms.decode_scale"),
                       ({"kvsim_calibration": 1, "terms": {"nope": 1}, "fitted_on": []},
                        "terms.nope")):
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
        with pytest.raises(ConfigError, match=re.escape(field)):
            load_calibration(tmp_path / "bad.yaml")
    srv, left = cal.server("datasheet")
    assert left == ["decode_scale"] and srv.decode_scale == 1.0 and srv.mixed_interference == 0.3
    srv, left = cal.server("kernel tables")
    assert left == [] and srv.decode_scale == 1.2


def test_calibrate_from_measurements_cli(tmp_path):
    for seed in (1, 2):
        write_vllm_bench(tmp_path / f"b{seed}.json", n=24, seed=seed)
    run = CliRunner()
    res = run.invoke(cli, ["calibrate", "--from-measurements", "--quick", "--gpu", "H100",
                           "--terms", "decode_scale", "--out", str(tmp_path / "cal.yaml"),
                           "--json", str(tmp_path / "b1.json"), str(tmp_path / "b2.json")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["calibration"]["fitted_on"] == ["b1", "b2"]
    assert {r["run"] for r in doc["rows"]} == {"b1", "b2"}
    assert all("leave_one_out_error" in r for r in doc["rows"])
    assert [f["fitted_on"] for f in doc["folds"]] == [["b2"], ["b1"]]
    cal = load_calibration(tmp_path / "cal.yaml")
    res = run.invoke(cli, ["validate", str(tmp_path / "b1.json"), "--calibration",
                           str(tmp_path / "cal.yaml"), "--json"])
    assert res.exit_code == 0, res.output
    vdoc = json.loads(res.stdout)
    assert {r["calibration"] for r in vdoc["rows"]} == {cal.label}
    bad = run.invoke(cli, ["calibrate", str(tmp_path / "b1.json")])
    assert bad.exit_code == 2 and "--from-measurements" in bad.output
    bad = run.invoke(cli, ["calibrate", "--gpu", "H100"])
    assert bad.exit_code == 2 and "--from-measurements" in bad.output
    bad = run.invoke(cli, ["calibrate", "--from-measurements", "--device", "cuda",
                           str(tmp_path / "b1.json")])
    assert bad.exit_code == 2 and "--device" in bad.output
    bad = run.invoke(cli, ["calibrate", "--from-measurements", "--terms", "warp_s",
                           str(tmp_path / "b1.json")])
    assert bad.exit_code == 2 and "--terms" in bad.output


# --- the study -----------------------------------------------------------------------------------
def test_accuracy_rows_are_validate_rows(tmp_path):
    from sim.studies.accuracy import evaluate

    paths = []
    for seed in (1, 2, 3):
        write_vllm_bench(tmp_path / f"r{seed}.json", n=16, seed=seed)
        paths.append(tmp_path / f"r{seed}.json")
    doc = evaluate(paths, quick=True, workers=1, progress=None)
    keys = {"run", "metric", "measured", "kvsim", "error", "profile", "calibration"}
    assert all(keys <= set(r) for r in doc["rows"])
    cals = {r["run"]: set() for r in doc["rows"]}
    for r in doc["rows"]:
        cals[r["run"]].add(r["calibration"])
    for run, c in cals.items():
        others = ", ".join(n for n in ("r1", "r2", "r3") if n != run)
        assert c == {"none", f"leave-one-out: fitted on {others}"}
    for r in doc["rows"]:
        if math.isfinite(r["error"]):
            assert r["error"] == pytest.approx((r["kvsim"] - r["measured"]) / r["measured"])
    assert [f["run"] for f in doc["folds"]] == ["r1", "r2", "r3"]
    assert all(a["bound"] == 0.05 for a in doc["acceptance"])
    assert np.isfinite([a["error"] for a in doc["acceptance"]]).all()


# --- the engine as the version sizes and schedules it (item 4) ---------------------------------
GT = Path(__file__).resolve().parents[2] / "shared" / "data" / "ground-truth" / "llmservingsim"
needs_gt = pytest.mark.skipif(not GT.is_dir(), reason="../shared/data/ground-truth absent")


@needs_gt
def test_kv_blocks_estimated_as_vllm_computes_them(tmp_path):
    """The RTX 4090 run without its measured block count: vLLM's rule on torch's total memory
    (the measurement's device_total_memory_bytes) gives its 2,588 blocks within 3%."""
    run = tmp_path / "RTX4090_Llama-3.1-8B"
    shutil.copytree(GT / run.name, run)
    (tmp_path / "workloads").symlink_to(GT / "workloads")
    meta = json.loads((run / "vllm_meta.json").read_text())
    assert meta["kv_cache"].pop("num_gpu_blocks") == 2588
    (run / "vllm_meta.json").write_text(json.dumps(meta))
    m, = read_measurement(run)
    assert m.engine["gpu_memory_bytes"] == 25250627584 and m.engine["async_scheduling"] is True
    s = setup(m)
    blocks = s.config.value("gpu_cache") / 16
    assert blocks == pytest.approx(2588, rel=0.03)
    assert any("estimated" in n for n in s.notes)
    assert s.config.value("vllm_async") is True


def test_vllm_batch_defaults_follow_the_gpu_tier(tmp_path):
    write_vllm_bench(tmp_path / "b.json", n=8)
    m, = read_measurement(tmp_path / "b.json")
    small = setup(m, gpu="RTX4090")
    assert (small.config.value("chunk_size"), small.config.value("max_running")) == (2048, 256)
    big = setup(m, gpu="H100")
    assert (big.config.value("chunk_size"), big.config.value("max_running")) == (8192, 1024)
    assert (setup(m, gpu="A100").config.value("chunk_size")) == 2048  # 80 GB, but an A100
    assert any("defaults" in n for n in small.notes)


def test_sglang_overlaps_its_cpu_time_with_the_gpu(tmp_path):
    """SGLang's overlap schedule: a step takes the larger of its kernels and its CPU time, so
    a CPU time far above every step's kernels sets the pace of decode."""
    from sim.config import RunConfig
    from sim.run import run

    base = dict(engine="sglang", trace="synthetic:claude-code?sessions=2", sessions=2,
                max_context=32768, gpu_cache=65536, model="llama-3.1-8b", gaps="cap:0")
    prof = load_profile(BASE).with_server(ServerCoeffs(cpu_step_s=0.2), "t")
    prof.dump(tmp_path / "p.yaml")
    slow = run(RunConfig.from_flat(**base, profile=str(tmp_path / "p.yaml")).validate("t"))
    fast = run(RunConfig.from_flat(**base, profile=BASE).validate("t"))
    d = slow.requests
    tpot = ((d.end_s - d.first_token_s) / (d.output_tokens - 1))[d.output_tokens > 1]
    assert tpot.min() >= 0.2 - 1e-9
    assert slow.requests.end_s.max() > 5 * fast.requests.end_s.max()


@needs_gt
@pytest.mark.parametrize(("version", "modelled"), [("0.19.0", "0.33"), ("0.34.1", "0.34")])
def test_kv_estimate_follows_the_measured_version(tmp_path, version, modelled):
    """The block count is estimated by the memory rule (sim/deploy.py) of the version kvsim
    models the server as: 0.19 as 0.33, a 0.34 patch release as 0.34 (its extensible cache's
    headroom), never another version's."""
    from costmodel.gpus import kv_cache_tokens
    from costmodel.specs import get_spec
    from sim.deploy import memory_rule
    from sim.studies.validate import measured_gpu

    run = tmp_path / "RTX4090_Llama-3.1-8B"
    shutil.copytree(GT / run.name, run)
    (tmp_path / "workloads").symlink_to(GT / "workloads")
    meta = json.loads((run / "vllm_meta.json").read_text())
    meta["kv_cache"].pop("num_gpu_blocks")
    meta["vllm_version"] = version
    (run / "vllm_meta.json").write_text(json.dumps(meta))
    m, = read_measurement(run)
    s = setup(m)
    assert s.config.value("vllm_version") == modelled
    spec, gpu = get_spec("llama-3.1-8b"), measured_gpu(m, m.engine["gpu"])
    rule = memory_rule(spec, gpu, 1, 0.9, "vllm", 2048, 256, modelled, False)
    assert s.config.value("gpu_cache") == kv_cache_tokens(spec, gpu, 1, rule.fraction, 16,
                                                          rule.reserve_bytes).tokens


# --- what the GPUs pay beyond the kernels (issue 53: LM head, TP all-reduce over the link) ---
def test_gpu_terms_add_to_every_step_and_token():
    """``gpu_step_s`` is paid by every prefill batch and decode step, ``gpu_per_token_s`` by
    every token computed; neither is overlapped, and zero terms price to the float."""
    from costmodel.units import Units

    p = load_profile(BASE)
    q = p.with_server(ServerCoeffs(gpu_step_s=0.002, gpu_per_token_s=1e-5), "test")
    u = Units(linear=1e9, attention=2e8, tokens=1000)
    assert q.prefill_seconds(u) == pytest.approx(p.prefill_seconds(u) + 0.002 + 1000 * 1e-5)
    assert q.decode_step_seconds(64, 90_000) == pytest.approx(
        p.decode_step_seconds(64, 90_000) + 0.002 + 64 * 1e-5)
    assert q.for_server(True).decode_step_seconds(8, 100) == q.decode_step_seconds(8, 100)
    z = p.with_server(ServerCoeffs(), "zero")
    assert z.prefill_seconds(u) == p.prefill_seconds(u)


def test_server_terms_price_the_lm_head_and_the_tp_link():
    """The LM head at the profile's own weight-read rate; TP all-reduces (two a layer, ring)
    over the stated link in place of those the profile holds, and the split logits gathered
    to the sampler, only where the replica has more than one GPU; sampling per decode row
    where the profile does not state it."""
    from costmodel.profile import SAMPLING_PER_SEQ_S, server_terms
    from costmodel.specs import get_spec

    one = load_profile("kernels-rtx_pro_6000_server-vllm-llama-3.1-8b")
    spec = get_spec("llama-3.1-8b")
    t, notes = server_terms(one, 16e9, 20e-6)
    rate = spec.active_params * 2 / one.decode.weights_s
    assert t["gpu_step_s"] == pytest.approx(spec.vocab * spec.hidden * 2 / rate)
    assert t["gpu_per_token_s"] == 0.0 and t["gpu_per_seq_s"] == SAMPLING_PER_SEQ_S
    assert t["mixed_decode_rows"] == 1.0 and "LM head" in notes[0]
    two = load_profile("kernels-rtx_pro_6000_server-vllm-qwen3-32b")
    s32 = get_spec("qwen3-32b")
    added, _ = server_terms(two, 16e9, 20e-6)
    lm2 = server_terms(two)[0]["gpu_step_s"]  # no link: the LM head alone
    n = 2 * s32.layers
    assert added["gpu_per_token_s"] == pytest.approx(n * s32.hidden * 2 / 16e9)  # 2(tp-1)/tp=1
    # and the vocabulary-split logits gathered to the sampler: half a row's, one latency
    assert added["gpu_step_s"] == pytest.approx(lm2 + n * 20e-6 + 20e-6)
    assert added["gpu_per_seq_s"] == pytest.approx(SAMPLING_PER_SEQ_S
                                                   + s32.vocab * 2 / 2 / 16e9)
    # in place of the tables' own: 2 us an all-reduce, 50 ps an element
    net, why = server_terms(two, 16e9, 20e-6, (2e-6, 5e-11))
    assert net["gpu_per_token_s"] == pytest.approx(n * (s32.hidden * 2 / 16e9
                                                        - 5e-11 * s32.hidden))
    assert net["gpu_step_s"] == pytest.approx(lm2 + n * 18e-6 + 20e-6)
    assert any("in place of the kernel tables'" in w for w in why)
    roof = load_profile("roofline-rtx4090-llama-3.1-8b")
    assert server_terms(roof)[0]["gpu_per_seq_s"] == 0.0  # the roofline states its own


def test_mixed_decode_rows_add_the_rows_reads_to_the_prefill():
    """A mixed step with ``mixed_decode_rows`` 1 costs the prefill plus the decode rows' own
    reads (the decode step less its fixed and weight terms); 0 keeps the max."""
    p = load_profile(BASE)
    q = p.with_server(ServerCoeffs(mixed_decode_rows=1.0), "test")
    d = p.decode_kernel_seconds(64, 64_000)
    rows = d - p.decode.fixed_s - p.decode.weights_s
    assert q.mixed_seconds(0.05, d, 64) == pytest.approx(max(0.05 + rows, d))
    assert p.mixed_seconds(0.05, d, 64) == max(0.05, d)


def test_validate_prices_a_tp_replica_over_its_stated_link():
    """The Qwen3-32B TP2 run: vLLM's kernel tables for the vLLM server, its config.json link
    (16 GB/s, 20 us) under the all-reduces; the TP1 run pays the LM head only."""
    m, = read_measurement(GT / "RTXPRO6000_Qwen3-32B")
    assert (m.engine["link_gb_s"], m.engine["link_latency_s"]) == (16.0, pytest.approx(2e-5))
    s = setup(m)
    assert s.config.value("profile") == "kernels-rtx_pro_6000_server-vllm-qwen3-32b"
    assert s.server.gpu_per_token_s > 0 and any("all-reduces" in n for n in s.notes)
    assert s.server.mixed_decode_rows == 1.0
    m1, = read_measurement(GT / "RTXPRO6000_Llama-3.1-8B")
    s1 = setup(m1)
    assert s1.server.gpu_per_token_s == 0 and s1.server.gpu_step_s > 0


def test_server_terms_price_an_ep_rank_s_dispatch_over_the_link():
    """One GPU of a DP2 x EP2 group: the all-gather and reduce-scatter of the group's tokens
    (a layer each; a rank sends and receives the other rank's share, ``hidden`` x 2 bytes per
    token of its own each way) over the stated link, in place of the tables' NCCL ones; the
    LM head at the rate ``weights_s`` reads what it holds (the routed experts apart)."""
    from costmodel.profile import server_terms
    from costmodel.specs import get_spec

    rank = load_profile("kernels-rtx_pro_6000_server-vllm-qwen3-30b-a3b-dp2ep2")
    spec = get_spec("qwen3-30b-a3b")
    lm = server_terms(rank)[0]["gpu_step_s"]  # no link: the LM head alone
    routed = 3 * spec.hidden * spec.expert_ffn * spec.active_experts * spec.layers
    rate = (spec.active_params - routed) * 2 / rank.decode.weights_s
    assert lm == pytest.approx(spec.vocab * spec.hidden * 2 / rate)
    n = 2 * spec.layers
    added, _ = server_terms(rank, 16e9, 20e-6)
    assert added["gpu_per_token_s"] == pytest.approx(n * spec.hidden * 2 / 16e9)
    assert added["gpu_step_s"] == pytest.approx(lm + n * 20e-6)
    # in place of the tables': 15 us a layer for both, 30 ps an element of the group's
    net, why = server_terms(rank, 16e9, 20e-6, table_dispatch=(15e-6, 3e-11))
    assert net["gpu_per_token_s"] == pytest.approx(
        n * spec.hidden * 2 / 16e9 - spec.layers * 3e-11 * 2 * spec.hidden)
    assert net["gpu_step_s"] == pytest.approx(lm + n * 20e-6 - spec.layers * 15e-6)
    assert any("EP2 dispatch" in w and "in place of" in w for w in why)
    lone = load_profile("kernels-rtx_pro_6000_server-vllm-qwen3-30b-a3b")
    assert server_terms(lone, 16e9, 20e-6)[0]["gpu_per_token_s"] == 0.0


def test_validate_prices_the_moe_run_as_ranks_of_its_expert_parallel_group():
    """The Qwen3-30B-A3B DP2 x EP2 run: two replicas, each one GPU of the group (its
    ``-dp2ep2`` profile: half the experts, the share both ranks' tokens read), its dispatch
    over the config.json link."""
    m, = read_measurement(GT / "RTXPRO6000_Qwen3-30B-A3B-Instruct-2507")
    s = setup(m)
    assert s.config.value("profile") == "kernels-rtx_pro_6000_server-vllm-qwen3-30b-a3b-dp2ep2"
    assert s.config.fleet.replicas == 2 and "each one GPU of the expert-parallel group" in \
        s.profile
    assert s.server.gpu_per_token_s > 0 and any("EP2 dispatch" in n for n in s.notes)


def test_a_datasheet_profile_s_fixed_step_time_is_host_time():
    """A datasheet profile's fixed step terms (scheduling, launches, sampling) are host time
    (``fixed_on_host``): off the GPU step, paid after it by a synchronous server and hidden
    behind its kernels by an overlapped one; kernel tables hold no such term."""
    from costmodel.profile import server_terms
    from costmodel.units import Units

    roof = load_profile("roofline-rtx4090-llama-3.1-8b")
    fixed = roof.decode.fixed_s
    assert fixed > 0 and server_terms(roof)[0]["fixed_on_host"] == 1.0
    assert server_terms(load_profile(BASE))[0]["fixed_on_host"] == 0.0
    host = roof.with_server(ServerCoeffs(fixed_on_host=1.0), "test")
    assert host.decode_kernel_seconds(16, 20_000) == pytest.approx(
        roof.decode_kernel_seconds(16, 20_000) - fixed)
    u = Units(linear=1e9, attention=2e8, tokens=1000)
    assert host.prefill_seconds(u) == pytest.approx(roof.prefill_seconds(u)
                                                    - roof.prefill.fixed_s)
    sync, over = host.for_server(False), host.for_server(True)
    assert sync.decode_step_seconds(16, 20_000) == pytest.approx(
        roof.decode_step_seconds(16, 20_000))
    gpu = host.decode_kernel_seconds(16, 20_000)
    assert over.decode_step_seconds(16, 20_000) == pytest.approx(max(gpu, fixed))
    steps = [over.decode_step_seconds(16, 20_000 + 16 * k) for k in range(5)]
    assert over.decode_run_seconds(16, 20_000, 5) == pytest.approx(sum(steps))
    m, = read_measurement(GT / "RTX4090_Llama-3.1-8B")  # priced by its roofline, async vLLM
    s = setup(m)
    assert s.server.fixed_on_host == 1.0 and any("host time" in n for n in s.notes)
