"""`kvsim reproduce` tables laid out for a 100-column terminal: no truncated header, no line
over 100 columns, one unit convention (relative changes in signed percent, hit-rate changes in
percentage points); and `kvsim run`'s table of many policies split to fit."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.table import Table

from sim.cli.main import cli
from sim.report.tables import cell
from sim.studies import STUDIES, accuracy, experiment_tables, fleet, pool, reproduce, zoo

GOLDENS = Path(__file__).parent / "goldens"
TINY = "synthetic:claude-code?sessions=2"
PATTERN = {"change": r"[+-]\d+\.\d%", "pp": r"[+-]\d+\.\d pp", "rate": r"\d+\.\d%",
           "s": r"\d+\.\d{3}"}


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    """One document per experiment: the goldens where there is one, else a tiny quick run."""
    out = {"ablation": "reproduce_ablation.json", "gpu-only": "reproduce_gpu-only_quick.json",
           "two-tier": "reproduce_two-tier_quick.json"}
    got = {k: json.loads((GOLDENS / v).read_text()) for k, v in out.items()}
    got["figure1"] = {"rows": json.loads(_invoke("figure1", "--json"))["rows"]}
    # a saved document of the accuracy study (rendering only: it replays the ground truth)
    got["accuracy"] = json.loads((Path(__file__).parent / "fixtures" /
                                  "reproduce_accuracy.json").read_text())
    for name in ("fcfs", "cpu-sweep", "cache-engineering", "policies", "hybrid"):
        got[name] = reproduce(name, trace=TINY, quick=True)  # as the command renders it
    fleet_row = {"workload": "cc-traces", "router": "sglang-cache-aware", "policy": "penelope",
                 "replicas": 8, "ttft_mean_s": 3.91, "ttft_p90_s": 9.2, "jct_mean_s": 12.5,
                 "hit_rate": 0.81, "reuse_available": 0.74, "reuse_captured": 0.52,
                 "affinity": 0.97, "load_cv": 0.06}
    got["fleet"] = {"rows": [fleet_row, {**fleet_row, "workload": "mooncake", "affinity": None}],
                    "notes": []}  # rendering only: the grid runs in test_fleet_routers
    pool_row = {"workload": "cc-traces", "router": "dynamo-kv", "replicas": 4, "pool": 4 << 20,
                "ttft_mean_s": 0.96, "ttft_p90_s": 2.1, "jct_mean_s": 9.9, "hit_rate": 0.954,
                "pool_hit_rate": 0.394, "fetched_tokens": 123_456_789, "fetch_s": 0.0123,
                "refused_fetches": 12, "bandwidth_utilization": 0.021, "reuse_captured": 0.61}
    got["pool"] = {"rows": [pool_row, {**pool_row, "pool": 0, "pool_hit_rate": 0.0}],
                   "capacity": [{"workload": "cc-traces", "router": "round-robin",
                                 "replicas": 4, "cache_tokens": 1 << 20, "pool_tokens": 0,
                                 "hit_rate": 0.5, "pool_hit_rate": 0.0,
                                 "ideal_hit_rate": 0.96}],
                   "notes": ["a note"]}  # rendering only: tests/test_pool_fleet.py runs it
    pd_row = {"workload": "cc-traces", "gpus": 8, "arrangement": "4P:4D", "policy": "penelope",
              "router": "sglang-cache-aware", "rule": "sglang-pd", "threshold": 2048,
              "decode_cache": "off", "pd_return": "output", "ttft_mean_s": 0.721,
              "ttft_p90_s": 11.6, "jct_mean_s": 11332.8, "hit_rate": 0.918,
              "ttft_change": 2.25, "agg_hit_rate": 0.959,
              "recomputed_output_share": 0.003, "prefill_s_mean": 0.479,
              "transfer_s_mean": 0.226, "first_decode_s_mean": 36.7,
              "decode_retractions": 1234, "redone_tokens": 12_345_678, "local_share": 0.846,
              "transfer_gb": 30093.1, "link_busy_max": 0.015, "prefill_busy": 0.999,
              "decode_busy": 0.302, "requests": 2668, "dropped_requests": 0,
              "engine": "vllm", "prealloc": "off", "prealloc_wait_s_mean": 12.3}
    got["pd"] = {"rows": [pd_row, {**pd_row, "workload": "mooncake", "arrangement": "agg 8",
                                   "rule": "-", "threshold": 0, "decode_cache": "-",
                                   "pd_return": "-", "router": "dynamo-kv",
                                   "engine": "sglang", "prealloc": "-"}],
                 "notes": ["mooncake workload left out: a long note about a missing file"]}
    for doc in got.values():
        doc.setdefault("trace_kind", "given trace")
    return got


def _invoke(*args: str) -> str:
    res = CliRunner().invoke(cli, ["reproduce", *args])
    assert res.exit_code == 0, res.output
    return res.stdout


def _render(item) -> str:
    con = Console(width=100, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    con.print(item)
    return con.export_text()


@pytest.mark.parametrize("name", STUDIES.names())
def test_tables_fit_100_columns_without_truncated_headers(name: str, docs) -> None:
    items = experiment_tables(name, docs[name])
    assert any(isinstance(t, Table) for t in items)
    for item in items:
        text = _render(item)
        assert "…" not in text, text
        assert max(len(ln.rstrip()) for ln in text.splitlines()) <= 100, text
        if isinstance(item, Table):  # every word of every header, whole
            words = set(text.split())
            for col in item.columns:
                for word in str(col.header).split():
                    assert word in words, (name, col.header, text)


@pytest.mark.parametrize("name", [n for n in STUDIES.names() if n != "figure1"])
def test_tables_use_one_unit_convention(name: str, docs) -> None:
    rows = docs[name]["rows"]
    layouts = STUDIES.get(name).layout
    if name == "fleet":
        layouts = [("", fleet.FLEET_KEYS + cols) for _, cols in fleet.FLEET_LAYOUTS]
    if name == "pool":
        layouts = [("", pool.POOL_KEYS + cols) for _, cols in pool.POOL_LAYOUTS]
    if name == "accuracy":  # its tables pivot validate's rows: errors in signed percent
        layouts = [("", [c for c in accuracy.COLUMNS if c.key == "error"])]
    if name == "policies":
        layouts = [("", zoo.POLICY_COLUMNS)]
        ref = {(r["model"], r["sessions"], r["gaps"], r["tree"]): r["hit_rate"] for r in rows
               if r["policy"] == "sglang"}
        rows = [{**r, "sglang_hit_rate": ref[(r["model"], r["sessions"], r["gaps"],
                                              r["tree"])]} for r in rows]
    seen = set()
    for _, cols in layouts:
        for col in cols:
            # a difference of two rates, or of two changes, reads in points; a relative
            # change (a key ending in _change, not a paper range) in signed percent
            if col.minus is not None or col.key == "difference":
                assert col.kind == "pp", col
            elif col.key.endswith("change") and not col.key.startswith("paper"):
                assert col.kind == "change", col
            elif "hit_rate" in col.key and not col.key.startswith("paper"):
                assert col.kind == "rate", col
            for r in rows:
                text = cell(r, col)
                if col.kind in PATTERN and text != "-":
                    assert re.fullmatch(PATTERN[col.kind], text), (col, text)
                    seen.add(col.kind)
    if name in ("fleet", "pool"):  # absolute values only: seconds and rates
        assert {"s", "rate"} <= seen
    elif name == "accuracy":  # measured and kvsim values print with their own units
        assert seen == {"change"}
    elif name != "cache-engineering":  # its rows: seconds, tokens and dollars only
        assert {"change", "rate", "pp"} <= seen


def test_run_table_of_many_policies_fits_100_columns(monkeypatch) -> None:
    import sim.cli.run as run_cli

    con = Console(width=100, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    monkeypatch.setattr(run_cli, "console", lambda: con)
    res = CliRunner().invoke(cli, ["run", "--trace", "synthetic:chat?sessions=6", "--gpu-cache",
                                   "16k", "--preset", "sglang,vllm,penelope", "--policy",
                                   "memdecay", "--policy", "greedydual"])
    assert res.exit_code == 0, res.output
    text = con.export_text()
    assert "…" not in text
    assert max(len(ln.rstrip()) for ln in text.splitlines()) <= 100
    for policy in ("sglang", "vllm", "penelope", "memdecay", "greedydual"):
        assert re.search(rf"┃ +{policy} ┃", text), policy
    hit = [ln for ln in text.splitlines() if ln.startswith("│ hit_rate ")]
    assert len(hit) == 2  # two tables, the baseline in each
    assert all(re.search(r"\d+\.\d% \([+-]\d+\.\d pp\)", ln) for ln in hit), hit


def test_sweep_table_fits_100_columns_with_changes_in_the_convention(tmp_path,
                                                                     monkeypatch) -> None:
    import sim.cli.sweep as sweep_cli

    cfg = tmp_path / "s.yaml"
    cfg.write_text("base: {trace: 'synthetic:chat?sessions=3', gpu_cache: 16k}\n"
                   "grid: {gaps: [recorded, tool], checkpoint_chunks: [true, false], "
                   "sessions: [1, 2], preset: [sglang, penelope]}\n"
                   "baseline: {preset: sglang}\n")
    con = Console(width=100, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    monkeypatch.setattr(sweep_cli, "console", lambda: con)
    res = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    text = con.export_text()
    assert "…" not in text
    assert max(len(ln.rstrip()) for ln in text.splitlines()) <= 100
    for head in ("checkpoint_chunks", "sessions", "gaps", "TTFT", "change", "hit"):
        assert head in text, head
    changes = [ln.split() for ln in text.splitlines() if ln.startswith("penelope")][-16:]
    assert changes and all(re.fullmatch(r"[+-]\d+\.\d%", c[-4]) and c[-1] == "pp"
                           for c in changes[-8:]), changes


@pytest.mark.parametrize("module,args", [
    ("models", ["models"]),
    ("microbench", ["microbench", "figure1"]),
    ("capacity", ["capacity", TINY, "--replicas", "2", "--router", "sglang-cache-aware",
                  "--in-flight-s", "2", "--pool", "1m", "--cache", "64k,128k"]),
    ("capacity", ["capacity", TINY, "--cache", "64k,128k"]),
    ("trace", ["trace", "stats", TINY]),
    ("run", ["run", "--trace", TINY, "--gpu-cache", "64k", "--replicas", "2", "--pool", "256k",
             "--preset", "sglang,penelope", "--router", "sglang-cache-aware"]),
])
def test_every_command_table_fits_100_columns_as_laid_out(module, args, monkeypatch) -> None:
    """Laid out on a wide console, so that the table's own width shows (a 100-column console
    would fold it instead)."""
    import importlib

    mod = importlib.import_module(f"sim.cli.{module}")
    con = Console(width=200, record=True, color_system=None, file=open("/dev/null", "w"))  # noqa: SIM115
    monkeypatch.setattr(mod, "console", lambda: con)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    text = con.export_text()
    assert text.strip() and "…" not in text
    widest = max(text.splitlines(), key=lambda ln: len(ln.rstrip()))
    assert len(widest.rstrip()) <= 100, widest
