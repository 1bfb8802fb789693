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
from sim.engines.request import Req, VllmReq
from sim.engines.sglang import Admission
from sim.kvcache.results import EvictResult

WRITTEN_OUT = (Req, VllmReq, Admission, RequestRecord, EvictResult)


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float)
                      and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_the_written_out_init_takes_the_fields(cls):
    assert "__init__" in vars(cls)
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
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            out[f.name] = values.get(f.name, object())
    return out


@pytest.mark.parametrize("cls", WRITTEN_OUT, ids=lambda c: c.__name__)
def test_defaults_and_factories_are_the_fields(cls):
    args = _required(cls)
    a, b = cls(**args), cls(**args)
    for f in dataclasses.fields(cls):
        got = getattr(a, f.name)
        if f.name in args:
            assert got is args[f.name]
        elif f.default is not dataclasses.MISSING:
            assert _same(got, f.default), f.name
        else:  # a fresh value per object, of the factory's
            want = f.default_factory()
            assert type(got) is type(want) and got is not getattr(b, f.name), f.name
            if isinstance(want, list):
                assert got == want, f.name

