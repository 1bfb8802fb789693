"""``kvsim reproduce NAME``: one of the paper's experiments, our numbers beside the paper's."""

from __future__ import annotations

import click
from rich.table import Table

from .common import console, emit_json, stderr

NAMES = ["figure1", "gpu-only", "two-tier", "ablation", "fcfs", "cpu-sweep"]


def _fmt(k: str, v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != v:
            return "-"
        if "change" in k or k == "difference" or "rate" in k or "share" in k:
            return f"{v:+.1%}" if ("change" in k or k == "difference") else f"{v:.1%}"
        return f"{v:.3f}"
    return str(v)


@click.command("reproduce")
@click.argument("name", type=click.Choice(NAMES))
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
@click.option("-j", "--jobs", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def reproduce_cmd(name: str, trace: str | None, gaps: str, prompt_nodes: str, quick: bool,
                  profiles: str | None, jobs: int, as_json: bool) -> None:
    """Run a named paper experiment and print ours beside the paper's numbers."""
    from sim.experiments import reproduce

    doc = reproduce(name, trace=trace, quick=quick, jobs=jobs, gaps=gaps,
                    prompt_nodes=prompt_nodes, profiles=profiles)
    stderr.print(f"{name}: trace {doc['trace']} ({doc['trace_kind']}), gaps {doc['gaps']}"
                 + (", quick" if quick else ""))
    if as_json:
        emit_json(doc)
        return
    rows = doc["rows"]
    t = Table(title=f"kvsim reproduce {name} -- {doc['trace_kind']}, gaps {doc['gaps']}")
    cols = list(rows[0]) if rows else []
    for c in cols:
        t.add_column(c, justify="left" if isinstance(rows[0][c], str) else "right")
    for r in rows:
        t.add_row(*(_fmt(c, r.get(c)) for c in cols))
    console().print(t)
