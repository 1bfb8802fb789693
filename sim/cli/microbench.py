"""``kvsim microbench figure1``: the paper's Figure 1, priced by the cost model."""

from __future__ import annotations

import click
from rich.table import Table

from costmodel.figure1 import figure1, illustrative_example
from costmodel.profile import load_profile
from costmodel.specs import get_spec
from sim.checks import check_profile

from .common import console, emit_json


@click.group("microbench")
def microbench_cmd() -> None:
    """Microbenchmarks of the cost model."""


@microbench_cmd.command("figure1")
@click.option("--model", "-m", default="qwen3-8b", show_default=True, help="Model spec.")
@click.option("--profile", "-p", default=None,
              help="Profile name or file (default: kernels-h100_sxm-MODEL).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def figure1_cmd(model: str, profile: str | None, as_json: bool) -> None:
    """Delete 30% of a cached context from position 2K or from the end, append 512 tokens:
    cost of the next request, both ways, for contexts 8K..128K."""
    try:
        spec = get_spec(model)
    except KeyError as e:
        raise click.BadParameter(str(e.args[0]), param_hint="--model") from None
    check_profile(profile, model)  # a binary or malformed file: one line naming it
    prof = load_profile(profile, model)
    rows = figure1(spec, prof)
    example = illustrative_example(spec)
    doc = {"model": model, "profile": prof.name, "profile_provenance": prof.provenance,
           "rows": rows, "illustrative_example": example}
    if as_json:
        emit_json(doc)
        return
    t = Table(title=f"Figure 1 -- {model}, profile {prof.name} ({prof.provenance})")
    for col in ("context", "deleted", "front units", "tail units", "speedup (units)",
                "segment only", "front s", "tail s", "speedup (s)", "paper (qwen3-8b)"):
        t.add_column(col, justify="right")
    for r in rows:
        paper = r["paper_measured_speedup"]
        t.add_row(f"{r['context_tokens'] // 1024}K", f"{r['deleted_tokens']:,}",
                  f"{r['front_units']:.3e}", f"{r['tail_units']:.3e}", f"{r['speedup']:.3f}",
                  f"{r['segment_speedup']:.3f}", f"{r['front_seconds']:.3f}",
                  f"{r['tail_seconds']:.3f}", f"{r['speedup_seconds']:.3f}",
                  "-" if paper is None else f"{paper:.2f}")
    con = console()
    con.print(t)
    con.print(f"Illustrative example (16K shared + 100K private, free 30K): tail costs "
              f"{example['speedup']:.2f}x front (seed: ~2.3x).")
