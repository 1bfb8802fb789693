"""Start-up (issue 55 item 2): ``kvsim --help`` imports no command module and none of the
libraries only some commands need, its listing is the commands' own short help, and the
lazy imports leave every registry as full as when everything is loaded. Not timed:
benchmarks/bench_startup.py measures the seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest

from sim.cli.main import COMMANDS, cli

# What only some commands need: tables and Parquet, plots, rich output, fits, the cache and
# its numpy, the trace loaders, YAML, the event loop.
HEAVY = ("pandas", "pyarrow", "matplotlib", "rich", "scipy", "numpy", "simpy", "yaml", "traces",
         "policies", "costmodel", "sim.config")


def _loaded(code: str) -> list[str]:
    """The modules of ``HEAVY`` (and of ``sim.cli`` besides main/common) that ``code`` leaves
    in ``sys.modules``, in a fresh interpreter."""
    probe = (f"{code}\nimport sys, json\n"
             f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r} "
             f"or m in {HEAVY!r} or (m.startswith('sim.cli.') "
             "and m not in ('sim.cli.main', 'sim.cli.common')))))")
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", probe], capture_output=True,
                         text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_importing_the_entry_point_loads_nothing_heavy():
    assert _loaded("import sim.cli.main") == []


def test_kvsim_help_loads_no_command_and_nothing_heavy():
    code = ("from sim.cli.main import cli\n"
            "try:\n    cli(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n")
    assert _loaded(code) == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_listed_sentence_is_the_commands_own_short_help(name):
    """``COMMANDS`` holds each command's first sentence: cut to any width, it reads as the
    command's own help does (click's ``get_short_help_str``)."""
    cmd = cli.get_command(click.Context(cli), name)
    assert cmd is not None and not cmd.hidden
    for limit in (20, 45, 60, 74, 100, 150, 400):
        mine = click.Command(name, help=COMMANDS[name][2]).get_short_help_str(limit)
        assert mine == cmd.get_short_help_str(limit)


def _help(setup: str) -> str:
    code = f"{setup}\nfrom sim.cli.main import cli\ncli(['--help'], prog_name='kvsim')"
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                          text=True, check=True, env={**os.environ, "COLUMNS": "100"}).stdout


def test_help_lists_every_command_as_click_would():
    """The lazy listing equals click's own listing of the loaded commands."""
    loaded = _help("import click\nfrom sim.cli.main import COMMANDS, cli\n"
                   "[cli.get_command(click.Context(cli), n) for n in COMMANDS]\n"
                   "assert set(cli.commands) >= set(COMMANDS)")
    lazy = _help("")
    assert lazy == loaded
    assert all(f"  {name} " in lazy for name in COMMANDS)


# (module, registry): each read through its public name in a fresh process
REGISTRIES = [("policies", "POLICIES"), ("policies", "ORDERS"), ("policies.routing", "ROUTERS"),
              ("policies.scheduling", "SCHEDULERS"), ("policies.eviction", "STARTS"),
              ("policies.eviction", "GRANULARITIES"), ("policies.eviction", "PRESETS"),
              ("policies.eviction", "FREE_ORDERS"), ("policies.pd_rules", "PD_RULES"),
              ("sim.engines", "ENGINES"), ("sim.engines", "VLLM_PATCHES"),
              ("sim.sweep.executors", "EXECUTORS"), ("sim.studies", "STUDIES"),
              ("sim.context.strategies", "STRATEGIES"), ("traces.synthetic", "PROFILES"),
              ("traces.load", "READERS"), ("costmodel.specs", "SPECS"),
              ("costmodel.profile", "PROFILE_FAMILIES"), ("calibration.grid", "GRIDS")]


def _names(setup: str) -> dict[str, list[str]]:
    code = (f"{setup}\nimport importlib, json\nout = {{}}\n"
            f"for mod, attr in {REGISTRIES!r}:\n"
            "    out[f'{mod}.{attr}'] = list(getattr(importlib.import_module(mod), attr))\n"
            "print(json.dumps(out))")
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                         text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_every_registry_lists_the_same_names_alone_as_with_everything_loaded():
    """A registry read on its own (only its module imported, as a user's script would) holds
    what it holds once every command is loaded: no entry waits on an import the lazy start-up
    skips."""
    everything = ("from sim.cli.main import COMMANDS, cli\nimport click\n"
                  "[cli.get_command(click.Context(cli), n) for n in COMMANDS]\n"
                  "import sim.studies, sim.kvcache\nsim.studies.STUDIES\nsim.kvcache.RadixKVCache")
    alone = _names("")
    assert all(alone.values())
    assert alone == _names(everything)


def test_a_run_loads_no_table_library_before_its_first_request():
    """pandas (and pyarrow with it) is taken where a result's table is read as a DataFrame:
    a small run's clock starts without them (``simpy.Environment.run`` is the replay's
    start)."""
    code = (
        "import sys, json, simpy\nseen = []\nrun = simpy.Environment.run\n"
        "def first(self, *a, **k):\n"
        "    seen.append(sorted(m for m in ('pandas', 'pyarrow', 'matplotlib', 'scipy') "
        "if m in sys.modules))\n"
        "    return run(self, *a, **k)\n"
        "simpy.Environment.run = first\n"
        "from sim.cli.main import cli\n"
        "try:\n"
        "    cli(['run', '--trace', 'synthetic:claude-code?sessions=4', '--max-context', '32k', "
        "'--gaps', 'tool', '--sessions', '2', '--gpu-cache', '64k', '--preset', 'sglang', "
        "'--json'])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print(json.dumps(seen))\n")
    res = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                         text=True, check=True)
    *doc, seen = res.stdout.strip().splitlines()
    assert json.loads("\n".join(doc))  # the run's JSON document
    assert json.loads(seen) == [[]]


def _script(args: list[str], cwd: str | None = None) -> subprocess.CompletedProcess:
    """``args`` through what the ``kvsim`` script runs (``sim.cli.main.main``), with an exit
    handler that reports whether the collector was frozen by then."""
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print(f'FROZEN {gc.get_freeze_count() > 0}', "
            "file=sys.stderr))\n"
            "sys.argv[0] = 'kvsim'\nfrom sim.cli.main import main\nmain()\n")
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code, *args],
                          capture_output=True, text=True, cwd=cwd, check=False)


@pytest.mark.parametrize(("args", "status"), [(["--version"], 0),
                                              (["run", "--no-such-option"], 2)])
def test_the_script_exits_with_the_commands_status_and_the_collector_frozen(args, status):
    """The interpreter's exit skips collecting what the command left (sim/cli/main.py
    ``main``): the exit status is the command's, and exit handlers still run after it."""
    res = _script(args)
    assert res.returncode == status, res.stderr
    assert res.stderr.strip().splitlines()[-1] == "FROZEN True"


def test_a_run_with_the_collector_frozen_at_exit_leaves_its_files_whole(tmp_path):
    """Every result file is renamed into place before the command returns: each reads back."""
    import pandas as pd

    out = tmp_path / "out"
    res = _script(["run", "--trace", "synthetic:claude-code?sessions=4", "--max-context",
                   "32k", "--gaps", "tool", "--sessions", "2", "--gpu-cache", "64k",
                   "--preset", "sglang", "--out", str(out)], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stderr.strip().splitlines()[-1] == "FROZEN True"
    runs = json.loads((out / "runs.json").read_text())["runs"]
    summary = json.loads((out / "sglang" / "summary.json").read_text())
    assert [r["policy"] for r in runs] == ["sglang"]
    assert len(pd.read_parquet(out / "sglang" / "requests.parquet")) == summary["requests"]
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == sorted(
        ["runs.json", "config.json", "summary.json", "requests.parquet"])


def _tiny_mooncake(path) -> None:
    """40 Mooncake records (512-token hash ids, ms timestamps): four prompts shared in turn."""
    with open(path, "w") as f:
        for i in range(40):
            ids = [*range(8 * (i % 4), 8 * (i % 4) + 8), 1000 + i]
            f.write(json.dumps({"timestamp": 250 * i, "input_length": 512 * len(ids) - 100,
                                "output_length": 20, "hash_ids": ids}) + "\n")


@pytest.mark.parametrize("router", ["round-robin", "dynamo-kv"])
def test_kvsim_run_on_a_mooncake_trace_loads_no_table_library(tmp_path, router):
    """``kvsim run`` with the default table output reads only its runs' summaries: the
    requests table stays columns (sim/engines/columns.py) and pandas and pyarrow are never imported,
    nor plots or fits (a fleet of the vLLM engine, as benchmarks/bench_dynamo.py runs it)."""
    trace = tmp_path / "trace.jsonl"
    _tiny_mooncake(trace)
    code = ("import atexit, json, sys\n"
            "atexit.register(lambda: print('LOADED ' + json.dumps(sorted({m.split('.')[0] "
            "for m in sys.modules} & "
            "{'pandas', 'pyarrow', 'matplotlib', 'scipy'})), "
            "file=sys.stderr))\n"
            "sys.argv[0] = 'kvsim'\nfrom sim.cli.main import main\nmain()\n")
    res = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code, "run", "-t", str(trace), "--format",
         "mooncake", "--engine", "vllm", "--preset", "vllm", "--replicas", "2", "--router",
         router, "--gpu-cache", "64k", "--max-running", "16", "--chunk-size", "4096"],
        capture_output=True, text=True, cwd=tmp_path, check=False,
        env={**os.environ, "KVSIM_CACHE_DIR": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stderr
    assert "requests" in res.stdout and "hit_rate" in res.stdout  # the table was printed
    loaded = res.stderr.strip().splitlines()[-1]
    assert loaded == "LOADED []", loaded
