"""``kvsim plan TRACE --slo ...``: the cheapest deployments that meet SLOs (sim/sweep/plan.py)."""

from __future__ import annotations

from collections.abc import Callable

import click

from sim.config import PD_FIELDS

from .common import config_options, console, emit_json, stderr
from .run_checks import option_spelling
from .trace import trace_options


def _list(text: str | None, option: str, kind=str) -> list:
    """A comma-separated option's items as ``kind``; an empty or unreadable item is refused
    naming ``option`` (exit 2)."""
    if text is None:
        return []
    items = [x.strip() for x in str(text).split(",")]
    if not all(items):
        raise click.BadParameter(f"{text!r} has an empty item", param_hint=option)
    try:
        return [kind(x) for x in items]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected a comma-separated list of "
                                 f"{kind.__name__}", param_hint=option) from None


@click.command("plan")
@click.argument("trace")
@trace_options
@config_options("run", only=("slo",), required=("slo",))
@config_options("cache", only=("model",))
@config_options("engine", only=("engine",))  # the server every replica runs
@click.option("--gpus", "gpu", default="H100", show_default=True,
              help="GPU kinds to search (comma-separated; costmodel/data/gpus.yaml).")
@click.option("--tp", default="1", show_default=True, help="TP sizes to search, e.g. 1,2.")
@click.option("--mem-fraction", default=None, metavar="F,...",
              help="Shares of each GPU's memory for weights and KV to search (default 0.9).")
@click.option("--replicas", default="1..8", show_default=True, metavar="LO..HI",
              help="Replica counts to search.")
@click.option("--routers", "router", default="least-load", show_default=True,
              help="Routers to compare (comma-separated).")
@click.option("--policies", "policy", default="sglang", show_default=True,
              help="Eviction policies to compare (presets or registered names).")
@click.option("--sessions", "-n", default="4", show_default=True,
              help="Load: sessions at once (closed loop); a list compares loads.")
@config_options("traffic", only=("replay",))
@click.option("--time-scale", default=None,
              help="Open loop load: send-time multipliers to compare (0.5 = twice the rate).")
@config_options("run", only=("repeats",), defaults={"repeats": 3})
@click.option("--search", type=click.Choice(["up", "bisect", "full"]), default="up",
              show_default=True, help="up: each size from the smallest until one meets, a "
                                      "run stopped once it can no longer meet (full's "
                                      "answers); bisect: the largest first, then halves; "
                                      "full: every size whole (the whole goodput curve). "
                                      "docs/sweeps.md, Plan.")
@click.option("--pd", default=None, metavar="P:D,...",
              help="Prefill:decode pool shapes to search instead of replicas (needs the "
                   "disaggregated fleet).")
@config_options("pd", only=("pd_link", "pd_local_threshold", "pd_rule"))  # with --pd
@click.option("--prices", type=click.Path(dir_okay=False, exists=True), default=None,
              help="A GPU catalog of costmodel/data/gpus.yaml's shape with your prices.")
@click.option("--out", "-o", required=True, help="Folder: points/<id>/, plan.json, plan.csv, "
              "plan.png; rerun to resume.")
@click.option("-j", "--jobs", type=click.IntRange(min=0), default=1, show_default=True,
              help="Local: parallel processes; Ray: tasks in flight (0 = no cap).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local",
              show_default=True, help="Where points run: a local process pool or Ray tasks.")
@click.option("--address", default=None, help="Ray: the cluster to join.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON document.")
def plan_cmd(gpu, tp, mem_fraction, replicas, router, policy, sessions, time_scale, search,
             pd, prices, out, jobs, executor, address, as_json, **fields) -> None:
    """Find the smallest and cheapest deployments (replicas x GPU x router x policy) whose
    runs of TRACE meet the SLOs, with repeats and 95% intervals (docs/sweeps.md, Plan).

    Each point runs --repeats decision seeds, and a size meets the --slo at its interval's
    pessimistic end."""
    from costmodel.gpus import load_gpus
    from sim.config import default_replay
    from sim.io import check_out_dir
    from sim.report.plan import pick_line, plan_notes, plan_tables, plot_plan
    from sim.report.progress import progress
    from sim.sweep import ExecutorSpec
    from sim.sweep.plan import PlanSpec, check_spec, parse_pd, parse_range, plan

    # every other option is named as its flat field (sim/config.py option, config_options)
    if fields["replay"] is None:
        fields["replay"] = default_replay(fields["trace"], fields["trace_format"])
    ctx = click.get_current_context()
    # each parameter is named as the RunConfig field it sets or searches (--gpus: gpu)
    given = frozenset(name for name in ctx.params
                      if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE)
    # the --pd options given without --pd are refused below as doing nothing
    base = {k: v for k, v in fields.items() if pd or k not in PD_FIELDS or k in given}
    replay = base["replay"]
    fractions = (_list(mem_fraction, "--mem-fraction", float) if mem_fraction is not None
                 else [None])
    if any(not 0 < f <= 1 for f in fractions if f is not None):
        raise click.BadParameter(f"{mem_fraction!r}: each must be in (0, 1]",
                                 param_hint="--mem-fraction")
    if replay == "open":
        loads = [{"time_scale": x} for x in _list(time_scale or "1.0", "--time-scale", float)]
    else:
        loads = [{"sessions": n} for n in _list(sessions, "--sessions", int)]
    spec = PlanSpec(base=base, gpus=[g.upper() for g in _list(gpu, "--gpus")],
                    tps=_list(tp, "--tp", int), routers=_list(router, "--routers"),
                    policies=_list(policy, "--policies"), loads=loads,
                    replicas=parse_range(replicas), search=search, pd=parse_pd(pd),
                    prices=load_gpus(prices) if prices else None, mem_fractions=fractions,
                    given=given, spell=option_spelling(ctx))
    check_spec(spec)  # every config checked before anything runs
    check_out_dir(out)
    stderr.print(spec.slo.describe(), markup=False, highlight=False)  # how --slo was read
    ex = ExecutorSpec(kind=executor, jobs=jobs, address=address).make()
    try:
        with progress("kvsim plan", "points", 0, stderr) as bar:
            doc = plan(spec, out, ex, round_reporter(bar))
    finally:
        ex.close()
    import pandas as pd_

    rows = pd_.read_parquet(f"{out}/plan.parquet").to_dict("records")
    png = plot_plan(doc, rows, __import__("pathlib").Path(out) / "plan.png")
    doc["plot"] = str(png)
    if as_json:
        emit_json(doc)
        return
    con = console()
    for i, t in enumerate(plan_tables(doc)):
        if i:
            con.print()
        con.print(t)
    for line in plan_notes(doc):
        stderr.print(line, markup=False, highlight=False)
    stderr.print(pick_line(doc, spec.replicas, bool(spec.pd)), markup=False, highlight=False)
    stderr.print(f"wrote {out}/plan.json, plan.csv, plan.png ({doc['points_run']} points, "
                 f"{doc['rounds']} rounds)")


def round_reporter(bar) -> Callable[[str, int, int], None]:
    """The planner's ``report(stage, done, total)`` on a progress tracker: a new round opens
    with its own count (not the last round's) and its ETA from its own pace."""
    shown: list[str] = []

    def report(stage: str, done: int, total: int) -> None:
        if shown[-1:] != [stage]:
            shown.append(stage)
            bar.stage(stage, done, total)  # the pace counts from this round's start
        else:
            bar.update(done, total)

    return report
