"""One registry shape for every kind (costmodel/registry.py): register, get with one message
for an unknown name, names in registration order, and FILE.py:CLASS for the kinds users
extend."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from costmodel.registry import Registry, is_class_file, unknown

MESSAGE = re.compile(r"^unknown (?P<kind>[\w .-]+) '(?P<name>[^']*)'; known: (?P<known>.+)$")


def kinds() -> dict[str, Registry]:
    """Every registry of the product, by what it holds."""
    from calibration.grid import GRIDS
    from costmodel.profile import PROFILE_FAMILIES
    from costmodel.specs import SPECS
    from policies import GRANULARITIES, ORDERS, POLICIES, PRESETS, STARTS
    from policies.routing import ROUTERS
    from policies.scheduling import SCHEDULERS
    from sim.context.strategies import STRATEGIES
    from sim.engines import ENGINES
    from sim.engines.vllm_patch import VLLM_PATCHES
    from sim.studies import STUDIES
    from sim.sweep.executors import EXECUTORS
    from traces.synthetic import PROFILES

    return {"policies": POLICIES, "orders": ORDERS, "starts": STARTS,
            "granularities": GRANULARITIES, "presets": PRESETS, "routers": ROUTERS,
            "schedulers": SCHEDULERS, "engines": ENGINES, "vllm patches": VLLM_PATCHES,
            "studies": STUDIES, "executors": EXECUTORS, "models": SPECS,
            "calibration grids": GRIDS, "synthetic profiles": PROFILES,
            "context strategies": STRATEGIES, "profile families": PROFILE_FAMILIES}


def test_register_get_names_and_the_one_message() -> None:
    r: Registry[int] = Registry("widget", LookupError)
    r.register("a", 1)

    @r.register("b")
    def b() -> int:
        return 2

    assert r.get("a") == 1 and r.get("b") is b and r["a"] == 1
    assert r.names() == ("a", "b") and list(r) == ["a", "b"] and len(r) == 2
    assert "a" in r and "c" not in r and dict(r) == {"a": 1, "b": b}
    with pytest.raises(LookupError) as e:
        r.get("c")
    assert str(e.value) == "unknown widget 'c'; known: a, b"
    assert r.message("c", also=["z"], hint="or a number") == \
        "unknown widget 'c'; known: z, a, b, or a number"
    r.register("a", 3)  # a later registration replaces
    assert r.get("a") == 3
    u: Registry[int] = Registry("gadget", unique=True)
    u.register("a", 1)
    with pytest.raises(ValueError, match="gadget 'a' registered twice"):
        u.register("a", 2)
    c = r.copy()
    c.register("d", 4)
    assert "d" in c and "d" not in r and c.kind == r.kind
    assert unknown("thing", "x", []) == "unknown thing 'x'; known: none"


def test_files_load_a_subclass_of_the_base(tmp_path) -> None:
    class Base:
        pass

    r: Registry[type] = Registry("plug-in", ValueError, base=Base, file_kind="plug")
    f = tmp_path / "mine.py"
    f.write_text("class Good:\n    pass\n")
    assert is_class_file(f"{f}:Good") and not is_class_file("good")
    with pytest.raises(ValueError, match="'Good' is not a subclass of Base"):
        r.get(f"{f}:Good")
    with pytest.raises(ValueError, match="no class 'Bad' in the plug file"):
        r.get(f"{f}:Bad")
    with pytest.raises(ValueError, match="plug file not found"):
        r.get(f"{tmp_path}/none.py:Good")
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1\nraise RuntimeError('boom')\n")
    with pytest.raises(ValueError, match=r"broken.py:2: cannot load plug file: RuntimeError"):
        r.get(f"{broken}:X")
    assert r.message("zz").endswith("known: none, or FILE.py:CLASS")


def test_a_user_class_from_a_file_is_the_kinds_own() -> None:
    from policies import POLICIES, EvictionPolicy
    from policies.routing import ROUTERS, Router

    examples = Path(__file__).resolve().parent.parent / "docs" / "examples"
    assert POLICIES.base is EvictionPolicy and ROUTERS.base is Router
    assert issubclass(POLICIES.get(f"{examples}/hold_tool_calls.py:HoldToolCalls"),
                      EvictionPolicy)
    assert issubclass(ROUTERS.get(f"{examples}/prefix_or_least_load.py:PrefixOrLeastLoad"),
                      Router)
    with pytest.raises(ValueError, match="is not a subclass of Router"):
        ROUTERS.get(f"{examples}/hold_tool_calls.py:HoldToolCalls")


@pytest.mark.parametrize("what", sorted(kinds()))
def test_every_kind_is_a_registry_with_the_one_message(what: str) -> None:
    reg = kinds()[what]
    assert isinstance(reg, Registry) and reg.names()
    with pytest.raises(Exception) as e:  # the kind's own error type
        reg.get("no-such-name")
    text = e.value.args[0]
    m = MESSAGE.match(text)
    assert m, text
    assert m["kind"] == reg.kind and m["name"] == "no-such-name"
    assert m["known"].startswith(", ".join(reg.names())) or set(reg.names()) <= set(
        m["known"].replace(", or FILE.py:CLASS", "").split(", "))


def test_the_configs_vllm_patch_names_are_the_registrys() -> None:
    """sim/config.py validates vllm_patch against its own tuple (it may not import the
    engines): the tuple is the registry's names, in order."""
    from sim.config import VLLM_PATCH_NAMES
    from sim.engines.vllm_patch import VLLM_PATCHES

    assert VLLM_PATCH_NAMES == VLLM_PATCHES.names()
