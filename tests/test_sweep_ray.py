"""Sweeps on Ray (a local Ray started with ``ray.init(num_cpus=2)``): the same table as the
local pool byte for byte, a killed worker's point retried while the others go on, resume
after a killed sweep, and the trace fetched once per worker (not once per point).

Kept short (one Ray start for the module, a 4-point grid on a tiny trace): CI time counts."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.io import is_tmp_name
from sim.sweep import load_sweep, point_id, run_point, run_sweep
from sim.sweep.executors import LocalPoolExecutor, RayExecutor
from tests.enginekit import write_cc_traces

ray = pytest.importorskip("ray")  # installed by `make test` (the ray extra): never skipped there

SWEEP = """
base:
  trace: {trace}
  gaps: tool
  max_new_tokens: 256
  sessions: 2
grid:
  preset: [sglang, penelope]
  gpu_cache: [8k, 16k]
baseline: {{preset: sglang}}
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory, ray_local) -> dict:
    """The sweep config and its table from the local pool (-j 2): the reference."""
    root = tmp_path_factory.mktemp("ray")
    write_cc_traces(root / "cc", sessions=4, turns=6)
    cfg = root / "sweep.yaml"
    cfg.write_text(SWEEP.format(trace=root / "cc"))
    res = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(root / "local"), "-j", "2"])
    assert res.exit_code == 0, res.stderr
    return {"root": root, "cfg": cfg, "csv": (root / "local" / "results.csv").read_bytes()}


def _tmp_files(d: Path) -> list[Path]:
    return [p for p in d.rglob("*") if is_tmp_name(p.name)]


def test_ray_table_is_byte_identical_to_the_local_pool(setup) -> None:
    out = setup["root"] / "ray"
    res = CliRunner().invoke(cli, ["sweep", str(setup["cfg"]), "--out", str(out),
                                   "--executor", "ray"])
    assert res.exit_code == 0, res.stderr
    assert (out / "results.csv").read_bytes() == setup["csv"]
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 4
    for pid in df["point"]:
        a = setup["root"] / "local" / "points" / pid / "requests.parquet"
        assert (out / "points" / pid / "requests.parquet").read_bytes() == a.read_bytes()
    assert ray.is_initialized()  # a Ray the caller started is left running


class _KillOnce(RayExecutor):
    """Ray executor whose worker SIGKILLs itself (after leaving a half-written temp file) the
    first time it runs ``victim``: what an OOM kill or a lost node does to a point."""

    def __init__(self, victim: str, marker: str) -> None:
        super().__init__(max_retries=2)
        self.victim, self.marker = victim, marker

    def map(self, fn, jobs):
        victim, marker = self.victim, self.marker

        def flaky(cfg, out, get_trace):
            if point_id(cfg) == victim:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    pass
                else:
                    d = Path(out) / "points" / victim
                    d.mkdir(parents=True, exist_ok=True)
                    (d / ".requests.parquet.half.tmp").write_bytes(b"PAR1 half")
                    os.kill(os.getpid(), signal.SIGKILL)
            return fn(cfg, out, get_trace)

        return super().map(flaky, jobs)


def test_killed_worker_is_retried_then_resume_gives_the_same_table(setup) -> None:
    sweep = load_sweep(setup["cfg"])
    out = setup["root"] / "killed"
    marker = setup["root"] / "killed-once"
    victim = sweep.points[1].id
    run_sweep(sweep, out, _KillOnce(victim, str(marker)))
    assert marker.exists()  # the worker really died mid-point
    assert (out / "results.csv").read_bytes() == setup["csv"]
    assert not _tmp_files(out)  # its half-written file is gone

    # A sweep killed in the middle: two points unfinished, one mid-write. Resume on Ray.
    points = out / "points"
    for p in sweep.points[2:]:
        (points / p.id / "summary.json").unlink()
    (points / sweep.points[3].id / ".config.json.dead.tmp").write_text("{")
    kept = {p.id: (points / p.id / "summary.json").stat().st_mtime_ns for p in sweep.points[:2]}
    (out / "results.csv").unlink()
    run_sweep(sweep, out, RayExecutor())
    assert (out / "results.csv").read_bytes() == setup["csv"]
    assert not _tmp_files(out)
    for pid, t in kept.items():  # finished points are not run again
        assert (points / pid / "summary.json").stat().st_mtime_ns == t


def test_trace_is_fetched_once_per_worker_not_once_per_point(setup) -> None:
    sweep = load_sweep(setup["cfg"])
    jobs = [(p.cfg, str(setup["root"] / "once")) for p in sweep.points] * 2  # 8 jobs
    infos = [info for _, info in RayExecutor().map(run_point, jobs)]
    by_worker: dict[str, set[int]] = {}
    for info in infos:
        by_worker.setdefault(info["worker"], set()).add(info["trace_loads"])
    # every job a worker ran saw the same count: it fetched the trace before its first job
    # and never again
    assert all(len(loads) == 1 for loads in by_worker.values()), by_worker
    assert len(by_worker) < len(jobs)


def _kill_first_run(cfg, out, get_trace):
    """Local pool: the process running the first point dies once (module level: picklable)."""
    marker = Path(out) / "killed-once"
    if cfg.policy.preset == "penelope" and cfg.cache.gpu_cache == 8192:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    return run_point(cfg, out, get_trace)


def test_local_pool_retries_a_dead_worker_too(setup) -> None:
    sweep = load_sweep(setup["cfg"])
    out = setup["root"] / "pool"
    out.mkdir()
    jobs = [(p.cfg, str(out)) for p in sweep.points]
    done = sorted(i for i, _ in LocalPoolExecutor(2).map(_kill_first_run, jobs))
    assert done == [0, 1, 2, 3] and (out / "killed-once").exists()


def test_reproduce_on_ray_equals_local(setup) -> None:
    from sim.studies import reproduce
    from sim.sweep.executors import ExecutorSpec

    trace = str(setup["root"] / "cc")
    local = reproduce("ablation", trace=trace, quick=True)
    on_ray = reproduce("ablation", trace=trace, quick=True,
                       executor=ExecutorSpec(kind="ray"))
    assert json.dumps(on_ray, sort_keys=True) == json.dumps(local, sort_keys=True)
    assert len(local["rows"]) == 12


def test_plan_on_ray_gives_the_local_plan_and_puts_the_trace_once(setup, monkeypatch) -> None:
    """``kvsim plan --executor ray``: its rounds are Ray tasks on one executor, the trace goes
    into the object store once for all rounds, and the plan is the local pool's (issue 55
    item 4). An SLO no size meets: the up search asks every size, one round each, its misses
    stopped early in the Ray workers as in the local pool."""
    puts = []
    real_put = ray.put
    monkeypatch.setattr(ray, "put", lambda v, **kw: puts.append(1) or real_put(v, **kw))
    args = ["plan", str(setup["root"] / "cc"), "--gaps", "tool", "--sessions", "2",
            "--replicas", "1..3", "--routers", "round-robin", "--policies", "sglang",
            "--slo", "ttft_p90=1ms", "--repeats", "1", "--json"]
    docs = {}
    for name, extra in (("local", ["-j", "2"]), ("ray", ["--executor", "ray"])):
        res = CliRunner().invoke(cli, [*args, *extra, "--out", str(setup["root"] / f"plan-{name}")])
        assert res.exit_code == 0, res.output
        docs[name] = json.loads(res.stdout)
    assert docs["ray"]["rounds"] > 1 and len(puts) == 1
    assert docs["ray"]["points_stopped"] > 0
    keep = ("chosen", "answers", "cheapest", "points_run", "points_stopped", "rounds")
    strip = lambda d: json.loads(json.dumps({k: d[k] for k in keep}).replace(  # noqa: E731
        "plan-ray", "plan-local"))
    assert strip(docs["ray"]) == strip(docs["local"])
