"""``kvsim plan TRACE --slo ...``: the cheapest deployments that meet SLOs (sim/sweep/plan.py)."""

from __future__ import annotations

import click

from .common import SLO_TEXT, console, emit_json, stderr
from .trace import trace_options


def _list(text: str | None, kind=str) -> list:
    if text is None:
        return []
    items = [x.strip() for x in str(text).split(",")]
    if not all(items):
        raise click.BadParameter(f"{text!r} has an empty item")
    try:
        return [kind(x) for x in items]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected a comma-separated list of "
                                 f"{kind.__name__}") from None


@click.command("plan")
@click.argument("trace")
@trace_options
@click.option("--slo", type=SLO_TEXT, required=True, metavar="KEY=VALUE,...",
              help="The SLOs to meet: ttft=2s,tpot=50ms (per request, with attain=0.9) "
                   "and/or ttft_p90=1s (per run); a bare number is ms, as in vllm bench "
                   "serve --goodput; docs/engine.md, Metrics.")
@click.option("--model", "-m", default="qwen3-8b", show_default=True,
              help="Model spec (kvsim models lists them).")
@click.option("--engine", type=click.Choice(["sglang", "vllm"]), default="sglang",
              show_default=True, help="The server every replica runs (docs/engine.md).")
@click.option("--gpus", default="H100", show_default=True,
              help="GPU kinds to search (comma-separated; costmodel/data/gpus.yaml).")
@click.option("--tp", default="1", show_default=True, help="TP sizes to search, e.g. 1,2.")
@click.option("--mem-fraction", default=None, metavar="F,...",
              help="Shares of each GPU's memory for weights and KV to search (default 0.9).")
@click.option("--replicas", default="1..8", show_default=True, metavar="LO..HI",
              help="Replica counts to search.")
@click.option("--routers", default="least-load", show_default=True,
              help="Routers to compare (comma-separated).")
@click.option("--policies", default="sglang", show_default=True,
              help="Eviction policies to compare (presets or registered names).")
@click.option("--sessions", "-n", default="4", show_default=True,
              help="Load: sessions at once (closed loop); a list compares loads.")
@click.option("--replay", type=click.Choice(["closed", "open"]), default=None,
              help="closed (sessions) or open (recorded send times; see --time-scale).")
@click.option("--time-scale", default=None,
              help="Open loop load: send-time multipliers to compare (0.5 = twice the rate).")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True,
              help="Repeats per point (decision seeds): a size meets at the interval's "
                   "pessimistic end.")
@click.option("--search", type=click.Choice(["bisect", "full"]), default="bisect",
              show_default=True, help="bisect the replica range, or run every size (the "
                                      "whole goodput curve).")
@click.option("--pd", default=None, metavar="P:D,...",
              help="Prefill:decode pool shapes to search instead of replicas (needs the "
                   "disaggregated fleet).")
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
def plan_cmd(trace, trace_format, block_size, shared_prefix, max_context, select, gap_model,
             lenient, seed, cache_dir, rebuild_sessions, slo, model, engine, gpus, tp,
             mem_fraction, replicas, routers, policies, sessions, replay, time_scale,
             repeats, search, pd, prices, out, jobs, executor, address, as_json) -> None:
    """Find the smallest and cheapest deployments (replicas x GPU x router x policy) whose
    runs of TRACE meet the SLOs, with repeats and 95% intervals (docs/sweeps.md, Plan)."""
    from costmodel.gpus import load_gpus
    from sim.config import default_replay
    from sim.io import check_out_dir
    from sim.report.plan import plan_tables, plot_plan
    from sim.report.progress import progress
    from sim.sweep import ExecutorSpec
    from sim.sweep.plan import PlanSpec, check_spec, parse_pd, parse_range, plan

    if replay is None:
        replay = default_replay(trace, trace_format)
    if time_scale is not None and replay != "open":
        raise click.UsageError("--time-scale does nothing here: it scales recorded send "
                               "times: add --replay open")
    base = dict(trace=trace, trace_format=trace_format, block_size=block_size,
                shared_prefix=shared_prefix, max_context=max_context, select=select,
                gaps=gap_model, lenient=lenient, seed=seed, trace_cache_dir=cache_dir,
                rebuild_sessions=rebuild_sessions, model=model, engine=engine, slo=slo,
                repeats=repeats, replay=replay)
    fractions = _list(mem_fraction, float) if mem_fraction is not None else [None]
    if any(not 0 < f <= 1 for f in fractions if f is not None):
        raise click.BadParameter(f"{mem_fraction!r}: each must be in (0, 1]",
                                 param_hint="--mem-fraction")
    if replay == "open":
        loads = [{"time_scale": x} for x in _list(time_scale or "1.0", float)]
    else:
        loads = [{"sessions": n} for n in _list(sessions, int)]
    spec = PlanSpec(base=base, gpus=[g.upper() for g in _list(gpus)], tps=_list(tp, int),
                    routers=_list(routers), policies=_list(policies), loads=loads,
                    replicas=parse_range(replicas), search=search, pd=parse_pd(pd),
                    prices=load_gpus(prices) if prices else None, mem_fractions=fractions)
    check_spec(spec)  # every config checked before anything runs
    check_out_dir(out)
    stderr.print(spec.slo.describe(), markup=False, highlight=False)  # how --slo was read
    ex = ExecutorSpec(kind=executor, jobs=jobs, address=address).make()
    try:
        with progress("kvsim plan", "points", 0, stderr) as bar:
            shown: list[str] = []

            def report(stage: str, done: int, total: int) -> None:
                if shown[-1:] != [stage]:
                    shown.append(stage)
                    bar.describe(stage)
                bar.update(done, total)

            doc = plan(spec, out, ex, report)
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
    chosen = doc["chosen"]
    if chosen:
        stderr.print(f"pick: {chosen['size']} x {chosen['gpu']} (TP {chosen['tp']}, "
                     f"{chosen['gpus']} GPUs, ${chosen['usd_per_h']:,.2f}/h), router "
                     f"{chosen['router']}, policy {chosen['policy']}")
    else:
        stderr.print("no deployment in the range meets the SLO: widen --replicas")
    stderr.print(f"wrote {out}/plan.json, plan.csv, plan.png ({doc['points_run']} points, "
                 f"{doc['rounds']} rounds)")
