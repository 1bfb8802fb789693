"""``kvsim validate`` and the readers of measured runs (traces/measured.py,
sim/studies/validate.py; issue 53 item 1): each reader on the shipped ground truth (when
../shared/data is present) and on files the tests generate (tests/measuredkit.py), bad and
partial files as one-line errors, one end-to-end run on the RTX 4090 folder."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SHARED_DATA

from sim.cli.main import cli
from sim.studies.validate import catalog_model, replay, rows
from sim.studies.validate import setup as setup_run
from tests.measuredkit import write_inference_perf, write_vllm_bench
from traces import TraceFormatError
from traces.measured import (
    chain_block_ids,
    read_inference_perf,
    read_llmservingsim,
    read_measurement,
    read_vllm_bench,
    request_metrics,
)

GT = SHARED_DATA / "ground-truth" / "llmservingsim"
RUNS = ("RTX4090_Llama-3.1-8B", "RTXPRO6000_Llama-3.1-8B", "RTXPRO6000_Qwen3-32B",
        "RTXPRO6000_Qwen3-30B-A3B-Instruct-2507")
needs_gt = pytest.mark.skipif(not GT.is_dir(), reason="../shared/data/ground-truth absent")


def _cli(*args: str):
    return CliRunner().invoke(cli, list(args))


# --- pure pieces --------------------------------------------------------------------------------
def test_chained_ids_share_exactly_the_common_whole_blocks():
    a = np.arange(40)  # 2 full 16-token blocks + 8 tokens
    b = np.concatenate([np.arange(20), [999] * 20])  # agrees on block 0 only
    c = np.concatenate([[5] * 16, np.arange(16, 32)])  # block 1 equals a's, parent differs
    ia, ib, ic, ia2 = chain_block_ids([a, b, c, a.copy()], 16)
    assert ia.shape == (2,) and ib.shape == (2,)  # the trailing partial block has no id
    assert ia[0] == ib[0] and ia[1] != ib[1]
    assert ic[1] != ia[1]  # same tokens under another prefix: another block
    assert (ia2 == ia).all()


def test_request_metrics_use_the_publishers_definitions():
    m = request_metrics(np.array([0.0, 1.0]), np.array([0.5, 1.2]), np.array([2.5, 1.2]),
                        np.array([5, 1]))
    assert m["ttft_mean"] == pytest.approx(0.35)
    assert m["tpot_mean"] == pytest.approx(0.5)  # (2.5 - 0.5) / 4; one-token request left out
    assert m["latency_mean"] == pytest.approx((2.5 + 0.2) / 2)
    assert m["throughput_rps"] == pytest.approx(2 / 2.5)


def test_hugging_face_ids_map_to_the_catalog():
    assert catalog_model("meta-llama/Llama-3.1-8B") == "llama-3.1-8b"
    assert catalog_model("Qwen/Qwen3-32B") == "qwen3-32b"
    assert catalog_model("acme/unknown-7b") is None


# --- LLMServingSim ground truth -----------------------------------------------------------------
def _vllm_column(folder: Path) -> dict[str, float]:
    out = {}
    for line in (folder / "validation_summary.txt").read_text().splitlines():
        m = re.match(r"(TTFT|TPOT|Latency) Mean\s+([0-9.]+)", line)
        if m:
            out[m[1].lower()] = float(m[2]) / 1000
    return out


@needs_gt
@pytest.mark.parametrize("name", RUNS)
def test_ground_truth_folders_read_as_the_publisher_scores_them(name):
    r = read_llmservingsim(GT / name)
    assert len(r.trace) == 300 and r.trace.block_size == 16
    for metric, value in _vllm_column(GT / name).items():  # 0.1 ms as printed
        assert r.metrics[f"{metric}_mean"] == pytest.approx(value, abs=6e-5)
    assert set(r.publisher) >= {"ttft_mean", "tpot_mean", "latency_mean"}
    assert r.engine["max_num_batched_tokens"] == 2048 and r.engine["max_num_seqs"] in (128, 256)
    assert r.metrics["peak_running"] >= 1
    assert (r.trace.send_time_s >= 0).all() and r.trace.send_time_s[0] == 0


@needs_gt
def test_ground_truth_prefix_hits_are_exactly_the_token_prefixes():
    r = read_llmservingsim(GT / RUNS[0])
    with gzip.open(GT / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl.gz") as f:
        rows_ = [json.loads(x) for x in f]
    reqs = [json.loads(x) for x in (GT / RUNS[0] / "vllm_requests.jsonl").read_text()
            .splitlines()]
    order = sorted(range(300), key=lambda i: reqs[i]["queued_ts"])
    seen: set[bytes] = set()
    want = []
    for k in order:  # an unbounded cache of whole 16-token prefixes, by the tokens themselves
        toks = np.asarray(rows_[int(reqs[k]["request_id"][6:])]["input_tok_ids"], np.int64)
        keys = [toks[:16 * (j + 1)].tobytes() for j in range(len(toks) // 16)]
        hit = 0
        while hit < len(keys) and keys[hit] in seen:
            hit += 1
        want.append(hit)
        seen.update(keys)
    assert r.trace.infinite_cache_hits().tolist() == want
    assert sum(want) > 0


@needs_gt
def test_kvsim_validate_on_the_rtx4090_run(tmp_path):
    res = _cli("validate", str(GT / RUNS[0]), "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    by = {r["metric"]: r for r in doc["rows"]}
    assert {"ttft_mean", "ttft_p99", "tpot_p90", "latency_p50", "throughput_rps",
            "peak_running", "peak_waiting", "peak_kv_usage"} <= set(by)
    for r in doc["rows"]:
        assert r["run"] == RUNS[0] and r["calibration"] == "none" and r["profile"]
        assert r["error"] == pytest.approx((r["kvsim"] - r["measured"]) / r["measured"])
    assert by["ttft_mean"]["measured"] == pytest.approx(65.4566, abs=1e-4)
    assert by["ttft_mean"]["publisher_error"] == pytest.approx(0.0056, abs=1e-4)
    assert by["peak_kv_usage"]["kvsim"] > 0.9  # the KV-bound run fills its 2,588 blocks
    assert doc["runs"][0]["engine"]["gpu_cache"] == 2588 * 16
    assert doc["runs"][0]["engine"]["max_running"] == 256
    assert doc["runs"][0]["engine"]["chunk_size"] == 2048
    text = _cli("validate", str(GT / RUNS[0]))
    assert text.exit_code == 0 and "ttft_mean" in text.stdout and "profile:" in text.stdout
    assert max(len(line) for line in text.stdout.splitlines()) <= 100


@needs_gt
def test_a_gpu_without_a_profile_is_priced_as_a_named_stand_in():
    for name in RUNS:
        s = setup_run(read_llmservingsim(GT / name))
        priced = s.profile.split()[0]
        if "h100" in priced or "derived" in priced:  # not an RTX profile: said in the label
            assert "[" in s.profile and ("RTX" in s.profile or "RTX" in s.profile.upper())
        if name.endswith("A3B-Instruct-2507"):  # DP2 x EP2: one GPU of the group, said so
            assert "DP2 x EP2" in s.profile and s.config.fleet.replicas == 2
            assert priced == "kernels-rtx_pro_6000_server-vllm-qwen3-30b-a3b-dp2ep2"
            assert "not priced" not in s.profile


# --- vllm bench serve --------------------------------------------------------------------------
def test_vllm_bench_detailed_result(tmp_path):
    doc = write_vllm_bench(tmp_path / "bench.json")
    r, = read_measurement(tmp_path / "bench.json")
    assert r.tool == "vllm-bench" and len(r.trace) == 24
    assert sorted(r.trace.prompt_tokens.tolist()) == sorted(doc["input_lens"])
    assert r.trace.infinite_cache_hits().sum() == 0  # random prompts share nothing
    assert r.metrics["ttft_mean"] == pytest.approx(np.mean(doc["ttfts"]))
    tpot = [(lat - t) / (o - 1) for lat, t, o in zip(doc["latencies"], doc["ttfts"],
                                                      doc["output_lens"], strict=True)]
    assert r.metrics["tpot_mean"] == pytest.approx(np.mean(tpot))
    assert "start_times" in r.exact


def test_vllm_bench_shared_prefix_from_metadata(tmp_path):
    write_vllm_bench(tmp_path / "b.json", random_prefix_len="160")
    r = read_vllm_bench(tmp_path / "b.json")
    assert (r.trace.infinite_cache_hits()[1:] == 10).all()  # 160 tokens = 10 blocks


def test_vllm_bench_validates_end_to_end(tmp_path):
    write_vllm_bench(tmp_path / "bench.json")
    res = _cli("validate", str(tmp_path / "bench.json"), "--gpu", "H100", "--max-num-seqs",
               "64", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {r["metric"] for r in doc["rows"]} >= {"ttft_mean", "tpot_p99", "latency_mean"}
    # a vLLM server is priced with vLLM's kernel tables
    assert all(r["profile"] == "kernels-h100_sxm-vllm-llama-3.1-8b" for r in doc["rows"])
    assert doc["runs"][0]["engine"]["max_running"] == 64


# --- inference-perf ----------------------------------------------------------------------------
def test_inference_perf_stage_reads_with_the_prefix_groups_generator(tmp_path):
    folder = write_inference_perf(tmp_path / "ip")
    r, = read_inference_perf(folder)
    assert r.tool == "inference-perf" and r.name.endswith("stage_0")
    assert len(r.trace) == 40  # 2 req/s x 20 s as 2 rounds of 20 users
    assert (r.trace.prompt_tokens == 1100).all()
    # 4 system prompts of 1,000 tokens: 62 full blocks each are shared from the second use on
    hits = r.trace.infinite_cache_hits()
    assert hits.max() == 1100 // 16 and (hits >= 62).sum() == 36
    assert r.metrics["ttft_mean"] == 0.08 and r.metrics["tpot_p90"] == pytest.approx(0.021 * 1.3)
    assert r.metrics["throughput_rps"] == 1.88


def test_inference_perf_validates_end_to_end(tmp_path):
    folder = write_inference_perf(tmp_path / "ip", multi=True)
    res = _cli("validate", str(folder), "--gpu", "H100", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["runs"][0]["served"] == doc["runs"][0]["requests"]
    assert {r["metric"] for r in doc["rows"]} == {
        "ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_mean", "tpot_p50", "tpot_p90",
        "tpot_p99", "latency_mean", "latency_p50", "latency_p90", "latency_p99",
        "throughput_rps", "throughput_tok_s"}


# --- bad and partial files ---------------------------------------------------------------------
def _one_line_error(path: Path, *needles: str) -> None:
    res = _cli("validate", str(path))
    assert res.exit_code == 2, res.output
    lines = [x for x in res.stderr.splitlines() if x.startswith("kvsim: error:")]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_bad_vllm_bench_files(tmp_path):
    doc = write_vllm_bench(tmp_path / "ok.json")
    for name, change, needles in (
            ("summary.json", {"ttfts": None}, ("'ttfts'", "--save-detailed")),
            ("short.json", {"output_lens": doc["output_lens"][:-1]}, ("'output_lens'", "23")),
            ("neg.json", {"ttfts": [-1.0] * 24}, ("'ttfts'", "non-negative")),
            ("text.json", {"input_lens": ["many"] * 24}, ("'input_lens'",))):
        bad = {k: v for k, v in {**doc, **change}.items() if v is not None}
        (tmp_path / name).write_text(json.dumps(bad))
        _one_line_error(tmp_path / name, name, *needles)
    (tmp_path / "cut.json").write_text(json.dumps(doc)[:500])
    _one_line_error(tmp_path / "cut.json", "cut.json", "not valid JSON")


def test_bad_inference_perf_folders(tmp_path):
    folder = write_inference_perf(tmp_path / "ip")
    cfg = folder / "config.yaml"
    cfg.write_text(cfg.read_text().replace("type: shared_prefix", "type: random"))
    _one_line_error(folder, "config.yaml", "'type'", "not modelled")
    folder2 = write_inference_perf(tmp_path / "ip2")
    cfg2 = folder2 / "config.yaml"
    cfg2.write_text(cfg2.read_text().replace("question_len: 100", "question_len: {min: 1}"))
    _one_line_error(folder2, "config.yaml", "'question_len'", "distributions")
    folder3 = write_inference_perf(tmp_path / "ip3")
    (folder3 / "stage_0_lifecycle_metrics.json").write_text('{"successes": {}}')
    _one_line_error(folder3, "stage_0_lifecycle_metrics.json", "'latency'", "missing")


@needs_gt
def test_bad_ground_truth_folders(tmp_path):
    src = GT / RUNS[0]
    dst = tmp_path / "gt" / RUNS[0]
    shutil.copytree(src, dst)
    dst.chmod(0o755)  # the shared copy is read-only
    for f in dst.iterdir():
        f.chmod(0o644)
    (tmp_path / "gt" / "workloads").mkdir()
    wl = tmp_path / "gt" / "workloads" / "sharegpt-llama-3.1-8b-300-sps10.jsonl.gz"
    wl.write_bytes((GT / "workloads" / wl.name).read_bytes()[:20_000])  # truncated gzip
    _one_line_error(dst, wl.name, "truncated")
    shutil.copy(GT / "workloads" / wl.name, wl)
    lines = (dst / "vllm_requests.jsonl").read_text().splitlines()
    rec = json.loads(lines[2])
    rec["request_id"] = "bench-9999"
    (dst / "vllm_requests.jsonl").write_text("\n".join([*lines[:2], json.dumps(rec)]) + "\n")
    _one_line_error(dst, "vllm_requests.jsonl", "line 3", "'request_id'", "bench-9999")
    rec = json.loads(lines[2])
    rec["first_token_ts"] = rec["queued_ts"] - 1
    (dst / "vllm_requests.jsonl").write_text(json.dumps(rec) + "\n")
    _one_line_error(dst, "line 1", "'first_token_ts'")
    (dst / "vllm_requests.jsonl").unlink()
    _one_line_error(dst, "vllm_requests.jsonl", "missing")
    (dst / "vllm_meta.json").write_text('{"model": "acme/none"}')
    _one_line_error(dst, "vllm_meta.json", "'engine_kwargs'", "missing")


def test_not_a_measurement(tmp_path):
    (tmp_path / "x.txt").write_text("hello")
    _one_line_error(tmp_path / "x.txt", "not a measured run")
    _one_line_error(tmp_path / "nowhere", "no such file")


def test_unknown_model_is_refused_by_name(tmp_path):
    write_vllm_bench(tmp_path / "b.json", model_id="acme/unknown-7b")
    _one_line_error(tmp_path / "b.json", "acme/unknown-7b", "--model")
    r = read_vllm_bench(tmp_path / "b.json")
    with pytest.raises(Exception, match="acme/unknown-7b"):
        setup_run(r)
    s = setup_run(r, model="llama-3.1-8b", gpu="H100")
    out = replay(r, s)
    assert out.served == 24 and rows(r, s, out)


def test_reader_errors_are_trace_format_errors(tmp_path):
    with pytest.raises(TraceFormatError, match="no stage_"):
        read_inference_perf(tmp_path)


def test_model_option_takes_a_catalog_name_or_a_config_json(tmp_path):
    write_vllm_bench(tmp_path / "b.json", n=6, model_id="acme/private-model")
    res = _cli("validate", str(tmp_path / "b.json"), "--model", "acme-none")
    assert res.exit_code == 2 and "--model" in res.stderr and "acme-none" in res.stderr
    cfg = tmp_path / "config.json"  # a Hugging Face config.json (tests/fixtures/hf)
    shutil.copy(Path(__file__).parent / "fixtures" / "hf" / "llama-3.2-1b.json", cfg)
    res = _cli("validate", str(tmp_path / "b.json"), "--model", str(cfg), "--gpu", "H100",
               "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows"][0]["profile"].startswith("derived-h100-")


def test_vllm_bench_without_send_times_draws_them_and_caps_concurrency(tmp_path):
    doc = write_vllm_bench(tmp_path / "b.json", n=200, max_concurrency=4, burstiness=0.5)
    del doc["start_times"]
    (tmp_path / "b.json").write_text(json.dumps(doc))
    r = read_vllm_bench(tmp_path / "b.json", seed=3)
    assert "send times (rate 4.0, burstiness 0.5, seed 3)" in r.regenerated
    gaps = np.diff(r.trace.send_time_s)
    assert (gaps >= 0).all() and 0.15 < gaps.mean() < 0.35  # 4 req/s
    s = setup_run(r, gpu="H100")
    assert s.config.traffic.max_concurrency == 4


def test_a_vllm_measurements_kv_is_sized_as_vllm_allocates_it():
    """A vLLM measurement without a block count: its KV tokens are vLLM's memory rule sized
    in vLLM's KV cache groups (one pool of uniform blocks, gpt-oss-120b's window group
    beside its full one), not SGLang's full and SWA pools (the engine-less default lane)."""
    from costmodel.gpus import get_gpu, kv_cache_tokens
    from costmodel.specs import get_spec
    from sim.deploy import memory_rule
    from sim.studies.validate import _kv_tokens
    from traces.measured import MeasuredRun

    m = MeasuredRun("m", "vllm-bench", "m.json", None, {}, {})  # type: ignore[arg-type]
    spec, gpu = get_spec("gpt-oss-120b"), get_gpu("H200")
    got = _kv_tokens(m, "gpt-oss-120b", 4, 16, "H200", 8192, 1024, "0.33", [])
    rule = memory_rule(spec, gpu, 4, None, "vllm", 8192, 1024, "0.33", False)
    by = {lane: kv_cache_tokens(spec, gpu, 4, rule.fraction, 16, rule.reserve_bytes,
                                lane).tokens for lane in ("vllm", "sglang")}
    assert got == by["vllm"] != by["sglang"]
