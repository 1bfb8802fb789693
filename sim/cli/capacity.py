"""``kvsim capacity TRACE``: hit rate against cache size, without timing
(sim/studies/capacity.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import click
import numpy as np

from sim.report.tables import Col, narrow_table

from .common import console, emit_json, parse_size, stderr
from .trace import load_from_options, trace_options

_RANGE = re.compile(r"^\s*([^:]+?)\.\.([^:]+?)(?::(\d+))?\s*$")


def parse_caches(text: str) -> list[int]:
    """``300k,1m,3m`` (a list) or ``256k..64m[:N]`` (N log-spaced sizes, 8 by default, both
    ends included). Sizes as everywhere (``parse_size``): ``3e6`` is 3,000,000 tokens, ``3m``
    and ``3Mi`` are 3 x 1,048,576."""
    m = _RANGE.match(text)
    if m:
        lo, hi = parse_size(m.group(1), "--cache"), parse_size(m.group(2), "--cache")
        n = int(m.group(3) or 8)
        if not 0 < lo < hi or n < 2:
            raise click.BadParameter(f"a range is LOW..HIGH[:N] with 0 < LOW < HIGH and "
                                     f"N >= 2, got {text!r}")
        sizes = np.geomspace(lo, hi, n)
        return sorted({round(float(s)) for s in sizes})
    sizes = [parse_size(part, "--cache") for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) <= 0:
        raise click.BadParameter(f"give sizes > 0 (300k,1m) or a range (256k..64m:8), "
                                 f"got {text!r}")
    return sorted(set(sizes))


def _caches(ctx: Any, param: Any, value: str | None) -> list[int] | None:
    return None if value is None else parse_caches(value)


def _hold(ctx: Any, param: Any, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise click.BadParameter(f"seconds > 0 (leave the option out for idle replicas), "
                                 f"got {value!r}")
    return x


def _default_caches(trace) -> list[int]:
    """From 64K tokens to the trace's distinct footprint, 8 log-spaced sizes."""
    footprint = int(trace.prompt_tokens.sum() - trace.infinite_cache_hits().sum()
                    * trace.block_size)
    hi = max(footprint, 1 << 17)
    return parse_caches(f"{1 << 16}..{hi}:8")


def size_echo(caches: list[int], pool_tokens: int, fleet: bool) -> str:
    """The sizes of the run in tokens, whatever their spelling (K = 1,024 tokens)."""
    per = " per replica" if fleet else ""
    text = f"cache sizes{per} (tokens): {', '.join(f'{c:,}' for c in caches)}"
    if pool_tokens:
        text += f"; pool {pool_tokens:,} tokens"
    return text


def warn_idle_replicas(rows: list) -> None:
    """Say when most of a fleet sat idle: the curve is then that of fewer caches."""
    for r in rows:
        if r.replicas > 1 and 2 * r.idle_replicas >= r.replicas:
            stderr.print(f"[yellow]warning:[/yellow] {r.router}, {r.cache_tokens:,}-token "
                         f"caches: {r.idle_replicas} of {r.replicas} replicas served under a "
                         "tenth of an even share of the requests; the fleet is in effect "
                         f"{r.replicas - r.idle_replicas} cache(s)")


@click.command("capacity")
@click.argument("paths", nargs=-1, required=True)
@trace_options
@click.option("--cache", "caches", default=None, callback=_caches,
              metavar="SIZES|LOW..HIGH[:N]",
              help="Cache sizes per replica in tokens: a list (300k,1m,3m,10m,50m) or a "
                   "log-spaced range (256k..64m:8); k and m are binary (3m = 3,145,728), "
                   "3e6 is 3,000,000. [default: 64k to the trace's distinct footprint]")
@click.option("--policy", "policies", multiple=True, default=("vllm",), show_default=True,
              help="Eviction policy (repeatable): any that needs no clock (vllm = LRU "
                   "block by block from the tail, sglang, penelope, a spec, FILE.py:CLASS).")
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(min=1),
              help="Replicas behind --router, each with a cache of every --cache size.")
@click.option("--router", default=None,
              help="Router of the fleet view (a registered name or FILE.py:CLASS): every "
                   "replica idle, cache views exact; one that prices time is refused. "
                   "[default: round-robin with --replicas > 1]")
@click.option("--pool", "pool", default=None, metavar="SIZE",
              help="A KV pool of SIZE tokens shared by the replicas, below their caches "
                   "(write-through, watermark eviction).")
@click.option("--pool-write", type=click.Choice(["write-through", "write-back"]),
              default="write-through", show_default=True,
              help="When blocks enter the pool: a replica writes them, or drops them.")
@click.option("--in-flight-s", "in_flight_s", default=None, callback=_hold, metavar="SECONDS",
              help="The fleet's load model: each request counts as in flight on its replica "
                   "for SECONDS of the trace's time after it arrives (about a request's "
                   "latency). Needed by routers that weigh load (dynamo-kv, llm-d). "
                   "[default: none, every replica idle]")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="Folder for capacity.json and capacity.png.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (the rows).")
def capacity_cmd(paths: tuple[str, ...], caches: list[int] | None, policies: tuple[str, ...],
                 replicas: int, router: str | None, pool: str | None, pool_write: str,
                 in_flight_s: float | None, out: str | None, as_json: bool, gap_model: str,
                 **opts: Any) -> None:
    """Hit rate against cache size for PATH (files, a folder or synthetic:NAME), without
    timing: requests in arrival order, each matched then inserted with its output (the
    cache-only replay of Mooncake's capacity analysis). Rows: cache_tokens, replicas, router,
    policy, pool_tokens, hit_rate, ideal_hit_rate (hit rates over prompt tokens; ideal = an
    unlimited cache)."""
    from sim.io import atomic_write_text, check_out_dir, dumps
    from sim.report.progress import progress
    from sim.studies.capacity import capacity_curve, clockless_policy, one_pass

    ctx = click.get_current_context()
    if ctx.get_parameter_source("gap_model") is not click.core.ParameterSource.DEFAULT:
        raise click.BadParameter("kvsim capacity has no clock: client waits change nothing "
                                 "(requests keep their recorded arrival order)",
                                 param_hint="--gaps")
    for p in policies:
        clockless_policy(p)  # refused before the trace loads
    fleet = replicas > 1 or router is not None or pool is not None
    if in_flight_s is not None and replicas < 2:
        raise click.BadParameter("a load model for a router choosing among replicas: give "
                                 "--replicas N (N >= 2)", param_hint="--in-flight-s")
    hold = in_flight_s or 0.0
    if fleet:  # the fleet view's modules (routers, SimPy) only for a fleet
        from sim.studies.capacity_fleet import clockless_router, fleet_capacity_curve

        router = router or "round-robin"
        clockless_router(router, None, hold, replicas)
    pool_tokens = parse_size(pool, "--pool") if pool is not None else 0
    if pool is not None and pool_tokens <= 0:
        raise click.BadParameter(f"a pool size > 0, got {pool!r}", param_hint="--pool")
    if out is not None:
        if not out.strip():
            raise click.BadParameter("an empty folder name", param_hint="--out")
        check_out_dir(out)
    trace = load_from_options(list(paths), **opts)
    caches = caches or _default_caches(trace)
    stderr.print(f"[dim]{size_echo(caches, pool_tokens, fleet)}[/dim]")
    # one replay of an unlimited cache for the ideal, which gives every size of the vllm
    # preset too (one LRU stack); one replay per (size, policy) for every other policy
    per_size = len(policies) if fleet else sum(not one_pass(p) for p in policies)
    total = len(trace) * (len(caches) * per_size + 1)
    with progress("kvsim capacity", "requests", total, stderr) as bar:
        bar.describe("unlimited cache" if fleet or per_size == len(policies) else
                     f"unlimited cache (LRU: all {len(caches)} sizes from its stack)")
        if fleet:
            rows = fleet_capacity_curve(trace, caches, replicas, router, pool_tokens,
                                        policies, pool_write=pool_write, in_flight_s=hold)
        else:
            rows = capacity_curve(trace, caches, policies)
    warn_idle_replicas(rows)
    docs = [r.as_dict() for r in rows]
    title = (f"{trace.name}: {len(trace):,} requests, "
             f"{int(trace.prompt_tokens.sum()):,} prompt tokens")
    if out is not None:
        from sim.report.plots import plot_capacity

        atomic_write_text(Path(out) / "capacity.json", dumps({"trace": trace.name,
                                                               "rows": docs}))
        plot_capacity(docs, title, Path(out) / "capacity.png")
    if as_json:
        emit_json(docs)
        return
    cols = [Col("cache\n(tokens)", "cache_tokens", "int"), Col("policy", "policy"),
            Col("hit\nrate", "hit_rate", "rate"), Col("of infinite\ncache", "of_ideal", "rate")]
    if fleet:
        cols[1:1] = [Col("N", "replicas", "int"), Col("router", "router"),
                     Col("pool\n(tokens)", "pool_tokens", "int")]
        cols.append(Col("from\npool", "pool_hit_rate", "rate"))
    rows = [{**d, "of_ideal": d["hit_rate"] / d["ideal_hit_rate"] if d["ideal_hit_rate"]
             else math.nan} for d in docs]
    console().print(narrow_table(f"kvsim capacity: {title}", cols, rows))
    if docs:
        console().print(f"infinite cache: {docs[0]['ideal_hit_rate']:.1%} of prompt tokens")
