"""A sweep stops at Ctrl-C (status 130, its workers ended, no point finishing after it), and a
second sweep on the same output folder is refused while the first runs (the folder's lock
file names the owner's pid; a lock left by a dead process is taken over)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO

from sim.cli.main import cli
from sim.io import LOCK_NAME

KVSIM = [sys.executable, "-c", "from sim.cli.main import main; main()"]
SLOW_POLICY = '''import time
from policies import EvictionPolicy, PRIVATE_HEAD, BLOCK


class Slow(EvictionPolicy):
    start, granularity = PRIVATE_HEAD, BLOCK

    def key(self, node):
        time.sleep(0.2)  # a point takes far longer than the test waits, even on a loaded machine
        return node.serial
'''
QUICK = "base: {trace: 'synthetic:chat?sessions=2&max_requests=2', gpu_cache: 16k}\n"


def _summaries(out: Path) -> int:
    return len(list((out / "points").glob("*/summary.json")))


def test_ctrl_c_stops_a_local_pool_sweep_at_once_with_status_130(tmp_path) -> None:
    psutil = pytest.importorskip("psutil")
    (tmp_path / "slow.py").write_text(SLOW_POLICY)
    cfg = tmp_path / "s.yaml"
    cfg.write_text("base: {trace: 'synthetic:chat?sessions=8', gpu_cache: 16k, "
                   "policy: slow.py:Slow}\ngrid: {sessions: [2, 3, 4, 5, 6, 7]}\n")
    out = tmp_path / "o"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # a session of its own: Ctrl-C is SIGINT to the terminal's whole process group. SIGINT
    # as a terminal delivers it: a suite started in the background of a non-interactive
    # shell inherits it ignored, and Python then installs no KeyboardInterrupt handler.
    main = subprocess.Popen([*KVSIM, "sweep", str(cfg), "--out", str(out), "-j", "2"], env=env,
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    workers: list = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(workers) < 2:
            time.sleep(0.2)
            workers = [c for c in psutil.Process(main.pid).children()
                       if "python" in c.name().lower()]
        assert len(workers) >= 2, "the pool did not start"
        time.sleep(1.0)  # the workers are inside their points now
        before = _summaries(out)
        t0 = time.monotonic()
        os.killpg(main.pid, signal.SIGINT)
        code = main.wait(timeout=30)
        took = time.monotonic() - t0
        err = main.stderr.read()
        assert code == 130, err
        assert took < 3.0, f"took {took:.1f} s to stop"
        assert "kvsim: interrupted" in err and "Traceback" not in err, err
        _gone, alive = psutil.wait_procs(workers, timeout=5)
        assert not alive, f"workers still running: {alive}"
        time.sleep(1.0)
        assert _summaries(out) == before  # no point finished after the interrupt
        assert not (out / LOCK_NAME).exists()
    finally:
        for p in [*psutil.Process().children(recursive=True), *workers]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def test_a_second_sweep_on_the_same_folder_is_refused(tmp_path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    ready = tmp_path / "locked"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time, pathlib\n"
         "from sim.io import folder_lock\n"
         "with folder_lock(sys.argv[1], 'kvsim sweep'):\n"
         "    pathlib.Path(sys.argv[2]).touch()\n"
         "    time.sleep(60)\n", str(out), str(ready)],
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists()
        cfg = tmp_path / "s.yaml"
        cfg.write_text(QUICK)
        res = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(out)])
        assert res.exit_code == 2, res.stderr
        line = res.stderr.strip().splitlines()[-1]
        assert line.startswith(f"kvsim: error: {out}: another kvsim sweep is writing here "
                               f"(pid and host: {holder.pid} "), line
        assert _summaries(out) == 0
    finally:
        holder.kill()
        holder.wait()
    # the holder was killed: its lock went with it, and its file is taken over
    res = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(out)])
    assert res.exit_code == 0, res.stderr
    assert f"taken over from {holder.pid} " in res.stderr
    assert _summaries(out) == 1 and not (out / LOCK_NAME).exists()


def test_a_lock_file_left_by_a_dead_process_is_taken_over(tmp_path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    (out / LOCK_NAME).write_text("999999999 some-host\n")
    cfg = tmp_path / "s.yaml"
    cfg.write_text(QUICK)
    res = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(out)])
    assert res.exit_code == 0, res.stderr
    assert "taken over from 999999999 some-host (no longer running)" in res.stderr
    assert not (out / LOCK_NAME).exists()


def test_ctrl_c_in_this_process_is_status_130_and_releases_the_folder(tmp_path,
                                                                      monkeypatch) -> None:
    import sim.run

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.run, "run", interrupted)
    cfg = tmp_path / "s.yaml"
    cfg.write_text(QUICK)
    res = CliRunner().invoke(cli, ["sweep", str(cfg), "--out", str(tmp_path / "o")])
    assert res.exit_code == 130 and res.stderr.strip().endswith("kvsim: interrupted")
    assert not (tmp_path / "o" / LOCK_NAME).exists()
