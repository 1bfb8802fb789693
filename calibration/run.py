"""``kvsim calibrate``: time a decoder stack on a grid, fit, and build a profile.

Depth: ``layers`` decoder layers of each attention kind the model has (full, and each sliding
window) are timed together; a point's whole-model time is ``sum over kinds of
(layers of that kind / layers timed) * measured``. The profile prices the named model's units;
``--quick`` times a tiny stand-in (:mod:`calibration.tiny`) and rescales.

What a pure-torch harness cannot see, and the profile therefore leaves out: the serving engine's
per-batch scheduling, sampling and launch overhead beyond the layers' own kernels (``fixed_s`` is
the harness' intercept), CUDA graphs in decode (``decode.fixed_s`` is 0; the decode intercept --
mostly streaming the weights -- is ``weights_s``), tensor parallelism (``gpus`` is 1).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from costmodel.profile import DecodeCoeffs, PrefillCoeffs, Profile, TransferCoeffs
from costmodel.specs import ModelSpec, get_spec
from costmodel.units import ranges_units
from sim.report.progress import current as current_progress

from . import fit as fitmod
from .errors import CalibrationError, require_torch
from .grid import GRIDS, PROGRESS_UNIT, Grid
from .tiny import rescale_factors, tiny_spec

DEFAULT_LAYERS = {"cpu": 2, "cuda": 4}


@dataclass
class Settings:
    model: str
    device: str = "cpu"
    layers: int | None = None
    quick: bool = False
    warmup: int | None = None
    rounds: int | None = None
    threads: int | None = None
    clock: str | None = None  # cpu only: wall | cpu
    seed: int = 0
    date: str = ""  # provenance only; passed in by the CLI, never read here

    def resolved(self) -> Settings:
        """Defaults. ``--quick`` on a CPU runs one torch thread timed by CPU time: on a shared
        2-core machine a second thread waits for whichever core is busy, and wall time counts
        the time the process sat descheduled; CPU time of one thread counts neither."""
        quick, cpu = self.quick, self.device == "cpu"
        threads = self.threads or (1 if quick and cpu else None)
        clock = self.clock or ("cpu" if cpu and threads == 1 else "wall")
        return Settings(
            self.model, self.device,
            self.layers or (1 if quick else DEFAULT_LAYERS.get(self.device, 1)),
            quick,
            self.warmup if self.warmup is not None else (1 if quick else 2),
            self.rounds if self.rounds is not None else 5,
            threads, clock, self.seed, self.date)


Progress = Callable[[str], None]


def _device(torch, name: str):
    if name not in ("cpu", "cuda"):
        raise CalibrationError(f"--device must be cpu or cuda, got {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise CalibrationError("--device cuda: torch sees no CUDA device "
                               f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
    return torch.device(name)


def device_name(torch, device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    n = torch.get_num_threads()
    return f"{platform.processor() or platform.machine()} CPU, {n} thread{'' if n == 1 else 's'}"


def check_memory(torch, device, need: int, what: str) -> None:
    """Refuse before allocating more than 90% of the free memory of ``device``."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = _host_available_bytes()
        if free is None:  # pragma: no cover - neither Linux nor POSIX
            return
    if need > 0.9 * free:
        raise CalibrationError(f"{what} needs ~{need / 2**30:.1f} GiB, {device.type} has "
                               f"{free / 2**30:.1f} GiB free: try fewer --layers or --quick")


def _host_available_bytes() -> int | None:
    """MemAvailable (free + reclaimable page cache) on Linux, else free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # pragma: no cover
        return None


def attention_self_check(torch, device, dtype) -> float:
    """Max abs difference between the harness' attention and the naive reference on small
    shapes (offset prefix, sliding window) on the calibration device itself."""
    from .attention import attend, naive_attention

    gen = torch.Generator().manual_seed(1)
    hq, hkv, d, length = 8, 2, 64, 320
    ck = torch.randn(1, hkv, length, d, generator=gen)
    cv = torch.randn(1, hkv, length, d, generator=gen)
    worst = 0.0
    ck, cv = ck.to(dtype).float(), cv.to(dtype).float()  # the reference sees rounded inputs
    for start, n, window in ((0, 64, None), (200, 96, None), (100, 150, 40), (300, 1, None)):
        q = torch.randn(1, hq, n, d, generator=gen).to(dtype).float()
        with torch.inference_mode():
            out = attend(q.to(device, dtype), ck.to(device, dtype), cv.to(device, dtype),
                         start, window)[0].float().cpu()
        ref = naive_attention(q[0], ck[0, :, :start + n], cv[0, :, :start + n],
                              torch.arange(start, start + n), torch.arange(start + n), window)
        worst = max(worst, float((out.double() - ref).abs().max()))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    if worst > tol:
        raise CalibrationError(f"attention self-check failed on {device}: max error {worst:.3g}")
    return worst


def _groups(spec: ModelSpec, layers: int) -> list[tuple[int | None, int, int]]:
    """(window, layers of that kind in the model, layers to time)."""
    return [(w, count, min(layers, count)) for w, count in spec.window_groups().items()]


def measure_prefill(torch, spec: ModelSpec, grid: Grid, st: Settings, device, dtype, timer,
                    progress: Progress) -> tuple[list[float], list[float], dict]:
    from .stack import weight_bytes

    total = [0.0] * len(grid.prefill)
    spread = [0.0] * len(grid.prefill)
    max_tokens = max(p.tokens for p in grid.prefill)
    per_layer = {}
    for window, count, timed in _groups(spec, st.layers):
        db = 2 if dtype != torch.float32 else 4
        cache = 2 * spec.kv_heads * spec.head_dim * grid.capacity * db
        act = max_tokens * (3 * max(spec.ffn, spec.expert_ffn) + 4 * spec.hidden
                            + (spec.q_heads + 2 * spec.kv_heads) * spec.head_dim) * db
        check_memory(torch, device,
                     timed * (weight_bytes(spec, db) + cache) + 2 * act, "the prefill stack")
        progress(f"prefill: {len(grid.prefill)} points x {st.rounds} rounds, {timed} of {count} "
                 f"layers ({'full' if window is None else f'window {window}'})")
        med, spr = _time_prefill_group(torch, spec, grid, st, device, dtype, window, timed,
                                       max_tokens, timer)
        for i, (m, s) in enumerate(zip(med, spr, strict=True)):
            total[i] += m * count / timed
            spread[i] = max(spread[i], s)
        per_layer["full" if window is None else f"window-{window}"] = {
            "model_layers": count, "layers_timed": timed}
        _free(torch, device)
    return total, spread, per_layer


def measure_decode(torch, spec: ModelSpec, grid: Grid, st: Settings, device, dtype, timer,
                   progress: Progress) -> list[float]:
    from .stack import weight_bytes

    total = [0.0] * len(grid.decode)
    ntok = grid.decode_tokens
    db = 2 if dtype != torch.float32 else 4
    for window, count, timed in _groups(spec, st.layers):
        kv = spec.kv_heads * spec.head_dim
        check_memory(torch, device, timed * (weight_bytes(spec, db) + 2 * ntok * kv * db),
                     "the decode stack")
        progress(f"decode: {len(grid.decode)} points x {st.rounds} rounds, "
                 f"{timed} of {count} layers")
        med = _time_decode_group(torch, spec, grid, st, device, dtype, window, timed, timer)
        for i, m in enumerate(med):
            total[i] += m * count / timed
        _free(torch, device)
    return total


def _time_prefill_group(torch, spec, grid, st, device, dtype, window, timed, max_tokens, timer):
    from .measure import time_points
    from .stack import DecoderStack

    stack = DecoderStack(spec, [window] * timed, grid.capacity, device, dtype, st.seed)
    x = torch.randn(max_tokens, spec.hidden, generator=torch.Generator().manual_seed(2))
    x = x.to(device, dtype)
    fns = [(lambda p=p: stack.prefill(x[:p.tokens], p.ranges)) for p in grid.prefill]
    return time_points(timer, fns, st.warmup, st.rounds, st.seed)


def _time_decode_group(torch, spec, grid, st, device, dtype, window, timed, timer):
    from .measure import time_points
    from .stack import DecoderStack

    stack = DecoderStack(spec, [window] * timed, 1, device, dtype, st.seed)
    kv = spec.kv_heads * spec.head_dim
    ntok = grid.decode_tokens
    flat = [(torch.randn(ntok * kv, dtype=dtype, device=device),
             torch.randn(ntok * kv, dtype=dtype, device=device)) for _ in range(timed)]
    x = torch.randn(max(d.batch for d in grid.decode), spec.hidden,
                    generator=torch.Generator().manual_seed(3)).to(device, dtype)

    def step(b: int, c: int) -> None:
        shape = (b, spec.kv_heads, c, spec.head_dim)
        caches = [(k[:b * c * kv].view(shape), v[:b * c * kv].view(shape)) for k, v in flat]
        stack.decode_step(x[:b], c, caches)

    fns = [(lambda d=d: step(d.batch, d.context)) for d in grid.decode]
    return time_points(timer, fns, st.warmup, st.rounds, st.seed)[0]


def measure_copies(torch, grid: Grid, st: Settings, device, timer,
                   progress: Progress) -> tuple[str, list[float], list[float]]:
    """Host->device and device->host copy times; on a CPU, host memcpy both ways."""
    from .measure import time_points

    cuda = device.type == "cuda"
    biggest = max(grid.copy_bytes)
    host = torch.empty(biggest, dtype=torch.uint8, pin_memory=cuda).fill_(1)
    other = torch.empty(biggest, dtype=torch.uint8, device=device).fill_(2)
    h2d = [(lambda n=n: other[:n].copy_(host[:n], non_blocking=cuda)) for n in grid.copy_bytes]
    d2h = [(lambda n=n: host[:n].copy_(other[:n], non_blocking=cuda)) for n in grid.copy_bytes]
    progress(f"copies: {len(grid.copy_bytes)} sizes each way")
    t_h2d, _ = time_points(timer, h2d, st.warmup, st.rounds, st.seed)
    t_d2h, _ = time_points(timer, d2h, st.warmup, st.rounds, st.seed)
    kind = ("pinned host <-> device copies (CUDA events)" if cuda else
            "host memcpy (no device on a CPU: PCIe not measured; not a real transfer cost)")
    return kind, t_h2d, t_d2h


def _free(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _rows(points: list, measured: list[float], res: fitmod.FitResult) -> list[dict]:
    return [{"point": p, "measured_s": m, "predicted_s": float(pr), "rel_error": float(e),
             "holdout": bool(h)}
            for p, m, pr, e, h in zip(points, measured, res.predicted, res.rel_errors,
                                      res.holdout, strict=True)]


def calibrate(settings: Settings, progress: Progress | None = None) -> tuple[Profile, dict]:
    """Measure and fit. Returns the profile and a report (``fit`` metrics and details)."""
    progress = progress or (lambda msg: None)
    st = settings.resolved()
    torch = require_torch()
    try:
        target = get_spec(st.model)
    except KeyError as e:
        raise CalibrationError(str(e.args[0])) from None
    if st.clock not in ("wall", "cpu"):
        raise CalibrationError(f"clock must be wall or cpu, got {st.clock!r}")
    if st.layers < 1:
        raise CalibrationError(f"--layers must be >= 1, got {st.layers}")
    device = _device(torch, st.device)
    if st.threads:
        torch.set_num_threads(st.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    spec = tiny_spec(target) if st.quick else target
    grid = GRIDS.get("quick" if st.quick else st.device)()
    progress(f"calibrating {target.name} on {device_name(torch, device)} "
             f"({'quick: tiny stand-in' if st.quick else 'exact shapes'}, grid {grid.name})")
    check_err = attention_self_check(torch, device, dtype)
    bar = current_progress()
    if bar.counts(PROGRESS_UNIT):  # every call time_points makes, warmups included
        groups = len(_groups(spec, st.layers))
        bar.add_total((st.warmup + st.rounds) * (
            groups * (len(grid.prefill) + len(grid.decode)) + 2 * len(grid.copy_bytes)))

    from .measure import Timer

    timer = Timer(device, st.clock)
    t_pre, spread, groups = measure_prefill(torch, spec, grid, st, device, dtype, timer,
                                            progress)
    t_dec = measure_decode(torch, spec, grid, st, device, dtype, timer, progress)
    copy_kind, t_h2d, t_d2h = measure_copies(torch, grid, st, device, timer, progress)

    pre = fitmod.fit(fitmod.PREFILL_TERMS,
                     fitmod.prefill_design(spec, [p.ranges for p in grid.prefill]), t_pre,
                     [p.holdout for p in grid.prefill])
    dec = fitmod.fit(fitmod.DECODE_TERMS,
                     fitmod.decode_design([d.batch for d in grid.decode],
                                          [d.context for d in grid.decode]), t_dec,
                     [d.holdout for d in grid.decode])
    cp_h2d = fitmod.fit(fitmod.COPY_TERMS, fitmod.copy_design(grid.copy_bytes), t_h2d)
    cp_d2h = fitmod.fit(fitmod.COPY_TERMS, fitmod.copy_design(grid.copy_bytes), t_d2h)

    f = rescale_factors(spec, target) if st.quick else dict.fromkeys(
        ("per_unit", "per_token_linear", "weights", "kv"), 1.0)
    prefill = PrefillCoeffs(
        fixed_s=pre.coeff("fixed_s"),
        per_linear_unit_s=pre.coeff("per_linear_unit_s") * f["per_unit"],
        per_attention_unit_s=pre.coeff("per_attention_unit_s") * f["per_unit"],
        per_chunk_token_sq_s=pre.coeff("per_chunk_token_sq_s") * f["per_unit"])
    decode = DecodeCoeffs(
        fixed_s=0.0, weights_s=dec.coeff("intercept_s") * f["weights"],
        per_seq_s=dec.coeff("per_seq_s") * f["per_token_linear"],
        per_context_token_s=dec.coeff("per_context_token_s") * f["kv"])
    transfer = TransferCoeffs(
        h2d_bytes_per_s=_bandwidth(cp_h2d), d2h_bytes_per_s=_bandwidth(cp_d2h),
        latency_s=0.5 * (cp_h2d.coeff("latency_s") + cp_d2h.coeff("latency_s")))

    fit_doc = {k: pre.metrics[k] for k in ("r2", "median_abs_rel_error", "max_abs_rel_error",
                                            "holdout_median_abs_rel_error")}
    fit_doc.update({"holdout_max_abs_rel_error": pre.metrics["holdout_max_abs_rel_error"],
                    "points": pre.metrics["points"],
                    "holdout_points": pre.metrics["holdout_points"],
                    "decode": dec.summary(), "copy_h2d": cp_h2d.summary(),
                    "copy_d2h": cp_d2h.summary()})
    pre_rows = _rows([[list(r) for r in p.ranges] for p in grid.prefill], t_pre, pre)
    for row, p, s in zip(pre_rows, grid.prefill, spread, strict=True):
        row.update(kind=p.kind, tokens=p.tokens, spread=s)
    dec_rows = _rows([[d.batch, d.context] for d in grid.decode], t_dec, dec)
    measured = dict(zip([p.ranges for p in grid.prefill], t_pre, strict=True))
    holes = [_hole_row(spec, pre, measured, hole, new) for hole, new in grid.hole_checks]
    fig = [_figure1_row(spec, pre, measured, p.ranges, q.ranges)
           for p, q in zip(grid.prefill, grid.prefill[1:], strict=False)
           if p.kind == "figure1-front" and q.kind == "figure1-tail"]

    device_label = device_name(torch, device)
    tag = "quick-" if st.quick else ""
    details: dict[str, Any] = {
        "calibrated_by": "kvsim calibrate",
        "kvsim_version": _version(),
        "date": st.date,
        "device": device_label,
        "device_type": device.type,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "clock": timer.clock,
        "model": target.name,
        "quick": st.quick,
        "timed_spec": spec.summary() if st.quick else target.name,
        "rescale_to_model": f if st.quick else None,
        "layers_timed": groups,
        "warmup": st.warmup,
        "rounds": st.rounds,
        "statistic": "median over rounds",
        "grid": grid.summary(),
        "attention_self_check_max_abs_error": check_err,
        "copy_measurement": copy_kind,
        "fit": fit_doc,
        "figure1_measured": fig,
        "hole_restore": holes,
        "prefill_points": pre_rows,
        "decode_points": dec_rows,
        "copy_points": {"bytes": list(grid.copy_bytes), "h2d_s": t_h2d, "d2h_s": t_d2h},
        "notes": __doc__.split("\n\n", 2)[2].strip().replace("\n", " "),
    }
    prof = Profile(
        name=f"measured-{tag}{device.type}-{target.name}", model=target.name,
        device=device_label,
        provenance=(f"measured by kvsim calibrate on {device_label}"
                    + (" (quick: tiny stand-in shapes rescaled; a smoke test, not a forecast)"
                       if st.quick else "")),
        prefill=prefill, decode=decode, transfer=transfer, gpus=1,
        details=plain_types(details))
    return prof, {"fit": plain_types(fit_doc), "details": prof.details}


def _bandwidth(res: fitmod.FitResult) -> float:
    s = res.coeff("s_per_byte")
    return 1.0 / s if s > 0 else float("inf")


def _predict(spec: ModelSpec, res: fitmod.FitResult, ranges) -> float:
    import numpy as np

    return float((fitmod.prefill_design(spec, [ranges]) @ np.asarray(res.coeffs))[0])


def _hole_row(spec, res, measured, hole, new) -> dict:
    batched, apart = measured[(hole, new)], measured[(hole,)] + measured[(new,)]
    return {"hole": list(hole), "new": list(new), "batched_s": batched, "apart_s": apart,
            "batched_over_apart": batched / apart,
            "predicted_batched_s": _predict(spec, res, (hole, new))}


def _figure1_row(spec, res, measured, front, tail) -> dict:
    context = tail[0][1] - (front[1][1] - front[1][0])
    units_ratio = ranges_units(spec, tail).total / ranges_units(spec, front).total
    return {"context_tokens": context, "front": [list(r) for r in front],
            "tail": [list(r) for r in tail], "front_s": measured[front],
            "tail_s": measured[tail], "measured_speedup": measured[tail] / measured[front],
            "predicted_speedup": _predict(spec, res, tail) / _predict(spec, res, front),
            "units_speedup": units_ratio}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvsim")
    except PackageNotFoundError:  # pragma: no cover
        return "unknown"


def plain_types(obj: Any) -> Any:
    """YAML-safe plain types: str subclasses -> str, tuples -> lists, numpy scalars ->
    Python, inf/nan -> None."""
    import math

    if isinstance(obj, str):
        return str(obj)  # str subclasses (torch's TorchVersion) are not safe YAML
    if isinstance(obj, dict):
        return {str(k): plain_types(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain_types(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
