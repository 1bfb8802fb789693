"""``calibrate --from-kernels`` on small parquet fixtures with the real tables' schema.

The fixture's latencies follow closed forms (tests/kernelfixture.py), so interpolation is
checked against the formula off the grid, the cached-prefix derivation against a brute-force
sum over query rows, and the whole fit must be exact. Bad or missing tables exit 2 naming the
file and the column.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration.errors import CalibrationError
from calibration.kernels.attention import ContextAttention, GenerationAttention, Shape
from calibration.kernels.compose import KernelModel
from calibration.kernels.run import calibrate_from_kernels
from calibration.kernels.tables import GemmTable, KernelTableError, version_key
from costmodel.specs import get_spec
from sim.cli.main import cli
from tests import kernelfixture as kf


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    return kf.build(tmp_path_factory.mktemp("kernels"))


@pytest.fixture
def toy_copy(tmp_path) -> Path:
    return kf.build(tmp_path / "systems")


def test_version_order() -> None:
    vs = ["0.5.6.post2", "0.5.14", "0.5.9", "1.3.0rc20", "1.3.0", "1.3.0rc23", "0.5.6"]
    assert sorted(vs, key=version_key) == ["0.5.6", "0.5.6.post2", "0.5.9", "0.5.14",
                                           "1.3.0rc20", "1.3.0rc23", "1.3.0"]


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 60000), n=st.integers(1024, 40000), k=st.integers(1024, 40000))
def test_gemm_interpolation_is_exact_for_mnk_latency(toy, m, n, k) -> None:
    g = GemmTable(kf.table_path(toy, "gemm", "gemm_perf"), kf.VERSION)
    want = kf.GEMM_MS_PER_MNK * m * n * k * 1e-3
    assert float(g(m, n, k)) == pytest.approx(want, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(ranges=st.lists(st.tuples(st.integers(0, 40000), st.integers(1, 3000)), min_size=1,
                       max_size=3))
def test_cached_prefix_attention_is_the_causal_rows(toy, ranges) -> None:
    """attention(c, n) = A(1) + A(c+n) - A(c) = A(1) + sum of rows c..c+n-1 (row p: p+1 keys),
    with A(0) := A(1) (so a batch starting at 0 costs its measured prefill A(n)); past the
    measured 16K the per-pair cost continues (extrapolated, and flagged)."""
    ca = ContextAttention(kf.table_path(toy, "attention", "context_attention_perf"),
                          kf.VERSION, Shape(32, 8, 128, None))
    rs = [(c, c + n) for c, n in ranges]
    rows = sum(sum(p + 1 for p in range(a, b)) for a, b in rs)  # brute force
    rows -= sum(a == 0 for a, _ in rs)  # A(0) := A(1): row 0 is in the call's fixed A(1)
    fixed = kf.ATTN_FIXED_MS + kf.ATTN_MS_PER_PAIR
    assert ca.seconds(rs) == pytest.approx((fixed + kf.ATTN_MS_PER_PAIR * rows) * 1e-3,
                                           rel=1e-9)
    assert ca.extrapolated(rs) == any(b > 16384 for _, b in rs)


@pytest.mark.parametrize("window", [100, 1024, 5000])
def test_window_derived_from_full_attention(toy, window) -> None:
    """No window table: up to w the full curve; past it each row attends w keys at the full
    curve's cost per pair (linear in pairs here, so: the windowed pair count)."""
    ca = ContextAttention(kf.table_path(toy, "attention", "context_attention_perf"),
                          kf.VERSION, Shape(32, 8, 128, window))
    assert ca.info["window_from_full_attention"] is True
    for a, b in ((1, 3000), (2000, 9000), (20000, 20512)):
        rows = sum(min(p + 1, window) for p in range(a, b))
        want = kf.ATTN_FIXED_MS + kf.ATTN_MS_PER_PAIR * (1 + rows)
        assert ca.seconds([(a, b)]) == pytest.approx(want * 1e-3, rel=1e-9)


def test_generation_attention_and_stand_in_shapes(toy) -> None:
    path = kf.table_path(toy, "attention", "generation_attention_perf")
    ga = GenerationAttention(path, kf.VERSION, Shape(32, 8, 128, None))
    for b, c in ((1, 300), (8, 5000), (3, 1000), (64, 2000)):
        assert ga.seconds(b, c) == pytest.approx((kf.GEN_FIXED_MS + kf.GEN_MS * b * c) * 1e-3)
    assert not ga.extrapolated(8, 60000) and ga.extrapolated(8, 100000)
    # 32 heads / 4 KV heads is not in the table: (32, 8) stands in, decode scaled by KV heads.
    half = GenerationAttention(path, kf.VERSION, Shape(32, 4, 128, None))
    assert half.info["stand_in_kv_heads"] == 8
    assert half.seconds(4, 4095) == pytest.approx(ga.seconds(4, 4095) / 2)


def test_toy_fit_is_exact_and_tp_uses_the_comm_table(toy) -> None:
    prof, rep = calibrate_from_kernels(kf.SYSTEM, "qwen3-8b", data_dir=toy)
    f = rep["fit"]
    assert f["r2"] == pytest.approx(1.0, abs=1e-9)
    for key in ("median_abs_rel_error", "max_abs_rel_error", "holdout_median_abs_rel_error"):
        assert f[key] < 1e-6, key
    assert f["extrapolated"]["max_abs_rel_error"] < 1e-6  # the per-pair cost continues
    assert f["decode"]["max_abs_rel_error"] < 1e-6
    spec = get_spec("qwen3-8b")
    # attention units count p keys before position p; pairs count p + 1: same per-pair cost.
    assert prof.prefill.per_attention_unit_s == pytest.approx(
        kf.ATTN_MS_PER_PAIR * 1e-3, rel=1e-6)
    assert prof.prefill.per_linear_unit_s * spec.W == pytest.approx(
        kf.GEMM_MS_PER_MNK * 1e-3 * spec.linear_macs_per_token
        + 2 * 4 * spec.hidden * 2 / (2e12 * 0.5) + 3 * spec.ffn * 2 / 1e12
        + kf.ATTN_MS_PER_PAIR * 1e-3, rel=1e-6)
    assert prof.transfer.h2d_bytes_per_s == 50e9 and prof.transfer.latency_s == 2e-5
    pv = rep["provenance"]
    assert pv["system"] == "toy" and pv["framework"] == "sglang"
    assert pv["framework_version"] == "0.5.14" and pv["gpus"] == 1
    assert "(a directory of tables)" in pv["kernel_data"]["package"]
    # Two GPUs: heads split, two all-reduces per layer from the eager table.
    km = KernelModel(get_spec("qwen3-32b"), toy, kf.SYSTEM, "sglang", 2)
    assert km.sources["allreduce_eager"]["kernel_source"] == "sglang_eager"
    one = KernelModel(get_spec("qwen3-32b"), toy, kf.SYSTEM, "sglang", 2)
    one.allreduce = {}
    diff = km.prefill_seconds([(0, 1000)]) - one.prefill_seconds([(0, 1000)])
    ar = (0.003 + 1000 * 5120 * 1e-9) * 1e-3  # 5,120,000 elements, inside the measured sizes
    assert diff == pytest.approx(64 * 2 * ar, rel=1e-6)


def test_newest_version_with_the_shape_wins(toy_copy) -> None:
    old = kf.table_path(toy_copy, "gemm", "gemm_perf")
    new = kf.table_path(toy_copy, "gemm", "gemm_perf", "0.5.16")
    new.parent.mkdir(parents=True)
    kf.gemm_frame().assign(gemm_dtype="fp8").to_parquet(new, index=False)  # no bf16 rows
    km = KernelModel(get_spec("qwen3-8b"), toy_copy, kf.SYSTEM, "sglang", 1)
    assert km.sources["gemm"]["version"] == "0.5.14"
    kf.gemm_frame().drop(columns=["latency"]).to_parquet(new, index=False)  # malformed
    with pytest.raises(KernelTableError, match="latency"):
        KernelModel(get_spec("qwen3-8b"), toy_copy, kf.SYSTEM, "sglang", 1)
    assert old.is_file()


BAD = [
    ("gemm", "gemm_perf", lambda df: df.drop(columns=["k"]), "'k': missing"),
    ("gemm", "gemm_perf", lambda df: df.assign(m=df.m.astype(str)), "'m': must be integer"),
    ("attention", "context_attention_perf",
     lambda df: df.assign(latency=np.where(df.isl == 256, -1.0, df.latency)),
     "'latency': must be finite and > 0"),
    ("attention", "context_attention_perf",
     lambda df: df.assign(latency=np.where(df.isl == 256, np.nan, df.latency)),
     "'latency': has empty (null) values"),
    ("attention", "generation_attention_perf", lambda df: df.rename(columns={"step": "s"}),
     "'step': missing"),
    ("attention", "context_attention_perf", lambda df: df[df.head_dim == 64],
     "'head_dim': no bfloat16 context attention rows"),
]


@pytest.mark.parametrize(("op", "table", "change", "message"), BAD)
def test_bad_table_exits_2_naming_file_and_column(toy_copy, op, table, change, message):
    path = kf.table_path(toy_copy, op, table)
    kf.rewrite(path, change)
    r = CliRunner().invoke(cli, ["calibrate", "--from-kernels", kf.SYSTEM, "--kernel-data",
                                 str(toy_copy), "--model", "qwen3-8b", "--json"])
    assert r.exit_code == 2, r.output
    assert str(path) in r.output and message in r.output
    assert "Traceback" not in r.output


def test_missing_table_system_and_package(toy_copy, monkeypatch) -> None:
    path = kf.table_path(toy_copy, "attention", "generation_attention_perf")
    path.write_bytes(b"not parquet")
    with pytest.raises(KernelTableError, match="not a readable parquet file"):
        calibrate_from_kernels(kf.SYSTEM, "qwen3-8b", data_dir=toy_copy)
    path.unlink()
    with pytest.raises(KernelTableError, match=r"generation_attention_perf.parquet.*missing"):
        calibrate_from_kernels(kf.SYSTEM, "qwen3-8b", data_dir=toy_copy)
    with pytest.raises(CalibrationError, match=r"no such system.*known: toy"):
        calibrate_from_kernels("h999", "qwen3-8b", data_dir=toy_copy)
    (toy_copy / "toy.yaml").write_text("gpu: {mem_bw: fast}\n")
    with pytest.raises(KernelTableError, match=r"toy\.yaml: column 'gpu\.mem_bw'"):
        calibrate_from_kernels(kf.SYSTEM, "qwen3-8b", data_dir=toy_copy)
    import importlib.resources

    def gone(name):
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(importlib.resources, "files", gone)
    with pytest.raises(CalibrationError, match=r"kvsim\[kernels\]"):
        calibrate_from_kernels("h100_sxm", "qwen3-8b")


def test_cli_options_and_written_profile(toy, tmp_path) -> None:
    out = tmp_path / "p.yaml"
    args = ["calibrate", "--from-kernels", kf.SYSTEM, "--kernel-data", str(toy),
            "--model", "qwen3-8b"]
    r = CliRunner().invoke(cli, [*args, "--json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc) == {"fit", "provenance", "profile", "out"}
    assert doc["profile"]["name"] == "kernels-toy-qwen3-8b" and out.is_file()
    r = CliRunner().invoke(cli, [*args, "--quick"])
    assert r.exit_code == 2 and "--quick" in r.output
    r = CliRunner().invoke(cli, ["calibrate", "--framework", "vllm"])
    assert r.exit_code == 2 and "--from-kernels" in r.output
    r = CliRunner().invoke(cli, [*args, "--framework", "vllm"])
    assert r.exit_code == 2 and "missing: no vllm gemm table for toy" in r.output
    r = CliRunner().invoke(cli, [*args])
    assert r.exit_code == 0 and "Figure 1" in r.output
