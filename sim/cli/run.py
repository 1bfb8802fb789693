"""``kvsim run``: replay one trace under one or more policies and compare them."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from sim.config import RunConfig

from .common import SIZE, atomic_write_text, console, dumps, emit_json, stderr
from .trace import trace_options

if TYPE_CHECKING:
    from sim.runner import RunResult

# Summary metrics shown in the table and compared against the first run (lower is better
# except the hit rate).
COMPARED = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "jct_mean_s", "hit_rate",
            "recomputed_tokens", "recompute_units", "queue_wait_mean_s")


def change(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a != a or b != b or a == 0:
        return None
    return b / a - 1.0


def compare_runs(results: list[RunResult]) -> list[dict[str, Any]]:
    first = results[0].summary
    out = []
    for r in results:
        c = r.config
        out.append({
            "policy": c.policy_label, "policy_spec": c.policy_spec,
            "policy_params": c.policy_params, "scheduler": c.scheduler, "tiering": c.tiering,
            "summary": r.summary,
            "change_vs_first": {k: change(first.get(k), r.summary.get(k)) for k in COMPARED},
        })
    return out


def print_table(runs: list[dict[str, Any]], title: str) -> None:
    t = Table(title=title)
    t.add_column("metric")
    for r in runs:
        t.add_column(r["policy"], justify="right")
    fmt = {"hit_rate": "{:.1%}", "recomputed_tokens": "{:,.0f}", "recompute_units": "{:.3e}"}
    extra = ("cpu_hit_rate", "bytes_h2d", "bytes_d2h", "swap_buffer_loads") if any(
        r["summary"].get("cpu_cache_tokens") for r in runs) else ()
    fmt.update({"cpu_hit_rate": "{:.1%}", "bytes_h2d": "{:.3e}", "bytes_d2h": "{:.3e}"})
    for k in (*COMPARED, *extra, "requests", "evicted_tokens", "dropped_requests"):
        cells = []
        for i, r in enumerate(runs):
            v = r["summary"].get(k)
            s = "-" if v is None or v != v else fmt.get(k, "{:.3f}" if isinstance(v, float)
                                                        else "{:,}").format(v)
            ch = r["change_vs_first"].get(k)
            if i > 0 and ch is not None:
                s += f" ({ch:+.1%})"
            cells.append(s)
        t.add_row(k, *cells)
    console().print(t)


def parse_params(items: tuple[str, ...]) -> dict[str, str]:
    """``K=V`` items into a dict (values stay text: the policy class types them)."""
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise click.BadParameter(f"{item!r} is not K=V", param_hint="--policy-param")
        out[k.strip()] = v.strip()
    return out


def policy_configs(base: RunConfig, preset: str | None, evict: str | None,
                   granularity: str | None, order: str | None, policies: tuple[str, ...],
                   policy_params: tuple[str, ...]) -> list[RunConfig]:
    """The runs one ``kvsim run`` compares, the first being the baseline. A policy is chosen
    one way: presets, a composed order/start/granularity, or --policy (after presets)."""
    composed = evict or granularity or order
    if composed and (preset or policies):
        other = "--preset" if preset else "--policy"
        raise click.UsageError(f"--evict/--granularity/--order compose one policy: they "
                               f"cannot be combined with {other}")
    params = parse_params(policy_params)
    if params and not policies:
        raise click.UsageError("--policy-param needs --policy")
    if composed:
        return [replace(base, evict=evict, granularity=granularity, order=order)]
    configs = []
    if preset is not None:
        names = [p.strip() for p in preset.split(",")]
        if not all(names):
            raise click.BadParameter(f"{preset!r} has an empty name", param_hint="--preset")
        configs += [base.with_preset(p) for p in names]
    configs += [base.with_policy(p, params) for p in policies]
    if not configs:
        configs = [base.with_preset(p) for p in ("sglang", "vllm", "penelope")]
    labels = [c.policy_label for c in configs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise click.UsageError(f"policy {dup[0]!r} is given twice")
    return configs


@click.command("run")
@click.option("--trace", "-t", default="synthetic:claude-code", show_default=True,
              help="Trace path(s) (comma-separated) or synthetic:NAME[?k=v&...].")
@trace_options
@click.option("--model", "-m", default="qwen3-8b", show_default=True)
@click.option("--profile", "-p", default=None,
              help="Profile name or file (default kernels-h100_sxm-MODEL).")
@click.option("--gpu-cache", type=SIZE, default="256k", show_default=True,
              help="GPU KV capacity in tokens.")
@click.option("--cpu-cache", type=SIZE, default="0", show_default=True,
              help="CPU KV capacity in tokens (two tiers).")
@click.option("--tiering", type=click.Choice(["unified", "hicache"]), default="unified",
              show_default=True)
@click.option("--swap-buffer", type=SIZE, default="1024", show_default=True,
              help="unified: CPU swap buffer (tokens) used when both tiers are full.")
@click.option("--hicache-write-policy", type=click.Choice(
    ["write_through", "write_through_selective", "write_back"]), default="write_through",
    show_default=True)
@click.option("--sessions", "-n", type=int, default=4, show_default=True,
              help="Sessions active at once (closed loop).")
@click.option("--replay", type=click.Choice(["closed", "open"]), default="closed",
              show_default=True)
@click.option("--time-scale", type=float, default=1.0, show_default=True,
              help="Open loop: multiply recorded send times (0.5 = twice the request rate).")
@click.option("--preset", default=None,
              help="Comma-separated presets (sglang, vllm, penelope); the first is the baseline. "
                   "Default: sglang,vllm,penelope unless another policy option is given.")
@click.option("--evict", type=click.Choice(["tail", "leaf-head", "private-head"]), default=None,
              help="Start position of a composed policy (with --granularity, --order).")
@click.option("--granularity", type=click.Choice(["node", "block"]), default=None,
              help="Granularity of a composed policy: whole nodes or exact blocks.")
@click.option("--order", default=None,
              help="Victim order of a composed policy (lru, lfu, mru, fifo, or registered).")
@click.option("--policy", "policies", multiple=True,
              help="A policy by name (preset, order+start+granularity, registered) or "
                   "FILE.py:CLASS (your own EvictionPolicy subclass); repeat to compare. "
                   "Runs after any --preset.")
@click.option("--policy-param", "policy_params", multiple=True, metavar="K=V",
              help="Parameter of the --policy classes, e.g. --policy-param tau_s=5 "
                   "(repeatable; typed like the class's default).")
@click.option("--scheduler", type=click.Choice(["fcfs", "lpm", "lpm-cpu"]), default="lpm",
              show_default=True)
@click.option("--chunk-size", type=SIZE, default="8192", show_default=True)
@click.option("--prompt-nodes", type=click.Choice(["chunked", "whole"]), default="chunked",
              show_default=True,
              help="chunked: each prefill chunk enters the tree as it finishes (SGLang), so "
                   "nodes hold <= chunk-size tokens; whole: a prompt enters once done.")
@click.option("--max-new-tokens", type=int, default=None,
              help="Assumed max_new_tokens (default: unset, SGLang reserves up to 4096).")
@click.option("--max-running", type=int, default=None)
@click.option("--debug-cache", is_flag=True, help="Recount cache invariants after every op.")
@click.option("--out", "-o", default=None, help="Write requests.parquet, summary.json, "
              "config.json per run under this directory.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def run_cmd(trace, trace_format, block_size, shared_prefix, max_context, select, gap_model,
            lenient, seed, cache_dir, rebuild_sessions, model, profile, gpu_cache, cpu_cache,
            tiering, swap_buffer, hicache_write_policy, sessions, replay, time_scale, preset,
            evict, granularity, order, policies, policy_params, scheduler, chunk_size,
            prompt_nodes, max_new_tokens, max_running, debug_cache, out, as_json) -> None:
    """Replay a trace through the simulated server under each policy; report TTFT, JCT, hits."""
    from sim.runner import run, write_result  # the engine loads only when a run is asked for

    base = RunConfig(
        trace=trace, trace_format=trace_format, select=select, shared_prefix=shared_prefix,
        max_context=max_context, block_size=block_size, gaps=gap_model, lenient=lenient,
        trace_cache_dir=cache_dir, rebuild_sessions=rebuild_sessions,
        sessions=sessions, replay=replay, time_scale=time_scale,
        model=model, profile=profile, gpu_cache=gpu_cache, cpu_cache=cpu_cache,
        tiering=tiering, swap_buffer=swap_buffer, hicache_write_policy=hicache_write_policy,
        scheduler=scheduler, chunk_size=chunk_size,
        checkpoint_chunks=prompt_nodes == "chunked",
        max_new_tokens=max_new_tokens, max_running=max_running, seed=seed,
        debug_cache=debug_cache)
    configs = policy_configs(base, preset, evict, granularity, order, policies, policy_params)
    results = []
    for cfg in configs:
        cfg.validate("command line")
        t0 = time.perf_counter()  # wall time for the progress line only, never in results
        res = run(cfg)
        stderr.print(f"[dim]{cfg.policy_label}: {res.summary['requests']} requests in "
                     f"{time.perf_counter() - t0:.1f}s[/dim]")
        results.append(res)
        if out:
            write_result(res, f"{out}/{cfg.policy_label}")
    runs = compare_runs(results)
    if out:
        atomic_write_text(f"{out}/runs.json", dumps({"runs": runs}) + "\n")
    if as_json:
        emit_json({"runs": runs})
        return
    s = results[0].summary
    cpu = f" + CPU {cpu_cache:,} ({tiering})" if cpu_cache else ""
    print_table(runs, f"{s['trace']} ({s['trace_requests']} requests), {model}, "
                      f"GPU {gpu_cache:,} tokens{cpu}, N={sessions}, {scheduler}, "
                      f"gaps {gap_model}")
    if out:
        print(f"wrote {out}/", file=sys.stderr)
