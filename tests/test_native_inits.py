"""Dataclasses of the compiled core whose ``__init__`` is written out (so that mypyc builds
them natively: a generated one runs interpreted) take exactly their fields: the same names in
the same order, the same defaults, and a fresh value of the default factory where a field
has one (the written-out ``__init__`` takes None for it)."""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import pytest
import simpy

from sim.engines.recorder import RequestRecord
from sim.engines.request import Req
from sim.engines.sglang import Admission
from sim.engines.vllm import VllmReq
from sim.kvcache import Node, Tier
from sim.kvcache.results import EvictResult

WRITTEN_OUT = (Req, Admission, RequestRecord, EvictResult)


def _same(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return False
    return a == b or (isinstance(a, float) and isinstance(b, float)
                      and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_the_written_out_init_takes_the_fields(cls):
    assert "__init__" in vars(cls)
    if not inspect.isfunction(cls.__init__):  # compiled: no Python signature to read
        pytest.skip("a compiled __init__ has no signature; the Python path reads it")
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        if f.default is not dataclasses.MISSING:
            assert _same(p.default, f.default), f.name
        elif f.default_factory is not dataclasses.MISSING:
            assert p.default is None, f.name
        else:
            assert p.default is inspect.Parameter.empty, f.name


def _required(cls) -> dict:
    """A value for each field without a default."""
    env = simpy.Environment()
    values = {"done": env.event(), "ids": np.zeros(2, np.int64)}
    if cls is Admission:  # (typed: the compiled core checks them)
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


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
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



@pytest.mark.parametrize("cls", (Req, VllmReq), ids=lambda c: c.__name__)
def test_a_sent_request_is_the_one_built_by_keywords(cls):
    """``Req.sent`` (the replay's positional construction) gives the request a call by
    keywords gives: every field the same, the defaults included."""
    from sim.kvcache.paths import WalkHint

    done, hint, ids = simpy.Environment().event(), WalkHint(), np.arange(3, dtype=np.int64)
    args = dict(rid=5, session=2, arrival=1.5, prompt_tokens=100, output_tokens=7, ids=ids,
                done=done, prompt=object(), shared_blocks=1, next_gap="tool",
                next_gap_s=2.5, next_send_s=math.nan, hint=hint)
    sent = cls.sent(*args.values())
    built = cls(seq=0, **args)
    assert type(sent) is cls
    for f in dataclasses.fields(cls):
        a, b = getattr(sent, f.name), getattr(built, f.name)
        assert _same(a, b) or (isinstance(a, list) and a == b), f.name
