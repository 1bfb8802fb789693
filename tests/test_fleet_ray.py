"""A sweep of routers x replicas (a user's router file among them) on Ray: the same table and
the same per-request files as the local pool, byte for byte (the Ray test pattern of
tests/test_sweep_ray.py, one local Ray for the module)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from tests.enginekit import write_cc_traces

ray = pytest.importorskip("ray")  # installed by `make test` (the ray extra): never skipped there

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "prefix_or_least_load.py"
SWEEP = """
base:
  trace: {trace}
  gaps: tool
  max_new_tokens: 256
  sessions: 4
  gpu_cache: 8k
  preset: penelope
grid:
  router: [round-robin, session-affinity, '{example}:PrefixOrLeastLoad']
  replicas: [1, 3]
"""


def test_router_sweep_on_ray_equals_the_local_pool(tmp_path, ray_local) -> None:
    write_cc_traces(tmp_path / "cc", sessions=4, turns=6)
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(SWEEP.format(trace=tmp_path / "cc", example=EXAMPLE))
    local = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "local"),
                                     "-j", "2"])
    assert local.exit_code == 0, local.stderr
    on_ray = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "ray"),
                                      "--executor", "ray"])
    assert on_ray.exit_code == 0, on_ray.stderr
    csv = (tmp_path / "local" / "results.csv").read_bytes()
    assert (tmp_path / "ray" / "results.csv").read_bytes() == csv
    df = pd.read_csv(tmp_path / "ray" / "results.csv")
    assert len(df) == 6 and list(df["replicas"]) == [1, 3] * 3
    for pid in df["point"]:
        for name in ("requests.parquet", "load.parquet"):
            a = tmp_path / "local" / "points" / pid / name
            assert (tmp_path / "ray" / "points" / pid / name).read_bytes() == a.read_bytes()
