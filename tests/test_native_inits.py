"""The hot records of the compiled core are declared once: a request, its admission and its
record as plain dataclasses, an eviction's result by its native ``__init__``. Each object takes
the fields' defaults, and lists of its own (a request's locks, ranges and hint, a result's
freed and demoted ids)."""

from __future__ import annotations

import dataclasses
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

RECORDS = (Req, VllmReq, Admission, RequestRecord)


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
