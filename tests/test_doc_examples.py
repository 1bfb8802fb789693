"""The example commands of README.md and docs/*.md run clean: every complete one that runs
in seconds (generated traces, the shipped examples) exits 0 without a warning, so a reader who
copies one sees no "replayed anyway" or "dropped" line. The ones on ../shared/data or that take
minutes (full reproductions, the paper's sweeps) are listed and left out here; the sweep files
they use are loaded and checked."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO

from sim.cli.main import cli
from tests.conftest import needs_cc_traces

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PLACEHOLDERS = ("...", "PATH", "CONFIG", "OUT_DIR", "DIR", "[", "my.yaml", "sweep.yaml",
                "trace.jsonl", "my-h100", "/shared/results")
# minutes of work, the shared traces, a GPU, or a folder an earlier (left out) command writes
LEFT_OUT = ("../shared/data", "reproduce gpu-only", "reproduce ablation", "reproduce fcfs",
            "reproduce two-tier", "reproduce cpu-sweep", "kvsim sweep", "--device cuda",
            "kvsim plot")


def commands(path: Path) -> list[str]:
    """The ``kvsim ...`` lines of the file's shell code blocks, continuation lines joined and
    trailing ``  # comments`` cut."""
    out: list[str] = []
    fence: str | None = None
    cur: str | None = None
    for ln in path.read_text().splitlines():
        s = ln.rstrip()
        if s.lstrip().startswith("```"):
            fence = None if fence is not None else (s.strip()[3:] or "text")
            continue
        if fence not in ("text", "bash", "sh", "console"):
            continue
        if cur is not None:
            cur += " " + s.strip().rstrip("\\").strip()
            if not s.endswith("\\"):
                out.append(cur.split("  #")[0].strip())
                cur = None
            continue
        m = re.match(r"^\s*(?:\$ )?(kvsim .*)$", s)
        if m and s.endswith("\\"):
            cur = m.group(1).rstrip("\\").strip()
        elif m:
            out.append(m.group(1).split("  #")[0].strip())
    return out


def _runnable(cmd: str) -> bool:
    bare = re.sub(r"\"[^\"]*\"|'[^']*'", "", cmd)  # quoted values may hold | and ?
    return not any(p in bare for p in PLACEHOLDERS) and "|" not in bare \
        and not any(s in cmd for s in LEFT_OUT)


EXAMPLES = [(p.name, c) for p in DOCS for c in commands(p)]
RUNNABLE = [(name, c) for name, c in EXAMPLES if _runnable(c)]


def test_the_examples_are_found() -> None:
    assert len(EXAMPLES) > 40
    assert len(RUNNABLE) >= 8, RUNNABLE


@pytest.mark.parametrize("doc,cmd", RUNNABLE, ids=[f"{d}:{c[:60]}" for d, c in RUNNABLE])
def test_a_documented_example_runs_clean(doc, cmd, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)  # examples name repository files from the repository root
    args = shlex.split(cmd)[1:]
    for opt in ("--out", "--timeline"):  # written where the test can throw them away
        if opt in args:
            args[args.index(opt) + 1] = str(tmp_path / opt.strip("-"))
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, f"{doc}: {cmd}\n{res.stderr}"
    warnings = [ln for ln in res.stderr.splitlines() if "warning" in ln.lower()]
    assert not warnings, f"{doc}: {cmd}\n" + "\n".join(warnings)


@needs_cc_traces
def test_the_documented_sweep_files_load_wherever_they_are_run_from(tmp_path,
                                                                      monkeypatch) -> None:
    from sim.sweep import load_sweep

    monkeypatch.chdir(tmp_path)  # trace paths are relative to the sweep file
    for f in sorted((REPO / "docs" / "sweeps").glob("*.yaml")):
        sweep = load_sweep(f)
        assert Path(sweep.points[0].cfg.traffic.trace).is_dir(), f


@needs_cc_traces
def test_the_readme_example_prints_the_numbers_the_readme_quotes(monkeypatch) -> None:
    """README's example on the shared traces, run as printed, gives the mean TTFTs and changes
    the README quotes beside it (issue 51: a cap:10 fcfs command gave -8.2% / -23.6% beside
    a table of -12.1% / -23.8%, which needed --gaps tool --scheduler lpm)."""
    monkeypatch.chdir(REPO)
    readme = REPO / "README.md"
    cmd = next(c for c in commands(readme) if "../shared/data/cc-traces" in c
               and "top-requests:24" in c)
    quoted = re.search(r"Its table opens with the mean TTFT: sglang ([\d.]+) s, vllm ([\d.]+) s"
                       r" \(([-+][\d.]+%)\), penelope ([\d.]+) s\s+\(([-+][\d.]+%)\)",
                       readme.read_text())
    assert quoted, "README: the example's output is not quoted"
    res = CliRunner().invoke(cli, [*shlex.split(cmd)[1:], "--json"])
    assert res.exit_code == 0, res.stderr
    runs = {r["policy"]: r for r in json.loads(res.stdout)["runs"]}
    got = (f"{runs['sglang']['summary']['ttft_mean_s']:.3f}",
           f"{runs['vllm']['summary']['ttft_mean_s']:.3f}",
           f"{runs['vllm']['change_vs_first']['ttft_mean_s']:+.1%}",
           f"{runs['penelope']['summary']['ttft_mean_s']:.3f}",
           f"{runs['penelope']['change_vs_first']['ttft_mean_s']:+.1%}")
    assert got == quoted.groups()
    assert "-12.1% / -23.8%" in readme.read_text()  # the results' default-profile row
