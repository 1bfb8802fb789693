"""The minimal example file of every input format (docs/examples/traces/, documented field by
field in docs/traces.md) loads through the real loaders into exactly the trace it describes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import REPO

from sim.cli.main import cli
from traces import detect_format, load_trace

EXAMPLES = REPO / "docs" / "examples" / "traces"
DOC = REPO / "docs" / "traces.md"
FILES = {"cc-traces": EXAMPLES / "cc-traces.json", "mooncake": EXAMPLES / "mooncake.jsonl",
         "tracelab": EXAMPLES / "tracelab.jsonl", "freeinference": EXAMPLES / "freeinference"}


@pytest.mark.parametrize("fmt", FILES)
def test_example_is_detected_as_its_format(fmt) -> None:
    assert detect_format([str(FILES[fmt])]) == fmt


def _load(fmt):
    return load_trace(str(FILES[fmt]), cache_dir=None)


def test_cc_traces_example() -> None:
    t = _load("cc-traces")
    main, sub = t.sessions
    assert (main.id, main.parent, sub.parent, sub.agent_type) == \
        ("example-session", -1, 0, "Explore")
    assert t.prompt_tokens.tolist() == [200, 300, 400, 150, 260]
    assert t.output_tokens.tolist() == [30, 20, 50, 10, 15]
    # the sub-agent starts at its completion time minus its duration: 20 - 14.5 s
    assert t.send_time_s.tolist() == [0.0, 4.5, 25.0, 5.5, 10.5]
    # recorded waits: think_time, except after sub-agents (from their completion, t = 20)
    assert t.gap_s.tolist() == [0.0, 3.0, 5.0, 0.0, 3.0]
    assert main.prefix_hint_tokens == 140 and sub.prefix_hint_tokens == 110
    # chained ids: request 1 extends request 0 by one 64-token block
    assert t.prefix_blocks[1] == 3 and t.n_blocks(1) == 4


def test_mooncake_example() -> None:
    t = _load("mooncake")
    assert len(t.sessions) == 3 and all(s.parent == -1 for s in t.sessions)
    assert t.send_time_s.tolist() == [0.0, 0.25, 0.9]
    assert t.prompt_tokens.tolist() == [1100, 1600, 700]
    # 512-token ids shared across users: two full blocks in common = 16 blocks of 64
    a, b = t.block_ids(0), t.block_ids(1)
    assert int(np.argmin(a[:16] == b[:16])) == 0 and (a[:16] == b[:16]).all()


def test_tracelab_example() -> None:
    t = _load("tracelab")
    (s,) = t.sessions
    assert s.id == "claude:example"
    assert t.prompt_tokens.tolist() == [1200, 1500, 1700]
    assert t.send_time_s.tolist() == [0.0, 7.0, 60.0]
    assert t.gap_s.tolist() == [0.0, 5.0, 51.0]  # send minus the previous reply end
    # round 1 extends round 0's input + output: all 1,240 tokens, 19 full blocks
    from traces.builder import common_prefix

    assert common_prefix(t.block_ids(1), t.finish_block_ids(0)) == (1200 + 40) // 64


def test_freeinference_example() -> None:
    t = _load("freeinference")
    main, sub = t.sessions
    assert (main.parent, sub.parent, main.agent_type) == (-1, 0, "claude-code")
    assert t.prompt_tokens.tolist() == [100, 150, 64]
    assert t.send_time_s.tolist() == [0.0, 6.0, 2.5]
    assert t.gap_s.tolist()[1] == 2.0  # from the sub-agent's end (5 s), not the reply (3 s)
    assert main.prefix_hint_tokens == 80


@pytest.mark.parametrize("fmt", FILES)
def test_example_runs_from_the_cli(fmt, tmp_path) -> None:
    res = CliRunner().invoke(cli, ["run", "--trace", str(FILES[fmt]), "--gpu-cache", "16k",
                                   "--preset", "sglang", "--json", "--cache-dir", "off"])
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["runs"][0]["summary"]["requests"] == len(_load(fmt))


IGNORED = {"models", "hash_id_scope", "output_types", "stop", "provider", "tools", "user_id",
           "parent_session_id", "call_index", "name", "model", "format_version"}


def _keys(obj) -> set[str]:
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in _keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in _keys(v)}
    return set()


def test_every_field_of_the_examples_is_documented() -> None:
    section = DOC.read_text().split("### Fields of each format")[1].split("\n### ")[0]
    documented = {w for span in re.findall(r"`([^`]*)`", section)
                  for w in re.findall(r"[a-z_]+", span)}
    docs = [json.loads(FILES["cc-traces"].read_text())]
    for f in (FILES["mooncake"], FILES["tracelab"],
              *sorted((FILES["freeinference"] / "traces").glob("*.jsonl"))):
        docs += [json.loads(line) for line in f.read_text().splitlines()]
    missing = sorted(_keys(docs) - documented - IGNORED)
    assert not missing, f"fields of docs/examples/traces not in docs/traces.md: {missing}"
    for f in FILES.values():
        assert f"docs/examples/traces/{f.name}" in section
