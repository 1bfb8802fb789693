"""The policy API as users meet it: labels from fields, one way to choose a policy, user
policies loaded from files (CLI and sweeps), parameters, pins and events."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import REPO

from policies import (
    BLOCK,
    PRIVATE_HEAD,
    TAIL,
    Arrival,
    EvictionPolicy,
    PolicyError,
    Reply,
    get_policy,
)
from sim.config import ConfigError, RunConfig
from sim.kvcache import RadixKVCache
from sim.run import check, run
from tests.clikit import invoke
from tests.enginekit import KitTrace

EXAMPLE = REPO / "docs" / "examples" / "hold_tool_calls.py"
DOC = REPO / "docs" / "policies.md"
SYNTH = ["--trace", "synthetic:claude-code?sessions=16", "--max-context", "64k",
         "--gaps", "tool", "--gpu-cache", "96k", "--sessions", "4"]


# ---------------------------------------------------------------------------- labels
def test_labels_come_from_the_fields() -> None:
    assert RunConfig().policy_label == "penelope"  # the default policy
    assert RunConfig.from_flat(evict="tail", granularity="node").policy_label == "sglang"
    assert RunConfig.from_flat(evict="tail", granularity="block").policy_label == "vllm"
    assert RunConfig.from_flat(evict="leaf-head").policy_label == "lru+leaf-head+node"
    assert RunConfig.from_flat(order="lfu", evict="tail", granularity="block").policy_label == \
        "lfu+tail+block"
    assert RunConfig.from_flat(preset="sglang").policy_label == "sglang"
    assert RunConfig.from_flat(policy="lru+private-head+block").policy_label == "penelope"


@pytest.mark.parametrize("fields", [
    {"preset": "sglang", "evict": "private-head"},
    {"preset": "sglang", "policy": "vllm"},
    {"policy": "vllm", "granularity": "node"},
])
def test_a_policy_is_chosen_one_way(fields: dict) -> None:
    with pytest.raises(ConfigError, match="choose a policy one way"):
        check(RunConfig.from_flat(**fields))


def test_config_round_trip_keeps_the_policy() -> None:
    cfg = RunConfig.from_flat(policy=f"{EXAMPLE}:HoldToolCalls", policy_params={"hold_s": 3})
    d = cfg.to_dict()
    assert d["policy_label"] == "hold-tool-calls(hold_s=3.0)"
    assert len(d["policy_source_sha1"]) == 40
    assert RunConfig.from_dict(d) == cfg


@pytest.mark.parametrize(("args", "needle"), [
    (["--preset", "sglang", "--evict", "tail"], "cannot be combined with --preset"),
    (["--preset", "sglang,,penelope"], "empty name"),
    (["--policy", "vllm", "--granularity", "node"], "cannot be combined with --policy"),
    (["--policy-param", "x=1"], "--policy-param needs --policy"),
    (["--policy", "penelope", "--policy-param", "x"], "is not K=V"),
    (["--preset", "sglang", "--policy", "sglang"], "given twice"),
])
def test_cli_policy_selection_errors_exit_2(args: list[str], needle: str) -> None:
    code, out, err = invoke("run", *SYNTH, *args)
    assert code == 2, out + err
    assert needle in err and "Traceback" not in err


# ---------------------------------------------------------------------------- user files
def test_worked_example_in_the_docs_is_the_file_the_tests_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert EXAMPLE.read_text() in blocks
    lines = [x for x in EXAMPLE.read_text().splitlines() if x.strip()]
    assert 20 <= len(lines) <= 40


def test_worked_example_runs_from_the_cli_and_changes_results(tmp_path: Path) -> None:
    code, out, err = invoke("run", *SYNTH, "--preset", "penelope",
                            "--policy", f"{EXAMPLE}:HoldToolCalls",
                            "--policy-param", "hold_s=60", "--json", "--out", tmp_path)
    assert code == 0, err
    runs = json.loads(out)["runs"]
    assert [r["policy"] for r in runs] == ["penelope", "hold-tool-calls(hold_s=60.0)"]
    base, mine = (r["summary"] for r in runs)
    assert base["requests"] == mine["requests"] > 100
    # Holding tool-call histories changes what is evicted, hence hits and TTFT.
    assert mine["hit_rate"] != base["hit_rate"]
    assert runs[1]["change_vs_first"]["ttft_mean_s"] != 0.0
    assert (tmp_path / "hold-tool-calls(hold_s=60.0)" / "summary.json").is_file()


def test_worked_example_runs_from_a_sweep(tmp_path: Path) -> None:
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "examples" / EXAMPLE.name)
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(
        "base:\n  trace: synthetic:claude-code?sessions=16\n  max_context: 64k\n"
        "  gpu_cache: 96k\n  gaps: tool\n  sessions: 4\n"
        'grid:\n  policy: [penelope, "examples/hold_tool_calls.py:HoldToolCalls?hold_s=60"]\n'
        "baseline: {policy: penelope}\n")
    code, _, err = invoke("sweep", cfg, "--out", tmp_path / "out")
    assert code == 0, err
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert sorted(df["policy"]) == ["hold-tool-calls(hold_s=60.0)", "penelope"]
    mine = df[df["policy"] != "penelope"].iloc[0]
    assert mine["hit_rate_change"] != 0.0


def _write_policy(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "mine.py"
    p.write_text(text)
    return p


@pytest.mark.parametrize(("source", "spec", "needle"), [
    (None, "missing.py:X", "policy file not found"),
    ("x = (\n", "{f}:X", "mine.py:1: cannot load policy file: SyntaxError"),
    ("raise RuntimeError('boom')\n", "{f}:X", "mine.py:1: cannot load policy file"),
    ("class Y: pass\n", "{f}:X", "no class 'X'"),
    ("class X: pass\n", "{f}:X", "not a subclass of EvictionPolicy"),
    ("from policies import EvictionPolicy\nclass X(EvictionPolicy):\n    k: int = 1\n",
     "{f}:X?k=lots", "parameter 'k': 'lots' is not a int"),
    ("from policies import EvictionPolicy\nclass X(EvictionPolicy):\n    pass\n",
     "{f}:X?q=1", "has no parameter 'q'"),
])
def test_bad_policy_files_exit_2_naming_the_file(tmp_path: Path, source, spec, needle) -> None:
    f = _write_policy(tmp_path, source) if source is not None else tmp_path / "missing.py"
    code, out, err = invoke("run", *SYNTH, "--policy", spec.format(f=f))
    assert code == 2, out + err
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_parameters_are_typed_like_their_defaults() -> None:
    class P(EvictionPolicy):
        name = "p"
        a: int = 1
        b: float = 0.5
        c: bool = False
        d: str = "x"

    p = P(a="3", b="2", c="yes", d=7)
    assert (p.a, p.b, p.c, p.d) == (3, 2.0, True, "7")
    assert P(b=3).b == 3.0 and isinstance(P(b=3).b, float)
    with pytest.raises(PolicyError, match="'c'"):
        P(c="maybe")
    with pytest.raises(PolicyError, match="is not a int"):
        P(a=True)
    assert P(a=5).label == "p(a=5)" and P().label == "p"
    assert get_policy("penelope") == get_policy("lru+private-head+block?")
    with pytest.raises(PolicyError, match="takes no parameters"):
        get_policy("penelope?x=1")


# ---------------------------------------------------------------------------- pins
class PinLeaf(EvictionPolicy):
    """Pins whatever leaf holds block id 20 (D in the hand-built tree) forever."""

    name = "pin-d"
    pins = True

    def pinned_until(self, node):
        return float("inf") if 20 in node.ids.tolist() else float("-inf")


def _tree(policy: EvictionPolicy) -> RadixKVCache:
    """root -- A[1 2 3] -- B[10..17] -- D[20 21 22] (LRU leaf); A -- E[30 31]."""
    cache = RadixKVCache(64, policy, debug=True)
    for ids in ([1, 2, 3, *range(10, 18), 20, 21, 22], [1, 2, 3, *range(10, 18)],
                [1, 2, 3, 30, 31]):
        cache.insert(np.array(ids))
    return cache


def test_a_pinned_leaf_goes_only_after_every_unpinned_one() -> None:
    plain = _tree(get_policy("sglang"))
    assert [r.tolist() for r in plain.evict(1).freed] == [[20, 21, 22]]  # D is the LRU leaf
    cache = _tree(PinLeaf())
    assert [r.tolist() for r in cache.evict(1).freed] == [[30, 31]]  # E instead
    # Memory pressure breaks the pin: D goes, then B and A behind it.
    r = cache.evict(100)
    assert [x.tolist() for x in r.freed] == [[20, 21, 22], list(range(10, 18)), [1, 2, 3]]


# ---------------------------------------------------------------------------- events
class Recorder(EvictionPolicy):
    name = "recorder"
    events = frozenset({"arrival", "reply"})

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen: list = []

    def on_arrival(self, event):
        self.seen.append(event)

    def on_reply(self, event):
        self.seen.append(event)


class Seer(Recorder):
    name = "seer"
    clairvoyant = True


@pytest.mark.parametrize("cls", [Recorder, Seer])
def test_events_reach_the_policy_in_order(monkeypatch, cls) -> None:
    made: list[EvictionPolicy] = []
    real = RunConfig.make_policy

    def spy(self):
        p = cls() if self.policy.policy == "spy" else real(self)
        made.append(p)
        return p

    monkeypatch.setattr(RunConfig, "make_policy", spy)
    trace = KitTrace([[(1000, 10, 0.0), (2000, 10, 4.0), (2500, 5, 2.0)],
                      [(3000, 10, 0.0)]])
    res = run(RunConfig.from_flat(policy="spy", sessions=2, gpu_cache=65536), trace)
    policy = made[-1]
    arrivals = [e for e in policy.seen if isinstance(e, Arrival)]
    replies = [e for e in policy.seen if isinstance(e, Reply)]
    assert len(arrivals) == len(replies) == res.summary["requests"] == 4
    by_req = {e.request: e for e in replies}
    assert [by_req[r].next_gap for r in range(4)] == ["tool", "tool", "end", "end"]
    assert all(e.leaf is not None and e.leaf.end * 64 <= e.context_tokens + 10
               for e in replies)
    for e in policy.seen:  # every reply comes after its arrival
        if isinstance(e, Reply):
            assert any(a.request == e.request for a in arrivals)
            assert e.time >= next(a.time for a in arrivals if a.request == e.request)
    gaps = [by_req[r].next_gap_s for r in range(4)]
    if cls is Seer:
        assert gaps[:2] == [4.0, 2.0] and np.isnan(gaps[2])
    else:
        assert all(np.isnan(g) for g in gaps)


def test_bad_chain_from_a_user_start_is_caught_in_debug_mode() -> None:
    from policies import StartPosition

    class Everything(StartPosition):
        name, from_head, makes_holes, reads_node_boundaries = "everything", True, True, False

        def chain(self, leaf, view):
            out = [leaf]
            while not view.is_root(out[-1].parent):
                out.append(out[-1].parent)
            return out[::-1]  # walks into the shared node A too

    cache = _tree(EvictionPolicy("lru", Everything(), BLOCK))
    with pytest.raises(AssertionError, match="shared"):
        cache.evict(20)
    assert TAIL.name == "tail" and PRIVATE_HEAD.from_head
