"""``kvsim validate``: replay a measured run (traces/measured.py) with its engine's
configuration and score every metric against the measurement (docs/accuracy.md).

One measured run -> one ``RunConfig`` (``setup``: ``--engine vllm`` with the server's block
size, ``max_num_seqs`` -> ``max_running``, ``max_num_batched_tokens`` -> ``chunk_size``, the KV
tokens from ``num_gpu_blocks`` x block size when the measurement has them, else estimated from
the GPU's memory) and the profile that prices it, named in every row with what it stands in
for (``Setup.profile``): a GPU without a measured profile in costmodel/data/gpus.yaml is
priced with the H100 tables of the model, a TP or DP x EP shape the profile was not measured
on is priced as the profile's own shape, and the label says so. A model kvsim does not have is
refused by name. ``replay`` runs it and computes the same metrics as the measurement
(``traces.measured.request_metrics``) and, from a per-step observer, the running and waiting
requests and KV usage at every second of the run (``peak_*``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from costmodel.gpus import GPU, MIB, kv_cache_tokens, load_gpus, profile_for
from costmodel.profile import (
    DERIVED_TERMS,
    NEUTRAL_SERVER,
    ServerCoeffs,
    default_profile_name,
    load_profile,
    server_terms,
    shipped_profiles,
)
from costmodel.specs import all_model_names, get_spec
from sim.config import DEFAULTS, ConfigError, RunConfig
from sim.engines import StepObserver
from traces.measured import LATENCIES, STATS, MeasuredRun, request_metrics, series_peaks

METRICS: tuple[str, ...] = (*(f"{m}_{s}" for m in LATENCIES for s in STATS), "throughput_rps",
                            "throughput_tok_s", "peak_running", "peak_waiting", "peak_kv_usage")
CALIBRATION = "none"  # no server terms fitted (kvsim calibrate --from-measurements fits them)


@dataclass
class Setup:
    """The run that replays one measurement, and how it stands in for the real server."""

    config: RunConfig
    profile: str  # the profile's name and, where it is not the measured shape, what it is
    notes: list[str] = field(default_factory=list)
    # the server terms on top of the profile (calibration/measured.py ``Calibration.apply``)
    calibration: str = CALIBRATION
    # what the GPUs pay beyond the profile's kernels, derived (costmodel/profile.py
    # ``server_terms``: the LM head, TP all-reduces over the stated link); priced by ``replay``
    server: ServerCoeffs = NEUTRAL_SERVER


def catalog_model(name: str) -> str | None:
    """kvsim's catalog name of a Hugging Face model id (``meta-llama/Llama-3.1-8B`` ->
    ``llama-3.1-8b``): the spec whose ``source`` is that id, else the id's last part lower-
    cased, with a trailing ``-Instruct[-DATE]`` dropped (the same weights' shapes)."""
    known = all_model_names()
    if name in known:
        return name
    low = name.strip().lower()
    for m in known:
        src = get_spec(m).source.lower()
        if low and (low == src or low == re.sub(r"\(.*?\)", "", src)
                    or low == src.replace("(", "").replace(")", "")):
            return m
    base = low.rsplit("/", 1)[-1]
    for cand in (base, re.sub(r"-instruct(-\d+)?$", "", base)):
        if cand in known:
            return cand
    return None


def _norm(gpu: str) -> str:
    s = re.sub(r"[^a-z0-9]", "", gpu.lower())
    for word in ("nvidia", "geforce", "blackwell", "workstationedition", "serveredition"):
        s = s.replace(word, "")
    return s


def catalog_gpu(name: str) -> GPU | None:
    """The costmodel/data/gpus.yaml entry of a device name as drivers and tools write it
    (``NVIDIA GeForce RTX 4090``, ``RTXPRO6000``), compared without case, spaces or vendor
    words; None when the catalog has no such GPU."""
    want = _norm(name)
    for key, gpu in load_gpus().items():
        if _norm(key) == want:
            return gpu
    return None


def _choose_profile(model: str, gpu_name: str | None, tp: int, dp: int, ep: int,
                    profile: str | None) -> tuple[str, str]:
    """(profile name, label): the label names what it stands in for, where it does."""
    shape = f"TP{tp}" + (f" x DP{dp}" if dp > 1 else "") + (f" x EP{ep}" if ep > 1 else "")
    if profile is not None:
        return profile, f"{profile} (chosen with --profile for {shape} x {gpu_name or 'GPU'})"
    gpu = catalog_gpu(gpu_name) if gpu_name else None
    stand: list[str] = []
    if gpu is not None:  # the kernel tables of the engine simulated (vLLM's) where they exist
        choice = profile_for(gpu, model, tp, "vllm", ep)
        name = choice.name
        if not choice.exact:
            stand.append(choice.note)
    else:
        name = default_profile_name(model)
        if name not in shipped_profiles():
            name = f"derived-h100-{model}"
        stand.append(f"stand-in: H100 speed for {gpu_name or 'an unnamed GPU'}, "
                     "which costmodel/data/gpus.yaml lacks")
    if gpu is None and (measured_on := load_profile(name, model).gpus) != tp:
        stand.append(f"measured on {measured_on} GPU(s), the run is TP{tp}")
    if dp > 1 or ep > 1:  # a -dp<ep>ep<ep> profile prices one GPU of the group (compose.py)
        whole = ep > 1 and gpu is not None and name.endswith(f"-dp{ep}ep{ep}")
        stand.append(f"DP{dp} x EP{ep} as {dp} replicas behind least-load" + (
            ", each one GPU of the expert-parallel group (its experts, the group's tokens "
            "and dispatch)" if whole else ", expert all-to-all not priced"))
    return name, name + (f" [{'; '.join(stand)}]" if stand else "")


def measured_gpu(m: MeasuredRun, gpu_name: str | None) -> GPU | None:
    """The GPU as vLLM saw it: the catalog's entry with the measured total memory (torch's
    ``mem_get_info`` total, what ``gpu_memory_utilization`` multiplies; nvidia-smi's, the
    catalog's, is some hundreds of MiB more) when the measurement has it; else the
    catalog's; else the memory the publisher's setup states; None when nothing says."""
    eng = m.engine
    gpu = catalog_gpu(gpu_name) if gpu_name else None
    if gpu is None and eng.get("gpu_memory_gb"):
        gb = float(eng["gpu_memory_gb"])
        gpu = GPU(gpu_name or "GPU", int(gb * 1e9 // MIB), 0.0, 0.0, 0.0, None, 0.0, "measured")
    if gpu is not None and eng.get("gpu_memory_bytes"):
        gpu = dataclasses.replace(gpu, memory_mib=int(eng["gpu_memory_bytes"]) // MIB)
    return gpu


# vllm/engine/arg_utils.py ``get_batch_defaults`` for an API server (UsageContext
# OPENAI_API_SERVER): (max_num_batched_tokens, max_num_seqs) on a GPU of >= 70 GiB that is not
# an A100, else; the same rule from V1's first release through 0.34
VLLM_BATCH_DEFAULTS = {True: (8192, 1024), False: (2048, 256)}


def vllm_batch_defaults(gpu: GPU | None) -> tuple[int, int]:
    """vLLM's default max_num_batched_tokens and max_num_seqs on ``gpu`` (an unknown GPU:
    the large tier, as kvsim's vLLM engine defaults)."""
    big = gpu is None or (gpu.memory_mib >= 70 * 1024 and "A100" not in gpu.name.upper())
    return VLLM_BATCH_DEFAULTS[big]


def _kv_tokens(m: MeasuredRun, model: str, tp: int, bs: int, gpu_name: str | None,
               chunk: int, seqs: int, version: str, notes: list[str]) -> int | None:
    """KV tokens per replica: the measured block count, else vLLM's rule on the GPU's memory
    (sim/deploy.py ``memory_rule`` at the stated utilization), else None (kvsim's default)."""
    from sim.deploy import memory_rule

    eng = m.engine
    if eng.get("num_gpu_blocks"):
        notes.append(f"KV: {eng['num_gpu_blocks']:,} blocks x {bs} as measured")
        return int(eng["num_gpu_blocks"]) * bs
    spec = get_spec(model)
    gpu = measured_gpu(m, gpu_name)
    if gpu is None:
        return None
    util = eng.get("gpu_memory_utilization")
    rule = memory_rule(spec, gpu, tp, util, "vllm", chunk, seqs, version, False)
    try:
        size = kv_cache_tokens(spec, gpu, tp, rule.fraction, bs, rule.reserve_bytes, "vllm")
    except ValueError as e:
        raise ConfigError("measurement", "gpu_memory", str(e)) from None
    notes.append(f"KV: {size.tokens:,} tokens estimated ({gpu.memory_mib:,} MiB x "
                 f"{rule.fraction:g} less weights and vLLM's reserve; not measured)")
    return size.tokens


def _table_allreduce(prof: Any) -> tuple[float, float] | None:
    """(seconds per all-reduce, seconds per element) of the measured all-reduce a TP
    kernel-table profile composed (calibration/kernels/compose.py ``allreduce_line``); None
    for one GPU, another kind of profile, or without the tables installed."""
    d = prof.details
    if prof.gpus < 2 or not {"system", "framework"} <= set(d):
        return None
    return _table_line("allreduce_line", str(d["system"]), str(d["framework"]), prof.gpus,
                       prof.spec.hidden)


def _table_dispatch(prof: Any) -> tuple[float, float] | None:
    """(seconds per layer, seconds per element) of the NCCL dispatch a DP x EP kernel-table
    profile composed (calibration/kernels/compose.py ``dispatch_line``); None for any other
    profile, or without the tables installed."""
    d = prof.details
    ep = int(d.get("expert_parallel", 1))
    if ep < 2 or "system" not in d:
        return None
    return _table_line("dispatch_line", str(d["system"]), ep, prof.spec.hidden)


@functools.cache
def _table_line(name: str, *args: Any) -> tuple[float, float] | None:
    """compose.py's ``name`` line on the installed tables; None where there are none."""
    from calibration.errors import CalibrationError
    from calibration.kernels import compose
    from calibration.kernels.run import locate
    from calibration.kernels.tables import KernelTableError

    try:
        return getattr(compose, name)(locate(None)[0], *args)
    except (CalibrationError, KernelTableError, OSError):  # not installed, no rows: added
        return None


def setup(m: MeasuredRun, *, model: str | None = None, gpu: str | None = None,
          profile: str | None = None, max_num_seqs: int | None = None,
          max_num_batched_tokens: int | None = None, gpu_cache: int | None = None,
          seed: int = 0) -> Setup:
    """The kvsim run of ``m`` (module docstring); options override what the source says
    (a ``vllm bench serve`` result has no server configuration)."""
    eng = m.engine
    if model is not None:  # a catalog name or a config.json path, as everywhere
        try:
            get_spec(model)
        except KeyError as e:
            raise ConfigError("option", "--model", str(e.args[0])) from None
    else:
        model = catalog_model(eng.get("model") or "")
        if model is None:
            raise ConfigError("measurement", "model",
                              f"{eng.get('model') or 'no model named'}: not in kvsim's catalog "
                              "(kvsim models); give --model NAME or --model path/config.json")
    gpu_name = gpu or eng.get("gpu")
    tp, dp, ep = int(eng.get("tp", 1)), int(eng.get("dp", 1)), int(eng.get("ep", 1))
    bs = int(eng.get("block_size", 16))
    notes: list[str] = []
    tier = vllm_batch_defaults(measured_gpu(m, gpu_name))
    seqs = max_num_seqs or eng.get("max_num_seqs")
    chunk = max_num_batched_tokens or eng.get("max_num_batched_tokens")
    if not chunk or not seqs:
        notes.append(f"vLLM's API-server defaults on this GPU where the source is silent: "
                     f"max_num_batched_tokens {tier[0]:,}, max_num_seqs {tier[1]:,}")
    chunk = chunk or tier[0]
    seqs = seqs or tier[1]
    # the vLLM kvsim models the server as: its own (0.33, 0.34), an older one as 0.33 (the
    # same V1 scheduler, block pool and memory rule), kvsim's default where none is stated
    version = str(eng.get("vllm_version") or "")
    minor = ".".join(version.split(".")[:2])  # 0.34.1 -> 0.34
    modelled = minor if minor in ("0.33", "0.34") else "0.33" if version else str(
        DEFAULTS["vllm_version"])
    if gpu_cache is None:
        gpu_cache = _kv_tokens(m, model, tp, bs, gpu_name, chunk, seqs, modelled, notes)
    name, label = _choose_profile(model, gpu_name, tp, dp, ep, profile)
    flat: dict[str, Any] = {
        "engine": "vllm", "model": model, "profile": name, "block_size": bs,
        "chunk_size": chunk, "replay": "open", "trace": m.source, "preset": "vllm",
        "seed": seed}
    if seqs:
        flat["max_running"] = int(seqs)
    if gpu_cache:
        flat["gpu_cache"] = int(gpu_cache)
    if eng.get("max_concurrency"):
        flat["max_concurrency"] = int(eng["max_concurrency"])
    if "async_scheduling" in eng:  # the server's scheduler (vLLM's default: async)
        flat["vllm_async"] = bool(eng["async_scheduling"])
    if dp > 1:
        flat["replicas"], flat["router"] = dp, "least-load"
    if m.trace.options.get("open_loop_after_reply"):
        notes.append("a later chat turn waits for the previous reply")
    if version and minor != modelled:
        notes.append(f"vLLM {version} modelled as 0.33 (same V1 scheduler and block pool)")
    flat["vllm_version"] = modelled
    cfg = RunConfig.from_flat("measurement", **flat).validate("measurement")
    link = float(eng["link_gb_s"]) * 1e9 if eng.get("link_gb_s") else None
    prof = load_profile(name, model)
    terms, why = server_terms(prof, link, float(eng.get("link_latency_s", 0.0)),
                              _table_allreduce(prof) if link else None,
                              _table_dispatch(prof) if link else None)
    if tp > 1 and link is None:
        why.append(f"TP{tp} all-reduces: the profile's own only (the source states no link)")
    srv = dataclasses.replace(NEUTRAL_SERVER, **terms)
    return Setup(cfg, label, notes + [f"beyond the kernels: {w}" for w in why], server=srv)


def value_text(metric: str, v: float | None) -> str:
    """A measured or replayed value with its unit, as the tables print it."""
    if v is None or not math.isfinite(v):
        return "-"
    if metric.startswith(("ttft", "tpot", "latency")):
        return f"{v * 1000:,.1f} ms" if v < 1 else f"{v:,.2f} s"
    if metric == "peak_kv_usage":
        return f"{v:.1%}"
    if metric.startswith("throughput"):
        return f"{v:,.2f}" + (" req/s" if metric.endswith("rps") else " tok/s")
    return f"{v:,.0f}"


class _Series(StepObserver):
    """Each server's (time, running, waiting, used blocks) after every step it takes."""

    def __init__(self) -> None:
        self.rows: dict[int, list[tuple[float, int, int, int, int]]] = {}

    def _note(self, engine: Any) -> None:
        pool = engine.pool
        self.rows.setdefault(id(engine), []).append(
            (engine.env.now, len(engine.running), len(engine.waiting),
             pool.capacity_blocks - pool.free_blocks, pool.capacity_blocks))

    def scheduled(self, engine: Any, batch: list) -> None:
        self._note(engine)

    def completed(self, engine: Any, batch: list) -> None:
        self._note(engine)

    def decoded(self, engine: Any, steps: int) -> None:
        self._note(engine)

    def per_second(self, end: float) -> dict[str, np.ndarray]:
        """The fleet's state at each whole second (each server's last step before it, summed
        over servers), as the measured series samples it."""
        ticks = np.arange(1.0, max(1.0, math.ceil(end)) + 1.0)
        tot = {k: np.zeros(ticks.shape[0]) for k in ("running", "waiting", "used", "cap")}
        for rows in self.rows.values():
            a = np.asarray(rows, np.float64)
            at = np.searchsorted(a[:, 0], ticks, side="right") - 1
            ok = at >= 0
            for j, k in enumerate(("running", "waiting", "used", "cap"), 1):
                tot[k][ok] += a[at[ok], j]
        cap = np.where(tot["cap"] > 0, tot["cap"], 1.0)
        return {"t": ticks, "running": tot["running"], "waiting": tot["waiting"],
                "kv_usage": tot["used"] / cap}


@dataclass
class Replayed:
    metrics: dict[str, float]
    served: int
    dropped: int
    seconds: float


def replay(m: MeasuredRun, s: Setup, on_reply: Callable[[], None] | None = None) -> Replayed:
    """Run ``s.config`` on ``m.trace``; the metrics as the measurement defines them."""
    import time

    from sim.run import run

    obs = _Series()
    t0 = time.perf_counter()
    if s.server.neutral:
        res = run(s.config, trace=m.trace, on_reply=on_reply, steps=obs)
    else:  # the profile with the derived terms, as a file (what every --profile reads)
        import tempfile
        from pathlib import Path

        cfg = s.config
        name, model = cfg.value("profile"), cfg.value("model")
        prof = load_profile(name, model)  # its own server terms kept, the derived ones set
        prof = prof.with_server(dataclasses.replace(prof.server, **{
            k: getattr(s.server, k) for k in DERIVED_TERMS}), "kvsim validate: derived")
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / f"{Path(str(name)).name.removesuffix('.yaml')}-server.yaml"
            prof.dump(path)
            res = run(cfg.with_fields(profile=str(path)), trace=m.trace, on_reply=on_reply,
                      steps=obs)
    df = res.requests
    ok = ~(df["dropped"].to_numpy(bool) | df["aborted"].to_numpy(bool))
    d = df[ok]
    metrics = request_metrics(d["send_s"].to_numpy(), d["first_token_s"].to_numpy(),
                              d["end_s"].to_numpy(), d["output_tokens"].to_numpy())
    end = float(d["end_s"].max()) if len(d) else 0.0
    metrics.update(series_peaks(obs.per_second(end)))
    return Replayed(metrics, int(ok.sum()), int((~ok).sum()), time.perf_counter() - t0)


def rows(m: MeasuredRun, s: Setup, r: Replayed) -> list[dict[str, Any]]:
    """One row per metric the measurement has: measured, kvsim, signed relative error
    ((kvsim - measured) / measured), the publisher's error where it has one."""
    out = []
    for metric in METRICS:
        if metric not in m.metrics:
            continue
        meas, sim = m.metrics[metric], r.metrics.get(metric, math.nan)
        err = (sim - meas) / meas if meas and math.isfinite(sim) else math.nan
        row = {"run": m.name, "metric": metric, "measured": meas, "kvsim": sim,
               "error": err, "profile": s.profile, "calibration": s.calibration}
        if metric in m.publisher:
            row["publisher_error"] = m.publisher[metric]
        out.append(row)
    return out


def run_info(m: MeasuredRun, s: Setup, r: Replayed) -> dict[str, Any]:
    """What the JSON document says about one run beside its rows."""
    return {"run": m.name, "tool": m.tool, "source": m.source, "requests": len(m.trace),
            "served": r.served, "dropped": r.dropped, "profile": s.profile,
            "calibration": s.calibration, "exact": m.exact, "regenerated": m.regenerated,
            "notes": s.notes, "engine": {k: s.config.value(k) for k in (
                "engine", "model", "block_size", "chunk_size", "max_running", "gpu_cache",
                "replicas", "vllm_version")},
            "replay_seconds": round(r.seconds, 3)}


__all__ = ["CALIBRATION", "METRICS", "Replayed", "Setup", "catalog_gpu", "catalog_model",
           "replay", "rows", "run_info", "setup", "value_text"]
