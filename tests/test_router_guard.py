"""A router the user wrote in their own file, as it fails: an exception inside ``route()``
or an answer that is not a replica index is ONE line naming the router, the method and the
user's file and line (the user's own frames under it; ``--debug`` keeps every frame), in
``kvsim run``, ``kvsim capacity`` and a sweep point, which fails alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli.main import cli

BAD_ROUTERS = '''from policies.routing import Router


class Raises(Router):
    def route(self, request, view):
        return helper(view)


def helper(view):
    return {}["missing"]


class Answer(Router):
    value: str = "7"

    def route(self, request, view):
        return {"7": 7, "-1": -1, "1.0": 1.0, "None": None, "True": True,
                "'1'": "1"}[self.value]


class FinishRaises(Router):
    def route(self, request, view):
        return 0

    def on_finish(self, rid, replica, now):
        raise RuntimeError("bookkeeping")
'''
RUN = ["run", "--trace", "synthetic:chat?sessions=4&max_requests=3", "--gpu-cache", "16k",
       "--preset", "sglang", "--replicas", "2"]
CAPACITY = ["capacity", "synthetic:chat?sessions=4&max_requests=3", "--cache", "16k",
            "--replicas", "2"]


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("routers") / "bad.py"
    f.write_text(BAD_ROUTERS)
    return f


def _error_line(res) -> tuple[str, list[str]]:
    """The one ``kvsim: error:`` line and the frames printed under it."""
    shown = res.stderr
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), shown
    assert "Traceback" not in shown, shown
    errors = [ln for ln in shown.splitlines() if ln.startswith("kvsim: error: ")]
    assert len(errors) == 1, shown
    after = shown[shown.index("kvsim: error: "):].splitlines()[1:]
    return errors[0], [ln for ln in after if ln.startswith("  File ")]


@pytest.mark.parametrize("command", [RUN, CAPACITY])
def test_a_router_that_raises_is_one_line_with_its_frames(bad, command) -> None:
    res = CliRunner().invoke(cli, [*command, "--router", f"{bad}:Raises"])
    line, frames = _error_line(res)
    assert "router Raises: route() raised KeyError: 'missing'" in line, line
    assert f"({bad}:10)" in line  # where it raised: the helper's line
    assert len(frames) == 2 and all(str(bad) in f for f in frames), res.stderr


def test_a_router_hook_that_raises_is_one_line(bad) -> None:
    res = CliRunner().invoke(cli, [*RUN, "--router", f"{bad}:FinishRaises"])
    line, _ = _error_line(res)
    assert "router FinishRaises: on_finish() raised RuntimeError: bookkeeping" in line


@pytest.mark.parametrize("value,shown", [("7", "7 (int)"), ("-1", "-1 (int)"),
                                         ("1.0", "1.0 (float)"), ("None", "None (NoneType)"),
                                         ("True", "True (bool)"), ("'1'", "'1' (str)")])
@pytest.mark.parametrize("command", [RUN, CAPACITY[:-2]])
def test_a_router_answer_that_is_not_an_index_is_one_line(bad, command, value, shown) -> None:
    args = [*command, "--router", f"{bad}:Answer?value={value}"]
    if command[0] == "capacity":
        args += ["--replicas", "2"]
    line, frames = _error_line(CliRunner().invoke(cli, args))
    assert f"route() returned {shown}; it must return a replica index, an int in 0..1" in line
    assert f"({bad}:16)" in line and not frames


def test_debug_keeps_every_frame_of_a_router_error(bad) -> None:
    from policies.guard import UserPolicyError

    res = CliRunner().invoke(cli, ["--debug", *RUN, "--router", f"{bad}:Raises"])
    assert isinstance(res.exception, UserPolicyError)
    chain, e = [], res.exception
    while e is not None:
        chain.append(type(e))
        e = e.__cause__
    assert KeyError in chain


def test_a_router_that_fails_in_one_sweep_point_fails_that_point_only(bad, tmp_path) -> None:
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(f"base: {{trace: 'synthetic:chat?sessions=4&max_requests=3', "
                   f"gpu_cache: 16k, preset: sglang, replicas: 2}}\n"
                   f"grid: {{router: [round-robin, '{bad}:Raises', least-load]}}\n")
    res = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "out")])
    line, _ = _error_line(res)
    assert "1 of 3 points failed" in line and "route() raised KeyError" in line, line
    done = sorted(p.parent.name for p in (tmp_path / "out" / "points").glob("*/summary.json"))
    sweep = json.loads((tmp_path / "out" / "sweep.json").read_text())
    ids = [p["point"] for p in sweep["points"]]
    assert done == sorted([ids[0], ids[2]])  # the other points finished
