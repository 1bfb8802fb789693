"""Differential test: kvsim's vLLM engine step logic (sim/engines/vllm.py ``schedule`` /
``update``) against vLLM 0.33's REAL V1 ``Scheduler`` and ``AsyncScheduler``
(benchmarks/vllm_sched_ref.py: installed with --no-deps, everything but the scheduler,
the KV-cache core and the request model stubbed; CI installs it in ``make test``, so nothing
here is skipped there).

Both are driven in lock step with the same request stream and a stub model runner (one
token per scheduled request whose computed tokens reach its length): sync as
``EngineCore.step`` (schedule, then process the output), async as
``EngineCore.step_with_batch_queue`` (the next step scheduled before the one in flight is
processed). After every ``schedule()`` the ordered scheduled rows (request, first position,
tokens) and the preempted set must agree; after every output processed, the finished set,
the free block count, every running request's block table and the waiting and running
orders. Workloads: multi-turn sessions sharing a prefix (follow-ups hit their
predecessors' prompt and decode blocks), preemption-heavy pools, small token budgets
(chunked prefill with decode rows riding along), a max_num_seqs cap.
"""

from __future__ import annotations

import copy

import pytest

from benchmarks.vllm_sched_ref import KvsimScheduler, drive, workload
from sim.engines import VllmServer
from sim.kvcache.blockpool import BlockPool

BS = 16
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


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_vllm_sched_diff(asynchronous: bool, capsys) -> None:
    steps = preemptions = 0
    for name, w, d in WORKLOADS:
        res = drive(workload(block_size=BS, **w), block_size=BS, asynchronous=asynchronous,
                    **d)
        assert not res.divergences, f"{name}: {res.divergences[0]}"
        assert res.updates == res.steps
        steps += res.steps
        preemptions += res.preemptions
    with capsys.disabled():
        print(f"\nvllm sched diff ({'async' if asynchronous else 'sync'}): {len(WORKLOADS)} "
              f"workloads, {steps} steps, {preemptions} preemptions, 0 divergences")
    assert steps > 10_000 and preemptions >= 40


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
    extend = BlockPool.extend
    monkeypatch.setattr(BlockPool, "extend",
                        lambda self, rid, n, known=None: extend(self, rid, n))
    _name, w, d = WORKLOADS[-1]
    res = drive(workload(block_size=BS, **w), block_size=BS, asynchronous=True, **d)
    assert res.divergences


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
