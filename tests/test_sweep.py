"""Sweeps on the local executors: the YAML format as documented, resume after a killed write,
the done marker written last, the table's columns, and a sweep without a grid."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import FLAT, ConfigError, RunConfig
from sim.sweep import SECTIONS, load_sweep, run_sweep
from sim.sweep.executors import ExecutorSpec, LocalPoolExecutor, SerialExecutor, WorkerLostError

DOCS = Path(__file__).resolve().parent.parent / "docs" / "sweeps.md"
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
{extra}"""


def _sweep_yaml(tmp: Path, trace: Path, extra: str = "") -> Path:
    p = tmp / "sweep.yaml"
    p.write_text(SWEEP.format(trace=trace, extra=extra))
    return p


def test_docs_document_every_key() -> None:
    text = DOCS.read_text()
    documented = set(re.findall(r"^\| `(\w+)` \|", text, flags=re.M))
    missing = set(FLAT) - documented
    assert not missing, f"docs/sweeps.md lacks run fields {sorted(missing)}"
    assert set(SECTIONS) <= documented
    for key in ("kind", "jobs", "address", "max_retries"):
        assert f"{key}:" in text or f"`{key}`" in text


def test_executor_section_and_command_line(tmp_path, trace) -> None:
    sweep = load_sweep(_sweep_yaml(tmp_path, trace, "executor: {kind: ray, jobs: 3, "
                                              "address: auto, max_retries: 1}\n"))
    assert sweep.executor == ExecutorSpec(kind="ray", jobs=3, address="auto", max_retries=1)
    assert load_sweep(_sweep_yaml(tmp_path, trace, "executor: local\n")).executor == ExecutorSpec()
    assert isinstance(ExecutorSpec(jobs=1).make(), SerialExecutor)
    assert isinstance(ExecutorSpec(jobs=2).make(), LocalPoolExecutor)
    for bad, key in (("executor: {kind: spark}\n", "executor.kind"),
                     ("executor: {jobs: -1}\n", "executor.jobs"),
                     ("executor: {nodes: 4}\n", "executor.nodes")):
        with pytest.raises(ConfigError, match=re.escape(key)):
            load_sweep(_sweep_yaml(tmp_path, trace, bad))


def test_summary_is_written_last(tmp_path, trace, monkeypatch) -> None:
    import sim.run.result

    order: list[str] = []
    text, parquet = sim.run.result.atomic_write_text, sim.run.result.atomic_write_parquet
    monkeypatch.setattr(sim.run.result, "atomic_write_text", lambda path, t: (
        order.append(Path(path).name), text(path, t))[1])
    monkeypatch.setattr(sim.run.result, "atomic_write_parquet", lambda df, path: (
        order.append(Path(path).name), parquet(df, path))[1])
    sweep = load_sweep(_sweep_yaml(tmp_path, trace))
    run_sweep(sweep, tmp_path / "o", SerialExecutor())
    assert order[:3] == ["requests.parquet", "config.json", "summary.json"]
    assert order.count("summary.json") == 4


def test_resume_after_a_killed_write_and_the_table(tmp_path, trace) -> None:
    cfg = _sweep_yaml(tmp_path, trace)
    code = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "a")])
    assert code.exit_code == 0, code.stderr
    csv = (tmp_path / "a" / "results.csv").read_bytes()
    df = pd.read_csv(tmp_path / "a" / "results.csv")
    # one policy column (the grid's preset is the policy), the grid's fields as written
    assert list(df.columns[:3]) == ["point", "policy", "gpu_cache"]
    assert "preset" not in df.columns and list(df["gpu_cache"]) == ["8k", "16k", "8k", "16k"]
    assert {"trace_skipped_files", "trace_skipped_records", "dropped_over_context"} <= \
        set(df.columns)
    # killed mid-write: a point without its marker, temp files left behind
    points = tmp_path / "a" / "points"
    victim = df["point"][3]
    (points / victim / "summary.json").unlink()
    (points / victim / ".summary.json.x1.tmp").write_text("{")
    (points / df["point"][0] / ".requests.parquet.x2.tmp").write_bytes(b"PAR1")
    kept = (points / df["point"][0] / "summary.json").stat().st_mtime_ns
    res = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "a"), "-j", "2"])
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / "a" / "results.csv").read_bytes() == csv
    assert not list(points.rglob("*.tmp"))
    assert (points / df["point"][0] / "summary.json").stat().st_mtime_ns == kept
    for f in [*points.rglob("*.json"), *points.rglob("*.parquet"),
              *(tmp_path / "a").glob("results.*")]:
        assert f.stat().st_mode & 0o777 == 0o644, f


def test_sweep_without_a_grid_says_it_runs_one_point(tmp_path, trace) -> None:
    p = tmp_path / "one.yaml"
    p.write_text(f"base: {{trace: {trace}, sessions: 2, gpu_cache: 16k}}\n")
    res = CliRunner().invoke(cli, ["sweep", str(p), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.stderr
    assert "has no grid: running one point" in res.stderr
    assert len(pd.read_csv(tmp_path / "o" / "results.csv")) == 1


def test_failed_point_lets_the_others_finish(tmp_path, trace) -> None:
    """A point whose trace cannot be read fails alone; the sweep says so (exit 2) and a rerun
    after the fix runs only that point."""
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "trace_0000.json").write_text('{"requests": [{"t": 0}]}')
    p = tmp_path / "two.yaml"
    p.write_text(f"base: {{sessions: 2, gpu_cache: 16k}}\ngrid: {{trace: [{trace}, {bad}]}}\n")
    res = CliRunner().invoke(cli, ["sweep", str(p), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert "1 of 2 points failed" in lines[-1] and "trace_0000.json" in lines[-1]
    assert len(list((tmp_path / "o" / "points").glob("*/summary.json"))) == 1
    assert not (tmp_path / "o" / "results.csv").exists()


def _job_or_exit(cfg, arg, get_trace):
    """A job that kills its own worker when its argument says so (module level: picklable)."""
    if arg == "kill":
        os._exit(3)
    time.sleep(0.2)  # still running when the other worker dies
    return arg


@pytest.mark.parametrize("workers", [2, 3])
def test_local_pool_charges_only_the_job_whose_worker_died(workers) -> None:
    """One job kills its worker: the broken pool takes every pending job down with it, but
    only that job is charged; the others complete and the error names it alone."""
    jobs = [(RunConfig(), "a"), (RunConfig(), "kill"), (RunConfig(), "b"), (RunConfig(), "c")]
    done: dict[int, str] = {}
    with pytest.raises(WorkerLostError, match=r"^job 1: its worker process died 2 times$"):
        for i, res in LocalPoolExecutor(workers, max_retries=1).map(_job_or_exit, jobs):
            done[i] = res
    assert done == {0: "a", 2: "b", 3: "c"}


def _worker_and_loads(cfg, arg, get_trace):
    """Which worker ran a job and how many traces it has loaded (module level: picklable)."""
    from sim.sweep.executors import worker_id, worker_trace_loads

    get_trace()
    return worker_id(), worker_trace_loads()


def test_local_pool_keeps_its_workers_and_their_traces_across_maps() -> None:
    """A plan's rounds are maps on one executor: the second map runs on the first's workers,
    which load the trace once each, not once per round (issue 55 item 4)."""
    cfg = RunConfig.from_flat(trace="synthetic:claude-code?sessions=2")
    ex = LocalPoolExecutor(2)
    try:
        first = [r for _, r in ex.map(_worker_and_loads, [(cfg, i) for i in range(4)])]
        second = [r for _, r in ex.map(_worker_and_loads, [(cfg, i) for i in range(4)])]
    finally:
        ex.close()
    assert {w for w, _ in second} <= {w for w, _ in first}
    loads = dict(first)  # per worker, its count after the first map (a forked worker starts
    assert all(n == loads[w] for w, n in second)  # with this process's): none in the second
