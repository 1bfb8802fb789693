"""The hot records of the compiled core are declared once, as keyword-only dataclasses: a
request, its admission, its record, an eviction's and a load's result. The compiled build gives
each a native ``__init__`` written out from its fields (setup.py ``native_source``: mypyc would
run the dataclasses module's, interpreted); these tests hold that generated ``__init__`` to the
dataclass's contract (the same fields in order, keyword-only, the same defaults, a fresh value
of each factory) and check that the build's extensions carry it. Each object takes the fields'
defaults, and lists of its own (a request's locks, ranges and hint, a result's freed and
demoted ids)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import sys
import types

import numpy as np
import pytest
import simpy

import setup as corebuild  # the build (setup.py at the repository's root)
from sim import native
from sim.engines.recorder import RequestRecord
from sim.engines.request import Req
from sim.engines.sglang import Admission
from sim.engines.vllm import VllmReq
from sim.kvcache import Node, Tier
from sim.kvcache.results import EvictResult, LoadResult

RECORDS = (Req, VllmReq, Admission, RequestRecord, EvictResult, LoadResult)
# The records the compiled build gives a native __init__ (keyword-only dataclasses of
# compiled modules; VllmReq's module is interpreted).
NATIVE = (Req, Admission, RequestRecord, EvictResult, LoadResult)


def _same(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    return a == b or (isinstance(a, float) and isinstance(b, float)
                      and math.isnan(a) and math.isnan(b))


def _required(cls) -> dict:
    """A value for each field without a default."""
    env = simpy.Environment()
    values = {"done": env.event(), "ids": np.zeros(2, np.int64)}
    if cls.__name__ == "Admission":  # (typed: the compiled core checks them)
        values["req"] = Req(**_required(Req))
        values["node"] = Node(np.zeros(1, np.int64), 0, None, Tier.GPU, 1)
        values.update(ranges=[(0, 64)], segments=(), found=())
    out = {}
    typed = {"bool": True, "int": 3, "float": 0.5, "str": "s"}  # (the compiled core checks)
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kind = getattr(f.type, "__name__", f.type)  # (a class where the core resolved it)
            out[f.name] = values.get(f.name, typed.get(kind, object()))
    return out


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_defaults_and_factories_are_the_fields(cls):
    args = _required(cls)
    a, b = cls(**args), cls(**args)
    for f in dataclasses.fields(cls):
        got = getattr(a, f.name)
        if f.name in args:
            assert _same(got, args[f.name]), f.name  # (the compiled core reboxes numbers)
        elif f.default is not dataclasses.MISSING:
            assert _same(got, f.default), f.name
        else:  # a fresh value per object, of the factory's
            want = f.default_factory()
            assert type(got) is type(want) and got is not getattr(b, f.name), f.name
            if isinstance(want, list):
                assert got == want, f.name


def test_an_eviction_result_starts_empty_with_lists_of_its_own():
    a, b = EvictResult(ok=True), EvictResult(ok=False)
    assert (a.ok, b.ok) == (True, False)
    assert (a.freed_blocks, a.holes_made, a.deleted_blocks, a.demoted_blocks) == (0, 0, 0, 0)
    assert a.freed == a.demoted == [] and a.freed is not b.freed and a.demoted is not b.demoted
    assert a.freed is not a.demoted


def _generated(cls: type) -> type:
    """``cls`` as the compiled copy declares it (setup.py ``native_source``), run as Python:
    the dataclass with the generated ``__init__`` in its body."""
    name = f"_native_copy_{cls.__module__.replace('.', '_')}"
    module = types.ModuleType(name)
    module.__package__ = cls.__module__.rpartition(".")[0]  # (its relative imports)
    sys.modules[name] = module  # (the dataclasses module reads the class's module)
    try:
        exec(compile(corebuild.native_source(cls.__module__), name, "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return getattr(module, cls.__name__)


@pytest.mark.parametrize("cls", NATIVE, ids=lambda c: c.__name__)
def test_the_generated_init_is_the_dataclasss_contract(cls):
    gen = _generated(cls)
    assert "__init__" in vars(gen)  # written in the class: the dataclass keeps it
    params = list(inspect.signature(gen.__init__).parameters.values())[1:]
    fields = [f for f in dataclasses.fields(cls) if f.init]
    assert [p.name for p in params] == [f.name for f in fields]
    assert {p.kind for p in params} == {inspect.Parameter.KEYWORD_ONLY}
    for p, f in zip(params, fields, strict=True):
        if f.default_factory is not dataclasses.MISSING:
            assert p.default is None, f.name  # None: not given, a fresh factory value
        elif f.default is dataclasses.MISSING:
            assert p.default is inspect.Parameter.empty, f.name
        else:
            assert _same(p.default, f.default), f.name
    # built by the same keywords, both objects agree field by field, and every value given
    # is the object's own
    args = _required(cls)
    a, b = cls(**args), gen(**args)
    for f in dataclasses.fields(cls):
        got, want = getattr(b, f.name), getattr(a, f.name)
        assert type(got) is type(want), f.name
        if f.default_factory is dataclasses.MISSING or isinstance(want, list):
            assert _same(got, want), f.name  # (else a fresh object of the factory's type)
    given = {f.name: object() for f in fields}
    made = gen(**given)
    assert all(getattr(made, k) is v for k, v in given.items())
    with pytest.raises(TypeError):  # keyword-only: a swapped pair cannot pass by position
        gen(*args.values())


def test_the_compiled_copy_keeps_every_line_and_changes_only_the_records():
    for module in native.COMPILED:
        src = native.source(module).read_text().splitlines()
        gen = corebuild.native_source(module).splitlines()
        assert len(gen) == len(src), module  # a compiled traceback's line is the source's
        changed = [(a, b) for a, b in zip(src, gen, strict=True) if a != b]
        assert all(not a.strip() and b.strip().startswith("def __init__(self, *")
                   for a, b in changed), module
    assert {c.__module__ for c in NATIVE} <= set(native.COMPILED)


def _init_of(code: str) -> str | None:
    node = ast.parse(code).body[0]
    assert isinstance(node, ast.ClassDef)
    return corebuild.native_init(node, "m.C")


def test_only_keyword_only_mutable_dataclasses_get_a_generated_init():
    assert _init_of("@dataclass(kw_only=True)\nclass C:\n    a: int\n    b: str = 'x'\n") == (
        "def __init__(self, *, a: int, b: str = 'x') -> None: self.a = a; self.b = b")
    for decorator in ("@dataclass", "@dataclass(kw_only=True, frozen=True)",
                      "@dataclass(kw_only=True, init=False)", "@other"):
        assert _init_of(f"{decorator}\nclass C:\n    a: int\n") is None, decorator
    own = "@dataclass(kw_only=True)\nclass C:\n    a: int\n    def __init__(self): pass\n"
    assert _init_of(own) is None
    with pytest.raises(SystemExit, match="may be None"):  # None marks "not given"
        _init_of("@dataclass(kw_only=True)\nclass C:\n"
                 "    a: list | None = field(default_factory=list)\n")
    with pytest.raises(SystemExit, match="base class"):  # its fields would be elsewhere
        _init_of("@dataclass(kw_only=True)\nclass C(B):\n    a: int\n")


def test_post_init_and_fields_outside_init_follow_the_dataclass():
    init = _init_of("@dataclass(kw_only=True)\nclass C:\n    a: int\n"
                    "    n: list = field(default_factory=list, init=False)\n"
                    "    z: ClassVar[int] = 3\n    def __post_init__(self): pass\n")
    assert init == ("def __init__(self, *, a: int) -> None: self.a = a; self.n = list(); "
                    "self.__post_init__()")


@pytest.mark.skipif(not native.current()[0], reason="the Python path runs the dataclasses'")
@pytest.mark.parametrize("cls", NATIVE, ids=lambda c: c.__name__)
def test_the_compiled_records_init_is_native(cls):
    assert not isinstance(vars(cls)["__init__"], types.FunctionType)  # not interpreted
    assert dataclasses.is_dataclass(cls)  # fields(), repr and eq as declared
