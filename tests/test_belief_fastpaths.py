"""The fleet's fast paths (sim/fleet/beliefs.py, sim/fleet/load.py, the dynamo-kv router's
active blocks) against brute-force models written block by block: the same answers and the
same final state on random holders, prompts and KV-event streams."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from policies.routers.dynamo import DynamoKV
from policies.routing import KVEvents, PodLRU, ReplicaView, RouteRequest, RouterView
from sim.fleet.beliefs import EventBelief, PodLRUBelief, consecutive_prefixes
from sim.fleet.eventindex import COLLECT_FLOOR, ChainIndex
from sim.fleet.load import Predicted
from sim.kvcache.events import BlockRemoved, BlockStored, ChainWritten

N = 4
masks = st.integers(0, (1 << N) - 1)
# small id universe so prompts share blocks and holders overlap
block_ids = st.integers(0, 12)


def brute_prefixes(ids: list[int], holders: dict[int, int], n: int) -> list[int]:
    out = []
    for r in range(n):
        k = 0
        while k < len(ids) and holders.get(ids[k], 0) >> r & 1:
            k += 1
        out.append(k)
    return out


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(block_ids, masks), st.lists(block_ids, max_size=20))
def test_consecutive_prefixes_equals_the_scan(holders, ids):
    assert consecutive_prefixes(ids, holders, N) == brute_prefixes(ids, holders, N)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(block_ids, masks), st.lists(block_ids, max_size=20),
       st.integers(1, 25))
def test_podlru_overlaps_equals_the_scan(holders, ids, max_prefix):
    belief = PodLRUBelief(N, PodLRU(capacity_blocks=100, max_prefix_blocks=max_prefix))
    belief.holders.update(holders)
    want = [0] * N
    for b in ids[:max_prefix]:
        m = holders.get(b, 0)
        if not m:
            break
        for r in range(N):
            want[r] += m >> r & 1
    assert belief.overlaps(np.asarray(ids, dtype=np.int64), 0.0) == want


class LinkedModel:
    """Dynamo 1.6's event index block by block: a store skips a block whose parent the
    worker lacks (and everything after it); a removal takes the block's subtree."""

    def __init__(self) -> None:
        self.held: list[set[int]] = [set() for _ in range(N)]
        self.children: list[dict[int, set[int]]] = [{} for _ in range(N)]
        self.dropped = 0

    def store(self, r: int, ids: list[int], parent: int | None) -> None:
        prev = parent
        for i, b in enumerate(ids):
            if prev is not None and prev >= 0 and prev not in self.held[r]:
                self.dropped += len(ids) - i
                return
            self.held[r].add(b)
            if prev is not None and prev >= 0:
                self.children[r].setdefault(prev, set()).add(b)
            prev = b

    def remove(self, r: int, ids: list[int]) -> None:
        for b in ids:  # one subtree at a time, depth first
            stack = [b]
            while stack:
                x = stack.pop()
                self.held[r].discard(x)
                stack.extend(self.children[r].pop(x, ()))


events = st.lists(st.tuples(st.integers(0, N - 1), st.booleans(),
                            st.lists(block_ids, min_size=1, max_size=6),
                            st.one_of(st.none(), st.integers(-1, 12))), max_size=40)


@settings(max_examples=300, deadline=None)
@given(events, st.booleans())
@example([(0, True, [5, 6, 5, 7], None), (0, False, [5], None)], True)  # a repeated id
@example([(0, True, [2, 0, 0, 1, 1, 0], None), (0, False, [2], None)], True)  # a branch twice
@example([(0, True, [5, 6, 5, 7], -1), (1, True, [5, 6], -1), (0, False, [6], None)], True)
@example([(0, True, [1, 2], -1), (0, True, [3, 4, 3], 2), (1, True, [1, 2, 3], -1),
          (0, False, [3], None)], True)  # a repeated id in a store that names its parent
def test_event_index_equals_the_block_by_block_model(stream, orphans):
    check_event_index(stream, orphans)


def check_event_index(stream, orphans: bool, collect_floor: int = COLLECT_FLOOR,
                      every_event: bool = False) -> EventBelief:
    """The index after ``stream`` (after each event with ``every_event``) equals the
    block-by-block model's: holders, sizes, dropped blocks and the overlap of every run of
    the stream."""
    belief = EventBelief(N, KVEvents(lag_s=0.0, drop_orphans=orphans), collect_floor)
    model = LinkedModel()
    for k, (r, stored, ids, parent) in enumerate(stream):
        arr = np.asarray(ids, dtype=np.int64)
        if stored:
            belief.stored(r, arr, 0.0, parent)
        else:
            belief.removed(r, arr, 0.0)
        if orphans:
            (model.store(r, ids, parent) if stored else model.remove(r, ids))
        elif stored:
            model.held[r].update(ids)
        else:
            model.held[r].difference_update(ids)
        if every_event or k == len(stream) - 1:
            same_as_model(belief, model, stream)
    return belief


def same_as_model(belief: EventBelief, model: LinkedModel, stream) -> None:
    want = {}
    for r in range(N):
        for b in model.held[r]:
            want[b] = want.get(b, 0) | 1 << r
    assert belief.holders == want
    assert belief.sizes() == [len(h) for h in model.held]
    assert belief.dropped == model.dropped
    for _, _, ids, _ in stream:
        assert belief.overlaps(np.asarray(ids, dtype=np.int64), 0.0) \
            == brute_prefixes(ids, want, N)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 2), max_size=8)),
                max_size=20),
       st.randoms(use_true_random=False))
def test_active_block_counts_equal_per_block_refcounts(prompts, rnd):
    """Predicted load and dynamo-kv's active blocks: per worker, a block counts once per
    active request that holds it, and leaves with the last; the router's cost counts the
    request's blocks not active on each worker. Prompts are chained, as every trace's are
    (one id per distinct token prefix)."""
    chain: dict[tuple[int, ...], int] = {}
    pred = Predicted(3)
    router = DynamoKV()
    router.bind(3, 16, np.random.default_rng(0))
    live: list[tuple[int, int, list[int]]] = []
    for rid, (w, seq) in enumerate(prompts):
        ids = [chain.setdefault(tuple(seq[: i + 1]), len(chain)) for i in range(len(seq))]
        arr = np.asarray(ids, dtype=np.int64)
        pred.added(w, rid, arr, 10)
        live.append((rid, w, ids))
        if live and rnd.random() < 0.4:
            rid_done, w_done, ids_done = live.pop(rnd.randrange(len(live)))
            pred.freed(w_done, rid_done, np.asarray(ids_done, dtype=np.int64))
        probe = np.asarray([*ids[: len(ids) // 2], 10_000 + rid], dtype=np.int64)
        prefixes = pred.active_prefixes(probe)
        view = RouterView(0.0, tuple(ReplicaView(
            i, 0, None, 0, 0, 0, active_blocks=pred.active_blocks(i), active_prefill_tokens=0,
            active_prefix_blocks=prefixes[i]) for i in range(3)))
        want_cost = []
        for x in range(3):
            refs = {b for _, lw, p in live if lw == x for b in p}
            new = sum(1 for b in probe.tolist() if b not in refs)
            want_cost.append((16 * len(probe)) / 16 + len(refs) + new)
        assert router.costs(RouteRequest(-1, 0, 0.0, 16 * len(probe), probe, 16), view) \
            == want_cost
    for w in range(3):
        want: dict[int, int] = {}
        for _, lw, ids in live:
            if lw == w:
                for b in ids:
                    want[b] = want.get(b, 0) + 1
        assert pred.active_blocks(w) == len(want)


@st.composite
def tree_streams(draw):
    """Events shaped like a radix cache's: chained prompts over a small token alphabet
    (ids shared at equal prefixes), each event a run of one prompt. Most extend what the
    replica holds of a prompt (stored: the next blocks after the held prefix, with the block
    before as parent) or cut it back (removed: the tail of the held prefix), as the engines
    report changes; the rest are arbitrary runs (repeats, holes, a missing parent, a run
    past a branch), so both the run-at-once paths and the block-by-block ones are taken."""
    chain: dict[tuple[int, ...], int] = {}
    prompts = []
    for seq in draw(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12),
                             min_size=1, max_size=6)):
        prompts.append([chain.setdefault(tuple(seq[: i + 1]), len(chain))
                        for i in range(len(seq))])
    held: list[set[int]] = [set() for _ in range(N)]  # what the engine would hold
    out = []
    for _ in range(draw(st.integers(0, 40))):
        r = draw(st.integers(0, N - 1))
        p = prompts[draw(st.integers(0, len(prompts) - 1))]
        k = 0
        while k < len(p) and p[k] in held[r]:
            k += 1
        kind = draw(st.sampled_from(["extend", "cut", "any"]))
        if kind == "extend" and k < len(p):
            run, parent, stored = p[k:draw(st.integers(k + 1, len(p)))], p[k - 1] if k else -1, True
        elif kind == "cut" and k:
            run, parent, stored = p[draw(st.integers(0, k - 1)):k], None, False
        else:
            a = draw(st.integers(0, len(p) - 1))
            run = p[a:draw(st.integers(a + 1, len(p)))]
            parent = draw(st.sampled_from([p[a - 1] if a else -1, None, -1]))
            stored = draw(st.booleans())
        (held[r].update if stored else held[r].difference_update)(run)
        out.append((r, stored, run, parent))
    return out


@settings(max_examples=400, deadline=None)
@given(tree_streams(), st.booleans())
def test_event_index_on_tree_shaped_streams(stream, orphans):
    check_event_index(stream, orphans)


@settings(max_examples=200, deadline=None)
@given(tree_streams(), st.booleans(), st.randoms(use_true_random=False))
def test_lagged_index_is_the_prompt_one_behind_by_the_lag(stream, orphans, rnd):
    """With ``lag_s`` > 0, the overlaps and sizes at any time are those of a lag-free index
    fed only the events emitted at least ``lag_s`` before."""
    lag = 1.5
    lagged = EventBelief(N, KVEvents(lag_s=lag, drop_orphans=orphans))
    prompt = EventBelief(N, KVEvents(lag_s=0.0, drop_orphans=orphans))
    times = sorted(rnd.uniform(0, 10) for _ in stream)
    fed, now = 0, 0.0
    for i, (t, (r, stored, ids, parent)) in enumerate(zip(times, stream, strict=True)):
        arr = np.asarray(ids, dtype=np.int64)
        (lagged.stored(r, arr, t, parent) if stored else lagged.removed(r, arr, t))
        now = max(now, t + rnd.uniform(0, 2 * lag))  # a query after the emission
        while fed <= i and times[fed] + lag <= now:
            r2, stored2, ids2, parent2 = stream[fed]
            arr2 = np.asarray(ids2, dtype=np.int64)
            (prompt.stored(r2, arr2, 0.0, parent2) if stored2 else prompt.removed(r2, arr2, 0.0))
            fed += 1
        assert lagged.overlaps(arr, now) == prompt.overlaps(arr, now)
        assert lagged.sizes() == prompt.sizes()


@st.composite
def deep_streams(draw):
    """Long chained prompts over a branching tree (a shared head, then per-prompt chains with
    branches of their own), stored whole after a held prefix, with removals of single blocks
    anywhere: a removal near the head takes long chains and their branches with it (the
    subtree walk of ``drop_orphans``), and stores and removals of what the index already
    forgot follow, as the engines report them after a hole."""
    chain: dict[tuple[int, ...], int] = {}
    head = draw(st.lists(st.integers(0, 1), min_size=1, max_size=8))
    prompts = []
    for tail in draw(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=60),
                              min_size=1, max_size=5)):
        seq = head + tail
        prompts.append([chain.setdefault(tuple(seq[: i + 1]), len(chain))
                        for i in range(len(seq))])
    out = []
    for _ in range(draw(st.integers(0, 30))):
        r = draw(st.integers(0, N - 1))
        p = prompts[draw(st.integers(0, len(prompts) - 1))]
        a = draw(st.integers(0, len(p) - 1))
        if draw(st.booleans()):
            out.append((r, True, p[a:], p[a - 1] if a else -1))
        else:
            gone = p[a:a + draw(st.integers(1, 6))]
            # vLLM evicts a freed request tail first: its removals go back up the chain
            out.append((r, False, gone[::-1] if draw(st.booleans()) else gone, None))
    return out


@settings(max_examples=300, deadline=None)
@given(deep_streams(), st.sampled_from([COLLECT_FLOOR, 1, 8]))
def test_event_index_drops_deep_subtrees_as_the_model(stream, floor):
    # Chained, every store naming its parent (the engines without a CPU tier): the index
    # stays run by run throughout (sim/fleet/eventindex.py ChainIndex), splitting runs where
    # a chain branches off, and forgetting the runs no replica holds (a floor of 1 or 8
    # collects after nearly every store) changes no answer.
    belief = check_event_index(stream, True, floor, every_event=True)
    assert isinstance(belief.index, ChainIndex)


@settings(max_examples=200, deadline=None)
@given(deep_streams(), st.sampled_from([0, 1, 2]), st.sampled_from([0, 37, (1 << 40) + 3]),
       st.sampled_from([COLLECT_FLOOR, 4]))
def test_span_buckets_change_no_answer(stream, bits, shift, floor):
    # ChainIndex keeps a run of consecutive ids as a span listed per bucket of 2**SPAN_BITS
    # ids (RunMap): small buckets make runs reach several, split across them and leave
    # listings behind a split or a collection; shifted ids start spans inside a bucket and
    # far from zero (versioned keys). Every answer after every event is the model's.
    import sim.fleet.eventindex as eventindex

    moved = [(r, stored, [b + shift for b in ids],
              parent + shift if parent is not None and parent >= 0 else parent)
             for r, stored, ids, parent in stream]
    saved = eventindex.SPAN_BITS
    eventindex.SPAN_BITS = bits
    try:
        belief = check_event_index(moved, True, floor, every_event=True)
    finally:
        eventindex.SPAN_BITS = saved
    assert isinstance(belief.index, ChainIndex)


@pytest.mark.pure_path("counts the cuts of a Python ChainIndex")
def test_a_removal_going_back_up_a_chain_cuts_once(monkeypatch):
    # vLLM's pool evicts a freed request tail first, so its removal events list a chain
    # backwards: one cut at the shallowest id, not one per block (issue 55 item 1)
    belief = EventBelief(N, KVEvents(lag_s=0.0, drop_orphans=True))
    ids = np.arange(1000, 1300, dtype=np.int64)
    belief.stored(0, ids, 0.0, -1)
    cuts = []
    cut = ChainIndex._cut
    monkeypatch.setattr(ChainIndex, "_cut", lambda self, *a: (cuts.append(a), cut(self, *a)))
    belief.removed(0, ids[100:][::-1].copy(), 0.0)
    assert len(cuts) == 1 and belief.sizes() == [100, 0, 0, 0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, N - 1), st.integers(0, 119), st.integers(1, 60),
                          st.integers(0, 3)), min_size=1, max_size=8),
       st.sampled_from([False, True]))
def test_removals_walking_back_up_long_runs(removals, dense):
    # A removal lists ids going back up a run for many blocks (vLLM frees a request's tail
    # first), then leaves it: at the run's start (into its parent run, split off by a branch),
    # at another run, or at an id the replica no longer holds; the runs are consecutive ids
    # or not (ChainIndex's two kinds). Every answer after every event is the model's.
    ids = list(range(1000, 1120)) if dense else [7 * b + 3 for b in range(120)]
    branch = [ids[k] + 100_000 for k in range(40)]
    stream = [(r, True, ids, -1) for r in range(N)]
    stream += [(r, True, branch, ids[59]) for r in range(N)]  # splits the chain after 60
    for r, at, length, jump in removals:
        gone = ids[max(0, at - length + 1):at + 1][::-1]
        gone += [branch[5 * jump], ids[(at + 17 * jump) % 120]][:jump]
        stream.append((r, False, gone, None))
        stream.append((r, True, ids[:at + 1], -1))  # stored again (what it lacks returns)
    belief = check_event_index(stream, True, every_event=True)
    assert isinstance(belief.index, ChainIndex)


def test_a_removal_leaves_the_link_a_later_load_without_parent_follows():
    # Replica 0 stores the chain 1 -> 2 -> 3 and loses 2 (and so 3): the block-by-block
    # index keeps 1's link to 2. A CPU load restores 2 with no parent named (no new link),
    # which hands the state over to the block-by-block index: removing 1 must take 2 along
    # the link left behind, as Dynamo's radix index does, and only along it (4 never was
    # 1's child on this replica).
    stream = [(0, True, [1, 2, 3], -1), (0, False, [2], None), (0, True, [2], None),
              (0, True, [4], None), (0, False, [1], None)]
    belief = check_event_index(stream, True, every_event=True)
    assert not isinstance(belief.index, ChainIndex)  # handed over at the first load
    assert belief.holders == {4: 1}


@pytest.mark.parametrize("stream, left", [
    # 3 goes (2 keeps its link to 3), then 2 (its links go with it; 1 keeps its link to 2);
    # 2 comes back after 1 and 3 by a load: removing 2 again must not take 3 along a link
    # that went with 2 the first time
    ([(0, True, [1, 2, 3, 4], -1), (0, False, [3], None), (0, False, [2], None),
      (0, True, [2], 1), (0, True, [3], None), (0, False, [2], None)], {1, 3}),
    # the same with a longer removal than the links left behind (they are looked up the
    # other way round)
    ([(0, True, [1, 2, 3, 4, 5, 6], -1), (0, False, [5], None), (0, False, [2], None),
      (0, True, [2, 3, 4], 1), (0, True, [5], None), (0, False, [4], None)], {1, 2, 3, 5}),
    # ... and where the block whose link was left behind is the first one removed
    ([(0, True, [1, 2, 3, 4, 5, 6], -1), (0, False, [3], None), (0, True, [3, 4, 5], 2),
      (0, False, [2], None), (0, True, [2], 1), (0, True, [3], None), (0, False, [2], None)],
     {1, 3}),
])
def test_links_go_with_the_removed_block_they_leave(stream, left):
    belief = check_event_index(stream, True, every_event=True)
    assert set(belief.holders) == left


@settings(max_examples=300, deadline=None)
@given(deep_streams(), st.data())
def test_the_hand_over_to_blocks_keeps_every_answer(stream, data):
    # A CPU load (parent None) anywhere in a chained stream: before it the index runs run
    # by run, after it block by block from the state handed over (its removals' links
    # included); every answer after every event equals the model's.
    at = data.draw(st.integers(0, len(stream)))
    r = data.draw(st.integers(0, N - 1))
    ids = data.draw(st.lists(st.integers(0, 40), min_size=1, max_size=4, unique=True))
    belief = check_event_index([*stream[:at], (r, True, ids, None), *stream[at:]], True,
                               every_event=True)
    assert not isinstance(belief.index, ChainIndex)


@settings(max_examples=200, deadline=None)
@given(tree_streams(), st.booleans(), st.sampled_from([0.0, 1.5]),
       st.randoms(use_true_random=False))
def test_the_index_fed_replica_by_replica_equals_the_one_fed_event_by_event(
        stream, orphans, lag, rnd):
    """``replica_events`` (the feed's per-replica lists, sim/fleet/kvevents.py) applies the
    same events as ``stored``/``removed`` called once per event, at zero and positive lag:
    the same overlaps, sizes and dropped blocks at every query, however the events are
    grouped into deliveries (a replica's blocks change only by its own events)."""
    spec = KVEvents(lag_s=lag, drop_orphans=orphans)
    by_event, by_replica = EventBelief(N, spec), EventBelief(N, spec)
    batches: list[list] = [[] for _ in range(N)]
    now = 0.0
    for serial, (r, stored, ids, parent) in enumerate(stream):
        now += rnd.uniform(0, 1)
        arr = np.asarray(ids, dtype=np.int64)
        (by_event.stored(r, arr, now, parent) if stored else by_event.removed(r, arr, now))
        event = BlockStored(arr, parent) if stored else BlockRemoved(arr)
        batches[r].append(((now, serial), event))
        batches[rnd.randrange(N)].append(((now, serial), ChainWritten(arr)))  # ignored
        if rnd.random() < 0.3 or serial == len(stream) - 1:
            for replica in rnd.sample(range(N), N):
                by_replica.replica_events(replica, batches[replica])
                batches[replica] = []
            at = now + rnd.uniform(0, 2 * lag)
            assert by_replica.overlaps(arr, at) == by_event.overlaps(arr, at)
            assert by_replica.sizes() == by_event.sizes()
            assert by_replica.dropped == by_event.dropped


def test_a_run_finds_an_id_at_its_own_place_not_across_two():
    """``Run.offset`` searches the run's bytes: an id's 8 bytes may also appear straddling
    two other ids (here id 5's bytes at byte 12: the high half of ``5 << 32`` and the low
    half of 0), which must be skipped for its own place."""
    from sim.fleet.eventindex import Run
    ids = [5, 5 << 32, 0, 7]
    run = Run(ids, np.asarray(ids, dtype=np.int64).tobytes(), 10, None)
    assert run.raw.rfind((5).to_bytes(8, sys.byteorder, signed=True)) % 8 != 0
    assert [run.offset(b) for b in ids] == [0, 1, 2, 3]
