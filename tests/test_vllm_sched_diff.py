"""Differential test: kvsim's vLLM engine step logic (sim/engines/vllm.py ``schedule`` /
``update``) against vLLM's REAL V1 ``Scheduler`` and ``AsyncScheduler``, 0.33.0 and 0.34.0
alike (benchmarks/vllm_sched_ref.py: each pinned install with --no-deps, everything but the
scheduler, the KV-cache core and the request model stubbed; CI installs both in ``make test``,
so nothing here is skipped there, and a missing one fails).

Both are driven in lock step with the same request stream and a stub model runner (one
token per scheduled request whose computed tokens reach its length): sync as
``EngineCore.step`` (schedule, then process the output), async as
``EngineCore.step_with_batch_queue`` (the next step scheduled before the one in flight is
processed). After every ``schedule()`` the ordered scheduled rows (request, first position,
tokens) and the preempted set must agree; after every output processed, the finished set,
the free block count, every running request's block table and the waiting and running
orders. Workloads: multi-turn sessions sharing a prefix (follow-ups hit their
predecessors' prompt and decode blocks), preemption-heavy pools, small token budgets
(chunked prefill with decode rows riding along), a max_num_seqs cap; at 16-token blocks and at
64 (0.34's deployed CUDA default: four of them with prompts and budgets x4); 0.34's opt-in
cache-aware admission (``--vllm-cache-aware-window``) on both sides.
"""

from __future__ import annotations

import copy

import pytest

from benchmarks.vllm_ref import since
from benchmarks.vllm_sched_ref import KvsimScheduler, drive, workload
from sim.engines import VllmServer
from sim.kvcache import blockpool
from sim.kvcache.blockpool import BlockPool

BS = 16


# every test here runs against each pinned vLLM (``drive``'s default version: tests/conftest.py)
pytestmark = pytest.mark.usefixtures("vllm")

# (name, workload arguments, drive arguments)
WORKLOADS = [
    *[(f"preempt-{s}", dict(seed=s, sessions=8, turns=3, prompt=200, output=400,
                            shared_blocks=2, spread=10),
       dict(capacity_blocks=48, budget=8192)) for s in range(3)],
    *[(f"tight-{s}", dict(seed=30 + s, sessions=10, turns=2, prompt=120, output=300,
                          shared_blocks=1, spread=6),
       dict(capacity_blocks=32, budget=8192)) for s in range(2)],
    *[(f"chunks-{s}", dict(seed=10 + s, sessions=6, turns=4, prompt=600, output=80),
       dict(capacity_blocks=90, budget=96)) for s in range(3)],
    *[(f"seqs-{s}", dict(seed=20 + s, sessions=6, turns=3, prompt=300, output=100),
       dict(capacity_blocks=120, budget=512, max_seqs=3)) for s in range(2)],
    ("turns-budget", dict(seed=1, sessions=6, turns=4, prompt=400, output=120),
     dict(capacity_blocks=70, budget=256)),
]
# at 64-token blocks (scaled x4) and with cache-aware admission: one of each kind
# (preemption, a tight pool, chunked prefill, the max_num_seqs cap)
WORKLOADS_64 = [WORKLOADS[i] for i in (0, 3, 5, 8)]
WORKLOADS_CACHE_AWARE = [WORKLOADS[i] for i in (0, 3, 5, 8)]


def scaled(workloads: list, k: int) -> list:
    """The same workloads at ``k`` times the block size: prompts and budgets x k (the same
    blocks per prompt and per step), outputs as they were (fewer decode steps)."""
    return [(f"{name}-x{k}", {**w, "prompt": w.get("prompt", 300) * k},
             {**d, "budget": d["budget"] * k}) for name, w, d in workloads]


def run_set(workloads: list, bs: int, asynchronous: bool, **kw) -> tuple[int, int]:
    """Drive every workload at ``bs``-token blocks; (steps, preemptions) in all."""
    steps = preemptions = 0
    for name, w, d in workloads:
        res = drive(workload(block_size=bs, **w), block_size=bs, asynchronous=asynchronous,
                    **d, **kw)
        assert not res.divergences, f"{name}: {res.divergences[0]}"
        assert res.updates == res.steps
        steps += res.steps
        preemptions += res.preemptions
    return steps, preemptions


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_vllm_sched_diff(vllm: str, asynchronous: bool, capsys) -> None:
    steps, preemptions = run_set(WORKLOADS, BS, asynchronous)
    with capsys.disabled():
        print(f"\nvllm {vllm} sched diff ({'async' if asynchronous else 'sync'}): "
              f"{len(WORKLOADS)} workloads, {steps} steps, {preemptions} preemptions, "
              "0 divergences")
    assert steps > 10_000 and preemptions >= 40


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_vllm_sched_diff_at_64_token_blocks(vllm: str, asynchronous: bool, capsys) -> None:
    """vLLM 0.34's deployed CUDA default block size (kvsim's default): hits, evictions and
    preemptions at 64-token granularity."""
    sets = scaled(WORKLOADS_64, 4)
    steps, preemptions = run_set(sets, 64, asynchronous)
    with capsys.disabled():
        print(f"\nvllm {vllm} sched diff bs64 ({'async' if asynchronous else 'sync'}): "
              f"{len(sets)} workloads, {steps} steps, {preemptions} preemptions, "
              "0 divergences")
    assert preemptions >= 10


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_vllm_sched_diff_cache_aware_admission(vllm: str, asynchronous: bool,
                                               capsys) -> None:
    """0.34's opt-in cache-aware admission, window 8: at threshold 0 (every step reorders)
    and 0.5 (once half the pool is used); 0.33 has none (kvsim refuses the knob there)."""
    if not since(vllm, "0.34"):
        with pytest.raises(ValueError, match=r"new in vLLM 0\.34"):
            drive(workload(block_size=BS, **WORKLOADS[0][1]), block_size=BS,
                  asynchronous=asynchronous, cache_aware=(8, 0.0), **WORKLOADS[0][2])
        return
    steps = 0
    for threshold in (0.0, 0.5):
        steps += run_set(WORKLOADS_CACHE_AWARE, BS, asynchronous,
                         cache_aware=(8, threshold))[0]
    with capsys.disabled():
        print(f"\nvllm {vllm} sched diff cache-aware ({'async' if asynchronous else 'sync'})"
              f": {2 * len(WORKLOADS_CACHE_AWARE)} workloads, {steps} steps, 0 divergences")


@pytest.mark.pure_path("replaces VllmServer._reorder_waiting, which compiled callers do not "
                       "look up")
def test_sched_diff_sees_fcfs_where_vllm_reorders(monkeypatch, vllm: str) -> None:
    # The cache-aware comparison has teeth: kvsim serving FCFS beside vLLM 0.34 with the
    # window on diverges (the waiting order is compared after every step).
    if not since(vllm, "0.34"):
        return
    monkeypatch.setattr(VllmServer, "_reorder_waiting", lambda self: None)
    _name, w, d = WORKLOADS[0]
    res = drive(workload(block_size=BS, **w), block_size=BS, asynchronous=False,
                cache_aware=(8, 0.0), **d)
    assert res.divergences


@pytest.mark.pure_path("replaces VllmServer._preempt, which compiled callers do not look up")
def test_sched_diff_sees_a_misplaced_preempted_request(monkeypatch) -> None:
    # The comparison has teeth: a preempted request put at the BACK of the waiting queue
    # (vLLM prepends it) diverges.
    preempt = VllmServer._preempt

    def to_the_back(self, req):
        preempt(self, req)
        self.waiting.append(self.waiting.pop(0))

    monkeypatch.setattr(VllmServer, "_preempt", to_the_back)
    _name, w, d = WORKLOADS[0]
    res = drive(workload(block_size=BS, **w), block_size=BS, asynchronous=False, **d)
    assert res.divergences


def test_sched_diff_sees_decode_blocks_cached_too_early(monkeypatch) -> None:
    # Async: a decode block is cached only once the output that completes it is processed;
    # caching it as soon as it is computed (as under the sync scheduler) diverges.
    class EarlyCaching(BlockPool):  # built by the kvsim side as sim.kvcache.blockpool's
        def extend(self, rid, n, known=None):
            return super().extend(rid, n)

    monkeypatch.setattr(blockpool, "BlockPool", EarlyCaching)
    _name, w, d = WORKLOADS[-1]
    res = drive(workload(block_size=BS, **w), block_size=BS, asynchronous=True, **d)
    assert res.divergences


@pytest.mark.pure_path("admits on a deep copy of the block pool; a compiled pool is not copied")
def test_no_admission_in_a_step_that_preempted() -> None:
    # vLLM 0.33 schedules waiting requests only when the running loop preempted nobody.
    # Under async scheduling the victim (now the head of the queue) can fit again in the
    # very step that preempted it: on a copy of the pool such steps would admit it, yet the
    # engine admits nobody in them (and vLLM's AsyncScheduler agrees: test above).
    _name, w, d = WORKLOADS[-1]
    reqs = workload(block_size=BS, **w)
    side = KvsimScheduler(d["capacity_blocks"], BS, d["budget"], 1024, True,
                          {r.rid: r.ids for r in reqs})
    server = side.server
    pending = sorted(reqs, key=lambda r: (r.arrive, r.rid))
    queue: list = []
    preempting = would_admit = calls = 0
    while pending or queue or server.busy():
        while pending and pending[0].arrive <= calls:
            side.add(pending.pop(0))
        calls += 1
        if server.busy():
            waiting = {id(r) for r in server.waiting}
            step = server.schedule()
            if step.preempted:
                preempting += 1
                # nobody admitted: no waiting request, and no victim taken back
                assert not [r for r, _s, _n in step.rows
                            if id(r) in waiting or r in step.preempted]
                head = server.waiting[0]
                left = d["budget"] - sum(n for _r, _s, n in step.rows)
                pool = copy.deepcopy(server.pool)
                if left > 0 and pool.admit(head.rid, head.seq_ids,
                                           head.prompt_tokens + head.generated,
                                           left) is not None:
                    would_admit += 1
            queue.insert(0, step)
            if len(queue) < 2:  # the batch queue is not full: schedule the next at once
                continue
        elif not queue:
            continue
        server.update(queue.pop())
    assert preempting > 0 and would_admit > 0
