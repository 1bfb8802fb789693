"""An async KV load leaves in-flight prefills their blocks (issue 51 item 6): vLLM allocates a
decode worker's remote load with ``reserved_blocks`` = what the running requests still
prefilling must yet allocate (scheduler.py ``_inflight_prefill_reserved_blocks``, 0.33 and
0.34 alike); kvsim's ``BlockPool.admit_remote`` takes it, ``VllmServer._allocate_remote``
computes it (``_inflight_prefill_blocks``).

At kvsim's defaults (no long-prefill threshold, no --max-num-inflight-kv-loads) the waiting
loop runs only with token budget left, so every running prefill has either finished or taken
the whole budget: the reservation is 0 whenever a load is allocated there (no run changes).
It binds where a load is allocated beside an unfinished prefill, which the test below does by
hand on a decode worker running a local (conditionally disaggregated) chunked prefill."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.vllm_sched_ref import KvsimScheduler, Request
from sim.kvcache.blockpool import BlockPool

BS = 16


def test_admit_remote_leaves_the_reserved_blocks_free() -> None:
    pool = BlockPool(20, BS, debug=True)
    assert pool.admit(0, np.arange(16), 256, 64) == 0  # 4 of its 16 blocks so far
    assert pool.blocks_to_grow(0, 256) == 12
    ids = np.arange(100, 106)
    assert pool.admit_remote(1, ids, 96, reserved=12) is None  # 6 > 16 free - 12
    assert pool.free_blocks == 16
    assert pool.admit_remote(1, ids, 96, reserved=10) == 0  # 6 <= 16 - 10


def _decode_worker() -> tuple[KvsimScheduler, Request]:
    """A 20-block decode worker whose local 256-token prefill runs in 64-token chunks."""
    local = Request(0, 256, 4, np.arange(16), 0)
    side = KvsimScheduler(20, BS, 64, 1024, False, {0: local.ids, 1: np.arange(100, 106)},
                          "0.34")
    side.add(local)
    return side, local


def _remote(side: KvsimScheduler, granted: list) -> object:
    from sim.context import FullPrompt
    from sim.engines.vllm import VllmReq

    ids = np.arange(100, 106)
    r = VllmReq(rid=1, session=1, arrival=0.0, seq=0, prompt_tokens=96, output_tokens=4,
                ids=ids, done=side.env.event(), prompt=FullPrompt(side, 1, ids, 96, 4))
    side.server.reserve_remote(r, lambda: granted.append(r.rid))
    return r


def test_a_remote_load_waits_for_the_blocks_a_local_chunked_prefill_still_needs() -> None:
    side, _local = _decode_worker()
    server = side.server
    local = side._reqs[0]
    step, rows, _pre = side.schedule()
    assert rows == [(0, 0, 64)]  # the local prefill's first chunk: 4 blocks held
    side.update(step)
    granted: list = []
    remote = _remote(side, granted)
    remote.seq_ids = remote.prompt.finish
    # its 6 blocks fit the 16 free, not beside the 12 the local prefill still needs
    assert server._inflight_prefill_blocks() == 12
    assert not server._allocate_remote(remote)
    assert not granted and server.waiting == [remote] and server.pool.free_blocks == 16
    # the prefill goes on, each chunk the step's whole budget (the waiting loop does not
    # run), to its end; then the 17 blocks it holds leave no room for the load's 6 until the
    # local request finishes: the load is allocated in the step after
    for _ in range(3):
        step, rows, _pre = side.schedule()
        side.update(step)
        assert rows[0][2] == 64 and not granted
    assert server._inflight_prefill_blocks() == 0
    while not local.done.triggered:
        step, _rows, _pre = side.schedule()
        side.update(step)
        assert not granted
    side.schedule()
    assert granted == [1] and server.pool.free_blocks == 20 - 6


@pytest.mark.pure_path("replaces VllmServer._inflight_prefill_blocks, which compiled callers "
                       "do not look up")
def test_without_the_reservation_the_load_would_take_the_prefills_blocks(monkeypatch) -> None:
    """The same state with nothing reserved (kvsim before): the load is allocated at once,
    and the local prefill, 12 blocks short with 10 free, is preempted by recompute at its
    third chunk after (the deadlock-prone case vLLM's reservation avoids)."""
    from sim.engines.vllm import VllmServer

    monkeypatch.setattr(VllmServer, "_inflight_prefill_blocks", lambda self: 0)
    side, _local = _decode_worker()
    step, _rows, _pre = side.schedule()
    side.update(step)
    granted: list = []
    remote = _remote(side, granted)
    remote.seq_ids = remote.prompt.finish
    assert side.server._allocate_remote(remote) and granted == [1]
    assert side.server.pool.free_blocks == 10
    preempted = []
    for _ in range(3):
        step, _rows, pre = side.schedule()
        side.update(step)
        preempted.append(pre)
    assert preempted == [[], [], [0]]
