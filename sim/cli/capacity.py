"""``kvsim capacity TRACE``: hit rate against cache size, without timing
(sim/studies/capacity.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, cast

import click
import numpy as np

from sim.config import KNOBS
from sim.report.tables import Col, narrow_table

from .common import config_options, console, emit_json, parse_size, stderr
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


class ByteSizes(list):
    """``--cache`` sizes in bytes of KV memory per replica: sized into tokens per ``--model``
    (``costmodel.gpus.kv_capacity``), so curves of different models compare at equal memory."""


def parse_byte_sizes(text: str) -> ByteSizes | None:
    """``10GiB,40GiB`` or ``8GiB..64GiB[:N]`` (N log-spaced, 8 by default); None when the
    sizes are in tokens. Units as ``--gpu-cache`` spells them (``sim/deploy.py``)."""
    if "B" not in text:  # every byte unit ends in a capital B; token sizes have none
        return None
    from sim.deploy import parse_kv_bytes

    m = _RANGE.match(text)
    parts = [m.group(1), m.group(2)] if m else [x for x in text.split(",") if x.strip()]
    got = [parse_kv_bytes(x.strip()) for x in parts]
    if all(g is None for g in got):
        return None
    if any(g is None for g in got) or not got:
        raise click.BadParameter(f"give every size in bytes (40GiB) or every size in tokens "
                                 f"(256k), not both, got {text!r}")
    sizes = [int(g or 0) for g in got]
    if m:
        n = int(m.group(3) or 8)
        if not 0 < sizes[0] < sizes[1] or n < 2:
            raise click.BadParameter(f"a range is LOW..HIGH[:N] with 0 < LOW < HIGH and "
                                     f"N >= 2, got {text!r}")
        sizes = [round(float(x)) for x in np.geomspace(sizes[0], sizes[1], n)]
    if min(sizes) <= 0:
        raise click.BadParameter(f"give sizes > 0, got {text!r}")
    return ByteSizes(sorted(set(sizes)))


def _caches(ctx: Any, param: Any, value: str | None) -> list[int] | None:
    if value is None:
        return None
    return parse_byte_sizes(value) or parse_caches(value)


def bytes_to_tokens(sizes: ByteSizes, model: str, kv_dtype: str, engine: str,
                    block_size: int) -> list[int]:
    """Tokens of ``model`` (at ``kv_dtype``) each size holds on one GPU under ``engine``'s
    allocation of its KV cache groups (``costmodel.gpus.kv_capacity``: the run's
    ``gpu_cache``; docs/capacity.md); one under a block is refused naming ``--cache``."""
    from costmodel.gpus import kv_capacity
    from costmodel.specs import get_spec

    try:
        spec = get_spec(model, kv_dtype)
    except KeyError as e:
        raise click.BadParameter(str(e.args[0]), param_hint="--model") from None
    tokens = [kv_capacity(spec, b, 1, engine, block_size).tokens for b in sizes]
    for b, t in zip(sizes, tokens, strict=True):
        if t < block_size:
            raise click.BadParameter(f"{b / 2**30:g} GiB holds {t} tokens of {model}: fewer "
                                     f"than one {block_size}-token block", param_hint="--cache")
    return tokens


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
@config_options("fleet", only=("replicas", "router"))
@config_options("pool", only=("pool", "pool_write"))
@click.option("--in-flight-s", "in_flight_s", default=None, callback=_hold, metavar="SECONDS",
              help="The fleet's load model: each request counts as in flight on its replica "
                   "for SECONDS of the trace's time after it arrives (about a request's "
                   "latency). Needed by routers that weigh load (dynamo-kv, llm-d). "
                   "[default: none, every replica idle]")
@click.option("--model", "models", multiple=True,
              help="With --cache in bytes (10GiB,40GiB or 8GiB..64GiB:4; KV memory per "
                   "replica, one GPU): the model (repeatable) whose KV cache groups size "
                   "them into tokens, so curves of models compare at equal memory. "
                   "[default: qwen3-8b]")
@config_options("cache", only=("kv_dtype",))
@click.option("--engine", "size_engine", type=click.Choice(tuple(KNOBS)), default=None,
              help="With --cache in bytes: whose allocation of the KV cache groups sizes them "
                   "(docs/hybrid.md, Capacity in bytes). [default: the first --policy when it "
                   "is vllm or sglang, else sglang]")
@click.option("--out", default=None, type=click.Path(file_okay=False),
              help="Folder for capacity.json and capacity.png.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (the rows).")
def capacity_cmd(paths: tuple[str, ...], caches: list[int] | None, policies: tuple[str, ...],
                 replicas: int, router: str | None, pool: int, pool_write: str,
                 in_flight_s: float | None, models: tuple[str, ...], kv_dtype: str,
                 size_engine: str | None, out: str | None, as_json: bool, gaps: str,
                 **opts: Any) -> None:
    """Hit rate against cache size for PATH (files, a folder or synthetic:NAME), without
    timing: requests in arrival order, each matched then inserted with its output (the
    cache-only replay of Mooncake's capacity analysis). Rows: cache_tokens, replicas, router,
    policy, pool_tokens, hit_rate, ideal_hit_rate (hit rates over prompt tokens; ideal = an
    unlimited cache); with --cache in bytes, model and cache_bytes first (one curve per
    --model at equal memory)."""
    from sim.io import atomic_write_text, check_out_dir, dumps
    from sim.report.progress import progress
    from sim.studies.capacity import capacity_curve, clockless_policy, one_pass

    ctx = click.get_current_context()
    if ctx.get_parameter_source("gaps") is not click.core.ParameterSource.DEFAULT:
        raise click.BadParameter("kvsim capacity has no clock: client waits change nothing "
                                 "(requests keep their recorded arrival order)",
                                 param_hint="--gaps")
    for p in policies:
        clockless_policy(p)  # refused before the trace loads
    in_bytes = isinstance(caches, ByteSizes)
    dtype_given = ctx.get_parameter_source("kv_dtype") is not click.core.ParameterSource.DEFAULT
    for given, name in ((models, "--model"), (dtype_given, "--kv-dtype"),
                        (size_engine, "--engine")):
        if given and not in_bytes:
            raise click.BadParameter("sizes --cache given in bytes (10GiB,40GiB): give "
                                     "--cache in bytes", param_hint=name)
    engine = size_engine or (policies[0] if policies[0] in KNOBS else "sglang")
    fleet = replicas > 1 or router is not None or pool > 0
    if in_flight_s is not None and replicas < 2:
        raise click.BadParameter("a load model for a router choosing among replicas: give "
                                 "--replicas N (N >= 2)", param_hint="--in-flight-s")
    hold = in_flight_s or 0.0
    if fleet:  # the fleet view's modules (routers, SimPy) only for a fleet
        from sim.studies.capacity_fleet import clockless_router, fleet_capacity_curve

        router = router or "round-robin"
        clockless_router(router, None, hold, replicas)
    if out is not None:
        if not out.strip():
            raise click.BadParameter("an empty folder name", param_hint="--out")
        check_out_dir(out)
    trace = load_from_options(list(paths), **opts)
    # (model, byte sizes, token sizes) per curve; one curve in tokens without --cache bytes
    curves: list[tuple[str | None, list[int], list[int]]] = []
    if in_bytes:
        for m in models or ("qwen3-8b",):
            tokens = bytes_to_tokens(cast(ByteSizes, caches), m, kv_dtype, engine,
                                     trace.block_size)
            curves.append((m, list(cast(ByteSizes, caches)), tokens))
            stderr.print(f"[dim]{m} ({kv_dtype} KV, {engine} groups): "
                         f"{size_echo(tokens, pool, fleet)}[/dim]")
    else:
        caches = caches or _default_caches(trace)
        curves.append((None, [], caches))
        stderr.print(f"[dim]{size_echo(caches, pool, fleet)}[/dim]")
    # one replay of an unlimited cache for the ideal, which gives every size of the vllm
    # preset too (one LRU stack); one replay per (size, policy) for every other policy
    per_size = len(policies) if fleet else sum(not one_pass(p) for p in policies)
    total = sum(len(trace) * (len(set(c[2])) * per_size + 1) for c in curves)
    docs: list[dict[str, Any]] = []
    with progress("kvsim capacity", "requests", total, stderr) as bar:
        for model, nbytes, sizes in curves:
            unique = sorted(set(sizes))
            bar.describe("unlimited cache" if fleet or per_size == len(policies) else
                         f"unlimited cache (LRU: all {len(unique)} sizes from its stack)")
            if fleet:
                rows = fleet_capacity_curve(trace, unique, replicas, router, pool,
                                            policies, pool_write=pool_write,
                                            in_flight_s=hold)
            else:
                rows = capacity_curve(trace, unique, policies)
            warn_idle_replicas(rows)
            if model is None:
                docs += [r.as_dict() for r in rows]
                continue
            by_tokens: dict[int, list[dict[str, Any]]] = {}
            for r in rows:
                by_tokens.setdefault(r.cache_tokens, []).append(r.as_dict())
            docs += [{"model": model, "cache_bytes": b, **d}
                     for b, t in zip(nbytes, sizes, strict=True) for d in by_tokens[t]]
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
    if in_bytes:
        cols[0:0] = [Col("model", "model"), Col("KV\n(GiB)", "cache_gib")]
    if fleet:
        cols[1:1] = [Col("N", "replicas", "int"), Col("router", "router"),
                     Col("pool\n(tokens)", "pool_tokens", "int")]
        cols.append(Col("from\npool", "pool_hit_rate", "rate"))
    rows = [{**d, "of_ideal": d["hit_rate"] / d["ideal_hit_rate"] if d["ideal_hit_rate"]
             else math.nan, "cache_gib": f"{d.get('cache_bytes', 0) / 2**30:g}"} for d in docs]
    console().print(narrow_table(f"kvsim capacity: {title}", cols, rows))
    if docs:
        console().print(f"infinite cache: {docs[0]['ideal_hit_rate']:.1%} of prompt tokens")
