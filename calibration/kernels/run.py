"""``kvsim calibrate --from-kernels``: compose times on a grid, fit the profile, provenance.

The grid has prefill batches inside the measured data (every attention lookup at most the
table's longest sequence, 16,384 tokens: *measured*) and beyond it (*extrapolated*: the paper's
long contexts, Figure 1 at 16K-128K); decode steps at batch sizes 1-256 over the measured
(batch, context) pairs, and a few beyond. The profile is fitted on measured points only, with
every fourth held out (the honest error). Batches of fewer than ``MIN_FIT_TOKENS`` tokens are
reported apart, as are extrapolated points: below ~512 tokens a prefill reads every weight
once whatever the token count (weight-read bound), a floor the linear form cannot follow
without losing accuracy everywhere else (fitted with them, the held-out median error on
qwen3-8b/H100 doubles to ~6% and the large batches' error to 9%).

    prefill  t = fixed_s + per_linear_unit_s * linear + per_attention_unit_s * attention
    decode   t = weights_s + per_seq_s * batch + per_context_token_s * batch * context
                 [+ experts_s * share(batch)]    (MoE)
    transfer   = the system description's PCIe bandwidth per GPU (x gpus) and p2p latency
An MoE decode step reads the experts its tokens route to: a share of them that saturates
long before the batch is large (``costmodel/profile.py`` ``expert_share``: each token picks
``k`` of ``E``, so at 32 sequences Qwen3-30B-A3B's 128 experts are 87% read). The fused-MoE
tables follow that curve (on rtx_pro_6000_server, 2 ms of expert kernels a step at batch 1,
40 at 64 and beyond), which no line in the batch holds (a line alone misses that
profile's decode by 41% in median, with the share by 11%); ``experts_s`` is its height.

``per_chunk_token_sq_s`` is 0: with it the fit gains a little inside 16K and loses much more
beyond (at 128K it pulls Figure 1's speedup from 2.9 to 2.5, since a 40K-token batch pays
its square), and the measured curves give it no support. The fixed terms come from GPU time
alone (``decode.fixed_s`` is 0, the decode intercept is
``weights_s``): the kernel tables hold no CPU-side scheduling, launch or sampling time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np

from calibration import fit as fitmod
from calibration.errors import CalibrationError
from calibration.run import plain_types
from costmodel.derive import GPUS
from costmodel.figure1 import APPEND, CONTEXTS_K, DELETE_FRACTION, FRONT_START
from costmodel.profile import DecodeCoeffs, PrefillCoeffs, Profile, TransferCoeffs, expert_share
from costmodel.specs import ModelSpec, get_spec
from costmodel.units import ranges_units

from .compose import FRAMEWORKS, KernelModel

PACKAGE = "aiconfigurator-core"
PINNED = "0.12.0"
K = 1024
MIN_FIT_TOKENS = 512
HINT = f"pip install 'kvsim[kernels]' (installs {PACKAGE}=={PINNED})"
Progress = Callable[[str], None]


def locate(data_dir: str | Path | None) -> tuple[Path, dict[str, str]]:
    """The tables' root and where it came from: the installed package, or ``data_dir``."""
    if data_dir is not None:
        root = Path(data_dir)
        if not root.is_dir():
            raise CalibrationError(f"--kernel-data {data_dir}: not a directory")
        return root, {"package": "(a directory of tables)", "path": str(root)}
    try:
        root = Path(str(resources.files("aiconfigurator_core") / "systems"))
        version = metadata.version(PACKAGE)
    except (ModuleNotFoundError, metadata.PackageNotFoundError):
        raise CalibrationError(f"--from-kernels needs the measured tables: {HINT}") from None
    return root, {"package": PACKAGE, "version": version}


def systems(root: Path) -> list[str]:
    return sorted(p.stem for p in root.glob("*.yaml") if (root / "data" / p.stem).is_dir())


def profile_name(system: str, framework: str, model: str, gpus: int | None = None,
                 ep: int = 1) -> str:
    """``kernels-<system>-[<framework>-]<model>[-tp<gpus>][-dp<ep>ep<ep>]`` (costmodel.gpus
    ``kernel_profile_name``: the one naming rule, which ``profile_for`` looks up)."""
    from costmodel.gpus import kernel_profile_name

    return kernel_profile_name(system, framework, model, gpus, ep)


@dataclass(frozen=True)
class Point:
    ranges: tuple[tuple[int, int], ...]
    kind: str
    holdout: bool = False


def prefill_grid() -> list[Point]:
    """Measured points (every range ends at most at 16K), then extrapolated ones."""
    pts: list[Point] = []
    for n in (256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384):
        pts.append(Point(((0, n),), "n-sweep"))
    for c in (1024, 2048, 4096, 6144, 8192, 12288):
        for n in (256, 512, 1024, 2048, 4096):
            if c + n <= 16 * K:
                pts.append(Point(((c, c + n),), "prefix-sweep"))
    for ctx in (4 * K, 8 * K, 12 * K):
        pts += _figure1_pair(ctx)
    # Every fourth point held out: the prefix sweep's rows have five points, so the held-out
    # ones rotate through batch sizes and prefixes.
    pts = [Point(p.ranges, p.kind, i % 4 == 1) for i, p in enumerate(pts)]
    for c in (16 * K, 32 * K, 64 * K, 100 * K):
        for n in (512, 4096):
            pts.append(Point(((c, c + n),), "prefix-sweep"))
    for k in CONTEXTS_K:
        pts += _figure1_pair(k * K)
    return pts


def _figure1_pair(ctx: int) -> list[Point]:
    d = round(DELETE_FRACTION * ctx)
    new = (ctx, ctx + APPEND)
    return [Point(((FRONT_START, FRONT_START + d), new), "figure1-front"),
            Point(((ctx - d, ctx + APPEND),), "figure1-tail")]


def decode_grid(km: KernelModel) -> list[tuple[int, int, bool]]:
    """(batch, context, holdout): measured pairs at batch 1-256 (contexts >= 255), then a
    few beyond the table (extrapolated)."""
    pts = []
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        for c in (255, 1023, 4095, 16383, 65535):
            if not km.decode_extrapolated(b, c):
                pts.append((b, c))
    out = [(b, c, i % 4 == 1) for i, (b, c) in enumerate(pts)]
    extra = [(1, 131071), (8, 131071), (64, 32767), (256, 8191)]
    return out + [(b, c, False) for b, c in extra if (b, c) not in pts]


def _errors(rel: np.ndarray) -> dict[str, float | None]:
    a = np.abs(rel)
    return {"median_abs_rel_error": float(np.median(a)) if a.size else None,
            "max_abs_rel_error": float(np.max(a)) if a.size else None, "points": int(a.size)}


def calibrate_from_kernels(system: str, model: str, framework: str = "sglang",
                           gpus: int | None = None, data_dir: str | Path | None = None,
                           progress: Progress | None = None,
                           ep: int = 1) -> tuple[Profile, dict]:
    """Compose, fit and build the profile. Returns it and a report (``fit``, ``provenance``).
    ``ep > 1``: one GPU of an attention-DP x expert-parallel group of ``ep`` (compose.py)."""
    progress = progress or (lambda msg: None)
    if framework not in FRAMEWORKS:
        raise CalibrationError(f"--framework must be one of {', '.join(FRAMEWORKS)}")
    try:
        spec = get_spec(model)
    except KeyError as e:
        raise CalibrationError(str(e.args[0])) from None
    root, origin = locate(data_dir)
    known = systems(root)
    if system not in known:
        raise CalibrationError(f"--from-kernels {system}: no such system with tables in {root}; "
                               f"known: {', '.join(known) or 'none'}")
    gpus = gpus or GPUS.get(model, 1)
    try:
        km = KernelModel(spec, root, system, framework, gpus, ep=ep)
    except ValueError as e:
        if getattr(e, "exit_code", None):
            raise
        raise CalibrationError(f"--gpus {gpus}: {e}") from None
    progress(f"composing {model} on {gpus} x {system} ({framework}) from {root}")

    grid = prefill_grid()
    composed = np.array([km.prefill_seconds(p.ranges) for p in grid])
    extra = np.array([km.prefill_extrapolated(p.ranges) for p in grid])
    small = np.array([_tokens(p.ranges) < MIN_FIT_TOKENS for p in grid]) & ~extra
    hold = np.array([p.holdout for p in grid])
    fitted = ~extra & ~small
    terms = fitmod.PREFILL_TERMS[:3]
    a = fitmod.prefill_design(spec, [p.ranges for p in grid])[:, :3]
    pre = fitmod.fit(terms, a[fitted], composed[fitted], hold[fitted])
    pred = a @ pre.coeffs
    rel = pred / composed - 1

    dgrid = decode_grid(km)
    dt = np.array([km.decode_seconds(b, c) for b, c, _ in dgrid])
    dextra = np.array([km.decode_extrapolated(b, c) for b, c, _ in dgrid])
    dhold = np.array([h for _, _, h in dgrid])
    da = fitmod.decode_design([b for b, _, _ in dgrid], [c for _, c, _ in dgrid])
    dterms = fitmod.DECODE_TERMS
    if spec.experts:  # the experts read: the share a step's tokens route to (module docstring)
        share = [expert_share(spec, b, ep) for b, _, _ in dgrid]
        da, dterms = np.column_stack([da, share]), (*dterms, "experts_s")
    dec = fitmod.fit(dterms, da[~dextra], dt[~dextra], dhold[~dextra])
    drel = (da @ dec.coeffs) / dt - 1

    d = km.desc
    prefill = PrefillCoeffs(*(pre.coeff(t) for t in terms), per_chunk_token_sq_s=0.0)
    decode = DecodeCoeffs(0.0, dec.coeff("intercept_s"), dec.coeff("per_seq_s"),
                          dec.coeff("per_context_token_s"),
                          dec.coeff("experts_s") if spec.experts else 0.0)
    transfer = TransferCoeffs(gpus * d.pcie_bw, gpus * d.pcie_bw, d.p2p_latency_s)

    fit_doc: dict[str, Any] = {
        k: pre.metrics[k] for k in ("r2", "median_abs_rel_error", "max_abs_rel_error",
                                    "holdout_median_abs_rel_error", "holdout_max_abs_rel_error",
                                    "points", "holdout_points")}
    fit_doc["min_tokens"] = MIN_FIT_TOKENS
    fit_doc["small_batches"] = _errors(rel[small])
    fit_doc["extrapolated"] = _errors(rel[extra])
    fit_doc["decode"] = {**dec.summary(), "extrapolated": _errors(drel[dextra])}
    versions = {k: v["version"] for k, v in km.sources.items()
                if isinstance(v, dict) and "version" in v}
    for k in ("context_attention", "generation_attention"):
        versions[k] = sorted({t["version"] for t in km.sources[k].values()})[-1]
    fw_version = versions["context_attention"]
    provenance: dict[str, Any] = {
        "calibrated_by": "kvsim calibrate --from-kernels",
        "kvsim_version": _version(),
        "kernel_data": origin,
        "system": system,
        "system_description": Path(d.path).name,
        "framework": framework,
        "framework_version": fw_version,
        "table_versions": versions,
        "gpus": gpus,
        **({"data_parallel": ep, "expert_parallel": ep} if ep > 1 else {}),
        "measured": {
            "prefill": "attention lookups up to the tables' longest sequence "
                       f"({max(c.max_isl for c in km.context.values()):,} tokens); GEMM, MoE "
                       "and all-reduce sizes inside their tables",
            "decode": "batch 1-256 at the (batch, context) pairs in the generation table"},
        "extrapolated": {
            "prefill": "context attention past the longest measured sequence: the last "
                       "measured segment's cost per query-key pair",
            "decode": "contexts past the largest measured step for a batch size: the last "
                      "segment extended",
            "profile": "the fitted form beyond both"},
        "derived": {
            "cached_prefix": "attention(c, n) = A(1) + A(c+n) - A(c), A = measured prefill "
                             "with no prefix (calibration/kernels/attention.py)",
            "elementwise": km.sources["elementwise"],
            "transfer": f"PCIe {d.pcie_bw / 1e9:g} GB/s per GPU x {gpus} and p2p latency "
                        f"{d.p2p_latency_s:g} s from {Path(d.path).name} (nominal, not measured)",
        },
        "nvlink_bytes_per_s_per_gpu": d.nvlink_bw,
        "tables": {k: v for k, v in km.sources.items() if k != "elementwise"},
        "fit": fit_doc,
    }
    details = {**provenance,
               "figure1_composed": _figure1(spec, km, prefill),
               "prefill_points": [_row(p.ranges, t, q, p.holdout, x, sm) for p, t, q, x, sm in
                                  zip(grid, composed, pred, extra, small, strict=True)],
               "decode_points": [_row([b, c], t, t * (1 + r), h, x) for (b, c, h), t, r, x in
                                 zip(dgrid, dt, drel, dextra, strict=True)],
               "notes": __doc__.split("\n\n", 3)[3].strip().replace("\n", " ")}
    prof = Profile(
        name=profile_name(system, framework, model, gpus, ep), model=model, gpus=gpus,
        device=f"{system} x{gpus}{f' of DP{ep} x EP{ep}' if ep > 1 else ''} ({framework} "
               f"{fw_version} kernel tables)",
        provenance=(f"fitted to measured kernel tables ({origin['package']} "
                    f"{origin.get('version', '')}, {system}, {framework} {fw_version}); "
                    "context attention measured to 16K tokens, extrapolated beyond").replace(
                        " ,", ","),
        prefill=prefill, decode=decode, transfer=transfer, details=plain_types(details))
    return prof, {"fit": plain_types(fit_doc), "provenance": plain_types(provenance)}


def _tokens(ranges) -> int:
    return sum(b - a for a, b in ranges)


def _row(point, composed: float, predicted: float, holdout: bool, extrapolated: bool,
         small: bool = False) -> dict:
    kind = ("extrapolated" if extrapolated else "small" if small else
            "holdout" if holdout else "train")
    return {"point": [list(r) for r in point] if isinstance(point[0], tuple) else list(point),
            "composed_s": float(composed), "predicted_s": float(predicted), "set": kind}


def _figure1(spec: ModelSpec, km: KernelModel, prefill: PrefillCoeffs) -> list[dict]:
    rows = []
    for k in CONTEXTS_K:
        front, tail = (p.ranges for p in _figure1_pair(k * K))

        def fitted(r):
            u = ranges_units(spec, r)
            return (prefill.fixed_s + prefill.per_linear_unit_s * u.linear
                    + prefill.per_attention_unit_s * u.attention
                    + prefill.per_chunk_token_sq_s * u.tokens**2)

        rows.append({"context_tokens": k * K,
                     "composed_speedup": km.prefill_seconds(tail) / km.prefill_seconds(front),
                     "profile_speedup": fitted(tail) / fitted(front),
                     "extrapolated": bool(km.prefill_extrapolated(front))})
    return rows


def _version() -> str:
    try:
        return metadata.version("kvsim")
    except metadata.PackageNotFoundError:  # pragma: no cover
        return "unknown"


