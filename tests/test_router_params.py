"""Router parameters: every one of every registered router has a declared range, values
outside it (and NaN) are refused when the router is made, before any run; a parameter the
others' values make inert is refused; belief specs check their own fields."""

from __future__ import annotations

import itertools
import math

import pytest
from click.testing import CliRunner

from policies import PolicyError
from policies.eviction import OneOf, Range
from policies.routing import (
    ROUTERS,
    ApproxTree,
    ApproxTTL,
    KVEvents,
    PodLRU,
    Router,
    ScrapedMetrics,
    get_router,
)
from sim.cli.main import cli
from sim.config import ConfigError, RunConfig
from sim.run import check


def _outside(domain, default) -> list:
    """Values just outside ``domain`` (NaN and the infinite ends too for a float)."""
    if isinstance(domain, OneOf):
        return ["not-" + "-".join(map(str, domain.values))]
    out: list = [math.nan] if isinstance(default, float) else []
    for end, step, is_open in ((domain.lo, -1, domain.lo_open), (domain.hi, 1, domain.hi_open)):
        if math.isinf(end):
            if isinstance(default, float):
                out.append(end)  # infinite ends are open
        elif isinstance(default, int):
            out.append(int(end) if is_open else int(end) + step)
        else:
            out.append(end if is_open else end + step * 1e-9)
    return out


def _context(name: str, k: str) -> dict[str, str]:
    """Values of the flags and choices (``OneOf`` parameters such as ``version``) under
    which parameter ``k`` of router ``name`` is not inert."""
    cls = ROUTERS[name]
    choices = {f: ("true", "false") for f, d in cls.parameters().items() if isinstance(d, bool)}
    choices |= {f: tuple(map(str, dom.values)) for f, dom in cls.parameter_ranges.items()
                if isinstance(dom, OneOf) and f != k}
    defaults = {f: str(d).lower() if isinstance(d, bool) else str(d)
                for f, d in cls.parameters().items()}
    for picked in itertools.product(*choices.values()):
        # only the choices that differ from their defaults are given
        ctx = {f: v for f, v in zip(choices, picked, strict=True) if v != defaults[f]}
        try:
            router = get_router(name, ctx)
        except PolicyError:  # a combination whose choices idle one another
            continue
        if k not in router.idle_parameters():
            return ctx
    raise AssertionError(f"{name}.{k} does nothing under every flag")


# the shipped routers (other tests register routers of their own)
SHIPPED = {name: cls for name, cls in ROUTERS.items()
           if cls.__module__.startswith("policies.routers.")}
PARAMS = [(name, k) for name, cls in sorted(SHIPPED.items()) for k in cls.parameters()]


def test_every_router_parameter_has_a_range() -> None:
    assert {"sglang-cache-aware", "dynamo-kv", "llm-d", "mooncake", "preble",
            "session-affinity"} <= set(SHIPPED)
    missing = [f"{name}.{k}" for name, k in PARAMS
               if not isinstance(ROUTERS[name].parameters()[k], bool)
               and k not in ROUTERS[name].parameter_ranges]
    assert not missing, f"parameters without a declared range: {missing}"
    for name, cls in SHIPPED.items():
        for k, default in cls.parameters().items():
            domain = cls.parameter_ranges.get(k)
            assert domain is None or default in domain, f"{name}.{k} default {default!r}"


@pytest.mark.parametrize("name,k", [p for p in PARAMS
                                    if not isinstance(ROUTERS[p[0]].parameters()[p[1]], bool)])
def test_out_of_range_router_parameters_are_refused(name, k) -> None:
    domain = ROUTERS[name].parameter_ranges[k]
    default = ROUTERS[name].parameters()[k]
    ctx = _context(name, k)
    values = _outside(domain, default)
    assert values
    for v in values:
        with pytest.raises(PolicyError) as e:
            get_router(name, {**ctx, k: str(v)})
        assert repr(k) in str(e.value) and "does nothing" not in str(e.value), str(e.value)
    get_router(name, {**ctx, k: str(default)})  # the default itself is in range


@pytest.mark.parametrize("name,params,needle", [
    ("dynamo-kv", {"temperature": "-1"}, "'temperature' must be finite and >= 0, got -1.0"),
    ("dynamo-kv", {"prefill_load_scale": "inf"}, "'prefill_load_scale' must be finite"),
    ("sglang-cache-aware", {"cache_threshold": "1.5"}, "must be in [0, 1], got 1.5"),
    ("sglang-cache-aware", {"cache_threshold": "-1"}, "must be in [0, 1], got -1.0"),
    ("sglang-cache-aware", {"cache_threshold": "nan"}, "'nan' is not a number (NaN)"),
    ("preble", {"window_s": "-10"}, "'window_s' must be finite and > 0, got -10.0"),
    ("llm-d", {"scrape_s": "0"}, "'scrape_s' must be finite and > 0, got 0.0"),
    ("mooncake", {"event_lag_s": "-0.5"}, "'event_lag_s' must be finite and >= 0"),
    ("dynamo-kv", {"event_lag_s": "-1"}, "'event_lag_s' must be finite and >= 0"),
    ("dynamo-kv", {"ttl_s": "30"}, "parameter 'ttl_s' does nothing here"),
    ("dynamo-kv", {"max_tree_size": "1000"}, "parameter 'max_tree_size' does nothing here"),
    ("dynamo-kv", {"use_kv_events": "false", "event_lag_s": "1"},
     "parameter 'event_lag_s' does nothing here"),
])
def test_the_issue_cases_are_refused_with_the_range(name, params, needle) -> None:
    with pytest.raises(PolicyError) as e:
        get_router(name, params)
    assert needle in str(e.value) and f"router {name!r}" in str(e.value)


def test_in_range_values_and_the_approximate_mode_still_apply() -> None:
    r = get_router("dynamo-kv", {"use_kv_events": "false", "ttl_s": "30"})
    assert r.ttl_s == 30.0 and isinstance(r.cache_view, ApproxTTL)
    assert get_router("sglang-cache-aware", {"cache_threshold": "1"}).cache_threshold == 1.0
    assert get_router("dynamo-kv", {"temperature": "0.5"}).label == "dynamo-kv(temperature=0.5)"


def test_a_refused_router_parameter_is_one_line_before_the_run() -> None:
    res = CliRunner().invoke(cli, ["run", "--trace", "synthetic:chat?sessions=2", "--gpu-cache",
                                   "16k", "--replicas", "2", "--router", "dynamo-kv",
                                   "--router-param", "temperature=nan"])
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "temperature" in lines[0] and "NaN" in lines[0], res.stderr
    with pytest.raises(ConfigError, match="scrape_s"):
        check(RunConfig.from_flat(replicas=2, router="llm-d", router_params={"scrape_s": 0}))


def test_nan_is_refused_for_any_float_parameter() -> None:
    class Mine(Router):
        weight: float = 1.0

        def route(self, request, view):
            return 0

    for v in ("nan", math.nan, "NaN"):
        with pytest.raises(PolicyError, match="NaN"):
            Mine(weight=v)


def test_a_user_router_may_declare_ranges_and_inert_parameters() -> None:
    from policies.routing import ranges

    class Mine(Router):
        share: float = 0.5
        exact: bool = True
        lag_s: float = 0.0
        parameter_ranges = ranges(share=Range(0.0, 1.0, hi_open=True), lag_s=Range(0.0))

        def idle_parameters(self):
            return {} if self.exact else {"lag_s": "no events without exact"}

        def route(self, request, view):
            return 0

    assert Mine(share=0.99).share == 0.99
    with pytest.raises(PolicyError, match=r"in \[0, 1\)"):
        Mine(share=1)
    with pytest.raises(PolicyError, match="no events without exact"):
        Mine(exact=False, lag_s=1)

    class Stray(Router):
        parameter_ranges = ranges(nothing=Range(0.0))

    with pytest.raises(PolicyError, match="not a parameter"):
        Stray()


@pytest.mark.parametrize("make,needle", [
    (lambda: ScrapedMetrics(scrape_s=0.0), "scrape_s must be finite and > 0"),
    (lambda: ScrapedMetrics(scrape_s=math.nan), "scrape_s"),
    (lambda: KVEvents(lag_s=-1.0), "lag_s must be finite and >= 0"),
    (lambda: ApproxTree(eviction_interval_s=0.0), "eviction_interval_s"),
    (lambda: ApproxTTL(prune_ratio=1.5), "prune_ratio must be in (0, 1]"),
    (lambda: PodLRU(capacity_blocks=0), "capacity_blocks"),
])
def test_belief_specs_check_their_fields(make, needle) -> None:
    with pytest.raises(PolicyError, match=None) as e:
        make()
    assert needle in str(e.value)


def test_a_user_router_with_a_bad_view_is_refused_at_build_time(tmp_path) -> None:
    f = tmp_path / "r.py"
    f.write_text("from policies.routing import Router, ScrapedMetrics\n"
                 "class Scrapes(Router):\n"
                 "    every_s: float = 0.0\n"
                 "    @property\n"
                 "    def load_view(self):\n"
                 "        return ScrapedMetrics(scrape_s=self.every_s)\n"
                 "    def route(self, request, view):\n"
                 "        return 0\n")
    res = CliRunner().invoke(cli, ["run", "--trace", "synthetic:chat?sessions=2", "--gpu-cache",
                                   "16k", "--replicas", "2", "--router", f"{f}:Scrapes"])
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr
    assert "scrape_s must be finite and > 0, got 0.0" in res.stderr
