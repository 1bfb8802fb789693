"""``kvsim capacity TRACE``: hit rate against cache size, without timing (sim/capacity.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import click
import numpy as np

from .common import console, emit_json, parse_size, stderr
from .tables import Col, narrow_table
from .trace import load_from_options, trace_options

_RANGE = re.compile(r"^\s*([^.:]+)\.\.([^.:]+)(?::(\d+))?\s*$")


def parse_caches(text: str) -> list[int]:
    """``300k,1m,3m`` (a list) or ``256k..64m[:N]`` (N log-spaced sizes, 8 by default, both
    ends included). Sizes as everywhere: K = 1024 tokens."""
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


def _default_caches(trace) -> list[int]:
    """From 64K tokens to the trace's distinct footprint, 8 log-spaced sizes."""
    footprint = int(trace.prompt_tokens.sum() - trace.infinite_cache_hits().sum()
                    * trace.block_size)
    hi = max(footprint, 1 << 17)
    return parse_caches(f"{1 << 16}..{hi}:8")


@click.command("capacity")
@click.argument("paths", nargs=-1, required=True)
@trace_options
@click.option("--cache", "caches", default=None, callback=_caches,
              metavar="SIZES|LOW..HIGH[:N]",
              help="Cache sizes per replica: a list (300k,1m,3m,10m,50m) or a log-spaced "
                   "range (256k..64m:8). [default: 64k to the trace's distinct footprint]")
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
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="Folder for capacity.json and capacity.png.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (the rows).")
def capacity_cmd(paths: tuple[str, ...], caches: list[int] | None, policies: tuple[str, ...],
                 replicas: int, router: str | None, pool: str | None, pool_write: str,
                 out: str | None, as_json: bool, gap_model: str, **opts: Any) -> None:
    """Hit rate against cache size for PATH (files, a folder or synthetic:NAME), without
    timing: requests in arrival order, each matched then inserted (the cache-only replay of
    Mooncake's capacity analysis). Rows: cache_tokens, replicas, router, policy, pool_tokens,
    hit_rate, ideal_hit_rate (hit rates over prompt tokens; ideal = an unlimited cache)."""
    from sim.capacity import capacity_curve, clockless_policy
    from sim.capacity_fleet import clockless_router, fleet_capacity_curve
    from sim.io import atomic_write_text, check_out_dir, dumps

    for p in policies:
        clockless_policy(p)  # refused before the trace loads
    fleet = replicas > 1 or router is not None or pool is not None
    if fleet:
        router = router or "round-robin"
        clockless_router(router)
    pool_tokens = parse_size(pool, "--pool") if pool is not None else 0
    if pool is not None and pool_tokens <= 0:
        raise click.BadParameter(f"a pool size > 0, got {pool!r}", param_hint="--pool")
    if out is not None:
        if not out.strip():
            raise click.BadParameter("an empty folder name", param_hint="--out")
        check_out_dir(out)
    trace = load_from_options(list(paths), **opts)
    caches = caches or _default_caches(trace)
    from rich.progress import BarColumn, Progress, TimeRemainingColumn

    total = len(trace) * len(caches) * len(policies)
    with Progress("capacity", BarColumn(), "{task.completed:,}/{task.total:,} requests",
                  TimeRemainingColumn(), console=stderr, transient=True) as bar:
        task = bar.add_task("capacity", total=total)
        if fleet:
            rows = fleet_capacity_curve(trace, caches, replicas, router, pool_tokens,
                                        policies, progress=lambda k: bar.advance(task, k),
                                        pool_write=pool_write)
        else:
            rows = capacity_curve(trace, caches, policies,
                                  progress=lambda k: bar.advance(task, k))
    docs = [r.as_dict() for r in rows]
    title = (f"{trace.name}: {len(trace):,} requests, "
             f"{int(trace.prompt_tokens.sum()):,} prompt tokens")
    if out is not None:
        from sim.plots import plot_capacity

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
