"""A fleet the trace cannot occupy is refused before it runs; replicas the router left idle
are counted (``idle_replicas``) and warned about; the end-of-run work does not grow with idle
replicas, and an idle replica changes no dtype of the fleet's request table."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import RunConfig
from sim.engines.recorder import RunRecorder
from sim.fleet.results import FleetSizeError
from sim.run import load_run_trace, run

SYN = "synthetic:chat?sessions=3&max_requests=3"
BASE = RunConfig.from_flat(trace=SYN, gpu_cache=16384, preset="sglang")


# Every request to replica 0: the rest of the fleet sits idle. A file, not a registered
# router, so that tests enumerating the registry do not meet it.
FIRST_REPLICA = """from policies.routing import Router


class FirstReplica(Router):
    def route(self, request, view):
        return 0
"""


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> str:
    f = tmp_path_factory.mktemp("router") / "first.py"
    f.write_text(FIRST_REPLICA)
    return f"{f}:FirstReplica"


def test_more_replicas_than_requests_is_refused_before_the_run() -> None:
    n = len(load_run_trace(BASE))
    with pytest.raises(FleetSizeError, match=f"the trace has {n:,} requests"):
        run(BASE.with_fields(replicas=n + 1))
    assert run(BASE.with_fields(replicas=n)).summary["replicas"] == n
    res = CliRunner().invoke(cli, ["run", "--trace", SYN, "--gpu-cache", "16k", "--preset",
                                   "sglang", "--replicas", "100000"])
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last == (f"kvsim: error: --replicas 100,000: the trace has {n:,} requests, so "
                    f"{100000 - n:,} replicas or more could never serve one; use at most {n:,}")
    assert "requests (0%)" not in res.stderr  # refused before the progress of the runs


def test_idle_replicas_are_counted_and_warned_about(tmp_path, first) -> None:
    s = run(BASE.with_fields(replicas=4, router=first)).summary
    assert s["idle_replicas"] == 3
    assert [p["requests"] for p in s["replica_summaries"]][1:] == [0, 0, 0]
    assert run(BASE.with_fields(replicas=2, router="round-robin")).summary["idle_replicas"] == 0
    res = CliRunner().invoke(cli, ["run", "--trace", SYN, "--gpu-cache", "16k", "--preset",
                                   "sglang", "--replicas", "4", "--router", first])
    assert res.exit_code == 0, res.stderr
    assert ("warning: sglang: 3 of 4 replicas served no request (router FirstReplica)"
            in res.stderr)
    assert "idle_replicas" in res.stdout
    cfg = tmp_path / "s.yaml"
    cfg.write_text(yaml.safe_dump({"base": {"trace": SYN, "gpu_cache": "16k", "preset": "sglang",
                                            "replicas": 3},
                                   "grid": {"router": ["round-robin", first]}}))
    res = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "out")])
    assert res.exit_code == 0, res.stderr
    warned = [ln for ln in res.stderr.splitlines() if "replicas served no request" in ln]
    assert len(warned) == 1 and "2 of 3 replicas" in warned[0], res.stderr
    assert "idle_replicas" in res.stdout


def test_reproduce_fleet_tables_show_idle_replicas() -> None:
    from rich.console import Console

    from sim.studies.fleet import fleet_tables

    row = {"workload": "w", "router": "sglang-cache-aware", "policy": "sglang", "replicas": 4,
           "ttft_mean_s": 1.0, "ttft_p90_s": 2.0, "jct_mean_s": 3.0, "hit_rate": 0.5,
           "reuse_available": 0.6, "reuse_captured": 0.5, "affinity": 1.0, "load_cv": 1.7,
           "idle_replicas": 3}
    con = Console(width=100, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    for t in fleet_tables({"rows": [row], "notes": []}):
        con.print(t)
    text = con.export_text()
    assert "idle" in text and "replicas" in text
    assert max(len(ln.rstrip()) for ln in text.splitlines()) <= 100


@pytest.mark.pure_path("spies on RunRecorder.summary, which the compiled summaries() calls "
                       "without looking it up")
def test_idle_replicas_add_no_end_of_run_summaries(monkeypatch, first) -> None:
    calls = []
    real = RunRecorder.summary

    def counting(self, *a, **k):
        calls.append(len(self.records))
        return real(self, *a, **k)

    monkeypatch.setattr(RunRecorder, "summary", counting)
    run(BASE.with_fields(replicas=8, router=first))
    # the fleet's, replica 0's, and one idle replica's: not one per idle replica
    assert len(calls) == 3, calls


def test_idle_replicas_change_no_dtype(first) -> None:
    many = run(BASE.with_fields(replicas=8, router=first))
    few = run(BASE.with_fields(replicas=1, router=first))
    assert dict(many.requests.dtypes) == dict(few.requests.dtypes)
    assert many.requests.drop(columns=["replica"]).equals(few.requests.drop(columns=["replica"]))
    idle = many.summary["replica_summaries"][1:]
    assert [p["replica"] for p in idle] == list(range(1, 8))
    # the first idle replica's summary is computed; the others are equal to it
    assert all({**p, "replica": 0} == {**idle[0], "replica": 0} for p in idle)
    assert idle[0]["requests"] == 0 and idle[0]["prefill_busy_s"] == 0
