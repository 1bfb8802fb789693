"""``kvsim validate MEASUREMENT...``: replay measured runs and score kvsim against them
(traces/measured.py reads them, sim/studies/validate.py replays them; docs/accuracy.md)."""

from __future__ import annotations

from typing import Any

import click

from sim.report.progress import Tracker
from sim.report.tables import Col, narrow_table
from sim.studies.validate import value_text as _value

from .common import SIZE, console, emit_json, stderr

# measured and kvsim are preformatted with their unit; the "paper" kind prints a string as is
# (right-aligned, as numbers are)
COLUMNS = [Col("metric", "metric"), Col("measured", "measured_text", "paper"),
           Col("kvsim", "kvsim_text", "paper"), Col("error", "error", "change"),
           Col("publisher's\nerror", "publisher_error", "change")]


@click.command("validate")
@click.argument("measurements", nargs=-1, required=True, metavar="MEASUREMENT...")
@click.option("--model", default=None,
              help="Model to price (catalog name or path/config.json); default: the one the "
                   "measurement names.")
@click.option("--gpu", default=None,
              help="GPU the run was measured on (costmodel/data/gpus.yaml name); default: the "
                   "one the measurement names.")
@click.option("--profile", default=None,
              help="Time profile (name or file); default: the measured GPU's, else the "
                   "model's H100 profile, named as a stand-in in every row.")
@click.option("--max-num-seqs", type=click.IntRange(1), default=None,
              help="vLLM max_num_seqs, where the measurement does not say it.")
@click.option("--max-num-batched-tokens", type=click.IntRange(1), default=None,
              help="vLLM max_num_batched_tokens, where the measurement does not say it "
                   "(default 8192).")
@click.option("--gpu-cache", type=SIZE, default=None,
              help="KV tokens per replica; default: the measured block count, else vLLM's "
                   "sizing on the GPU's memory.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of what is regenerated (synthetic prompts, send times).")
@click.option("--calibration", type=click.Path(dir_okay=False), default=None,
              help="Server terms fitted by kvsim calibrate --from-measurements --out FILE, "
                   "priced on top of each run's profile.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document: runs and rows (one per run and metric).")
def validate_cmd(measurements: tuple[str, ...], model: str | None, gpu: str | None,
                 profile: str | None, max_num_seqs: int | None,
                 max_num_batched_tokens: int | None, gpu_cache: int | None, seed: int,
                 calibration: str | None, as_json: bool) -> None:
    """Replay measured runs exactly and print, per metric, the measurement, kvsim and the
    signed relative error (kvsim - measured) / measured.

    MEASUREMENT: an LLMServingSim ground-truth folder (vllm_meta.json), a `vllm bench serve
    --save-result --save-detailed` JSON, or an inference-perf report folder (its config YAML
    and stage_<n>_lifecycle_metrics.json). Progress goes to stderr."""
    from sim.studies.validate import replay, rows, run_info, setup
    from traces.measured import read_measurement

    runs = [m for path in measurements for m in read_measurement(path, seed=seed)]
    setups = [setup(m, model=model, gpu=gpu, profile=profile, max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_batched_tokens, gpu_cache=gpu_cache,
                    seed=seed) for m in runs]  # every refusal before any replay
    if calibration is not None:
        import tempfile
        from pathlib import Path

        from calibration.measured import load_calibration

        cal = load_calibration(calibration)
        tmp = tempfile.TemporaryDirectory(prefix="kvsim-validate-")
        setups = [cal.apply(s, Path(tmp.name)) for s in setups]
    doc_runs: list[dict[str, Any]] = []
    doc_rows: list[dict[str, Any]] = []
    for m, s in zip(runs, setups, strict=True):
        bar = Tracker(f"validate {m.name}", "requests", len(m.trace), stderr, 2.0)
        bar.start()
        try:
            r = replay(m, s, on_reply=bar.advance)
        except BaseException:
            bar.stop(failed=True)
            raise
        bar.stop()
        doc_runs.append(run_info(m, s, r))
        doc_rows.extend(rows(m, s, r))
    if as_json:
        emit_json({"runs": doc_runs, "rows": doc_rows})
        return
    out = console()
    for info in doc_runs:
        shown = [{**row, "measured_text": _value(row["metric"], row["measured"]),
                  "kvsim_text": _value(row["metric"], row["kvsim"])}
                 for row in doc_rows if row["run"] == info["run"]]
        cols = COLUMNS if any("publisher_error" in r for r in shown) else COLUMNS[:-1]
        out.print(narrow_table(f"kvsim validate {info['run']} ({info['tool']}, "
                               f"{info['served']}/{info['requests']} requests served; "
                               f"calibration: {info['calibration']})", cols, shown))
        for line in [f"profile: {info['profile']}", f"exact: {info['exact']}",
                     f"regenerated: {info['regenerated']}", *info["notes"]]:
            out.print(line, soft_wrap=False, width=100, markup=False)
        out.print()
