"""Server terms fitted from measured runs (``kvsim calibrate --from-measurements``; issue 53
item 5; docs/accuracy.md "Calibration").

A measured run (traces/measured.py) replays exactly as ``kvsim validate`` replays it
(sim/studies/validate.py ``setup`` / ``replay``); the fit moves the named terms of
``costmodel.profile.ServerCoeffs`` (``TERMS``: a few of them, ``DEFAULT_TERMS``) until the
replays' mean TTFT, mean TPOT and mean latency (``TARGETS``) match the measurements, in the
least-squares sense on log ratios (``log(kvsim / measured)``: a run's seconds and another's
weigh alike), with a weak pull toward the kernels' own prices (``PRIOR``) so that a direction
the runs do not determine stays where the kernels put it. The optimiser is a bounded,
damped Gauss-Newton over replays (forward differences, ``ITERATIONS`` steps): deterministic,
and every evaluation is a real replay, memoised per (run, terms) so that the leave-one-out
folds, which all start from the neutral terms, share their first evaluations.

Which terms transfer, and why these three by default:

- ``decode_scale`` / ``prefill_scale``: the server's decode and prefill against the kernel
  tables (launch gaps, norms, sampler, CUDA-graph padding that kernel timings leave out). A
  ratio to tables measured the same way on every GPU, it carries across GPUs priced by kernel
  tables; a GPU priced by its datasheet roofline (``derive.roofline``, its own stated
  efficiencies) is another base, so a scale is one parameter per profile kind
  (``profile_kind``): each run moves only its own kind's, and ``Calibration.apply`` prices a
  run of a kind the fit never saw without scales (its notes say so). Leave-one-out fits a run
  on the others of its own kind where there are any.
- ``mixed_interference``: how much of the smaller of a mixed step's prefill compute and
  decode memory time adds to the larger (one forward pass runs both; the roofline's max
  assumes they overlap perfectly): batch physics, not the GPU's.
- ``cpu_step_s`` / ``cpu_per_seq_s`` / ``cpu_per_token_s`` (not fitted by default): under
  async scheduling the CPU prepares the next step while the GPU runs this one, so with steps
  of tens of milliseconds (every shipped run) they are hidden and no run can measure them;
  ``--terms`` fits them from synchronous runs or small batches.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from costmodel.profile import DERIVED_TERMS, NEUTRAL_SERVER, ServerCoeffs, load_profile
from costmodel.safeyaml import safe_load
from sim.config import ConfigError

FORMAT_VERSION = 1
TARGETS: tuple[str, ...] = ("ttft_mean", "tpot_mean", "latency_mean")


@dataclass(frozen=True)
class Term:
    """A fitted server term: its bounds and finite-difference step in the fit's coordinate
    (``log`` for a scale, so 1.1x and 1/1.1x are equally far), and its neutral value."""

    log: bool
    lo: float
    hi: float
    step: float
    unit: float = 1.0  # fit coordinate x unit = the ServerCoeffs value (seconds)

    def to_z(self, v: float) -> float:
        return math.log(v) if self.log else v / self.unit

    def from_z(self, z: float) -> float:
        return math.exp(z) if self.log else z * self.unit


TERMS: dict[str, Term] = {
    "decode_scale": Term(True, math.log(0.5), math.log(3.0), 0.05),
    "prefill_scale": Term(True, math.log(0.5), math.log(3.0), 0.05),
    "mixed_interference": Term(False, 0.0, 1.0, 0.1),
    # in units of a typical size (10 ms a step, 0.5 ms a request, 50 us a token), so that
    # the pull toward neutral weighs every term alike
    "cpu_step_s": Term(False, 0.0, 5.0, 0.05, 1e-2),
    "cpu_per_seq_s": Term(False, 0.0, 2.0, 0.04, 5e-4),
    "cpu_per_token_s": Term(False, 0.0, 2.0, 0.04, 5e-5),
}
DEFAULT_TERMS: tuple[str, ...] = ("decode_scale", "prefill_scale", "mixed_interference")
SCALES = ("decode_scale", "prefill_scale")  # relative to the profile kind they were fitted on
PRIOR = 0.01  # weight of (z - neutral)**2 beside the squared log-ratio residuals
ITERATIONS = 3
QUICK_ITERATIONS = 1


def profile_kind(profile_name: str) -> str:
    """``kernel tables`` for a profile fitted to measured kernel tables (``kernels-*``), else
    ``datasheet`` (``roofline-*``, ``derived-*``) or ``file``."""
    base = Path(profile_name).name
    if base.startswith("kernels-"):
        return "kernel tables"
    if base.startswith(("roofline-", "derived-")):
        return "datasheet"
    return "file"


@dataclass(frozen=True)
class Calibration:
    """Fitted server terms and what they were fitted on (a ``kvsim_calibration`` YAML file):
    ``terms`` apply to every run, ``scales`` (``SCALES``, ratios to a profile kind's own
    prices) only to runs priced by a profile of that kind (``profile_kind``)."""

    terms: dict[str, float]
    fitted_on: tuple[str, ...]
    scales: dict[str, dict[str, float]] = field(default_factory=dict)
    targets: tuple[str, ...] = TARGETS
    training_rms: float = math.nan  # root mean square log error on the runs fitted on
    evaluations: int = 0  # replays of a run at some terms the fit read (memoised or not)

    @property
    def label(self) -> str:
        return "fitted on " + ", ".join(self.fitted_on)

    def server(self, kind: str) -> tuple[ServerCoeffs, list[str]]:
        """The ServerCoeffs of a run priced by a profile of ``kind``, and the scale terms that
        were fitted for other kinds only (left out)."""
        fitted = {t for sc in self.scales.values() for t in sc}
        own = self.scales.get(kind, {})
        return replace(NEUTRAL_SERVER, **self.terms, **own), sorted(fitted - set(own))

    def apply(self, s: Any, where: Path) -> Any:
        """The validate ``Setup`` ``s`` priced with these terms on top of its profile (written
        as a profile file under ``where``), its notes and ``calibration`` saying so."""
        kind = profile_kind(s.config.value("profile"))
        srv, left = self.server(kind)
        note = [f"calibration: {self.label}"] + ([
            f"calibration: {', '.join(left)} left out (fitted on "
            f"{', '.join(sorted(self.scales))} profiles; this run is priced by its {kind})"]
            if left else [])
        return priced(s, srv, self.label, note, where)

    def to_dict(self) -> dict[str, Any]:
        return {"kvsim_calibration": FORMAT_VERSION, "terms": dict(self.terms),
                "scales": {k: dict(v) for k, v in self.scales.items()},
                "fitted_on": list(self.fitted_on), "targets": list(self.targets),
                "training_rms": self.training_rms, "evaluations": self.evaluations,
                "provenance": "kvsim calibrate --from-measurements (calibration/measured.py): "
                              "server terms fitted by replaying the runs named in fitted_on"}

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def priced(s: Any, srv: ServerCoeffs, label: str, notes: list[str], where: Path) -> Any:
    """The validate ``Setup`` ``s`` with the server terms ``srv`` on top of its profile: the
    profile written under ``where`` (the file every ``--profile`` reads) and named in the
    run's config, ``calibration`` = ``label``. The setup's derived terms (``DERIVED_TERMS``:
    the LM head, all-reduces over the link; never fitted) are kept beside the fitted ones."""
    cfg = s.config
    name, model = cfg.value("profile"), cfg.value("model")
    srv = replace(srv, **{k: getattr(s.server, k) for k in DERIVED_TERMS})
    prof = load_profile(name, model).with_server(
        srv, f"kvsim calibrate --from-measurements: {label}")
    path = where / f"{Path(str(name)).name.removesuffix('.yaml')}-calibrated.yaml"
    prof.dump(path)
    return replace(s, config=cfg.with_fields(profile=str(path)), notes=[*s.notes, *notes],
                   calibration=label, server=NEUTRAL_SERVER)


def load_calibration(path: str | Path, option: str = "--calibration") -> Calibration:
    """A calibration file, validated field by field (one line naming the field; exit 2)."""
    def bad(where: str, why: str) -> ConfigError:
        return ConfigError(option, f"{path}: {where}", why)
    try:
        raw = safe_load(Path(path).read_text())
    except OSError as e:
        raise bad("<file>", f"cannot read: {e.strerror}") from None
    except yaml.YAMLError:
        raise bad("<yaml>", "not valid YAML") from None
    if not isinstance(raw, dict) or raw.get("kvsim_calibration") != FORMAT_VERSION:
        raise bad("kvsim_calibration", f"must be {FORMAT_VERSION} (a file kvsim calibrate "
                  "--from-measurements --out wrote)")
    terms = raw.get("terms")
    if not isinstance(terms, dict):
        raise bad("terms", "missing or not a mapping")
    scales = raw.get("scales", {})
    if not isinstance(scales, dict) or not all(isinstance(v, dict) for v in scales.values()):
        raise bad("scales", "must map a profile kind to its scale terms")
    groups = [("terms", terms)] + [(f"scales.{k}", v) for k, v in scales.items()]
    for where, group in groups:
        for k, v in group.items():
            if k not in TERMS or (k in SCALES) != (where != "terms"):
                raise bad(f"{where}.{k}", "unknown term here; terms: " + ", ".join(
                    t for t in TERMS if t not in SCALES) + "; scales: " + ", ".join(SCALES))
            t = TERMS[k]
            ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) \
                and (v > 0 or not t.log) and t.lo - 1e-9 <= t.to_z(v) <= t.hi + 1e-9
            if not ok:
                raise bad(f"{where}.{k}", f"must be a number within the term's bounds "
                          f"[{t.from_z(t.lo):g}, {t.from_z(t.hi):g}], got {v!r}")
    names = raw.get("fitted_on")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad("fitted_on", "must be a list of run names")
    return Calibration({k: float(v) for k, v in terms.items()}, tuple(names),
                       {k: {t: float(x) for t, x in v.items()} for k, v in scales.items()},
                       training_rms=float(raw.get("training_rms", math.nan)),
                       evaluations=int(raw.get("evaluations", 0)))


# --- replays, memoised -------------------------------------------------------------------------
@dataclass
class Case:
    """One measured run and the validate setup that replays it."""

    run: Any  # traces.measured.MeasuredRun
    setup: Any  # sim.studies.validate.Setup
    # the measured run this case replays under another profile (a training twin, named
    # apart): leave-one-out never trains on a twin of the run it scores
    of: str = ""

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def measured(self) -> str:
        return self.of or self.run.name


_CASES: list[Case] = []  # the worker processes' view (fork inherits it)


def _replay_one(i: int, terms: tuple[tuple[str, float], ...], where: str) -> dict[str, float]:
    from sim.studies.validate import replay

    case = _CASES[i]
    d = Path(tempfile.mkdtemp(dir=where))
    srv = replace(NEUTRAL_SERVER, **dict(terms))
    return replay(case.run, priced(case.setup, srv, "fit", [], d)).metrics


class Replays:
    """Replays of the cases at given terms, memoised, in ``workers`` processes (each replay is
    deterministic, so the answers do not depend on how they are spread)."""

    def __init__(self, cases: Sequence[Case], workers: int = 1,
                 progress: Callable[[str], None] | None = None) -> None:
        self.cases = list(cases)
        self.index = {c.name: i for i, c in enumerate(self.cases)}
        self.memo: dict[tuple[str, tuple[tuple[str, float], ...]], dict[str, float]] = {}
        self.workers = max(1, workers)
        self.progress = progress
        self.tmp = tempfile.TemporaryDirectory(prefix="kvsim-calibrate-")
        self.count = 0
        self._pool: Any = None  # forked once, on the first batch that can use it

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        self.tmp.cleanup()

    def _workers(self) -> Any:
        """The process pool, forked once with the cases (``_CASES``) and kept for every
        later batch."""
        if self._pool is None:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            global _CASES
            _CASES = list(self.cases)  # a copy: a serial Replays refills _CASES in place
            self._pool = ProcessPoolExecutor(self.workers, mp.get_context("fork"))
        return self._pool

    @staticmethod
    def key(terms: dict[str, float]) -> tuple[tuple[str, float], ...]:
        """The terms that are not neutral, rounded: equal replays share one key."""
        return tuple(sorted((k, round(v, 12)) for k, v in terms.items()
                            if round(v, 12) != getattr(NEUTRAL_SERVER, k)))

    def metrics(self, wanted: Sequence[tuple[str, dict[str, float]]]) -> list[dict[str, float]]:
        """The replays' metrics of each (run name, terms), replaying what is not memoised."""
        todo = []
        for name, terms in wanted:
            k = (name, self.key(terms))
            if k not in self.memo and k not in todo:
                todo.append(k)
        if todo:
            self.count += len(todo)
            if self.progress:
                self.progress(f"{len(todo)} replays ({self.count} in all)")
            jobs = [(self.index[n], t, self.tmp.name) for n, t in todo]
            if self.workers > 1 and len(jobs) > 1:
                done = list(self._workers().map(_replay_one, *zip(*jobs, strict=True)))
            else:
                _CASES[:] = self.cases
                done = [_replay_one(*j) for j in jobs]
            self.memo.update(zip(todo, done, strict=True))
        return [self.memo[(n, self.key(t))] for n, t in wanted]


# --- the fit -----------------------------------------------------------------------------------
@dataclass
class FitResult:
    calibration: Calibration
    history: list[float] = field(default_factory=list)  # cost after each iteration


def kind_of(replays: Replays, name: str) -> str:
    return profile_kind(replays.cases[replays.index[name]].setup.config.value("profile"))


# --- replays asked for in rounds ----------------------------------------------------------------
# A computation that needs replays is a generator: it yields the (run name, terms) it wants
# and is sent their metrics, in order; ``drive`` answers it from a ``Replays``. ``together``
# runs several in lockstep, so that every round's replays of all of them are one batch for
# the process pool (the leave-one-out folds' fits are independent) while each sees exactly
# the answers it would see alone.
Wanted = list[tuple[str, dict[str, float]]]
Steps = Generator[Wanted, list[dict[str, float]], Any]


def drive(replays: Replays, steps: Steps) -> Any:
    """Run ``steps``, answering each round from ``replays``; what it returns."""
    try:
        wanted = next(steps)
        while True:
            wanted = steps.send(replays.metrics(wanted))
    except StopIteration as done:
        return done.value


def together(all_steps: Sequence[Steps]) -> Steps:
    """The computations ``all_steps`` in lockstep: each round asks for what every one not yet
    finished wants (in their order); returns their results, in their order."""
    results: list[Any] = [None] * len(all_steps)
    pending: dict[int, Wanted] = {}
    for i, st in enumerate(all_steps):
        try:
            pending[i] = next(st)
        except StopIteration as done:
            results[i] = done.value
    while pending:
        got = iter((yield [w for i in sorted(pending) for w in pending[i]]))
        answered, pending = pending, {}
        for i in sorted(answered):
            mine = [next(got) for _ in answered[i]]
            try:
                pending[i] = all_steps[i].send(mine)
            except StopIteration as done:
                results[i] = done.value
    return results


def metrics_of(wanted: Wanted) -> Steps:
    """The replays ``wanted``, as one round (to run beside others with ``together``)."""
    return (yield wanted)


def fit(replays: Replays, names: Sequence[str], terms: Sequence[str] = DEFAULT_TERMS,
        targets: Sequence[str] = TARGETS, iterations: int = ITERATIONS) -> FitResult:
    """The terms that best replay the runs ``names`` (and only them: no other run's
    measurement is read), from the neutral terms (module docstring). A scale term is one
    parameter per profile kind among the runs (each run moves only its own kind's)."""
    return drive(replays, fit_steps(replays, names, terms, targets, iterations))


def fit_steps(replays: Replays, names: Sequence[str], terms: Sequence[str] = DEFAULT_TERMS,
              targets: Sequence[str] = TARGETS, iterations: int = ITERATIONS) -> Steps:
    """``fit``, asking for its replays in rounds (``drive``)."""
    for t in terms:
        if t not in TERMS:
            raise ConfigError("option", "--terms", f"unknown term {t!r}; known: "
                              f"{', '.join(TERMS)}")
    kinds = {n: kind_of(replays, n) for n in names}
    params = [(t, None) for t in terms if t not in SCALES] + [
        (t, k) for k in sorted(set(kinds.values())) for t in terms if t in SCALES]
    spec = [TERMS[t] for t, _k in params]
    z0 = np.array([s.to_z(getattr(NEUTRAL_SERVER, t)) for s, (t, _k) in zip(spec, params,
                                                                           strict=True)])
    lo = np.array([s.lo for s in spec])
    hi = np.array([s.hi for s in spec])
    h = np.array([s.step for s in spec])

    evaluations = [0]

    def run_terms(z: np.ndarray, name: str) -> dict[str, float]:
        return {t: s.from_z(float(v)) for (t, k), s, v in zip(params, spec, z, strict=True)
                if k is None or k == kinds[name]}

    def residuals(zs: list[np.ndarray]) -> Steps:
        """log(kvsim / measured) per run and target, at each point (one round of replays)."""
        evaluations[0] += len(zs) * len(names)
        got = iter((yield [(n, run_terms(z, n)) for z in zs for n in names]))
        out = []
        for _z in zs:
            r = []
            for n in names:
                sim = next(got)
                meas = replays.cases[replays.index[n]].run.metrics
                for k in targets:
                    if meas.get(k, 0) > 0:
                        v = sim.get(k, math.nan)
                        r.append(math.log(v / meas[k]) if v > 0 and math.isfinite(v) else 5.0)
            out.append(np.asarray(r))
        return out

    def cost(r: np.ndarray, z: np.ndarray) -> float:
        return float(r @ r + PRIOR * ((z - z0) @ (z - z0)))

    def probes(z: np.ndarray) -> list[np.ndarray]:
        out = [z]  # forward differences, backward at an upper bound
        for i in range(len(z)):
            e = z.copy()
            e[i] = z[i] + h[i] if z[i] + h[i] <= hi[i] else z[i] - h[i]
            out.append(e)
        return out

    z = z0.copy()
    pts = probes(z)
    res = yield from residuals(pts)
    r, c = res[0], cost(res[0], z)
    history = [c]
    mu = 1e-3
    for _ in range(iterations):
        jac = np.stack([(res[i + 1] - r) / (pts[i + 1][i] - z[i]) for i in range(len(z))], 1)
        a = jac.T @ jac + PRIOR * np.eye(len(z))
        g = jac.T @ r + PRIOR * (z - z0)
        improved = False
        for _try in range(3):  # damped: a step that does not lower the cost is shortened
            zn = np.clip(z + np.linalg.solve(a + mu * np.diag(np.diag(a)), -g), lo, hi)
            if np.allclose(zn, z, atol=1e-6):
                break
            pts = probes(zn)
            res = yield from residuals(pts)
            cn = cost(res[0], zn)
            if cn < c:
                z, r, c, improved = zn, res[0], cn, True
                mu = max(mu / 4, 1e-6)
                break
            mu *= 8
        history.append(c)
        if not improved:
            break
    shared = {t: round(s.from_z(float(v)), 6)
              for (t, k), s, v in zip(params, spec, z, strict=True) if k is None}
    scales: dict[str, dict[str, float]] = {}
    for (t, k), s, v in zip(params, spec, z, strict=True):
        if k is not None:
            scales.setdefault(k, {})[t] = round(s.from_z(float(v)), 6)
    rms = float(math.sqrt(r @ r / max(1, len(r))))
    cal = Calibration(shared, tuple(names), scales, tuple(targets), round(rms, 6),
                      evaluations[0])
    return FitResult(cal, history)


@dataclass
class Fold:
    """One leave-one-out fold: the run scored, the calibration fitted without it, and the
    scored run's metrics replayed with that calibration."""

    scored: str
    calibration: Calibration
    metrics: dict[str, float]


def leave_one_out(replays: Replays, names: Sequence[str], scored: Sequence[str] | None = None,
                  terms: Sequence[str] = DEFAULT_TERMS, targets: Sequence[str] = TARGETS,
                  iterations: int = ITERATIONS) -> list[Fold]:
    """For each run of ``scored`` (default: ``names``): fit on the runs of ``names`` other
    than it, then replay it with that fit. Of those, the runs priced by its own profile kind
    where there are any (another kind's run informs only the shared terms, at the price of
    fitting its own scales), else all of them (and it is priced without scales). A run of
    ``scored`` outside ``names`` is scored with the same rule over all of ``names``."""
    return drive(replays, leave_one_out_steps(replays, names, scored, terms, targets,
                                              iterations))


def leave_one_out_steps(replays: Replays, names: Sequence[str],
                        scored: Sequence[str] | None = None,
                        terms: Sequence[str] = DEFAULT_TERMS, targets: Sequence[str] = TARGETS,
                        iterations: int = ITERATIONS) -> Steps:
    """``leave_one_out``, asking for its replays in rounds (``drive``): the folds' distinct
    fits in lockstep, then every scored run's replay in one round."""
    trains: list[tuple[str, str, tuple[str, ...]]] = []  # (scored, its kind, fitted on)
    for s in (scored if scored is not None else names):
        others = tuple(n for n in names
                       if replays.cases[replays.index[n]].measured != s and n != s)
        if not others:
            raise ConfigError("option", "RUN", "leave-one-out needs at least two runs")
        kind = kind_of(replays, s)
        trains.append((s, kind, tuple(n for n in others if kind_of(replays, n) == kind)
                       or others))
    distinct = list(dict.fromkeys(train for _s, _k, train in trains))
    results = yield from together([fit_steps(replays, train, terms, targets, iterations)
                                   for train in distinct])
    fits = {train: r.calibration for train, r in zip(distinct, results, strict=True)}
    applied = []
    for s, kind, train in trains:
        srv, _left = fits[train].server(kind)
        applied.append((s, {t: getattr(srv, t) for t in TERMS}))
    got = yield applied
    return [Fold(s, fits[train], m) for (s, _k, train), m in zip(trains, got, strict=True)]


def default_workers() -> int:
    """Processes for the replays: the CPUs this process may use, at most 4."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(4, n))


__all__ = ["DEFAULT_TERMS", "TARGETS", "TERMS", "Calibration", "Case", "Fold", "Replays",
           "default_workers", "drive", "fit", "fit_steps", "leave_one_out",
           "leave_one_out_steps", "load_calibration", "metrics_of", "priced", "profile_kind",
           "together"]
