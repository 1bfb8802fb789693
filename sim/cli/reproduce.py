"""``kvsim reproduce NAME``: one of the paper's experiments, our numbers beside the paper's.

The studies (sim/studies/) hold their runs, documents and tables; this command parses the
options, shows progress and prints what the study renders."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import click
from rich.table import Table

from sim.config import KNOBS
from sim.studies import STUDIES

from .common import console, emit_json, stderr


def warn_idle_fleets(rows: list[dict[str, Any]]) -> None:
    """One warning line when fleet runs left replicas without a request (their rows' column
    ``idle replicas`` says which)."""
    idle = [r for r in rows if r.get("idle_replicas")]
    if idle:
        r = max(idle, key=lambda r: r["idle_replicas"])
        stderr.print(f"[yellow]warning:[/yellow] {len(idle)} of {len(rows)} fleet runs left "
                     f"replicas without a request (column 'idle replicas'; the most: "
                     f"{r['router']}, {r['policy']}, {r['idle_replicas']} of "
                     f"{r['replicas']} idle on {r['workload']})")


@click.command("reproduce")
@click.argument("name", type=click.Choice(STUDIES.names()))
@click.option("--trace", "-t", default=None,
              help="Trace to replay (default: ../shared/data/cc-traces when present, else "
                   "synthetic:claude-code).")
@click.option("--gaps", default="tool", show_default=True,
              help="Gap model; the paper replays the recorded tool time.")
@click.option("--prompt-nodes", type=click.Choice(["chunked", "whole"]), default="chunked",
              show_default=True, help="Tree shape (see kvsim run --help); ablation runs both.")
@click.option("--quick", is_flag=True, help="Shrink every run to seconds.")
@click.option("--profiles", type=click.Choice(["derived", "kernels"]), default=None,
              help="Shipped H100 profiles to price with: derived (datasheet) or kernels "
                   "(measured kernel tables) [default: each model's default profile].")
@click.option("-j", "--jobs", type=click.IntRange(min=0), default=1, show_default=True,
              help="Local: parallel processes. Ray: runs in flight (0 = no cap).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True, help="Where the runs execute (see kvsim sweep --help).")
@click.option("--address", default=None, metavar="ADDR",
              help="Ray: the cluster to join (auto, ray://HOST:10001); default: a local Ray.")
@click.option("--engine", type=click.Choice(tuple(KNOBS)), default="sglang",
              show_default=True,
              help="policies only: vllm runs Continuum's patches of vLLM against vLLM at "
                   "N = 4, 8, 16, 32 (docs/policies.md).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def reproduce_cmd(name: str, trace: str | None, gaps: str, prompt_nodes: str, quick: bool,
                  profiles: str | None, jobs: int, executor: str, address: str | None,
                  engine: str, as_json: bool) -> None:
    """Run a named paper experiment and print ours beside the paper's numbers."""
    from sim.report.progress import progress
    from sim.studies import reproduce
    from sim.sweep.executors import ExecutorSpec

    if address and executor != "ray":
        raise click.UsageError("--address is for --executor ray")
    study = STUDIES.get(name)
    if engine not in study.engines():
        which = [n for n in STUDIES.names() if engine in STUDIES.get(n).engines()]
        raise click.UsageError(f"--engine {engine} is for the {', '.join(which)} experiment "
                               "only")
    spec = ExecutorSpec(kind=executor, jobs=jobs, address=address)
    with progress(f"kvsim reproduce {name}", "runs", console=stderr) if study.replays \
            else nullcontext():  # a study that prices a formula: nothing to wait for
        doc = reproduce(name, trace=trace, quick=quick, jobs=jobs, gaps=gaps,
                        prompt_nodes=prompt_nodes, executor=spec, profiles=profiles,
                        engine=engine)
    if study.replays:
        stderr.print(f"{name}: trace {doc['trace']} ({doc['trace_kind']}), gaps {doc['gaps']}"
                     + (", quick" if quick else ""))
    warn_idle_fleets(doc.get("rows", []))
    if as_json:
        emit_json(doc)
        return
    con = console()
    for i, table in enumerate(study.on(engine).render(doc)):
        if i and isinstance(table, Table):
            con.print()
        con.print(table)
