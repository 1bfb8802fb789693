"""The same answer on every machine (docs/engine.md, "Across machines").

A run must be a pure function of (trace, config, seed) on any CPU. The failure this guards
against: numpy's vectorised ``np.exp`` takes an AVX-512 code path where the CPU has one, so the
synthetic traces' lognormal draws differed in their last bit between machines with and without
AVX-512, and so did every time stamp downstream (``requests_sha1`` of a golden run moved while
every summary field stayed equal). Three checks, each able to catch that on ONE machine:

1. no product code calls a transcendental function whose bits depend on the machine (numpy or
   scipy ufuncs, libm through ``math``, numpy's libm-based distributions, a float power);
2. ``costmodel.detmath`` gives the same bits through every input path, agrees with correctly
   rounded references to 1 ulp, and its values are pinned as hex (goldens of intermediate
   quantities, not only hashes);
3. a subprocess with every numpy SIMD dispatch target switched off (the code path of a CPU
   without AVX2 or AVX-512), OpenBLAS forced to another kernel, another hash seed and the
   system allocator reproduces, bit for bit, the synthetic traces and the runs made here.
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from decimal import Context, Decimal
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from costmodel import detmath

PRODUCT = ("sim", "policies", "traces", "costmodel")
# What may call libm freely: this module's subject, and the harness that times a GPU (its
# outputs are profile files with provenance, read back as data).
EXEMPT = {"costmodel/detmath.py"}

# Functions whose result bits may depend on the CPU, the SIMD path or the C library.
NUMPY_TRANSCENDENTAL = {
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "logaddexp", "logaddexp2",
    "power", "float_power", "sin", "cos", "tan", "arcsin", "arccos", "arctan", "arctan2",
    "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh", "cbrt", "hypot", "dot", "matmul",
    "vdot", "inner", "outer", "einsum", "tensordot"}
MATH_TRANSCENDENTAL = {
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "pow", "sin", "cos", "tan",
    "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "erf", "erfc", "gamma", "lgamma", "cbrt", "hypot", "dist"}
# numpy Generator methods computed with libm inside (uniform bits, integers and shuffles are
# pure integer work and stay allowed).
LIBM_DISTRIBUTIONS = {
    "standard_normal", "normal", "lognormal", "exponential", "standard_exponential", "gamma",
    "standard_gamma", "beta", "poisson", "pareto", "weibull", "zipf", "laplace", "logistic",
    "gumbel", "vonmises", "wald", "rayleigh", "chisquare", "standard_t", "standard_cauchy",
    "binomial", "negative_binomial", "geometric", "hypergeometric", "logseries",
    "multivariate_normal", "dirichlet", "triangular", "noncentral_chisquare", "f",
    "noncentral_f", "power"}


def machine_dependent_calls(source: str) -> list[tuple[int, str]]:
    """(line, expression) of every call in ``source`` whose bits may differ between CPUs."""
    tree = ast.parse(source)
    numpy_names = {"np", "numpy"}
    math_names = {"math"}
    direct: set[str] = set()  # ``from math import exp``
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "numpy":
                    numpy_names.add(a.asname or a.name)
                if a.name == "math":
                    math_names.add(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom) and node.module in ("math", "numpy", "scipy.special"):
            for a in node.names:
                if node.module == "scipy.special" or a.name in (
                        MATH_TRANSCENDENTAL | NUMPY_TRANSCENDENTAL):
                    direct.add(a.asname or a.name)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scipy.special"):
            out.append((node.lineno, f"from {node.module} import ..."))
        if isinstance(node, ast.Call):
            f = node.func
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(
                f.value, ast.Name) else None
            if (owner in numpy_names and f.attr in NUMPY_TRANSCENDENTAL) or (
                    owner in math_names and f.attr in MATH_TRANSCENDENTAL):
                out.append((node.lineno, ast.unparse(f)))
            if isinstance(f, ast.Attribute) and f.attr in LIBM_DISTRIBUTIONS and (
                    "rng" in ast.unparse(f.value) or "random" in ast.unparse(f.value)):
                out.append((node.lineno, ast.unparse(f)))
            if isinstance(f, ast.Name) and f.id in direct:
                out.append((node.lineno, f.id))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow | ast.MatMult):
            exp_ = node.right
            if isinstance(node.op, ast.MatMult):
                out.append((node.lineno, ast.unparse(node)))
            elif not (isinstance(exp_, ast.Constant) and isinstance(exp_.value, int)) and not (
                    isinstance(exp_, ast.UnaryOp) and isinstance(exp_.operand, ast.Constant)
                    and isinstance(exp_.operand.value, int)):
                # ``x ** n`` with n an integer literal is exact repeated multiplication for
                # ints; anything else is libm's pow when a float is involved. Integer-only
                # powers (``2 ** k``, ``1 << k``) are allowed through an int base literal.
                base = node.left
                if not (isinstance(base, ast.Constant) and isinstance(base.value, int)):
                    out.append((node.lineno, ast.unparse(node)))
    return out


def product_files() -> list[Path]:
    return sorted(p for pkg in PRODUCT for p in (REPO / pkg).rglob("*.py")
                  if str(p.relative_to(REPO)) not in EXEMPT)


def test_product_code_calls_no_machine_dependent_math() -> None:
    bad = [f"{p.relative_to(REPO)}:{line}: {expr}"
           for p in product_files() for line, expr in machine_dependent_calls(p.read_text())]
    assert not bad, ("transcendental functions whose bits depend on the CPU (use "
                     "costmodel.detmath):\n" + "\n".join(bad))


def test_the_scan_catches_what_broke_and_its_kin() -> None:
    caught = machine_dependent_calls(
        "import numpy as np\nimport math\nfrom math import exp2\nfrom scipy.special import ndtri\n"
        "a = p * np.exp(q * ndtri(u))\n"
        "b = float(p * np.exp(q * rng.standard_normal()))\n"
        "c = math.log(x) + exp2(y) + x ** 0.5 + x ** y + A @ B + np.dot(a, b)\n")
    exprs = {e for _, e in caught}
    assert {"np.exp", "ndtri", "rng.standard_normal", "math.log", "exp2", "x ** 0.5", "x ** y",
            "A @ B", "np.dot"} <= exprs, exprs
    assert "from scipy.special import ..." in exprs
    fine = machine_dependent_calls(
        "import numpy as np\nimport math\n"
        "a = np.sqrt(x) + math.sqrt(y) + math.floor(z) + x ** 2 + 2 ** k + rng.random(n)\n"
        "b = rng.integers(0, 10) + np.cumsum(v) + math.ldexp(m, e) + (x * y) / z\n")
    assert fine == []


# --- detmath: one value, one bit pattern -----------------------------------------------------
def _cr(fn: str, x: float) -> float:
    """The correctly rounded reference (Decimal at 40 digits)."""
    ctx = Context(prec=40)
    return float(getattr(ctx, fn)(Decimal(x)))


def _ulps(a: float, b: float) -> float:
    return abs(a - b) / math.ulp(b) if b else abs(a - b) / math.ulp(0.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_exp_and_log_are_within_one_ulp_of_correctly_rounded(seed: int) -> None:
    rng = np.random.default_rng(seed)
    xs = np.concatenate([rng.standard_normal(3000) * 5, rng.uniform(-745, 709, 1000)])
    assert max(_ulps(detmath.exp(x), _cr("exp", x)) for x in xs.tolist()) <= 1.0
    ys = np.concatenate([np.abs(xs) + 1e-9, 10.0 ** rng.uniform(-320, 308, 1000)])
    assert max(_ulps(detmath.log(y), _cr("ln", y)) for y in ys.tolist()) <= 1.0
    for x in (0.3, -2.5, 10.7, -1074.0, 1000.5):
        ref = float(Context(prec=40).power(Decimal(2), Decimal(x)))
        assert _ulps(detmath.exp2(x), ref) <= 2.0


def test_powi_is_multiplications_only_and_close_to_the_exact_power() -> None:
    """``detmath.powi`` (the MoE expert share's ``(1 - k/E)^n``, costmodel/profile.py): exactly
    the repeated squaring's product: relative error grows with n (each squaring doubles it),
    within 2n ulps of the exact power."""
    rng = np.random.default_rng(3)
    for x, n in zip(rng.uniform(0.5, 1.0, 300).tolist(), rng.integers(0, 4096, 300).tolist(),
                    strict=True):
        exact = float(Context(prec=60).power(Decimal(x), int(n)))
        assert _ulps(detmath.powi(x, int(n)), exact) <= max(2.0, 2.0 * int(n))
    assert detmath.powi(0.75, 0) == 1.0 and detmath.powi(0.75, 3) == 0.75 * 0.75 * 0.75
    with pytest.raises(ValueError):
        detmath.powi(0.5, -1)


def test_ndtri_is_cephes_ndtri() -> None:
    from scipy.special import ndtri  # the reference only: product code may not call it

    rng = np.random.default_rng(2)
    us = np.concatenate([rng.random(3000), 10.0 ** rng.uniform(-300, -1, 1000),
                         1.0 - 10.0 ** rng.uniform(-16, -1, 1000)])
    worst = max(_ulps(detmath.ndtri(u), float(ndtri(u))) for u in us.tolist())
    assert worst <= 8.0  # scipy's log is the C library's; the algorithm is the same
    assert detmath.ndtri(0.5) == 0.0
    assert detmath.ndtri(0.0) == -math.inf and detmath.ndtri(1.0) == math.inf
    assert math.isnan(detmath.ndtri(1.5))
    assert detmath.normal_from_bits(0) < detmath.normal_from_bits(1) < -8.0
    assert detmath.normal_from_bits((1 << 52) - 1) == -detmath.normal_from_bits(0)


def test_edge_cases_follow_math() -> None:
    assert detmath.exp(0.0) == 1.0 and detmath.exp(-800.0) == 0.0
    assert math.isnan(detmath.exp(math.nan)) and detmath.log(1.0) == 0.0
    assert detmath.log(math.inf) == math.inf and detmath.log(5e-324) == math.log(5e-324)
    with pytest.raises(OverflowError):
        detmath.exp(710.0)
    with pytest.raises(ValueError):
        detmath.log(0.0)


def test_every_input_type_gives_the_same_bits() -> None:
    """A numpy float64, a Python float and a numpy array element give one bit pattern."""
    for x in (0.1, -3.7, 12.25, 1e-7):
        for fn in (detmath.exp, detmath.exp2, detmath.ndtri if 0 < x < 1 else detmath.exp):
            v = fn(x)
            assert fn(np.float64(x)) == v and fn(np.array([x])[0]) == v
        if x > 0:
            assert detmath.log(np.float64(x)) == detmath.log(x)


# Goldens of intermediate quantities, as hex: a change in any one of these bits on any
# machine means the synthetic traces are no longer the same traces.
DETMATH_HEX = {
    "exp(0.1)": "0x1.1aec7b35a00d4p+0",
    "exp(-3.7)": "0x1.9511fc6871044p-6",
    "exp(12.25)": "0x1.982aa4f9aec90p+17",
    "log(12.25)": "0x1.40b512eb53d60p+1",
    "log(1e-300)": "-0x1.5963447f87fb5p+9",
    "ndtri(0.025)": "-0x1.f5c0331eeff86p+0",
    "ndtri(0.9)": "0x1.4813c36e26d32p+0",
    "exp2(-0.3)": "0x1.9fdf8bcce533dp-1",
}


def _detmath_values() -> dict[str, str]:
    out = {}
    for key in DETMATH_HEX:
        name, arg = key.rstrip(")").split("(")
        out[key] = getattr(detmath, name)(float(arg)).hex()
    return out


def test_detmath_values_are_pinned() -> None:
    assert _detmath_values() == DETMATH_HEX


# --- a CPU without AVX-512 (or AVX2), in a subprocess ---------------------------------------
PROBE = r"""
import hashlib, json, sys
import numpy as np
from sim.config import RunConfig
from sim.run import run
from traces import load_trace

out = {}
for spec in ("synthetic:claude-code?sessions=12", "synthetic:codex?sessions=6",
             "synthetic:chat?sessions=6", "synthetic:prefix-groups?groups=3&users=2&turns=3"):
    t = load_trace(spec, cache_dir="off")
    arrays, scalars = t.storage()
    h = hashlib.sha1(json.dumps(scalars, sort_keys=True).encode())
    for name in sorted(arrays):
        if arrays[name] is not None:
            h.update(name.encode() + np.ascontiguousarray(arrays[name]).tobytes())
    out[spec] = h.hexdigest()
base = dict(trace="synthetic:claude-code?sessions=12", max_context=65536, gaps="tool",
            gpu_cache=98304, sessions=4, profile="derived-h100-qwen3-8b",
            scheduler="lpm", trace_cache_dir="off")
for label, extra in (("penelope", {}),
                     ("vllm", {"engine": "vllm", "preset": "vllm", "scheduler": "fcfs"}),
                     ("memdecay", {"policy": "memdecay"}),
                     ("budget", {"context": "budget:16k"}),
                     ("fleet", {"replicas": 2, "router": "dynamo-kv",
                                "router_params": {"temperature": 0.5}})):
    cfg = RunConfig.from_flat(**{**base, "preset": "penelope", **extra})
    if "policy" in extra:
        cfg = RunConfig.from_flat(**{**base, **extra})
    r = run(cfg)
    out[label] = [hashlib.sha1(r.requests.to_csv(index=False).encode()).hexdigest(),
                  json.dumps(r.summary, sort_keys=True, default=str)]
json.dump(out, sys.stdout)
"""


def _probe(env_extra: dict[str, str]) -> dict:
    env = {**os.environ, **env_extra}
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def _all_dispatch_targets() -> str:
    from numpy._core import _multiarray_umath as mu

    found = {k for k, v in mu.__cpu_features__.items() if v}
    return " ".join(t for t in mu.__cpu_dispatch__ if t in found)


@pytest.mark.slow
def test_runs_are_bit_identical_without_the_cpus_simd_paths() -> None:
    here = _probe({"PYTHONHASHSEED": "0"})
    other = _probe({"NPY_DISABLE_CPU_FEATURES": _all_dispatch_targets(),
                    "OPENBLAS_CORETYPE": "Prescott", "PYTHONHASHSEED": "12345",
                    "PYTHONMALLOC": "malloc"})
    assert other == here
    assert json.loads(other["fleet"][1])["replicas"] == 2  # the probe really ran a fleet


def test_the_probe_would_see_a_simd_difference() -> None:
    """np.exp over an array: the bits the old generator used differ with AVX-512 switched
    off on a machine that has it (where it has not, both paths are the same code)."""
    code = ("import numpy as np, hashlib; x = np.random.default_rng(1).standard_normal(100000);"
            "print(hashlib.sha1(np.exp(x).tobytes()).hexdigest())")
    targets = _all_dispatch_targets()
    a = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    b = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "NPY_DISABLE_CPU_FEATURES": targets})
    from numpy._core import _multiarray_umath as mu

    if mu.__cpu_features__.get("AVX512F"):
        assert a.stdout != b.stdout
    else:
        assert a.stdout == b.stdout
