"""Named studies: the paper's experiments and the ones beside them, one ``Experiment`` record
each (sim/studies/study.py), and the clockless analyses they and ``kvsim capacity`` share.

====================  ========================================  =============================
module                owns                                      in -> out
====================  ========================================  =============================
study.py              the ``Experiment`` record, the paper's    StudySetup -> configs -> runs
                      setup (``StudySetup``), ``run_all``,
                      the registry ``STUDIES``
paper.py              figure1, gpu-only, ablation, fcfs         runs -> rows, tables
tiers.py              two-tier, cpu-sweep                       runs -> rows, tables
zoo.py                policies: the zoo against the oracle      runs -> rows, tables
continuum.py          policies on the vllm engine (Continuum)   runs -> rows, tables
cache_engineering.py  context strategies beside eviction        runs -> rows, extras, tables
fleet.py, pool.py     routers x eviction x replicas; a shared   runs, capacity -> rows, extras
                      pool and its capacity curves
pd.py                 aggregated against prefill/decode pools   runs -> rows, tables
                      at the same GPU count
capacity.py,          hit rate against cache size without a     Trace -> CapacityRows
capacity_fleet.py     clock (one cache, a fleet, a pool)
saturation.py         whether an open loop kept up              requests table -> Saturation
validate.py           a measured run replayed and scored        MeasuredRun -> Setup -> rows
                      (``kvsim validate``; docs/accuracy.md)
accuracy.py           every ground-truth run, uncalibrated and  MeasuredRun -> rows, folds
                      calibrated leave-one-out
hybrid.py             penelope vs sglang/vllm per attention     runs, figure1, capacity ->
                      kind at equal cache pressure in bytes     rows, extras
====================  ========================================  =============================

May import: ``sim.config``, ``sim.run``, ``sim.sweep`` (executors, ``relative_change``),
``sim.report`` (tables, progress), ``sim.kvcache`` and ``sim.fleet`` (the clockless replays),
``policies``, ``traces``, ``costmodel``, ``calibration.measured`` (accuracy.py's fit); never
the CLI. ``reproduce`` makes a study's JSON document; ``kvsim reproduce`` prints it with the
study's own tables.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.sweep.executors import ExecutorSpec

    from .study import STUDIES, Experiment, StudySetup, default_trace


@functools.cache
def _registered() -> ModuleType:
    """The study modules, loaded and registered at the first read of the registry: a
    command that only replays a capacity curve (``kvsim capacity`` imports
    ``sim.studies.capacity``) does not load every study, SimPy and the fleet with it."""
    from . import study
    from .accuracy import ACCURACY
    from .cache_engineering import CACHE_ENGINEERING
    from .fleet import FLEET
    from .hybrid import HYBRID
    from .paper import ABLATION, FCFS, FIGURE1, GPU_ONLY
    from .pd import PD
    from .pool import POOL
    from .tiers import CPU_SWEEP, TWO_TIER
    from .zoo import POLICIES

    # kvsim reproduce NAME, in the order its --help lists them
    for s in (FIGURE1, GPU_ONLY, TWO_TIER, ABLATION, FCFS, CPU_SWEEP, POLICIES,
              CACHE_ENGINEERING, FLEET, POOL, PD, ACCURACY, HYBRID):
        study.STUDIES.register(s.name, s)
    return study


def __getattr__(name: str) -> Any:
    if name in ("STUDIES", "Experiment", "StudySetup", "default_trace"):
        return getattr(_registered(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "STUDIES",
    "Experiment",
    "StudySetup",
    "default_trace",
    "experiment_tables",
    "reproduce",
]


def reproduce(name: str, trace: str | None = None, quick: bool = False, jobs: int = 1,
              gaps: str = "tool", prompt_nodes: str = "chunked",
              executor: ExecutorSpec | None = None,
              profiles: str | None = None, engine: str = "sglang") -> dict[str, Any]:
    """The JSON document of study ``name`` on ``engine``: what ran (trace, gaps, tree shapes),
    its rows, then what the study adds beside them."""
    reg = _registered()
    primary = reg.STUDIES.get(name)
    study = primary.on(engine)
    if trace is None:
        trace, which = reg.default_trace()
    else:
        which = "given trace"
    ctx = reg.StudySetup(trace=trace, quick=quick, gaps=gaps, jobs=jobs,
                         prompt_nodes=prompt_nodes, executor=executor, profiles=profiles)
    rows = study.rows(ctx)
    doc = {"experiment": name, "trace": trace, "trace_kind": which,
           "gaps": study.gaps_label(rows, gaps),
           "prompt_nodes": study.prompt_nodes or prompt_nodes,
           "quick": quick, "rows": rows}
    if study is not primary:  # only then: documents of the primary form stay as they were
        doc["engine"] = engine
    if profiles is not None:
        doc["profiles"] = profiles
    if ctx.notes:
        doc["notes"] = ctx.notes
    if study.extras is not None:
        doc.update(study.extras(ctx))
    return doc


def experiment_tables(name: str, doc: dict[str, Any]) -> list[Any]:
    """The heading and tables of study ``name``'s document (``kvsim reproduce NAME --json``),
    in the form of the engine it names."""
    return _registered().STUDIES.get(name).on(doc.get("engine")).render(doc)
