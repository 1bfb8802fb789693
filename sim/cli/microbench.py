"""``kvsim microbench figure1``: the paper's Figure 1, priced by the cost model."""

from __future__ import annotations

import click

from costmodel.figure1 import figure1, illustrative_example
from costmodel.profile import load_profile
from costmodel.specs import get_spec
from sim.checks import check_profile
from sim.report.tables import Col, narrow_table

from .common import console, emit_json

COLUMNS = [Col("context", "context_tokens", "tokens"),
           Col("deleted\n(tokens)", "deleted_tokens", "int"),
           Col("front\n(units)", "front_units", "units"),
           Col("tail\n(units)", "tail_units", "units"),
           Col("speedup\n(units)", "speedup", "x"),
           Col("segment\nonly", "segment_speedup", "x"),
           Col("front\n(s)", "front_seconds", "s"), Col("tail\n(s)", "tail_seconds", "s"),
           Col("speedup\n(s)", "speedup_seconds", "x"),
           Col("paper\n(8b)", "paper_measured_speedup", "ratio")]


@click.group("microbench")
def microbench_cmd() -> None:
    """Microbenchmarks of the cost model."""


@microbench_cmd.command("figure1")
@click.option("--model", "-m", default="qwen3-8b", show_default=True,
              help="Model spec (kvsim models) or a Hugging Face config.json path.")
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
    con = console()
    con.print(narrow_table(f"Figure 1 -- {model}, profile {prof.name} ({prof.provenance})",
                           COLUMNS, rows))
    con.print(f"Illustrative example (16K shared + 100K private, free 30K): tail costs "
              f"{example['speedup']:.2f}x front (seed: ~2.3x).")
