"""The PD rules' decisions by hand (policies/pd_rules.py), the CLI's PD options and refusals,
and ``kvsim reproduce pd``'s grid and document."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import sim.studies.pd as exp_pd
from policies.pd_rules import PD_RULES, DecodeWorker, PDRequest, make_rule
from sim.cli.main import cli
from sim.studies.study import StudySetup


def w(i, n=0, tokens=0, cached=0, step=0.01):
    return DecodeWorker(i, n, tokens, cached, step)


def req(prompt=4000, threshold=0, cache=True):
    return PDRequest(0, 0, 0.0, prompt, threshold, cache)


def rule(name):
    return make_rule(name, np.random.default_rng(0))


def test_disagg_decodes_by_cache_then_load():
    workers = (w(0, n=1), w(1, n=3, cached=2048), w(2, n=0))
    assert rule("disagg").decide(req(), workers).decode == 1  # the longest cached prefix
    assert rule("disagg").decide(req(cache=False), workers).decode == 2  # least in flight
    # local below the threshold: 4000 - 2048 = 1952 uncached tokens on worker 1
    assert rule("disagg").decide(req(threshold=2000), workers).local
    assert not rule("disagg").decide(req(threshold=1952), workers).local  # strictly below


def test_dynamo_local_iff_uncached_at_most_max_local_prefill_length():
    workers = (w(0, tokens=9000, cached=3000), w(1, tokens=100))
    c = rule("dynamo").decide(req(threshold=1000), workers)
    assert (c.decode, c.local) == (1, False)  # least active tokens; 4000 uncached there
    c = rule("dynamo").decide(req(threshold=4000), workers)
    assert c.local  # prefill_length - prefix_hit_length <= max_local_prefill_length


def test_sglang_pd_power_of_two_and_never_local():
    workers = tuple(w(i, n=i) for i in range(4))
    r = rule("sglang-pd")
    picks = {r.decide(req(threshold=10**6), workers) for _ in range(50)}
    assert all(not c.local for c in picks)
    assert {c.decode for c in picks} <= {0, 1, 2}  # the busiest wins no draw of two
    assert rule("sglang-pd").decide(req(), (w(0),)).decode == 0


def test_llmd_scores_prefix_share_plus_free_load():
    workers = (w(0, n=2, cached=4000), w(1, n=0))
    # worker 0: 1.0 + (1 - 2/2) = 1.0; worker 1: 0 + 1 = 1.0 -> tie, the lower index
    assert rule("llm-d").decide(req(), workers).decode == 0
    workers = (w(0, n=2, cached=2000), w(1, n=0))  # 0.5 + 0 against 1.0
    assert rule("llm-d").decide(req(threshold=100), workers).decode == 1


def test_mooncake_meets_tbt_or_marks_overload():
    workers = (w(0, n=0, step=0.2), w(1, n=5, step=0.05))
    c = rule("mooncake").decide(req(), workers)
    assert (c.decode, c.overloaded) == (1, False)  # the idle one misses the TBT SLO
    c = rule("mooncake").decide(req(), (w(0, n=1, step=0.2), w(1, n=0, step=0.3)))
    assert (c.decode, c.overloaded) == (1, True)  # none meets it: least loaded, flagged


def test_every_rule_names_what_it_follows():
    for name in PD_RULES.names():
        assert PD_RULES.get(name).follows, name


RUN = ["run", "--trace", "synthetic:claude-code?sessions=4", "--max-context", "32k",
       "--gaps", "tool", "--sessions", "2", "--gpu-cache", "64k", "--preset", "sglang"]


def test_cli_runs_a_pd_fleet_and_prints_its_summary():
    res = CliRunner().invoke(cli, [*RUN, "--prefill-replicas", "2", "--decode-replicas", "1",
                                   "--router", "least-load", "--pd-link", "nvlink4", "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)["runs"][0]["summary"]
    assert (s["pd_prefill_replicas"], s["pd_decode_replicas"], s["pd_link"]) == (2, 1,
                                                                                 "nvlink4")
    assert s["transfer_bytes"] > 0 and s["requests"] > 0


@pytest.mark.parametrize("args,needle", [
    (["--pd-link", "nvlink4"], "--pd-link does nothing here"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--pd-rule", "sglang-pd",
      "--pd-local-threshold", "1024"], "--pd-local-threshold does nothing here"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--pd-link", "ideal",
      "--pd-streaming", "layer"], "--pd-streaming does nothing here"),
    (["--prefill-replicas", "2"], "both pools"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--pd-link-scope", "pair"],
     "--pd-link-scope does nothing here"),
])
def test_cli_refuses_pd_options_that_do_nothing(args, needle):
    res = CliRunner().invoke(cli, [*RUN, *args])
    assert res.exit_code == 2 and needle in res.stderr, res.output


def test_reproduce_pd_grid():
    keys, cfgs = exp_pd.configs(StudySetup(trace="synthetic:claude-code"))
    n = 2 if exp_pd.MOONCAKE.is_file() else 1
    per = len(exp_pd.arrangements(exp_pd.GPUS))
    assert len(cfgs) == per * n
    for k, c in zip(keys, cfgs, strict=True):
        gpus = c.pd.prefill_replicas + c.pd.decode_replicas if c.is_pd else c.fleet.replicas
        assert gpus == exp_pd.GPUS == k["gpus"]  # every row at the same GPU count
        assert c.policy_spec == k["policy"]
    assert {c.pd.pd_rule for c in cfgs if c.is_pd} == {"disagg", *exp_pd.RULES}


def test_reproduce_pd_quick_json_and_tables(monkeypatch):
    monkeypatch.setattr(exp_pd, "MOONCAKE", exp_pd.MOONCAKE.with_name("absent.jsonl"))
    monkeypatch.setattr(exp_pd, "QUICK_GPUS", 2)
    res = CliRunner().invoke(cli, ["reproduce", "pd", "--quick", "--json", "--trace",
                                   "synthetic:claude-code"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    rows = doc["rows"]
    assert len(rows) == len(exp_pd.arrangements(2)) and any("mooncake" in x
                                                               for x in doc["notes"])
    agg = [r for r in rows if r["arrangement"].startswith("agg")]
    pd_rows = [r for r in rows if not r["arrangement"].startswith("agg")]
    assert all(r["transfer_gb"] == 0 for r in agg)
    assert all(r["transfer_gb"] > 0 or r["local_share"] == 1.0 for r in pd_rows)
    res = CliRunner().invoke(cli, ["reproduce", "pd", "--quick", "--trace",
                                   "synthetic:claude-code"])
    assert res.exit_code == 0 and "pools and links" in res.stdout, res.output


def test_a_reused_out_folder_loses_the_previous_pd_run(tmp_path):
    out = tmp_path / "out"
    args = [*RUN, "--prefill-replicas", "1", "--decode-replicas", "1", "--out", str(out)]
    assert CliRunner().invoke(cli, args).exit_code == 0
    assert (out / "sglang" / "pd_transfers.parquet").is_file()
    res = CliRunner().invoke(cli, [*RUN, "--out", str(out)])
    assert res.exit_code == 0 and not (out / "sglang" / "pd_transfers.parquet").exists()
