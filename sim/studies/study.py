"""What a named study is: one ``Experiment`` record, the ``StudySetup`` it runs in, its runs.

An ``Experiment`` holds everything ``kvsim reproduce NAME`` needs and nothing holds it for it:
its rows (the runs it makes, ``StudySetup -> rows``), what its document carries beside them
(``extras``), its tables (``layout`` under a heading, or ``tables`` of its own), the numbers
the paper published (``paper``), how its document names the tree shapes and gap models it ran
(``prompt_nodes``, ``gaps_of_rows``), whether it replays traces at all (``replays``), and its
forms on other engines (``forms``: ``policies`` on the vllm engine is Continuum's study). The
driver (sim/studies/__init__.py ``reproduce``) and the command read these fields; neither asks
for a study by its name.

Defaults follow the paper's setup (docs/reproduction.md, Setup): the 24 Claude Code sessions
with most requests after the context cut, a 15.6K-token shared prefix, the cache-aware
scheduler (lpm) for every system, GPU KV caps 256K / 192K / 384K tokens for Qwen3 8B / 32B /
235B-A22B, and the recorded *tool* waits as the gap model (the paper replays "the recorded tool
time"). Without ``--trace`` the shared cc-traces are used when present, else the synthetic
Claude Code trace. ``--quick`` shrinks every run to seconds (tests, notebooks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from costmodel.registry import Registry
from sim.config import RunConfig
from sim.report.progress import current as current_progress
from sim.report.tables import Col, narrow_table
from sim.sweep.executors import ExecutorSpec

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"
SHARED_CC_TRACES = SHARED_DATA / "cc-traces"
SHARED_PREFIX = 15974  # 15.6K tokens (K = 1024)
# --quick: the 8 sessions with most requests under 64K tokens, 4 at a time, in 96K tokens.
QUICK_SELECT = "top-requests:8"
QUICK_CONTEXT = 65536
QUICK_GPU_CACHE = 98304

# GPU-only KV caps and context cut per model (paper: 8B/32B 128K context, 235B 256K).
MODEL_SETUP: dict[str, tuple[int, int]] = {
    "qwen3-8b": (262144, 131072),
    "qwen3-32b": (196608, 131072),
    "qwen3-235b-a22b": (393216, 262144),
}

Rows = list[dict[str, Any]]
Layout = tuple[tuple[str, tuple[Col, ...]], ...]  # (table title, its columns) per table
# columns many studies' tables share
TREE, MODEL, N = Col("tree", "prompt_nodes"), Col("model", "model"), Col("N", "sessions", "int")


@dataclass
class StudySetup:
    trace: str
    quick: bool = False
    gaps: str = "tool"
    jobs: int = 1
    prompt_nodes: str = "chunked"  # chunked (SGLang: a node per prefill chunk) | whole
    profiles: str | None = None  # a shipped profile family (derived, kernels); None: default
    notes: list[str] = field(default_factory=list)
    executor: ExecutorSpec | None = None  # None: local, ``jobs`` processes

    def profile(self, model: str) -> str | None:
        from costmodel.profile import default_profile_name

        return None if self.profiles is None else default_profile_name(model, self.profiles)

    @property
    def is_synthetic(self) -> bool:
        return self.trace.startswith("synthetic:")

    def base(self, model: str = "qwen3-8b", sessions: int = 4) -> RunConfig:
        cache, ctx_cut = MODEL_SETUP.get(model, (262144, 131072))
        cfg = RunConfig.from_flat(trace=self.trace, model=model, gpu_cache=cache,
                                  max_context=ctx_cut,
                                  shared_prefix=None if self.is_synthetic else SHARED_PREFIX,
                                  select=None if self.is_synthetic else "top-requests:24",
                                  gaps=self.gaps, sessions=sessions, scheduler="lpm",
                                  checkpoint_chunks=self.prompt_nodes == "chunked",
                                  profile=self.profile(model))
        if self.quick:
            # Seconds, not minutes: fewer sessions, shorter contexts, a proportionally
            # smaller cache so that eviction still happens.
            cfg = cfg.with_fields(select=None if self.is_synthetic else QUICK_SELECT,
                                  max_context=QUICK_CONTEXT, gpu_cache=QUICK_GPU_CACHE)
            if self.is_synthetic:
                cfg = cfg.with_fields(trace=_quick_synthetic(self.trace))
        return cfg


def _quick_synthetic(trace: str) -> str:
    sep = "&" if "?" in trace else "?"
    return trace if "sessions=" in trace else f"{trace}{sep}sessions=6"


def run_all(ctx: StudySetup, configs: list[RunConfig], job: Callable | None = None) -> Rows:
    """Summaries of ``configs`` in order (or what ``job(cfg, None, get_trace)`` returns for
    each), on the context's executor (identical results on every executor: a run is a pure
    function of its config and trace)."""
    spec = ctx.executor or ExecutorSpec(jobs=ctx.jobs)
    if spec.kind == "local" and len(configs) < 2:
        spec = replace(spec, jobs=1)
    ex = spec.make()
    out: list[dict[str, Any] | None] = [None] * len(configs)
    bar = current_progress()  # counts finished runs as they arrive (from any worker)
    runs_counted = bar.counts("runs")
    if runs_counted:
        bar.add_total(len(configs))
    try:
        for i, summary in ex.map(job or summary_of, [(c, None) for c in configs]):
            out[i] = summary
            if runs_counted:
                bar.advance()
    finally:
        ex.close()
    return out  # type: ignore[return-value]


def summary_of(cfg: RunConfig, _arg: Any, get_trace: Callable[[], Any]) -> dict[str, Any]:
    from sim.run import run

    return run(cfg, get_trace()).summary


def fleet_summary(cfg: RunConfig, _arg: Any, get_trace: Callable[[], Any]) -> dict[str, Any]:
    """A fleet run's summary without the per-replica list (smaller to send back): the job
    function of the fleet and pool studies."""
    from sim.run import run

    s = run(cfg, get_trace()).summary
    s.pop("replica_summaries", None)
    return s


def default_trace() -> tuple[str, str]:
    if SHARED_CC_TRACES.is_dir():
        return str(SHARED_CC_TRACES), "shared cc-traces (real Claude Code sessions)"
    return "synthetic:claude-code", "synthetic Claude Code trace (../shared/data absent)"


def heading(name: str, doc: dict[str, Any]) -> str:
    """The line above a study's tables: its trace and gap model."""
    return f"kvsim reproduce {name} -- {doc['trace_kind']}, gaps {doc['gaps']}"


@dataclass(frozen=True)
class Experiment:
    """A named study (see the module docstring). ``engine``: the engine its runs use (its
    document names it only when it is not the primary form's)."""

    name: str
    rows: Callable[[StudySetup], Rows]
    layout: Layout = ()
    tables: Callable[[dict[str, Any]], list[Any]] | None = None  # None: heading + layout
    heading: Callable[[dict[str, Any]], str] | None = None  # added to the heading line
    after: Callable[[dict[str, Any]], list[Any]] | None = None  # tables after the layout
    extras: Callable[[StudySetup], dict[str, Any]] | None = None
    paper: Mapping[str, Any] = field(default_factory=dict)
    prompt_nodes: str | None = None  # "both": runs both tree shapes, whatever is asked
    gaps_of_rows: bool = False  # runs its own gap models: the document lists the rows'
    replays: bool = True  # False: prices a formula (no runs to wait for, no trace read)
    engine: str = "sglang"
    forms: Mapping[str, Experiment] = field(default_factory=dict)  # engine -> its form there

    def on(self, engine: str | None) -> Experiment:
        """This study's form on ``engine`` (None: this one); a ``KeyError`` names the studies
        that have one."""
        if engine is None or engine == self.engine:
            return self
        if engine in self.forms:
            return self.forms[engine]
        others = [n for n in STUDIES.names() if engine in STUDIES.get(n).forms]
        raise KeyError(f"experiment {self.name!r} runs on the {self.engine} engine only; "
                       f"--engine {engine}: {', '.join(others) or 'none'}")

    def engines(self) -> tuple[str, ...]:
        return (self.engine, *self.forms)

    def gaps_label(self, rows: Rows, asked: str) -> str:
        """The document's ``gaps``: what was asked, or every gap model the rows ran."""
        return ",".join(dict.fromkeys(r["gaps"] for r in rows)) if self.gaps_of_rows else asked

    def render(self, doc: dict[str, Any]) -> list[Any]:
        """The heading and tables of this study's document (its JSON)."""
        if self.tables is not None:
            return self.tables(doc)
        head = heading(self.name, doc) + (self.heading(doc) if self.heading else "")
        return [head, *(narrow_table(title, list(cols), doc["rows"])
                         for title, cols in self.layout),
                *(self.after(doc) if self.after else ())]


# kvsim reproduce NAME -> its study (sim/studies/__init__.py registers them)
STUDIES: Registry[Experiment] = Registry("experiment")
