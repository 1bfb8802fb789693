"""Derived (datasheet) profiles beside the measured-kernel ones: the tables of
``docs/calibration.md``, computed, never typed in::

    python -m calibration.kernels.compare            # markdown on stdout
    python -m calibration.kernels.compare --measured P.yaml --system h100_sxm
        # a torch-harness profile measured on a GPU (calibration/gpu_script.sh): the errors of
        # it, of the kernel-fitted and of the derived profile on its measured prefill points

1. per-coefficient ratios (kernel-fitted / derived), per model on one H100 system;
2. prediction errors of both profiles against the composed kernel times on one grid (the
   ``--from-kernels`` grid: fitted range, small batches, extrapolated);
3. Figure 1 (qwen3-8b) from each profile, from the composed kernel times, and the paper's.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

import numpy as np

from costmodel.derive import derive
from costmodel.figure1 import CONTEXTS_K, PAPER_MEASURED, figure1
from costmodel.profile import Profile, load_profile
from costmodel.specs import get_spec, model_names
from costmodel.units import ranges_units

from .compose import KernelModel
from .run import MIN_FIT_TOKENS, decode_grid, prefill_grid, profile_name
from .ship import SYSTEMS

SYSTEM = "h100_sxm"


def _root() -> Path:
    return Path(str(resources.files("aiconfigurator_core") / "systems"))


def ratios(system: str = SYSTEM) -> list[dict]:
    rows = []
    for m in model_names():
        d, k = derive(m), load_profile(profile_name(system, "sglang", m))
        rows.append({
            "model": m, "gpus": k.gpus,
            "prefill_fixed_ms": (1e3 * d.prefill.fixed_s, 1e3 * k.prefill.fixed_s),
            "per_linear_unit": k.prefill.per_linear_unit_s / d.prefill.per_linear_unit_s,
            "per_attention_unit": (k.prefill.per_attention_unit_s
                                   / d.prefill.per_attention_unit_s),
            "decode_intercept": ((k.decode.fixed_s + k.decode.weights_s)
                                 / (d.decode.fixed_s + d.decode.weights_s)),
            "decode_per_seq": k.decode.per_seq_s / d.decode.per_seq_s,
            "decode_per_context_token": (k.decode.per_context_token_s
                                         / d.decode.per_context_token_s),
            "transfer_bandwidth": k.transfer.h2d_bytes_per_s / d.transfer.h2d_bytes_per_s})
    return rows


def _stats(rel: np.ndarray) -> str:
    a = np.abs(rel)
    return f"{100 * np.median(a):.1f}% / {100 * a.max():.1f}%" if a.size else "-"


def errors(system: str = SYSTEM) -> list[dict]:
    """Both profiles against the composed kernel times of the same grid."""
    root, rows = _root(), []
    for m in model_names():
        spec = get_spec(m)
        d, k = derive(m), load_profile(profile_name(system, "sglang", m))
        km = KernelModel(spec, root, system, "sglang", k.gpus)
        grid = prefill_grid()
        t = np.array([km.prefill_seconds(p.ranges) for p in grid])
        extra = np.array([km.prefill_extrapolated(p.ranges) for p in grid])
        small = np.array([sum(b - a for a, b in p.ranges) < MIN_FIT_TOKENS for p in grid])
        sets = {"fitted range": ~extra & ~small, "small batches": ~extra & small,
                "extrapolated": extra}
        row: dict = {"model": m}
        for label, prof in (("derived", d), ("kernels", k)):
            pred = np.array([prof.prefill_seconds(ranges_units(spec, p.ranges)) for p in grid])
            for name, mask in sets.items():
                row[f"{label} {name}"] = _stats(pred[mask] / t[mask] - 1)
            dg = [(b, c) for b, c, _ in decode_grid(km) if not km.decode_extrapolated(b, c)]
            dt = np.array([km.decode_seconds(b, c) for b, c in dg])
            dp = np.array([prof.decode_step_seconds(b, b * c) for b, c in dg])
            row[f"{label} decode"] = _stats(dp / dt - 1)
        rows.append(row)
    return rows


def figure1_rows(model: str = "qwen3-8b") -> list[dict]:
    spec = get_spec(model)
    profiles: list[tuple[str, Profile]] = [("derived H100 (datasheet)", derive(model))]
    profiles += [(f"kernels {s}", load_profile(profile_name(s, "sglang", model)))
                 for s in SYSTEMS]
    rows = []
    for label, prof in profiles:
        rows.append({"profile": label, **{f"{r['context_tokens'] // 1024}K":
                                          r["speedup_seconds"] for r in figure1(spec, prof)}})
    k = load_profile(profile_name(SYSTEM, "sglang", model))
    rows.append({"profile": "composed H100 kernels (no fit)",
                 **{f"{r['context_tokens'] // 1024}K": r["composed_speedup"]
                    for r in k.details["figure1_composed"]}})
    rows.append({"profile": "paper (measured, H100)",
                 **{f"{c}K": PAPER_MEASURED.get(c) for c in CONTEXTS_K}})
    return rows


def against_measured(path: str | Path, system: str) -> list[dict]:
    """Errors (median / max |rel|) of three profiles on the prefill points that the torch
    harness measured for ``path``'s model: that profile's own fit, the kernel-fitted profile
    of ``system`` and the derived one."""
    measured = load_profile(str(path))
    pts = measured.details.get("prefill_points") or []
    if not pts:
        raise ValueError(f"{path}: no details.prefill_points (not a kvsim calibrate profile)")
    spec = measured.spec
    t = np.array([p["measured_s"] for p in pts])
    units = [ranges_units(spec, [tuple(r) for r in p["point"]]) for p in pts]
    rows = []
    for label, prof in (("torch harness (its own fit)", measured),
                        (f"kernels {system}", load_profile(profile_name(system, "sglang",
                                                                        spec.name))),
                        ("derived H100", derive(spec.name))):
        pred = np.array([prof.prefill_seconds(u) for u in units])
        rows.append({"profile": label, "prefill median / max |rel|": _stats(pred / t - 1),
                     "points": len(t)})
    return rows


def _table(rows: list[dict], fmt=None) -> str:
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, tuple):
                cells.append(" -> ".join(f"{x:.2f}" for x in v))
            elif isinstance(v, float):
                cells.append(f"{v:.3f}")
            else:
                cells.append("-" if v is None else str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m calibration.kernels.compare")
    ap.add_argument("--measured", help="a profile written by kvsim calibrate --device cuda")
    ap.add_argument("--system", default=SYSTEM, help="kernel-table system to compare with")
    args = ap.parse_args(argv)
    if args.measured:
        if load_profile(args.measured).details.get("quick"):
            print(f"{args.measured}: a --quick profile times a tiny stand-in; nothing to "
                  "compare with the kernel tables", file=sys.stderr)
            return 0
        print(_table(against_measured(args.measured, args.system)))
        return 0
    print(f"### Coefficients: kernel-fitted / derived ({SYSTEM}, sglang)\n")
    print(_table(ratios()))
    print(f"\n### Errors against the composed kernel times ({SYSTEM}; median / max |rel|)\n")
    print(_table(errors()))
    print("\n### Figure 1, qwen3-8b: tail / front prefill time\n")
    print(_table(figure1_rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
