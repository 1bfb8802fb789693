"""``kvsim trace stats``: JSON document, table, --compare, options."""

from __future__ import annotations

import json

from click.testing import CliRunner

from sim.cli.main import cli
from tests import tracefixtures as F


def test_stats_json_table_and_compare(tmp_path):
    S = F.make_sessions(seed=1)
    F.write_fx_cc_traces(tmp_path / "cc", S)
    run = CliRunner().invoke
    r = run(cli, ["trace", "stats", str(tmp_path / "cc"), "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)  # exactly one JSON document on stdout
    assert (doc["sessions"], doc["requests"], doc["subagent_requests"]) == (3, 21, 2)
    assert doc["gap_model"] == "recorded" and doc["options"]["format"] == "cc-traces"
    r = run(cli, ["trace", "stats", str(tmp_path / "cc"), "--json", "--gaps", "tool"])
    assert json.loads(r.stdout)["gap_s"]["human_median"] == 0.0
    r = run(cli, ["trace", "stats", str(tmp_path / "cc"), "--json", "--max-context", "2.5k",
                  "--select", "top-requests:2", "--shared-prefix", "auto"])
    doc = json.loads(r.stdout)
    assert doc["sessions"] == 2 and doc["prompt_tokens"]["max"] <= 2560
    assert doc["options"]["max_context"] == 2560
    assert doc["shared_prefix"]["tokens_median"] == 1600
    r = run(cli, ["trace", "stats", str(tmp_path / "cc"), "--compare",
                  "synthetic:chat?sessions=3"])
    assert r.exit_code == 0, r.stderr
    assert "main-agent requests" in r.stdout and "synthetic:chat" in r.stdout
    r = run(cli, ["trace", "stats", str(tmp_path / "cc"), "--json", "--compare",
                  "synthetic:chat?sessions=3"])
    docs = json.loads(r.stdout)["traces"]
    assert [d["format"] for d in docs] == ["cc-traces", "synthetic"]
