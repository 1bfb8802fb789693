"""``kvsim run``: replay one trace under one or more policies and compare them."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import click

from sim.config import DEFAULTS, RunConfig
from sim.report.runs import compare_runs, run_tables

from .common import atomic_write_text, config_options, console, dumps, emit_json, stderr
from .run_checks import (
    default_replay,
    note_throttled,
    option_spelling,
    params_per_policy,
    refuse_idle_options,
    warn_capped_shared_prefix,
    warn_idle_replicas,
    warn_saturation,
)

if TYPE_CHECKING:
    from sim.run import RunResult

def parse_router_params(items: tuple[str, ...]) -> dict[str, str]:
    """``--router-param K=V`` items into a dict (values stay text: the router class types
    them)."""
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise click.BadParameter(f"{item!r} is not K=V", param_hint="--router-param")
        out[k.strip()] = v.strip()
    return out


def print_table(runs: list[dict[str, Any]], title: str, lenient: bool = False) -> None:
    con = console()
    for t in run_tables(runs, title, con.width, lenient):
        con.print(t)


def policy_configs(base: RunConfig, preset: str | None, evict: str | None,
                   granularity: str | None, order: str | None, policy: tuple[str, ...],
                   policy_params: tuple[str, ...]) -> list[RunConfig]:
    """The runs one ``kvsim run`` compares, the first being the baseline. A policy is chosen
    one way: presets, a composed order/start/granularity, or --policy (after presets)."""
    policies = policy
    composed = evict or granularity or order
    if composed and (preset or policies):
        other = "--preset" if preset else "--policy"
        raise click.UsageError(f"--evict/--granularity/--order compose one policy: they "
                               f"cannot be combined with {other}")
    if policy_params and not policies:
        raise click.UsageError("--policy-param needs --policy")
    params = params_per_policy(policies, policy_params)
    if composed:
        return [base.with_fields(evict=evict, granularity=granularity, order=order)]
    configs = []
    if preset is not None:
        names = [p.strip() for p in preset.split(",")]
        if not all(names):
            raise click.BadParameter(f"{preset!r} has an empty name", param_hint="--preset")
        configs += [base.with_preset(p) for p in names]
    configs += [base.with_policy(p, params[p]) for p in policies]
    if not configs:
        from sim.engines import ENGINES

        configs = [base.with_preset(p) for p in ENGINES[base.engine.name].default_presets]
    labels = [c.policy_label for c in configs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise click.UsageError(f"policy {dup[0]!r} is given twice")
    return configs


def warn_quiet_surprises(res: RunResult, spec_context: int) -> None:
    """Drops and over-long prompts, said out loud; every request dropped is an error."""
    s, c = res.summary, res.config
    dropped = s.get("dropped_requests") or 0
    over = s.get("over_context_requests") or 0
    if over:
        stderr.print(f"[yellow]warning:[/yellow] {c.policy_label}: {over:,} requests have "
                     f"prompts above {c.cache.model}'s {spec_context:,}-token context; replayed "
                     "anyway (a server would refuse them): cut the trace with --max-context")
    aborted = s.get("aborted") or 0
    if aborted:
        stderr.print(f"[yellow]warning:[/yellow] {c.policy_label}: the server aborted "
                     f"{aborted:,} requests before their output was complete (a lone request "
                     "whose KV cannot grow): not served, they meet no SLO")
    if not dropped:
        return
    why = []
    if s.get("dropped_over_context"):
        why.append(f"{s['dropped_over_context']:,} with a prompt above {c.cache.model}'s "
                   f"{spec_context:,}-token context")
    if s.get("dropped_cache_too_small"):
        why.append(f"{s['dropped_cache_too_small']:,} that cannot fit a "
                   f"{c.cache.gpu_cache:,}-token "
                   "cache (prompt + decode reservation)")
    if not s.get("requests") and not aborted:
        raise RunInputError(f"--gpu-cache {c.cache.gpu_cache:,}: every request ({dropped:,}) was "
                            f"dropped: {'; '.join(why)}")
    stderr.print(f"[yellow]warning:[/yellow] {c.policy_label}: dropped {dropped:,} requests: "
                 f"{'; '.join(why)}")


def warn_pool_notes(res: RunResult) -> None:
    """A fleet's pool notes (sim/fleet/pooltier.py ``pool_notes``), said out loud."""
    for note in res.summary.get("pool_notes", ()):
        stderr.print(f"[yellow]warning:[/yellow] {res.config.policy_label}: {note}")


class RunInputError(ValueError):
    """A run that could not replay anything (exit status 2)."""

    exit_code = 2


def refuse_inflight_kv_loads(ctx: click.Context, param: click.Parameter,
                             value: int | None) -> None:
    """vLLM 0.34's --max-num-inflight-kv-loads, refused by name: kvsim's decode worker
    allocates a remote load only in the waiting loop, with token budget and a max_num_seqs
    slot left (sim/engines/vllm.py ``_allocate_remote``), never from a second queue that
    starts loads once both are spent."""
    if value is not None:
        raise click.BadParameter(
            "kvsim does not model vLLM 0.34's cap on KV loads in flight: its decode worker "
            "starts a remote KV load only when the step has token budget and a max_num_seqs "
            "slot left (vLLM's default, the option unset); drop the option", ctx, param)


def size_header(cfg: RunConfig) -> str:
    """Every size of the run in tokens, whatever its spelling (``3m`` is 3,145,728)."""
    parts = [f"GPU cache {cfg.cache.gpu_cache:,}"]
    if cfg.cache.cpu_cache:
        parts += [f"CPU cache {cfg.cache.cpu_cache:,}", f"swap buffer {cfg.cache.swap_buffer:,}"]
    if cfg.pool.size:
        parts.append(f"pool {cfg.pool.size:,} shared")
    if cfg.traffic.max_context is not None:
        parts.append(f"max context {cfg.traffic.max_context:,}")
    if isinstance(cfg.traffic.shared_prefix, int):
        parts.append(f"shared prefix {cfg.traffic.shared_prefix:,}")
    parts.append(f"chunk {cfg.engine.chunk_size:,}")
    return "sizes in tokens: " + ", ".join(parts)


def timeline_path(path: str, policy: str, runs: int) -> str:
    """``path`` for one run; ``STEM-POLICY.SUFFIX`` per policy when several run."""
    if runs == 1:
        return path
    from pathlib import Path

    p = Path(path)
    return str(p.with_name(f"{p.stem}-{policy}{p.suffix or '.json'}"))


def check_timeline_paths(path: str, policies: list[str], out: str | None) -> list[str]:
    """The file ``--timeline path`` writes per policy, each checked before any run (as
    ``--out`` is: sim/io ``check_out_file``); refused too: a path ``--out`` writes itself (a
    policy folder, a file of one, runs.json), which the run's results would collide with."""
    from pathlib import Path

    from sim.io import InputError, check_out_file
    from sim.run import RESULT_FILES, RUN_FOLDER_FILES

    check_out_file(path, "--timeline")  # as typed: an empty name or a folder names no file
    paths = [timeline_path(path, p, len(policies)) for p in policies]
    taken: dict[Path, str] = {}
    if out is not None:
        root = Path(out).expanduser().resolve()
        taken = {root / f: f"--out's {f}" for f in RUN_FOLDER_FILES}
        for p in policies:
            taken[root / p] = f"--out's folder for {p}"
            taken.update({root / p / f: f"--out's {p}/{f}" for f in RESULT_FILES})
    for p in paths:
        clash = taken.get(Path(p).expanduser().resolve())
        if clash is not None:
            raise InputError(f"--timeline {p}: {clash} is written there")
        check_out_file(p, "--timeline")
    return paths


def gpu_header(cfg: RunConfig) -> str:
    """The deployment in GPUs: KV tokens per replica and per GPU, and the profile, saying
    when it was not measured for this GPU and TP."""
    if cfg.cache.gpu is None and cfg.cache.gpu_cache_bytes is None:
        return ""
    from sim.deploy import profile_note, replica_tp, sizing_note

    tp, how = replica_tp(cfg), sizing_note(cfg)
    on = (f"{cfg.fleet.replicas * tp} x {cfg.cache.gpu or 'GPU'} ({cfg.fleet.replicas} "
          f"replica{'s' if cfg.fleet.replicas != 1 else ''} x TP {tp})")
    line = (f"GPUs: {on}, {how}: KV cache {cfg.cache.gpu_cache:,} tokens per replica "
            f"({cfg.cache.gpu_cache // tp:,} per GPU) of {cfg.cache.model}")
    if cfg.cache.gpu is not None:
        from costmodel.profile import load_profile

        note = profile_note(cfg, load_profile(cfg.cache.profile, cfg.cache.model))
        line += f"; profile {cfg.cache.profile}" + (f" ({note})" if note else " (measured)")
    return line


@click.command("run")
@config_options()  # every section's fields that declare an option (sim/config.py option)
@click.option("--max-num-inflight-kv-loads", type=int, default=None, expose_value=False,
              metavar="N", callback=refuse_inflight_kv_loads,
              help="vLLM 0.34's cap on a decode worker's KV loads in flight: not modelled "
                   "(refused; docs/engine.md).")
@click.option("--out", "-o", default=None, help="Write requests.parquet, config.json, "
              "summary.json per run under this folder (checked before anything runs); a "
              "previous run's outputs there (runs.json, plots, policy folders) are removed "
              "first, other files stay.")
@click.option("--timeline", default=None, metavar="FILE",
              help="Write the run's batches, decode runs, evictions, loads and queue depth as "
                   "Chrome trace-event JSON (opens in ui.perfetto.dev and chrome://tracing); "
                   "several policies: FILE-POLICY.json each; --repeats: the first repeat's "
                   "(checked before anything runs; stderr names each file).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def run_cmd(out: str | None, timeline: str | None, as_json: bool, **fields: Any) -> None:
    """Replay a trace through the simulated server under each policy; report TTFT, JCT, hits."""
    from costmodel.specs import get_spec
    from sim.checks import check_model_and_profile
    from sim.context import parse_context
    from sim.io import check_out_dir
    from sim.report.progress import progress
    from sim.run import check, load_run_trace, run, write_result  # engines load on demand

    from .common import trace_load_progress

    # every option is named as its flat field (sim/config.py option, config_options); the
    # policy options compose the runs compared, the rest make the base config
    ctx = click.get_current_context()
    policy = {k: fields.pop(k) for k in ("preset", "evict", "granularity", "order", "policy",
                                         "policy_params")}
    fields["router_params"] = parse_router_params(fields["router_params"])
    if fields["replay"] is None:
        fields["replay"] = default_replay(fields["trace"], fields["trace_format"])
    from sim.deploy import resolve_gpu_fields

    fields = resolve_gpu_fields(fields, "command line", option_spelling(ctx))
    if fields["gpu_cache"] is None:
        fields["gpu_cache"] = DEFAULTS["gpu_cache"]
    base = RunConfig.from_flat("command line", **fields)
    refuse_idle_options(ctx, base)
    configs = policy_configs(base, **policy)
    t, c, repeats = base.traffic, base.cache, base.repeats
    # Every input check before any work: configs, model, profile, the output folder.
    for cfg in configs:
        check(cfg, "command line")
    check_model_and_profile(configs[0], "command line")
    from sim.run.repeats import seed_users

    if repeats > 1 and not any(seed_users(cfg) for cfg in configs):
        # Repeats vary the decision seed only: here N repeats would be one run N times.
        stderr.print(f"[yellow]warning:[/yellow] --repeats {repeats}: nothing in this run draws "
                     "from the seed (one server, deterministic policies, the trace fixed), so "
                     "every repeat would be the same run: running it once (repeats 1)")
        repeats = 1
        configs = [cfg.with_fields(repeats=1) for cfg in configs]
    if out is not None:
        check_out_dir(out)
    timelines = None if timeline is None else check_timeline_paths(
        timeline, [c.policy_label for c in configs], out)
    if out is not None:  # a reused folder: the previous run's outputs go (docs: --out)
        from sim.run import clear_run_outputs

        gone = clear_run_outputs(out)
        if gone:
            stderr.print(f"[dim]{out}: removed the previous run's {', '.join(gone)}[/dim]")
    spec_context = get_spec(c.model).max_context
    t0 = time.perf_counter()  # wall time for the progress lines only, never in results
    with trace_load_progress():
        traces = [load_run_trace(cfg) for cfg in configs]
    tr = traces[0]
    from traces.load import check_shared_prefix

    check_shared_prefix(tr, t.shared_prefix)
    from sim.fleet.results import check_fleet_size

    for cfg, trace in zip(configs, traces, strict=True):
        check_fleet_size(cfg, trace)  # before any run: a fleet the trace cannot occupy
    warn_capped_shared_prefix(tr, t.shared_prefix, c.block_size)
    stderr.print(f"[dim]trace {tr.name}: {len(tr):,} requests loaded in "
                 f"{time.perf_counter() - t0:.1f}s[/dim]")
    stderr.print(f"[dim]{size_header(base)}[/dim]")
    vllm = base.engine.name == "vllm"
    if vllm and base.value("vllm_version") == "0.33" and c.block_size != 16:
        stderr.print(f"[dim]--vllm-version 0.33: vLLM 0.33 deployed 16-token KV blocks on CUDA "
                     f"by default (0.34: 64); this run keeps --block-size {c.block_size}[/dim]")
    gpu_line = gpu_header(base)
    if gpu_line:
        stderr.print(f"[dim]{gpu_line}[/dim]")
    if base.slo is not None:  # how --slo was read (a bare number is ms: sim/slo.py)
        from sim.slo import parse_slo

        stderr.print(parse_slo(base.slo).describe(), markup=False, highlight=False)
    results = []
    with progress("kvsim run", "requests", sum(len(t) for t in traces) * repeats,
                  stderr) as bar:
        for k, (cfg, trace) in enumerate(zip(configs, traces, strict=True)):
            bar.describe(f"{cfg.policy_label} ({k + 1} of {len(configs)})")
            t0 = time.perf_counter()
            tl = None
            if timelines is not None:
                from sim.timeline import Timeline

                tl = Timeline(lambda: 0.0)
            res = run(cfg, trace, tl, on_reply=bar.advance)
            if tl is not None:  # which file, and with repeats whose (only the first records)
                tl.write(timelines[k])
                stderr.print(f"[dim]timeline of {cfg.policy_label}"
                             + (f", repeat 0 of {repeats} (seed {cfg.seed}; the others "
                                "record none)" if repeats > 1 else "")
                             + f": {timelines[k]}[/dim]")
            bar.update(sum(len(t) for t in traces[:k + 1]) * repeats)  # exact after a run
            dt = time.perf_counter() - t0
            n = res.summary["requests"]
            stderr.print(f"[dim]{cfg.policy_label}: {n:,} requests simulated in {dt:.1f}s "
                         f"({n / max(dt, 1e-9):,.0f} requests/s)[/dim]")
            warn_quiet_surprises(res, spec_context)
            warn_saturation(res)
            note_throttled(res)
            warn_pool_notes(res)
            warn_idle_replicas(res)
            results.append(res)
            if out is not None:
                write_result(res, f"{out}/{cfg.policy_label}")
    runs = compare_runs(results)
    if out is not None:
        atomic_write_text(f"{out}/runs.json", dumps({"runs": runs}) + "\n")
    if as_json:
        emit_json({"runs": runs})
        return
    s = results[0].summary
    cpu = f" + CPU {c.cpu_cache:,} ({c.tiering})" if c.cpu_cache else ""
    strategy = "" if parse_context(base.context.strategy).is_full else (
        f", context {s['context']} (serving only: task accuracy not modelled)")
    print_table(runs, f"{s['trace']} ({s['trace_requests']} requests), {c.model}, "
                      f"GPU {base.cache.gpu_cache:,} tokens{cpu}, N={t.sessions}, "
                      f"{configs[0].engine_label} engine"
                      + (f" (vLLM {base.value('vllm_version')}, async "
                         f"{'on' if base.value('vllm_async') else 'off'})" if vllm
                         else "") + ", "
                      f"{base.policy.scheduler}, "
                      + (f"{base.fleet.replicas} replicas, router {s['router']}, " if "router" in s
                         and not base.is_pd else "")
                      + (f"{base.pd.prefill_replicas}P:{base.pd.decode_replicas}D over "
                         f"{base.pd.pd_link}, rule {base.pd.pd_rule}, " if base.is_pd else "") +
                      f"gaps {t.gaps}{strategy}", lenient=t.lenient)
    if out is not None:
        print(f"wrote {out}/", file=sys.stderr)
