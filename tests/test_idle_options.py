"""Options that would do nothing in the combination given are refused (exit 2, one line)
instead of running as if they had an effect: on the command line (``sim.config.IDLE_RULES``
through ``kvsim run``), in sweep files (naming the file and the field), and an option that
takes one value given twice (click would keep the last silently)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from sim.cli.main import cli
from sim.config import FLAT, IDLE_RULES, ConfigError, RunConfig, idle_fields
from sim.sweep import load_sweep
from tests.clikit import one_line_error

SYN = "synthetic:chat?sessions=2&max_requests=2"
RUN = ["run", "--trace", SYN, "--gpu-cache", "16k", "--preset", "sglang"]


@pytest.mark.parametrize("extra,needle", [
    (["--pool-bandwidth", "5"], "--pool-bandwidth does nothing here: it configures the shared "
                                "KV pool: add --pool"),
    (["--pool-write", "write-back"], "--pool-write does nothing here"),
    (["--pool-latency-us", "10"], "--pool-latency-us does nothing here"),
    (["--pool-watermark", "0.5", "--replicas", "2"], "--pool-watermark does nothing here"),
    (["--router", "least-load"], "--router does nothing here: one replica has nothing to "
                                 "route between: add --replicas N"),
    (["--prefill-replicas", "1", "--decode-replicas", "3", "--router", "dynamo-kv"],
     "--router does nothing here: it picks the prefill worker and one has nothing to choose "
     "from (the PD rule, --pd-rule, picks the decode worker): add --prefill-replicas N"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--pd-rule", "sglang-pd",
      "--pd-local-threshold", "2048"], "--pd-local-threshold does nothing here: the PD rule "
     "sglang-pd always disaggregates: use --pd-rule disagg, dynamo or llm-d"),
    (["--replay", "open", "--gaps", "tool"], "--gaps does nothing here: the open loop"),
    (["--replay", "open", "--sessions", "3"], "--sessions does nothing here: the open loop"),
    (["--replay", "open", "-n", "3"], "--sessions does nothing here"),
    (["--vllm-async", "off"], "field 'vllm_async': is a knob of the vllm engine, not of "
                              "'sglang': use --engine vllm"),
    (["--replicas", "2", "--router", "dynamo-kv", "--router-param", "ttl_s=30"],
     "parameter 'ttl_s' does nothing here"),
])
def test_an_option_that_does_nothing_or_belongs_elsewhere_is_refused(extra, needle) -> None:
    one_line_error([*RUN, *extra], needle)


@pytest.mark.parametrize("extra", [
    ["--preset", "sglang", "--pool", "64k", "--pool-bandwidth", "5", "--replicas", "2"],
    ["--preset", "sglang", "--router", "least-load", "--replicas", "2"],
    ["--preset", "sglang", "--replay", "open", "--time-scale", "2"],
    ["--engine", "vllm", "--preset", "vllm", "--vllm-async", "off"],
])
def test_the_same_options_where_they_act_still_run(extra) -> None:
    res = CliRunner().invoke(cli, ["run", "--trace", SYN, "--gpu-cache", "16k", *extra])
    assert res.exit_code == 0, res.stderr


def test_mooncake_defaults_to_the_open_loop_where_sessions_do_nothing(tmp_path) -> None:
    f = tmp_path / "m.jsonl"
    f.write_text("".join(f'{{"timestamp": {i * 100}, "input_length": 600, "output_length": 4, '
                         f'"hash_ids": [{i}, {i + 1}]}}\n' for i in range(4)))
    res = CliRunner().invoke(cli, ["run", "--trace", str(f), "--gpu-cache", "16k",
                                   "--sessions", "2"])
    assert res.exit_code == 2 and "Traceback" not in res.stderr, res.stderr
    notice, error = res.stderr.strip().splitlines()  # the replay notice, then the error
    assert notice.startswith("--replay open: a Mooncake trace")
    assert error.startswith("kvsim: error: --sessions does nothing here"), error


def test_every_idle_rule_names_run_fields() -> None:
    known = set(FLAT)
    for rule in IDLE_RULES:
        assert set(rule.fields) <= known, rule
    assert idle_fields(RunConfig(), ["pool_write", "seed"])[0][0] == "pool_write"
    assert not idle_fields(RunConfig.from_flat(pool=1 << 16, replicas=2), ["pool_write"])


def _sweep(tmp_path: Path, doc: dict) -> Path:
    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


BASE = {"trace": SYN, "gpu_cache": "16k", "preset": "sglang"}


@pytest.mark.parametrize("doc,where,field", [
    ({"base": BASE, "grid": {"pool_bandwidth": [5, 25]}}, "point 0", "pool_bandwidth"),
    ({"base": {**BASE, "replicas": 2}, "grid": {"pool": [0, "64k"],
                                               "pool_write": ["write-through", "write-back"]}},
     "point 0", "pool_write"),
    ({"base": {**BASE, "router": "least-load"}}, "", "base.router"),
    ({"base": {**BASE, "pool_write": "write-back"}}, "", "base.pool_write"),
    ({"base": {**BASE, "replay": "open"}, "grid": {"sessions": [2, 4]}}, "",
     "grid.sessions"),
    ({"base": {**BASE, "vllm_async": True}}, "", "base.vllm_async"),
])
def test_a_sweep_field_that_does_nothing_is_refused_naming_file_and_field(tmp_path, doc, where,
                                                                        field) -> None:
    f = _sweep(tmp_path, doc)
    with pytest.raises(ConfigError) as e:
        load_sweep(f)
    assert str(e.value).startswith(f"{f}{' ' + where if where else ''}: field {field!r}: "
                                   "does nothing"), str(e.value)


@pytest.mark.parametrize("doc,where", [
    ({"base": BASE, "grid": {"vllm_async": [True, False]}}, "point 1"),
    ({"base": {**BASE, "vllm_async": False}}, "point 0"),
    ({"base": {**BASE, "engine": "vllm", "preset": "vllm", "new_token_ratio": 0.5}}, "point 0"),
])
def test_a_sweep_knob_of_the_other_engine_is_refused_naming_its_engine(tmp_path, doc,
                                                                         where) -> None:
    f = _sweep(tmp_path, doc)
    with pytest.raises(ConfigError) as e:
        load_sweep(f)
    field = next(k for k in ("vllm_async", "new_token_ratio") if k in str(e.value))
    owner = "vllm" if field == "vllm_async" else "sglang"
    assert str(e.value).startswith(f"{f} {where}: field {field!r}: is a knob of the {owner} "
                                   "engine"), str(e.value)


def test_a_field_that_acts_in_some_points_is_accepted(tmp_path) -> None:
    f = _sweep(tmp_path, {"base": {**BASE, "replicas": 2, "pool_write": "write-back"},
                          "grid": {"pool": [0, "64k"]}})
    assert len(load_sweep(f).points) == 2
    # a router at 1 and 2 replicas: distinct points (a fleet of one is a fleet)
    f = _sweep(tmp_path, {"base": BASE, "grid": {"router": ["round-robin", "least-load"],
                                                 "replicas": [1, 2]}})
    assert len({p.id for p in load_sweep(f).points}) == 4


@pytest.mark.parametrize("args,needle", [
    ([*RUN, "--replicas", "2", "--router", "least-load", "--router", "random"],
     "--router is given twice (--router least-load, then --router random)"),
    (["run", "--trace", SYN, "--gpu-cache", "16k", "--preset", "sglang", "--preset=vllm"],
     "--preset is given twice (--preset sglang, then --preset=vllm)"),
    ([*RUN, "-n", "2", "-n3"], "-n is given twice"),
    (["trace", "stats", SYN, "--seed", "1", "--seed", "2"], "--seed is given twice"),
])
def test_an_option_that_takes_one_value_given_twice_is_refused(args, needle) -> None:
    one_line_error(args, needle)


def test_options_that_collect_values_may_repeat() -> None:
    res = CliRunner().invoke(cli, ["run", "--trace", SYN, "--gpu-cache", "16k",
                                   "--policy", "sglang", "--policy", "vllm", "--json", "--json"])
    assert res.exit_code == 0, res.stderr
