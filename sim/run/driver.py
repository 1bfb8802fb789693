"""``run``: one configuration end to end, trace -> replicas -> requests table + summary.

Every kind of run (sim/run/kinds.py: one server, a fleet, a disaggregated fleet) goes the
same way: check the config, price the model, load the trace, build the replicas and the
front on one clock; the kind serves the trace (replays it to the last reply, closes, says
what it served) and one assembly (sim/run/summary.py ``summarize``) makes the result. A run is
a pure function of (trace, config, seed); the same inputs give byte-identical outputs.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from costmodel.profile import load_profile
from costmodel.specs import get_spec
from sim.config import ConfigError, RunConfig
from sim.engines import StepObserver
from sim.engines.clock import Clock

from .check import check
from .kinds import kind_of
from .repeats import run_repeats
from .result import RunResult
from .summary import summarize
from .trace import load_run_trace

# The youngest generation's threshold while a run serves (CPython's default is 700): a run
# allocates objects that mostly live until it ends (requests, records, KV events), so at the
# default the collector runs every few hundred allocations and keeps re-walking survivors (a
# tenth of a vLLM fleet run's CPU, issue 55). Garbage cycles still go, a few times per second.
RUN_GC_THRESHOLD = 10_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """The cyclic collector's youngest threshold at least ``RUN_GC_THRESHOLD`` inside, the
    caller's thresholds restored after. When the collector runs cannot change a result: no
    simulated object has a finalizer or a weak reference the run reads."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], RUN_GC_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def run(cfg: RunConfig, trace=None, timeline=None,
        on_reply: Callable[[], None] | None = None,
        steps: StepObserver | None = None) -> RunResult:
    """``trace``: the loaded trace (default: ``load_run_trace(cfg)``); ``timeline``: a
    sim/timeline.py ``Timeline`` to record the run's batches into (the first repeat's, with
    repeats); ``on_reply``: called once per trace request answered, in every repeat (progress
    on screen: it observes, and returns nothing to the run); ``steps``: a
    ``sim.engines.StepObserver`` every server of the run tells what each of its steps did
    (every repeat's)."""
    if cfg.repeats > 1:
        # a steps observer is told every repeat's steps: no repeat is reused for it
        return run_repeats(cfg, trace, lambda c, t, k: run(c, t, timeline if k == 0 else None,
                                                           on_reply, steps),
                           reuse=steps is None)
    check(cfg)
    profile = load_profile(cfg.cache.profile, cfg.cache.model)
    try:  # the model as the profile prices it: each kind's attention at its own rate
        spec = get_spec(cfg.cache.model, cfg.cache.kv_dtype, profile.attention_weights)
    except KeyError as e:
        raise ConfigError("config", "model", str(e.args[0])) from None
    except ValueError as e:  # an unknown kv_dtype
        raise ConfigError("config", "kv_dtype", str(e)) from None
    if trace is None:
        trace = load_run_trace(cfg)
    with fewer_collections():
        env = Clock()
        built = kind_of(cfg)(env, cfg, spec, profile, trace, timeline)  # replicas and front
        if steps is not None:
            for engine in built.engines:
                engine.watch(steps)
        return summarize(built, built.serve(on_reply))
