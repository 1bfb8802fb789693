"""``kvsim calibrate``: time prefill/decode/copies with torch on this machine, or compose them
from NVIDIA's measured kernel tables (``--from-kernels SYSTEM``), and fit a profile."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import click
import yaml
from rich.table import Table

from calibration.errors import CalibrationError
from costmodel.profile import Profile, check_profile, load_profile
from costmodel.specs import get_spec

from .common import atomic_write_text, console, emit_json, stderr

TORCH_ONLY = ("layers", "quick", "rounds", "warmup", "threads", "clock")


@click.command("calibrate")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: bf16, timed with CUDA events; cpu: float32 (see --clock).")
@click.option("--from-kernels", "system", default=None, metavar="SYSTEM",
              help="Instead of timing here, compose times from the measured kernel tables of "
                   "SYSTEM (h100_sxm, h200_sxm, b200_sxm, ...; needs kvsim[kernels]).")
@click.option("--framework", type=click.Choice(["sglang", "vllm", "trtllm"]), default=None,
              help="With --from-kernels: whose kernels [default: sglang].")
@click.option("--gpus", type=click.IntRange(1, 64), default=None,
              help="With --from-kernels: tensor-parallel GPUs [default: the model's count in "
                   "the derived profiles].")
@click.option("--kernel-data", type=click.Path(file_okay=False), default=None,
              help="With --from-kernels: a directory laid out like aiconfigurator-core's "
                   "systems/ [default: the installed package].")
@click.option("--model", "-m", default="qwen3-8b", show_default=True, help="Model spec.")
@click.option("--layers", type=click.IntRange(min=1), default=None,
              help="Layers timed per attention kind, scaled to the model's depth "
                   "[default: 4 on cuda, 2 on cpu, 1 with --quick].")
@click.option("--quick", is_flag=True,
              help="Tiny stand-in shapes and a small grid (about 30 s on a 2-core CPU).")
@click.option("--out", "-o", type=click.Path(dir_okay=False), default=None,
              help="Write the profile here (YAML); use it with --profile PATH.")
@click.option("--rounds", type=click.IntRange(1, 1000), default=None,
              help="Timed rounds per point; the median is kept [default: 5].")
@click.option("--warmup", type=click.IntRange(0, 100), default=None,
              help="Untimed calls per point first [default: 1 quick, 2].")
@click.option("--threads", type=click.IntRange(1, 4096), default=None,
              help="torch CPU threads [default: 1 with --quick on cpu, else torch's].")
@click.option("--clock", type=click.Choice(["wall", "cpu"]), default=None,
              help="CPU timing: wall time or process CPU time [default: cpu with one "
                   "thread, else wall]. CUDA always uses CUDA events.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Weights and visit order.")
@click.option("--date", default=None, help="Provenance date [default: today, UTC].")
@click.option("--from-measurements", "from_measurements", is_flag=True,
              help="Instead: fit the server terms (CPU time, async overlap, mixed batches, "
                   "kernel efficiency) by replaying the measured RUNs (what kvsim validate "
                   "reads), report leave-one-out error, and with --out write a calibration "
                   "file for kvsim validate --calibration.")
@click.option("--gpu", "measured_gpu", default=None, metavar="NAME",
              help="With --from-measurements: the GPU the runs were measured on, where they "
                   "do not say it (a vllm bench serve result; costmodel/data/gpus.yaml name).")
@click.option("--terms", default=None, metavar="T1,T2",
              help="With --from-measurements: the terms fitted [default: decode_scale,"
                   "prefill_scale,mixed_interference].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.argument("runs", nargs=-1, metavar="[RUN...]")
def calibrate_cmd(device: str, system: str | None, framework: str | None, gpus: int | None,
                  kernel_data: str | None, model: str, layers: int | None, quick: bool,
                  out: str | None, rounds: int | None, warmup: int | None,
                  threads: int | None, clock: str | None, seed: int,
                  date: str | None, from_measurements: bool, measured_gpu: str | None,
                  terms: str | None, as_json: bool, runs: tuple[str, ...]) -> None:
    """Time a decoder stack with MODEL's shapes (random weights) on DEVICE and fit a profile,
    or (--from-kernels SYSTEM) compose MODEL's times from measured GPU kernel tables and fit.

    Prints the fit's R^2 and relative errors (training points and held-out points) and, with
    --out, writes the profile file that every --profile option accepts.

    With --from-measurements RUN...: fit the server terms from measured runs (docs/accuracy.md
    "Calibration"); --quick takes one fit iteration."""
    if from_measurements or runs or terms or measured_gpu:
        ctx = click.get_current_context()
        given = [p.name for p in ctx.command.params
                 if p.name not in ("runs", "from_measurements", "terms", "quick", "out",
                                   "seed", "as_json", "measured_gpu")
                 and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
        if not from_measurements:
            raise click.UsageError("RUN arguments, --gpu and --terms go with "
                                   "--from-measurements")
        if not runs:
            raise click.UsageError("--from-measurements needs at least one measured RUN")
        if given:
            raise click.UsageError(f"--{given[0].replace('_', '-')} does not go with "
                                   "--from-measurements (the runs name their model and GPU)")
        _from_measurements(runs, terms, measured_gpu, quick, out, seed, as_json)
        return
    try:
        get_spec(model)
    except KeyError as e:
        raise click.BadParameter(str(e.args[0]), param_hint="--model") from None

    def progress(msg: str) -> None:
        print(f"kvsim calibrate: {msg}", file=sys.stderr, flush=True)

    if system is not None:
        given = {"layers": layers, "quick": quick or None, "rounds": rounds, "warmup": warmup,
                 "threads": threads, "clock": clock}
        source = click.get_current_context().get_parameter_source("device")
        if source == click.core.ParameterSource.COMMANDLINE:  # has a default: was it given?
            given["device"] = device
        for name in ("device", *TORCH_ONLY):
            if given.get(name) is not None:
                raise click.UsageError(f"--{name} times torch here; it does not go with "
                                       "--from-kernels")
        _from_kernels(system, framework or "sglang", gpus, kernel_data, model, out, as_json,
                      progress)
        return
    for name, value in (("framework", framework), ("gpus", gpus), ("kernel-data", kernel_data)):
        if value is not None:
            raise click.UsageError(f"--{name} goes with --from-kernels SYSTEM")
    from calibration.run import Settings, calibrate

    settings = Settings(model=model, device=device, layers=layers, quick=quick, warmup=warmup,
                        rounds=rounds, threads=threads, clock=clock, seed=seed,
                        date=date or datetime.now(UTC).date().isoformat())
    from calibration.grid import PROGRESS_UNIT
    from sim.report.progress import progress as progress_bar

    with progress_bar("kvsim calibrate", PROGRESS_UNIT, console=stderr) as bar:
        prof, report = calibrate(settings, lambda msg: bar.log(f"kvsim calibrate: {msg}"))
    if out:
        prof = write_profile(prof, out, model)
        progress(f"wrote {out}")
    if as_json:
        emit_json({"profile": prof.to_dict(), "out": out, "fit": report["fit"]})
        return
    _print(prof, report, out)


def _from_kernels(system: str, framework: str, gpus: int | None, kernel_data: str | None,
                  model: str, out: str | None, as_json: bool, progress) -> None:
    from calibration.kernels.run import calibrate_from_kernels

    prof, report = calibrate_from_kernels(system, model, framework, gpus, kernel_data, progress)
    if out:
        prof = write_profile(prof, out, model)
        progress(f"wrote {out}")
    if as_json:
        emit_json({"fit": report["fit"], "provenance": report["provenance"],
                   "profile": prof.to_dict(), "out": out})
        return
    _print_kernels(prof, report, out)


def _from_measurements(paths: tuple[str, ...], terms: str | None, gpu: str | None,
                       quick: bool, out: str | None, seed: int, as_json: bool) -> None:
    """Fit on every run, score each run leave-one-out (calibration/measured.py)."""
    from calibration.measured import (
        DEFAULT_TERMS,
        ITERATIONS,
        QUICK_ITERATIONS,
        TARGETS,
        Case,
        Replays,
        default_workers,
        drive,
        fit_steps,
        leave_one_out_steps,
        metrics_of,
        together,
    )
    from sim.studies.validate import setup, value_text
    from traces.measured import read_measurement

    chosen = tuple(t.strip() for t in terms.split(",") if t.strip()) if terms else DEFAULT_TERMS
    measured = [m for p in paths for m in read_measurement(p, seed=seed)]
    names = [m.name for m in measured]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise click.BadParameter(f"two runs are named {dup!r}", param_hint="RUN")
    cases = [Case(m, setup(m, gpu=gpu, seed=seed)) for m in measured]  # every refusal first
    iterations = QUICK_ITERATIONS if quick else ITERATIONS

    def progress(msg: str) -> None:
        print(f"kvsim calibrate: {msg}", file=sys.stderr, flush=True)

    replays = Replays(cases, default_workers(), progress)
    try:  # the fit on every run and the leave-one-out folds in lockstep (one batch a round)
        neutral, result, folds = drive(replays, together([
            metrics_of([(n, {}) for n in names]),
            fit_steps(replays, names, chosen, TARGETS, iterations),
            leave_one_out_steps(replays, names, None, chosen, TARGETS, iterations)
            if len(names) > 1 else metrics_of([])]))
    finally:
        replays.close()
    cal = result.calibration
    if out:
        try:
            atomic_write_text(out, yaml.safe_dump(cal.to_dict(), sort_keys=False))
        except OSError as e:
            raise CalibrationError(f"{out}: cannot write: {e.strerror}") from None
        progress(f"wrote {out}")
    loo = {f.scored: f for f in folds}
    rows = []
    for m, met in zip(measured, neutral, strict=True):
        for k in TARGETS:
            meas = m.metrics.get(k)
            if not meas:
                continue
            row = {"run": m.name, "metric": k, "measured": meas, "uncalibrated": met[k],
                   "uncalibrated_error": (met[k] - meas) / meas}
            if m.name in loo:
                v = loo[m.name].metrics[k]
                row |= {"leave_one_out": v, "leave_one_out_error": (v - meas) / meas,
                        "fitted_on": list(loo[m.name].calibration.fitted_on)}
            rows.append(row)
    if as_json:
        emit_json({"calibration": cal.to_dict(), "out": out, "rows": rows,
                   "folds": [{"run": f.scored, "fitted_on": list(f.calibration.fitted_on),
                              "terms": f.calibration.terms, "scales": f.calibration.scales}
                             for f in folds],
                   "replays": replays.count})
        return
    con = console()
    table = Table(title=f"kvsim calibrate --from-measurements: {', '.join(cal.fitted_on)}")
    for head in ("run", "metric", "measured", "uncalibrated", "error", "leave-one-out",
                 "error"):
        table.add_column(head, justify="left" if head in ("run", "metric") else "right")
    for r in rows:
        table.add_row(r["run"], r["metric"], value_text(r["metric"], r["measured"]),
                      value_text(r["metric"], r["uncalibrated"]),
                      _signed(r["uncalibrated_error"]),
                      value_text(r["metric"], r.get("leave_one_out")),
                      _signed(r.get("leave_one_out_error")))
    con.print(table)
    fitted = [f"{k} = {v:.4g}" for k, v in cal.terms.items()] + [
        f"{k} = {v:.4g} ({kind})" for kind, sc in cal.scales.items() for k, v in sc.items()]
    con.print(f"terms (fitted on every run): {', '.join(fitted)}; training RMS log error "
              f"{cal.training_rms:.3f}; {replays.count} replays")
    if not folds:
        con.print("leave-one-out needs two runs or more: none scored")


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def write_profile(prof: Profile, out: str, model: str) -> Profile:
    """Validate, then write atomically; returns the profile as read back from ``out``. A
    profile that ``load_profile`` would refuse is never written (exit 2 naming the field)."""
    check_profile(prof, out)
    try:
        atomic_write_text(out, prof.to_yaml())
    except OSError as e:
        raise CalibrationError(f"{out}: cannot write: {e.strerror}") from None
    return load_profile(out, model)


def _print(prof, report: dict, out: str | None) -> None:
    con = console()
    fit, d = report["fit"], report["details"]
    con.print(f"[bold]{prof.name}[/bold]: {prof.provenance}")
    t = Table(title="Fit (relative error = predicted / measured - 1)")
    for col in ("what", "R^2", "median |err|", "max |err|", "held-out median |err|", "points"):
        t.add_column(col, justify="right")

    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    for name, m in (("prefill", fit), ("decode", fit["decode"]), ("copy h2d", fit["copy_h2d"]),
                    ("copy d2h", fit["copy_d2h"])):
        t.add_row(name, f"{m['r2']:.4f}", pct(m["median_abs_rel_error"]),
                  pct(m["max_abs_rel_error"]), pct(m["holdout_median_abs_rel_error"]),
                  f"{m['points']}+{m['holdout_points']}")
    con.print(t)
    p, dc, tr = prof.prefill, prof.decode, prof.transfer
    con.print(f"prefill: fixed {p.fixed_s:.3g} s, {p.per_linear_unit_s:.3g} s/linear unit, "
              f"{p.per_attention_unit_s:.3g} s/attention unit, "
              f"{p.per_chunk_token_sq_s:.3g} s/token^2")
    con.print(f"decode: weights {dc.weights_s:.3g} s, {dc.per_seq_s:.3g} s/seq, "
              f"{dc.per_context_token_s:.3g} s/context token")
    con.print(f"copies ({d['copy_measurement']}): h2d {tr.h2d_bytes_per_s / 1e9:.2f} GB/s, "
              f"d2h {tr.d2h_bytes_per_s / 1e9:.2f} GB/s, latency {tr.latency_s:.3g} s")
    f1 = Table(title="Figure 1 cases on this device (tail time / front time)")
    for col in ("context", "measured", "fitted profile", "units"):
        f1.add_column(col, justify="right")
    for r in d["figure1_measured"]:
        f1.add_row(f"{r['context_tokens']:,}", f"{r['measured_speedup']:.3f}",
                   f"{r['predicted_speedup']:.3f}", f"{r['units_speedup']:.3f}")
    con.print(f1)
    for h in d["hole_restore"]:
        con.print(f"hole restore {h['hole']} + new {h['new']}: batched / apart = "
                  f"{h['batched_over_apart']:.3f}")
    con.print(f"written to {out}" if out else "not written (no --out)")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _print_kernels(prof: Profile, report: dict, out: str | None) -> None:
    con = console()
    fit, pv = report["fit"], report["provenance"]
    con.print(f"[bold]{prof.name}[/bold]: {prof.provenance}")
    t = Table(title="Fit to the composed kernel times (relative error = profile / composed - 1)")
    for col in ("points", "R^2", "median |err|", "max |err|", "n"):
        t.add_column(col, justify="right")
    t.add_row(f"prefill, fitted (>= {fit['min_tokens']} tokens)", f"{fit['r2']:.4f}",
              _pct(fit["median_abs_rel_error"]), _pct(fit["max_abs_rel_error"]),
              str(fit["points"]))
    t.add_row("prefill, held out", "", _pct(fit["holdout_median_abs_rel_error"]),
              _pct(fit["holdout_max_abs_rel_error"]), str(fit["holdout_points"]))
    for label, key in (("prefill, small batches", "small_batches"),
                       ("prefill, extrapolated", "extrapolated")):
        m = fit[key]
        t.add_row(label, "", _pct(m["median_abs_rel_error"]), _pct(m["max_abs_rel_error"]),
                  str(m["points"]))
    dc = fit["decode"]
    t.add_row("decode, fitted", f"{dc['r2']:.4f}", _pct(dc["median_abs_rel_error"]),
              _pct(dc["max_abs_rel_error"]), str(dc["points"]))
    t.add_row("decode, held out", "", _pct(dc["holdout_median_abs_rel_error"]),
              _pct(dc["holdout_max_abs_rel_error"]), str(dc["holdout_points"]))
    t.add_row("decode, extrapolated", "", _pct(dc["extrapolated"]["median_abs_rel_error"]),
              _pct(dc["extrapolated"]["max_abs_rel_error"]), str(dc["extrapolated"]["points"]))
    con.print(t)
    p, d, tr = prof.prefill, prof.decode, prof.transfer
    con.print(f"prefill: fixed {p.fixed_s:.3g} s, {p.per_linear_unit_s:.3g} s/linear unit, "
              f"{p.per_attention_unit_s:.3g} s/attention unit")
    # an MoE profile's routed experts are a term of their own (calibration/kernels/run.py)
    experts = (f", experts {d.experts_s:.3g} s x the share of experts a step's tokens read"
               if d.experts_s else "")
    con.print(f"decode: weights {d.weights_s:.3g} s, {d.per_seq_s:.3g} s/seq, "
              f"{d.per_context_token_s:.3g} s/context token{experts}")
    con.print(f"transfer: {tr.h2d_bytes_per_s / 1e9:.0f} GB/s each way, latency "
              f"{tr.latency_s:.3g} s ({pv['derived']['transfer']})")
    src = " ".join(str(v) for v in pv["kernel_data"].values())
    con.print(f"tables: {src}, {pv['system']}, {pv['framework']} "
              f"{pv['framework_version']}, {pv['gpus']} GPU(s); {pv['extrapolated']['prefill']}")
    f1 = Table(title="Figure 1 (tail / front): composed from the kernels, and the fitted profile")
    for col in ("context", "kernels", "profile", "range"):
        f1.add_column(col, justify="right")
    for r in prof.details["figure1_composed"]:
        f1.add_row(f"{r['context_tokens'] // 1024}K", f"{r['composed_speedup']:.3f}",
                   f"{r['profile_speedup']:.3f}",
                   "extrapolated" if r["extrapolated"] else "measured")
    con.print(f1)
    con.print(f"written to {out}" if out else "not written (no --out)")
