"""Sizes in tokens: one grammar for every option and sweep field, explicit decimal and binary
spellings beside kvsim's own ``k``/``m`` (binary), and every size echoed back in tokens."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from sim.cli.common import parse_size
from sim.cli.main import cli

TRACE = "synthetic:claude-code?sessions=2"

# written out by hand: what each spelling means
TABLE = [
    ("262144", 262_144),
    ("3000000", 3_000_000),
    ("3_000_000", 3_000_000),
    ("3e6", 3_000_000),
    ("3E6", 3_000_000),
    ("1.5e6", 1_500_000),
    ("2.5e5", 250_000),
    ("256Ki", 262_144),
    ("256ki", 262_144),
    ("3Mi", 3_145_728),
    ("3MI", 3_145_728),
    ("1Gi", 1_073_741_824),
    ("1.5Ki", 1_536),
    ("256k", 262_144),  # kvsim's spelling: binary, as it always was
    ("256K", 262_144),
    ("3m", 3_145_728),
    ("3M", 3_145_728),
    ("15.6k", 15_974),  # 15,974.4 rounds to the nearest token
    (" 64k ", 65_536),
    ("0", 0),
]


@pytest.mark.parametrize("text, tokens", TABLE)
def test_size_spellings(text, tokens):
    assert parse_size(text, "--gpu-cache") == tokens


@pytest.mark.parametrize("text", ["3mb", "-1k", "1.5.2m", "3g", "3 M i", "1__0", "_1", "1e",
                                  "e6", "3e6k", "3e-2", "k", "", "1e400"])
def test_junk_is_refused_naming_the_option(text):
    with pytest.raises(click.BadParameter, match="--gpu-cache"):
        parse_size(text, "--gpu-cache")


@pytest.mark.parametrize("args", [["--gpu-cache", "3mb"], ["--gpu-cache", "-1k"],
                                  ["--gpu-cache", "1.5.2m"], ["--cpu-cache", "2gb"],
                                  ["--max-context", "1.5.2m"]])
def test_run_refuses_junk_sizes_in_one_line(args):
    res = CliRunner().invoke(cli, ["run", "--trace", TRACE, "--model", "qwen3-8b", *args])
    assert res.exit_code == 2, res.output
    assert args[0] in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("spelling, tokens", [("3m", 3_145_728), ("3Mi", 3_145_728),
                                              ("3e6", 3_000_000)])
def test_run_echoes_every_size_in_tokens(spelling, tokens):
    res = CliRunner().invoke(cli, ["run", "--trace", TRACE, "--model", "qwen3-8b",
                                   "--max-context", "64k", "--gpu-cache", spelling,
                                   "--preset", "vllm", "--json"])
    assert res.exit_code == 0, res.output
    assert (f"sizes in tokens: GPU cache {tokens:,}, max context 65,536, chunk 8,192"
            in res.stderr)
    summary = json.loads(res.stdout)["runs"][0]["summary"]
    assert summary["gpu_cache_tokens"] == tokens


def test_capacity_echoes_its_sizes_in_tokens():
    res = CliRunner().invoke(cli, ["capacity", TRACE, "--cache", "3e6,3m", "--replicas", "2",
                                   "--pool", "1.5e6", "--cache-dir", "off"])
    assert res.exit_code == 0, res.output
    assert ("cache sizes per replica (tokens): 3,000,000, 3,145,728; pool 1,500,000 tokens"
            in res.stderr)
    assert "3,000,000" in res.stdout and "3,145,728" in res.stdout  # the table's rows
    res = CliRunner().invoke(cli, ["capacity", TRACE, "--cache", "1.5e6..3Mi:2",
                                   "--cache-dir", "off", "--json"])
    assert res.exit_code == 0, res.output
    assert [r["cache_tokens"] for r in json.loads(res.stdout)] == [1_500_000, 3_145_728]


@pytest.mark.parametrize("cache", ["3mb", "1.5.2m", "-1k"])
def test_capacity_refuses_junk_sizes_naming_the_option(cache):
    res = CliRunner().invoke(cli, ["capacity", TRACE, "--cache", cache])
    assert res.exit_code == 2, res.output
    assert "--cache" in res.output and "Traceback" not in res.output


def test_a_sweep_reads_the_same_grammar(tmp_path):
    from sim.sweep import load_sweep

    p = tmp_path / "s.yaml"
    p.write_text(f"base: {{trace: '{TRACE}', sessions: 2}}\n"
                 "grid: {gpu_cache: [3m, 3Mi, 3e6, 3_000_000]}\n")
    sizes = [pt.cfg.cache.gpu_cache for pt in load_sweep(p).points]
    assert sizes == [3_145_728, 3_145_728, 3_000_000, 3_000_000]
    p.write_text(f"base: {{trace: '{TRACE}', sessions: 2, gpu_cache: 3mb}}\n")
    from sim.config import ConfigError

    with pytest.raises(ConfigError, match=r"gpu_cache.*3e6"):
        load_sweep(p)
