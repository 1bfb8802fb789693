"""A newcomer's mistakes (issue 21): no traceback and no silent wrong answer. Each test
failed before its fix (a traceback, a silent exit 0, or a wrong result)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO

from sim.cli.main import cli
from tests.clikit import one_line_error
from tests.enginekit import write_cc_traces

SYN = "synthetic:chat?sessions=3&max_requests=3"


def ok(args: list[str]):
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, f"kvsim {' '.join(args)}\n{res.stderr}\n{res.output}"
    return res


@pytest.fixture(scope="module")
def cc2x4(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cc")
    write_cc_traces(root / "cc", sessions=2, turns=4)
    return root / "cc"


# --- 1. negative seeds ------------------------------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    (["run", "--trace", SYN, "--seed", "-1", "--gpu-cache", "16k"], "'--seed'"),
    (["run", "--trace", "synthetic:chat?sessions=3&seed=-1", "--gpu-cache", "16k"], "seed=-1"),
    (["trace", "stats", SYN, "--seed", "-2"], "'--seed'"),
])
def test_negative_seed_is_one_line(args, needle) -> None:
    one_line_error(args, needle)


def test_negative_seed_in_a_config_or_the_api() -> None:
    from sim.config import ConfigError, RunConfig
    from traces import load_trace
    from traces.errors import OptionError

    with pytest.raises(ConfigError, match="seed"):
        RunConfig.from_flat(seed=-3).validate()
    with pytest.raises(OptionError, match="seed"):
        load_trace(SYN, seed=-1)


# --- 2. kvsim plot on truncated files ---------------------------------------------------------
@pytest.fixture()
def run_dir(tmp_path, cc2x4) -> Path:
    out = tmp_path / "run"
    ok(["run", "--trace", str(cc2x4), "--gpu-cache", "16k", "--sessions", "2",
        "--preset", "sglang,penelope", "--out", str(out)])
    return out


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_plot_truncated_runs_json_names_the_file(run_dir) -> None:
    _truncate(run_dir / "runs.json")
    one_line_error(["plot", str(run_dir)], f"{run_dir / 'runs.json'}: line")


def test_plot_truncated_parquet_names_the_file(run_dir) -> None:
    _truncate(run_dir / "penelope" / "requests.parquet")
    one_line_error(["plot", str(run_dir)],
                   f"{run_dir / 'penelope' / 'requests.parquet'}: not a readable Parquet")


# --- 3. sweep resume with a truncated summary.json -------------------------------------------
def test_sweep_reruns_a_point_whose_summary_does_not_parse(tmp_path, cc2x4) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"base: {{trace: {cc2x4}, sessions: 2, gpu_cache: 16k, gaps: tool}}\n"
                   "grid: {preset: [sglang, penelope]}\n")
    out = tmp_path / "out"
    ok(["sweep", str(cfg), "--out", str(out)])
    first = (out / "results.csv").read_text()
    summaries = sorted((out / "points").glob("*/summary.json"))
    good = summaries[0].read_text()
    _truncate(summaries[0])
    res = ok(["sweep", str(cfg), "--out", str(out)])
    assert f"{summaries[0]}: does not load" in res.stderr and "running point" in res.stderr
    assert summaries[0].read_text() == good  # ran again, the same result
    assert (out / "results.csv").read_text() == first
    res = ok(["sweep", str(cfg), "--out", str(out)])  # and now it is done
    assert "does not load" not in res.stderr


# --- 4. a truncated npz in the trace cache ---------------------------------------------------
def test_truncated_trace_cache_entry_is_rebuilt_with_a_notice(tmp_path, cc2x4) -> None:
    cache = tmp_path / "cache"
    args = ["trace", "stats", str(cc2x4), "--cache-dir", str(cache), "--json"]
    want = json.loads(ok(args).stdout)
    files = sorted(cache.glob("*.npz"))  # the parse and the Trace built from it
    assert [f.name.split("-")[0] for f in files] == ["built", "parsed"]
    for npz in files:
        _truncate(npz)
    res = ok(args)
    assert json.loads(res.stdout) == want
    notices = [ln for ln in res.stderr.splitlines() if "notice" in ln]
    assert len(notices) == 2
    for npz, line in zip(files, notices, strict=True):
        assert str(npz) in line and "rebuilding" in line
    assert "notice" not in ok(args).stderr  # rebuilt: loads again


# --- 6. a block size that is neither a divisor nor a multiple of the trace's -----------------
def test_block_size_that_loses_sharing_is_refused(cc2x4) -> None:
    one_line_error(["run", "--trace", str(cc2x4), "--block-size", "63", "--gpu-cache", "16k"],
                   "--block-size 63:")
    for bs in ("32", "128"):  # divisors and multiples map without loss
        ok(["trace", "stats", str(cc2x4), "--block-size", bs, "--cache-dir", "off"])


def test_block_size_check_covers_mooncake_and_freeinference() -> None:
    from traces.blocks import check_block_sizes
    from traces.errors import OptionError

    check_block_sizes(512, 64, "m")
    check_block_sizes(16, 64, "f")
    with pytest.raises(OptionError, match="512-token blocks"):
        check_block_sizes(512, 96, "m")


# --- 7. a shared prefix longer than every first prompt ---------------------------------------
def test_shared_prefix_longer_than_every_first_prompt_is_refused(cc2x4) -> None:
    one_line_error(["run", "--trace", SYN, "--shared-prefix", "10m", "--gpu-cache", "64k"],
                   "--shared-prefix 10,485,760 tokens is longer than every session's first")
    # cc2x4 fixture: first prompts 3000 and 3500 tokens; 3200 caps the first session only
    res = ok(["run", "--trace", str(cc2x4), "--shared-prefix", "3200", "--gpu-cache", "64k",
              "--sessions", "2", "--preset", "sglang"])
    assert "1 of 2 sessions have a shorter first prompt" in res.stderr


# --- 8. --out '' and a reused --out folder ---------------------------------------------------
@pytest.mark.parametrize("cmd", [["run", "--trace", SYN], ["plot", "."]])
def test_empty_out_is_refused(cmd) -> None:
    one_line_error([*cmd, "--out", ""], "--out '': empty folder name")


def test_reused_out_folder_holds_only_the_new_run(tmp_path) -> None:
    out = tmp_path / "o"
    base = ["run", "--trace", SYN, "--gpu-cache", "64k", "--out", str(out)]
    ok([*base, "--preset", "sglang,vllm"])
    ok(["plot", str(out)])
    (out / "notes.txt").write_text("mine\n")
    (out / "mine").mkdir()
    (out / "mine" / "summary.json").write_text("{}\n")
    (out / "mine" / "data.csv").write_text("x\n")
    (out / "sglang" / ".summary.json.k1ll3d.tmp").write_text("half")  # a killed run's
    (out / ".runs.json.k1ll3d.tmp").write_text("half")
    res = ok([*base, "--preset", "penelope"])
    assert "removed the previous run's" in res.stderr
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert left == ["mine", "mine/data.csv", "mine/summary.json", "notes.txt", "penelope",
                    "penelope/config.json", "penelope/requests.parquet",
                    "penelope/summary.json", "runs.json"], left
    runs = json.loads((out / "runs.json").read_text())["runs"]
    assert [r["policy"] for r in runs] == ["penelope"]


def test_reused_out_folder_of_a_fleet_run_holds_only_the_new_run(tmp_path) -> None:
    out = tmp_path / "o"
    base = ["run", "--trace", SYN, "--gpu-cache", "64k", "--out", str(out)]
    ok([*base, "--preset", "sglang", "--replicas", "2", "--router", "round-robin"])
    ok(["plot", str(out)])
    assert list(out.glob("replica_load_*.png")) and (out / "sglang" / "load.parquet").exists()
    ok([*base, "--preset", "penelope"])
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert left == ["penelope", "penelope/config.json", "penelope/requests.parquet",
                    "penelope/summary.json", "runs.json"], left


# --- 9. timestamped traces replay open; saturation is said -----------------------------------
def write_mooncake(path: Path, n: int = 40, every_ms: int = 100, blocks: int = 32) -> Path:
    """n requests of ``blocks`` 512-token blocks each (no sharing), ``every_ms`` apart."""
    lines = [json.dumps({"timestamp": i * every_ms, "input_length": blocks * 512,
                         "output_length": 20,
                         "hash_ids": list(range(i * blocks, (i + 1) * blocks))})
             for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_mooncake_defaults_to_open_loop_and_reports_saturation(tmp_path) -> None:
    mc = write_mooncake(tmp_path / "mc.jsonl")
    args = ["run", "--trace", str(mc), "--preset", "sglang", "--gpu-cache", "1m", "--json"]
    res = ok(args)
    run = json.loads(res.stdout)["runs"][0]
    assert "--replay open: a Mooncake trace" in res.stderr
    warn = [ln for ln in res.stderr.splitlines() if "saturated" in ln]
    assert len(warn) == 1 and "offers 10.26 requests/s" in warn[0], res.stderr
    # the same arrivals, 100x slower: the server keeps up, no warning
    slow = ok([*args, "--time-scale", "100"])
    assert "saturated" not in slow.stderr
    assert json.loads(slow.stdout)["runs"][0]["summary"]["ttft_mean_s"] < \
        run["summary"]["ttft_mean_s"] / 5
    # the closed loop stays available
    assert "--replay open" not in ok([*args, "--replay", "closed"]).stderr
    assert "(Mooncake)" in " ".join(CliRunner().invoke(cli, ["run", "--help"]).output.split())


# --- 10. options that do nothing in the combination ------------------------------------------
@pytest.mark.parametrize("extra,needle", [
    (["--tiering", "hicache"], "--tiering does nothing here: it configures the CPU tier"),
    (["--engine", "vllm", "--tiering", "unified"], "--tiering does nothing here: --engine vllm"),
    (["--engine", "vllm", "--hicache-write-policy", "write_back"],
     "--hicache-write-policy does nothing here"),
    (["--cpu-cache", "64k", "--hicache-write-policy", "write_back"],
     "--hicache-write-policy does nothing here: it is for --tiering hicache"),
    (["--time-scale", "0.5"], "--time-scale does nothing here"),
    (["--rebuild-sessions"], "--rebuild-sessions chains Mooncake requests"),
])
def test_idle_option_is_refused(extra, needle) -> None:
    one_line_error(["run", "--trace", SYN, "--gpu-cache", "64k", *extra], needle)


def test_cache_dir_that_is_a_file_and_rebuild_sessions_on_cc(tmp_path, cc2x4) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    one_line_error(["trace", "stats", str(cc2x4), "--cache-dir", str(f)], f"{f} (--cache-dir")
    one_line_error(["trace", "stats", str(cc2x4), "--rebuild-sessions"],
                   "is a cc-traces trace, which carries its own sessions")


def test_device_with_from_kernels_is_refused() -> None:
    one_line_error(["calibrate", "--device", "cuda", "--from-kernels", "h100_sxm"],
                   "--device times torch here")


# --- 5. a user's policy that raises or returns a wrong type ----------------------------------
BAD_POLICIES = '''from policies import EvictionPolicy


def helper(node):
    return 1 / node.num_blocks * 0 / 0


class Raises(EvictionPolicy):
    def key(self, node):
        return helper(node)


class NoneKey(EvictionPolicy):
    def key(self, node):
        return None


class StrKey(EvictionPolicy):
    def key(self, node):
        return str(node.last_access)


class StrPin(EvictionPolicy):
    pins = True

    def pinned_until(self, node):
        return "soon"


class ReplyRaises(EvictionPolicy):
    events = frozenset({"reply"})

    def on_reply(self, event):
        raise KeyError(event.session)
'''
PRESSURE = ["run", "--trace", "synthetic:chat?sessions=6", "--gpu-cache", "8k"]


@pytest.fixture(scope="module")
def bad_policies(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("pol") / "bad.py"
    f.write_text(BAD_POLICIES)
    return f


@pytest.mark.parametrize("cls,needle,line", [
    ("Raises", "policy Raises: key() raised ZeroDivisionError: float division by zero", 5),
    ("NoneKey", "policy NoneKey: key() returned None (NoneType); it must return a number", 14),
    ("StrKey", "policy StrKey: key() returned '", 19),
    ("StrPin", "policy StrPin: pinned_until() returned 'soon' (str); it must return a number",
     26),
    ("ReplyRaises", "policy ReplyRaises: on_reply() raised KeyError: 0", 34),
])
def test_user_policy_error_names_policy_method_file_and_line(bad_policies, cls, needle,
                                                             line) -> None:
    res = CliRunner().invoke(cli, [*PRESSURE, "--policy", f"{bad_policies}:{cls}"])
    shown = res.stderr
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), shown
    errors = [ln for ln in shown.splitlines() if ln.startswith("kvsim: error: ")]
    assert len(errors) == 1 and needle in errors[0], shown
    # where it raised; a wrong return type: the method's def line
    assert f"({bad_policies}:{line})" in errors[0], shown
    after = shown[shown.index("kvsim: error: "):].splitlines()[1:]
    frames = [ln for ln in after if ln.startswith("  File ")]
    assert all(str(bad_policies) in ln for ln in frames), shown  # the user's frames only
    assert "Traceback" not in shown
    if cls == "Raises":
        assert len(frames) == 2  # key, then helper


@pytest.mark.parametrize("where", ["front", "back"])
def test_debug_flag_shows_every_frame(bad_policies, where) -> None:
    args = [*PRESSURE, "--policy", f"{bad_policies}:Raises"]
    args = ["--debug", *args] if where == "front" else [*args, "--debug"]
    res = CliRunner().invoke(cli, args)
    from policies.guard import UserPolicyError

    assert isinstance(res.exception, UserPolicyError)  # not turned into one line
    chain, e = [], res.exception
    while e is not None:  # the whole chain is kept (SimPy re-raises with a cause)
        chain.append(type(e))
        e = e.__cause__
    assert ZeroDivisionError in chain


def test_user_policy_errors_survive_pickling() -> None:
    import pickle

    from policies.guard import UserPolicyError

    e = UserPolicyError("policy X: key() raised", "  File x.py")
    back = pickle.loads(pickle.dumps(e))
    assert (str(back), back.detail, back.exit_code) == (str(e), e.detail, 2)


# --- 13. derive, report.py, figure1 for another model -----------------------------------------
def test_costmodel_derive_does_not_write_the_repository(tmp_path, capsys) -> None:
    import yaml

    from costmodel import derive
    from costmodel.profile import shipped_profiles
    from costmodel.specs import model_names

    shipped = Path(derive.__file__).parent / "profiles"
    before = {p: p.stat().st_mtime_ns for p in shipped.glob("derived-h100-*.yaml")}
    derive.main([])
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["name"] for d in docs] == [f"derived-h100-{m}" for m in model_names()]
    derive.main(["--model", "qwen3-8b", "--out", str(tmp_path / "o")])
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["derived-h100-qwen3-8b.yaml"]
    assert {p: p.stat().st_mtime_ns for p in shipped.glob("derived-h100-*.yaml")} == before
    assert shipped_profiles()  # untouched and still loadable


@pytest.mark.parametrize("args", [["no-such-folder"], ["--sweeps", "no-such-sweep"], ["."]])
def test_report_on_a_missing_folder_exits_2(tmp_path, args) -> None:
    import subprocess
    import sys

    report = Path(__file__).resolve().parent.parent / "docs" / "report.py"
    res = subprocess.run([sys.executable, str(report), *args], cwd=tmp_path,
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stdout == "", res
    assert res.stderr.startswith("report.py: error: ") and len(res.stderr.splitlines()) == 1


def test_figure1_prints_the_papers_measurement_only_beside_its_model() -> None:
    doc = json.loads(ok(["microbench", "figure1", "--model", "qwen3-32b", "--json"]).stdout)
    assert all(r["paper_measured_speedup"] is None for r in doc["rows"])
    doc = json.loads(ok(["microbench", "figure1", "--json"]).stdout)
    assert [r["paper_measured_speedup"] for r in doc["rows"]] == [1.14, None, None, None, 2.93]


# --- 11. Ray addresses ------------------------------------------------------------------------
def _closed_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_ray_address_where_nothing_listens_fails_fast(tmp_path, scheme) -> None:
    import time

    pytest.importorskip("ray")
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"base: {{trace: '{SYN}', gpu_cache: 64k}}\ngrid: {{preset: [sglang]}}\n")
    address = f"{scheme}127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    one_line_error(["sweep", str(cfg), "--out", str(tmp_path / "o"), "--executor", "ray",
                    "--address", address], f"--address {address}: cannot reach Ray at")
    assert time.monotonic() - t0 < 30


def test_ray_without_address_starts_a_new_local_ray(monkeypatch) -> None:
    """docs/sweeps.md: no --address = a new local Ray, even if a cluster runs here (Ray's own
    default, address=None, would join the latest cluster started on this machine)."""
    import sim.sweep.executors as ex

    seen = []

    class FakeRay:
        @staticmethod
        def is_initialized() -> bool:
            return False

        @staticmethod
        def init(address=None, **kw) -> None:
            seen.append(address)

    monkeypatch.setattr(ex, "_need_ray", lambda: FakeRay)
    ex.RayExecutor(None)._init()
    ex.RayExecutor("auto")._init()
    assert seen == ["local", "auto"]


def test_ray_extra_includes_the_client() -> None:
    import tomllib

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["ray"]
    assert any(d.startswith("ray[client]==") for d in extra), extra


# --- 12. a killed sweep's pool workers exit ---------------------------------------------------
SLOW_POLICY = '''import time

from policies import EvictionPolicy


class Slow(EvictionPolicy):
    def key(self, node):
        time.sleep(0.5)
        return node.serial
'''


def test_pool_workers_exit_when_the_sweep_is_killed(tmp_path) -> None:
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    psutil = pytest.importorskip("psutil")
    (tmp_path / "slow.py").write_text(SLOW_POLICY)
    cfg = tmp_path / "s.yaml"
    # (a cache the requests fit: with every request dropped the points end at once and no
    # eviction asks the slow key, so the workers are gone before the sweep is killed)
    cfg.write_text("base: {trace: 'synthetic:chat?sessions=8', gpu_cache: 16k, "
                   "policy: slow.py:Slow}\ngrid: {sessions: [2, 3, 4, 5]}\n")
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(repo)}
    main = subprocess.Popen(
        [sys.executable, "-c", "from sim.cli.main import main; main()", "sweep", str(cfg),
         "--out", str(tmp_path / "o"), "-j", "2"], env=env, cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(workers) < 2:
            time.sleep(0.2)
            workers = [c for c in psutil.Process(main.pid).children()
                       if "python" in c.name().lower()]
        assert len(workers) >= 2, "the pool did not start"
        time.sleep(1.0)  # the workers are inside their points now
        main.send_signal(signal.SIGKILL)
        main.wait()
        _gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"orphaned workers still running: {alive}"
    finally:  # the main process and any worker left (orphans are not our children)
        for p in [*psutil.Process().children(recursive=True), *workers]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


# --- 17. sub-agents in the policy API, --policy-param POLICY.k=v, all-zero sweep charts ------
SUBAGENTS = REPO / "docs" / "examples" / "subagents_first.py"


def test_policy_context_lists_the_sessions_with_their_parents(monkeypatch) -> None:
    from policies import EvictionPolicy
    from sim.config import RunConfig
    from sim.run import load_run_trace, run

    bound = []
    monkeypatch.setattr(EvictionPolicy, "bind",
                        lambda self, ctx: (bound.append(ctx), setattr(self, "context", ctx)))
    cfg = RunConfig.from_flat(trace="synthetic:claude-code?sessions=16", gpu_cache=256 * 1024,
                              preset="penelope")
    run(cfg)
    trace = load_run_trace(cfg)
    (ctx,) = bound
    assert [(s.id, s.parent, s.agent_type) for s in ctx.sessions] == \
        [(s.id, s.parent, s.agent_type) for s in trace.sessions]
    subs = [i for i, s in enumerate(ctx.sessions) if s.is_subagent]
    assert subs and all(not ctx.sessions[ctx.sessions[i].parent].is_subagent for i in subs)
    with pytest.raises(AttributeError):
        ctx.sessions[subs[0]].parent = -1  # read only


def test_fleet_replicas_policies_see_the_sessions_too(monkeypatch) -> None:
    from policies import EvictionPolicy
    from sim.config import RunConfig
    from sim.run import run

    bound = []
    monkeypatch.setattr(EvictionPolicy, "bind",
                        lambda self, ctx: (bound.append(ctx), setattr(self, "context", ctx)))
    run(RunConfig.from_flat(trace="synthetic:claude-code?sessions=8", gpu_cache=256 * 1024,
                            preset="penelope", replicas=2, router="round-robin"))
    assert len(bound) == 2 and all(len(ctx.sessions) > 8 for ctx in bound)


def test_subagents_first_orders_subagent_histories_first() -> None:
    from types import SimpleNamespace as NS

    from policies import PolicyContext, Reply, SessionInfo, get_policy

    p = get_policy(f"{SUBAGENTS}:SubagentsFirst")
    p.bind(PolicyContext(now=lambda: 0.0, sessions=(SessionInfo("main"),
                                                    SessionInfo("sub", parent=0))))
    main, sub, unknown = (NS(serial=s, last_access=a) for s, a in ((1, 5), (2, 9), (3, 1)))
    p.on_reply(Reply(1.0, 0, 0, 100, main, "tool"))
    p.on_reply(Reply(2.0, 1, 1, 100, sub, "end"))
    order = sorted([main, sub, unknown], key=p.sort_key)
    assert [n.serial for n in order] == [2, 3, 1]  # the sub-agent's, though the newest


def test_subagents_first_is_documented_and_runs_from_the_cli() -> None:
    assert SUBAGENTS.read_text() in (REPO / "docs" / "policies.md").read_text()
    res = ok(["run", "--trace", "synthetic:claude-code?sessions=16", "--gaps", "tool",
              "--gpu-cache", "96k", "--sessions", "4", "--preset", "penelope",
              "--policy", f"{SUBAGENTS}:SubagentsFirst", "--json"])
    base, mine = (r["summary"] for r in json.loads(res.stdout)["runs"])
    assert base["requests"] == mine["requests"] > 100
    assert mine["ttft_mean_s"] != base["ttft_mean_s"]  # sub-agent histories went first


def _labels(res) -> list[str]:
    return [r["policy"] for r in json.loads(res.stdout)["runs"]]


def test_policy_param_goes_to_the_policy_it_names() -> None:
    base = ["run", "--trace", SYN, "--gpu-cache", "64k", "--json"]
    hold = f"{REPO / 'docs' / 'examples' / 'hold_tool_calls.py'}:HoldToolCalls"
    # unscoped: the one --policy that takes it (was: applied to both, tlru refused it)
    assert _labels(ok([*base, "--policy", "ttl", "--policy", "tlru",
                       "--policy-param", "tau_s=3"])) == ["ttl(tau_s=3.0)", "tlru"]
    assert _labels(ok([*base, "--policy", "ttl", "--policy", "tlru",
                       "--policy-param", "ttl.tau_s=3", "--policy-param", "tlru.xi=2"])
                   ) == ["ttl(tau_s=3.0)", "tlru(xi=2)"]
    assert _labels(ok([*base, "--policy", hold, "--policy", "ttl",
                       "--policy-param", f"{hold}.hold_s=30",
                       "--policy-param", "HoldToolCalls.hold_s=30"]))[0] == \
        "hold-tool-calls(hold_s=30.0)"
    assert _labels(ok([*base, "--policy", "ttl", "--policy-param", "tau_s=4"])) == \
        ["ttl(tau_s=4.0)"]  # the old form, one policy
    one_line_error([*base, "--policy", "ttl", "--policy", "tlru", "--policy-param", "zz=1"],
                   "zz=1: no --policy takes it; name the policy")
    one_line_error([*base, "--policy", "ttl", "--policy-param", "lru.tau_s=1"],
                   "no --policy is named 'lru'")


def test_sweep_whose_changes_are_all_zero_draws_no_empty_chart(tmp_path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"base: {{trace: '{SYN}', gpu_cache: 1m}}\n"
                   "grid: {preset: [sglang, vllm]}\nbaseline: {preset: sglang}\n")
    ok(["sweep", str(cfg), "--out", str(tmp_path / "o")])
    res = ok(["plot", str(tmp_path / "o")])
    assert not (tmp_path / "o" / "sweep_change.png").exists()
    assert "no change chart: every point's TTFT equals its baseline's" in res.stderr


def test_bar_legend_colours_differ_even_for_an_empty_series(tmp_path) -> None:
    import matplotlib.pyplot as plt

    from sim.report import plots

    captured = {}
    real_save = plots._save
    plots._save = lambda fig, path: captured.setdefault("fig", fig)
    try:
        plots._bars([], {"mean TTFT": [], "mean JCT": []}, "y", "t", tmp_path / "x.png")
    finally:
        plots._save = real_save
    handles = captured["fig"].axes[0].get_legend().legend_handles
    colours = [tuple(h.get_facecolor()) for h in handles]
    assert len(set(colours)) == 2, colours
    plt.close(captured["fig"])


def test_sweep_of_a_mooncake_trace_defaults_to_the_open_loop(tmp_path) -> None:
    from sim.sweep import load_sweep

    mc = write_mooncake(tmp_path / "mc.jsonl")
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"base: {{trace: {mc}}}\ngrid: {{preset: [sglang]}}\n")
    assert load_sweep(cfg).points[0].cfg.traffic.replay == "open"
    cfg.write_text(f"base: {{trace: {mc}, replay: closed}}\ngrid: {{preset: [sglang]}}\n")
    assert load_sweep(cfg).points[0].cfg.traffic.replay == "closed"
    cfg.write_text(f"base: {{trace: '{SYN}'}}\ngrid: {{preset: [sglang]}}\n")
    assert load_sweep(cfg).points[0].cfg.traffic.replay == "closed"


def test_plot_truncated_sweep_results_names_the_file(tmp_path) -> None:
    cfg = tmp_path / "s.yaml"
    cfg.write_text(f"base: {{trace: '{SYN}', gpu_cache: 64k}}\n"
                   "grid: {preset: [sglang, vllm, penelope]}\n")
    out = tmp_path / "o"
    ok(["sweep", str(cfg), "--out", str(out)])
    lines = (out / "results.csv").read_text().splitlines(keepends=True)
    (out / "results.csv").write_text("".join(lines[:2]))  # the header and one point
    one_line_error(["plot", str(out)], f"{out / 'results.csv'}: 1 rows for the 3 points")
