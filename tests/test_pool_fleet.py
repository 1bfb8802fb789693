"""Fleet runs with a shared pool (``--pool``): end to end, determinism (twice the same bytes;
a sweep on Ray equals the local pool, byte for byte), and the accounting of reused tokens."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import ConfigError, RunConfig
from sim.run import check, run, write_result
from tests.enginekit import write_cc_traces

SWEEP = """
base:
  trace: {trace}
  gaps: tool
  max_new_tokens: 256
  sessions: 4
  gpu_cache: 8k
  preset: sglang
grid:
  router: [round-robin, session-affinity]
  replicas: [1, 3]
  pool: [0, 64k]
"""


def config(trace, **kw) -> RunConfig:
    base = dict(trace=str(trace), gaps="tool", max_new_tokens=256, sessions=4,
                gpu_cache=8192, replicas=3, router="round-robin", pool=65536,
                pool_bandwidth=100.0)
    base.update(kw)
    return check(RunConfig.from_flat(**{"preset": "sglang", **base}), "test")


@pytest.fixture(scope="module")
def cc4x6(tmp_path_factory):
    path = tmp_path_factory.mktemp("cc")
    write_cc_traces(path, sessions=4, turns=6)
    return path


def test_a_pool_serves_reused_tokens_and_the_sources_add_up(cc4x6, tmp_path):
    res = run(config(cc4x6))
    t, s = res.requests, res.summary
    assert s["pool_fetched_tokens"] > 0 and s["pool_hit_rate"] > 0
    assert (t["local_gpu_tokens"] + t["pool_tokens"] == t["hit_gpu_tokens"]).all()
    assert s["reused_pool_tokens"] == int(t["pool_tokens"].sum())
    assert s["reused_gpu_tokens"] + s["reused_pool_tokens"] == int(t["hit_gpu_tokens"].sum())
    assert (t.loc[t["pool_tokens"] > 0, "fetch_s"] > 0).all()
    assert 0 < s["pool_bandwidth_utilization"] < 1
    assert s["pool_peak_tokens"] <= 65536
    occ = res.tables["pool"]
    assert occ["time_s"].is_monotonic_increasing and occ["tokens"].max() <= 65536
    moved = res.tables["pool_transfers"]
    assert len(moved) == s["pool_fetches"]
    assert (moved["end_s"] > moved["start_s"]).all()
    assert int(moved["bytes"].sum()) == s["pool_bytes_moved"]


def test_a_fleet_of_one_replica_with_a_pool_runs(cc4x6):
    s = run(config(cc4x6, replicas=1, router=None)).summary
    assert s["replicas"] == 1 and "pool_hit_rate" in s


def test_the_same_run_twice_writes_the_same_bytes(cc4x6, tmp_path):
    for k in ("a", "b"):
        write_result(run(config(cc4x6)), tmp_path / k)
    for name in ("requests.parquet", "pool.parquet", "pool_transfers.parquet",
                 "summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_without_a_pool_nothing_changes(cc4x6):
    a = run(config(cc4x6, pool=0)).summary
    assert "pool_hit_rate" not in a


def test_a_slow_link_refuses_every_fetch(cc4x6):
    """At 5 GB/s a qwen3-8b block (64 tokens x 144 KiB) takes longer to move than the
    H100 profile takes to recompute it: every fetch is refused and the pool serves
    nothing, though it holds the blocks."""
    s = run(config(cc4x6, pool_bandwidth=5.0)).summary
    assert s["pool_refused_fetches"] > 0 and s["pool_refused_tokens"] > 0
    assert s["pool_fetches"] == 0 and s["reused_pool_tokens"] == 0


@pytest.mark.parametrize("kw, field", [(dict(pool=-1), "pool"), (dict(pool=10), "pool"),
                                       (dict(pool_bandwidth=0.0), "pool_bandwidth"),
                                       (dict(pool_latency_us=-1.0), "pool_latency_us"),
                                       (dict(pool_write="sometimes"), "pool_write"),
                                       (dict(pool_watermark=1.5), "pool_watermark"),
                                       (dict(engine="vllm", preset="vllm"), "pool")])
def test_bad_pool_options_name_the_field(cc4x6, kw, field):
    with pytest.raises(ConfigError, match=field):
        check(RunConfig.from_flat(**{**dict(trace=str(cc4x6), pool=65536), **kw}), "test")


def test_cli_pool_options_fail_in_one_line(cc4x6):
    res = CliRunner().invoke(cli, ["run", "--trace", str(cc4x6), "--pool", "64k",
                                   "--pool-bandwidth", "0", "--preset", "sglang"])
    assert res.exit_code == 2 and "pool_bandwidth" in res.output
    assert "Traceback" not in res.output


def test_cli_run_with_a_pool_prints_pool_rows(cc4x6):
    res = CliRunner().invoke(cli, ["run", "--trace", str(cc4x6), "--replicas", "2", "--pool",
                                   "64k", "--preset", "sglang", "--gpu-cache", "8k",
                                   "--max-new-tokens", "256", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    s = doc["runs"][0]["summary"] if "runs" in doc else doc[0]["summary"]
    assert "pool_hit_rate" in s


def test_pool_sweep_on_ray_equals_the_local_pool(tmp_path, cc4x6):
    ray = pytest.importorskip("ray")
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(SWEEP.format(trace=cc4x6))
    local = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "local"),
                                     "-j", "2"])
    assert local.exit_code == 0, local.stderr
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        on_ray = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "ray"),
                                          "--executor", "ray"])
    finally:
        ray.shutdown()
    assert on_ray.exit_code == 0, on_ray.stderr
    csv = (tmp_path / "local" / "results.csv").read_bytes()
    assert (tmp_path / "ray" / "results.csv").read_bytes() == csv
    df = pd.read_csv(tmp_path / "ray" / "results.csv")
    assert len(df) == 8
    pooled = df[df["pool"].astype(str) != "0"]  # grid values as written
    assert len(pooled) == 4 and (pooled["pool_hit_rate"] >= 0).all()
    for pid in pooled["point"]:
        for name in ("requests.parquet", "pool.parquet"):
            a = tmp_path / "local" / "points" / pid / name
            assert (tmp_path / "ray" / "points" / pid / name).read_bytes() == a.read_bytes()


def test_plot_draws_the_pool_of_a_fleet_run(cc4x6, tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(cli, ["run", "--trace", str(cc4x6), "--replicas", "3", "--pool",
                                   "64k", "--pool-bandwidth", "100", "--preset", "sglang",
                                   "--gpu-cache", "8k", "--max-new-tokens", "256",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["plot", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "pool_sglang.png").stat().st_size > 10_000


def test_reproduce_pool_quick_prints_one_json_document():
    """Local caches vs a pool, two routers, both workloads (Mooncake when present), and the
    capacity curves of the same fleets; a pool never lowers the capacity hit rate."""
    res = CliRunner().invoke(cli, ["reproduce", "pool", "--quick", "--json", "--trace",
                                   "synthetic:claude-code?sessions=6"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    rows = doc["rows"]
    assert {r["pool"] > 0 for r in rows} == {False, True}
    assert len({r["router"] for r in rows}) == 2
    for r in rows:
        assert {"pool", "pool_hit_rate", "fetched_tokens", "fetch_s"} <= set(r)
        assert (r["fetched_tokens"] > 0) == (r["pool_hit_rate"] > 0)
        if not r["pool"]:
            assert r["fetched_tokens"] == 0 and r["fetch_s"] == 0
    cap = doc["capacity"]
    key = ("workload", "router", "cache_tokens")
    by = {(*tuple(r[k] for k in key), r["pool_tokens"] > 0): r["hit_rate"] for r in cap}
    for k, rate in by.items():
        if k[-1]:
            assert rate >= by[(*k[:-1], False)] - 1e-12


ROUTER_FILE = '''
from policies.routing import KVEvents, Router


class LogPool(Router):
    """Round robin that logs the pool credit it is shown (a cache view: it is shown one)."""
    cache_view = KVEvents()
    log: str = ""

    def bind(self, n_replicas, block_size, rng):
        super().bind(n_replicas, block_size, rng)
        self.count = 0

    def route(self, request, view):
        with open(self.log, "a") as f:
            f.write(f"{request.rid} {request.blocks} {view.pool_blocks}\\n")
        self.count += 1
        return (self.count - 1) % len(view)
'''


def test_routers_see_the_pools_prefix_of_each_request(cc4x6, tmp_path):
    f = tmp_path / "logpool.py"
    f.write_text(ROUTER_FILE)
    log = tmp_path / "seen.txt"
    res = run(config(cc4x6, router=f"{f}:LogPool", router_params={"log": str(log)}))
    seen = [tuple(line.split()) for line in log.read_text().splitlines()]
    assert len(seen) == res.summary["requests"] + res.summary["dropped_requests"]
    credits = [int(p) for _, _, p in seen]
    assert credits[0] == 0 and max(credits) > 0  # the first prompt finds an empty pool
    assert all(0 <= int(p) <= int(b) for _, b, p in seen)
    log.unlink()
    run(config(cc4x6, pool=0, router=f"{f}:LogPool", router_params={"log": str(log)}))
    assert {line.split()[2] for line in log.read_text().splitlines()} == {"None"}
