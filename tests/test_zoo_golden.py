"""Golden tests: the zoo's eviction orders on small hand-built trees, with events fed by hand
and a context whose clock and prices the test sets.

Sessions used throughout (block ids; the shared prefix is blocks 1 2)::

    root -- S[1 2] -- A[10 11 12 13]           session 0   (inserted first: least recent)
                  |-- B[20 21 22 23 24 25]     session 1
                  `-- C[30 31]                 session 2   (most recent)

Prices: recomputing tokens [a, b) costs ``sum over p of (W + p)`` micro-seconds, W = 1000
(Section 2.2's shape with a small W, so positions matter).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from policies import Arrival, PolicyContext, Reply, get_policy
from policies.zoo.common import DEAD, SHARED, HistoryOwners
from policies.zoo.memdecay import REGIONS
from policies.zoo.random_victims import uniform
from sim.kvcache import RadixKVCache
from tests.chained import freed, joined

W = 1000
BS = 64
S = [1, 2]
A = [10, 11, 12, 13]
B = [20, 21, 22, 23, 24, 25]
C = [30, 31]


def price(a: int, b: int) -> float:
    """Seconds for tokens [a, b): (b - a) W + sum of positions, in microseconds."""
    return ((b - a) * W + (a + b - 1) * (b - a) / 2) * 1e-6


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def policy_setup(spec: str, seed: int = 0, **params):
    clock = Clock()
    policy = get_policy(spec, params)
    policy.bind(PolicyContext(now=clock, block_size=BS, seed=seed, recompute_seconds=price))
    cache = RadixKVCache(64, policy, debug=True)
    return policy, cache, clock


def three_sessions(cache: RadixKVCache) -> dict[int, object]:
    """Insert the three histories (in session order); return session -> its leaf."""
    return {s: cache.insert(joined(S, h)).node for s, h in enumerate((A, B, C))}


def reply(policy, s: int, leaf, t: float, gap: str = "tool", gap_s: float = math.nan,
          tokens: int | None = None, queue_s: float = math.nan) -> None:
    tokens = leaf.end * BS if tokens is None else tokens
    policy.on_reply(Reply(t, s, s, tokens, leaf, gap, gap_s, queue_s))


def arrival(policy, s: int, t: float, ids: np.ndarray, regions=None) -> None:
    policy.on_arrival(Arrival(t, s, s, ids.size * BS, ids, regions))


# ---------------------------------------------------------------------------- shared
def test_history_owners_mark_shared_and_dead_nodes() -> None:
    cache = RadixKVCache(64, "penelope", debug=True)
    leaves = three_sessions(cache)
    owners = HistoryOwners()
    for s, leaf in leaves.items():
        owners.walk(s, leaf)
    shared = leaves[0].parent
    assert owners.owner(shared) == SHARED and shared.end == 2
    assert [owners.owner(leaves[s]) for s in range(3)] == [0, 1, 2]
    # Session 0's next prompt leaves A after its first block: the rest of A is DEAD.
    new = cache.insert(joined(S, A[:1], [40, 41])).node
    owners.walk(0, new)
    assert owners.owner(new) == 0 and owners.owner(new.parent) == 0  # A[:1], split off
    assert owners.owner(leaves[0]) == DEAD  # A[1:] keeps its serial: left behind


def test_zoo_region_names_match_the_traces() -> None:
    import traces

    assert tuple(traces.REGION_NAMES) == REGIONS


def test_labels_name_the_oracle_and_changed_starts() -> None:
    assert get_policy("clairvoyant").label == "clairvoyant-oracle"
    assert get_policy("clairvoyant?cost_aware=false").label == \
        "clairvoyant-oracle(cost_aware=False)"
    assert get_policy("tlru?start=private-head&granularity=block").label == \
        "tlru@private-head+block"
    assert get_policy("ttl?tau_s=5").label == "ttl(tau_s=5.0)"
    assert get_policy("ttl") != get_policy("ttl?start=private-head&granularity=block")


# ---------------------------------------------------------------------------- random
def test_random_order_is_pinned_per_seed_and_independent_of_call_order() -> None:
    orders = {}
    for seed in (0, 1):
        policy, cache, _ = policy_setup("random", seed=seed)
        leaves = three_sessions(cache)
        orders[seed] = [freed(cache.evict(1)) for _ in range(3)]
        # the same order from the hash: after k victims, the smallest uniform(seed, serial, k)
        alive, want = [0, 1, 2], []
        for k in range(3):
            v = min(alive, key=lambda s, k=k: uniform(seed, leaves[s].serial, k))
            alive.remove(v)
            want.append([(A, B, C)[v]])
        assert orders[seed] == want
    assert orders[0] == [[A], [B], [C]]
    assert orders[1] == [[C], [B], [A]]
    # keys are a hash of (seed, serial, victims so far): the order of the calls is irrelevant
    policy, cache, _ = policy_setup("random", seed=3)
    leaves = list(three_sessions(cache).values())
    assert [policy.key(n) for n in leaves] == [policy.key(n) for n in leaves[::-1]][::-1]


def test_random_first_victim_is_uniform() -> None:
    counts = np.zeros(3, dtype=int)
    for seed in range(3000):
        keys = [uniform(seed, serial, 0) for serial in (7, 8, 9)]
        counts[int(np.argmin(keys))] += 1
    assert all(abs(c - 1000) < 100 for c in counts), counts  # 1000 +- 3.3 sigma


# ---------------------------------------------------------------------------- ttl
def test_ttl_pin_holds_a_tool_call_until_tau_then_lru() -> None:
    policy, cache, clock = policy_setup("ttl", tau_s=10.0)
    leaves = three_sessions(cache)
    for s in range(3):
        arrival(policy, s, 0.0, joined(S, (A, B, C)[s]))
    reply(policy, 0, leaves[0], 0.0)  # A ends in a tool call: pinned until t = 10
    clock.t = 5.0
    assert freed(cache.evict(2)) == [B[-2:]]  # A is the LRU leaf but pinned: B's tail
    clock.t = 10.0  # the pin ends at its deadline
    assert freed(cache.evict(1)) == [A[-1:]]


def test_ttl_pin_survives_until_the_next_request_if_it_arrives_in_time() -> None:
    policy, cache, clock = policy_setup("ttl", tau_s=10.0)
    leaves = three_sessions(cache)
    arrival(policy, 0, 0.0, joined(S, A))
    reply(policy, 0, leaves[0], 0.0)
    arrival(policy, 0, 9.0, joined(S, A, [14]))  # back before the deadline: held until admitted
    clock.t = 50.0
    assert policy.pinned_until(leaves[0]) == math.inf
    assert freed(cache.evict(1)) == [B[-1:]]
    reply(policy, 0, leaves[0], 50.0, gap="human")  # the request finished: no pin
    assert freed(cache.evict(1)) == [A[-1:]]


def test_ttl_under_pressure_frees_pinned_histories_latest_program_first() -> None:
    policy, cache, clock = policy_setup("ttl", tau_s=100.0)
    leaves = three_sessions(cache)
    for s, t in ((1, 0.0), (0, 1.0), (2, 2.0)):  # program arrivals: 1, then 0, then 2
        arrival(policy, s, t, joined(S, (A, B, C)[s]))
    for s in range(3):
        reply(policy, s, leaves[s], 3.0)
    clock.t = 4.0
    assert freed(cache.evict(14)) == [C, A, B, S]  # all pinned: 2, 0, 1, then the prefix


def test_ttl_tau_rule_cold_start_and_empirical() -> None:
    policy, _, _ = policy_setup("ttl", cold_start=3)
    policy.bind(PolicyContext(now=lambda: 0.0, recompute_seconds=lambda a, b: 4.0))
    # cold start: exponential prior, mean 1 s: tau = ln(B / 1 s) for B = C = 4 s
    assert policy.tau(1000) == pytest.approx(math.log(4.0))
    for d in (1.0, 2.0, 2.0, 10.0):  # tool durations: reply -> next arrival
        policy.called_at[7] = 100.0
        arrival(policy, 7, 100.0 + d, joined(S))
    # F(1) = 1/4, F(2) = 3/4, F(10) = 1: gains with B = 4: 0, 1, -6 -> tau = 2
    assert policy.tau(1000) == 2.0
    for b, want in ((20.0, 2.0), (40.0, 10.0), (1.0, 0.0)):
        policy.bind(PolicyContext(now=lambda: 0.0, recompute_seconds=lambda a, b, v=b: v))
        assert policy.tau(1000) == want, b


def test_ttl_eta_is_minus_the_correlation_of_steps_done_and_left() -> None:
    policy, _, _ = policy_setup("ttl")
    assert policy.eta() == 1.0  # no completed program yet
    pairs = []
    for n in (3, 5, 12):
        policy.program_done(n)
        pairs += [(k, n - k) for k in range(1, n + 1)]
    k, m = np.array(pairs, dtype=float).T
    assert policy.eta() == pytest.approx(max(0.0, -np.corrcoef(k, m)[0, 1]))


def test_ttl_learns_the_queue_wait_of_unpinned_returns() -> None:
    policy, cache, _clock = policy_setup("ttl", tau_s=1.0)
    leaves = three_sessions(cache)
    reply(policy, 0, leaves[0], 0.0)  # pinned until 1 s
    arrival(policy, 0, 5.0, joined(S, A))  # back after the pin expired
    reply(policy, 0, leaves[0], 8.0, gap="human", queue_s=2.0)
    assert policy.queue_s == pytest.approx(0.1 * 2.0)
    reply(policy, 1, leaves[1], 8.0, gap="tool")
    arrival(policy, 1, 8.5, joined(S, B))  # back in time: not an eviction's queue
    reply(policy, 1, leaves[1], 9.0, gap="human", queue_s=50.0)
    assert policy.queue_s == pytest.approx(0.2)


# ---------------------------------------------------------------------------- tlru
def test_tlru_evicts_tel_safe_nodes_first_then_lru() -> None:
    # B's history grows by D = 2 blocks (the newest leaf). xi = 200 tokens, q_hat = 0, so a
    # node is TEL-safe when it starts at or after L - 200 (L: its history's high water):
    #   A [128, 384)  L 384: B = 184   not safe     C [128, 256)  L 256: B = 56   safe
    #   D [512, 640)  L 640: B = 440   safe         B [128, 512)  L 640: B = 440  not safe
    policy, cache, _clock = policy_setup("tlru", xi=200, q_hat=0)
    leaves = three_sessions(cache)
    d = cache.insert(joined(S, B, [26, 27])).node
    assert (d.start, d.end) == (8, 10)
    for s, leaf in ((0, leaves[0]), (2, leaves[2]), (1, d)):
        reply(policy, s, leaf, 1.0)
    assert [policy.key(n)[0] for n in (leaves[0], leaves[2], d)] == [1, 0, 0]
    # TEL-safe first (LRU among them: C, then D, the most recent leaf), then LRU: A, B, S.
    assert freed(cache.evict(1)) == [C]
    assert freed(cache.evict(1)) == [[26, 27]]
    b_node = leaves[1]
    assert policy.budget(b_node) == 640 - 200  # the high water: L does not shrink
    assert [freed(cache.evict(1)) for _ in range(3)] == [[A], [B], [S]]
    # plain LRU would have taken A first
    lru = RadixKVCache(64, "sglang", debug=True)
    three_sessions(lru)
    lru.insert(joined(S, B, [26, 27]))
    assert freed(lru.evict(1)) == [A]


def test_tlru_with_a_large_threshold_is_all_tel_safe_and_lru() -> None:
    policy, cache, _ = policy_setup("tlru", xi=1 << 20)
    leaves = three_sessions(cache)
    for s, leaf in leaves.items():
        reply(policy, s, leaf, 1.0)
    assert [freed(cache.evict(1)) for _ in range(3)] == [[A], [B], [C]]


def test_tlru_split_node_keeps_the_branch_high_water() -> None:
    """A new branch splits A after its first block: the new prefix node [10] carries A's
    high water (SGLang copies it on a split). Once A's suffix and the branch are gone, [10]
    is a leaf at [2, 3) whose branch ran to 384 tokens: B = 184 > 128, not TEL-safe; without
    the copy its L would be its own end (192), B = -8: TEL-safe."""
    policy, cache, _clock = policy_setup("tlru", xi=200, q_hat=0)
    leaves = three_sessions(cache)
    for s, leaf in leaves.items():
        reply(policy, s, leaf, 1.0)
    branch = cache.insert(joined(S, A[:1], [40])).node
    prefix = branch.parent
    assert (prefix.start, prefix.end) == (2, 3) and leaves[0].parent is prefix
    assert policy.budget(prefix) == policy.budget(leaves[0]) == 384 - 200
    assert policy.key(prefix)[0] == 1  # not TEL-safe
    # TEL-safe first, LRU among them: C, A's suffix [3, 6), the branch; then B
    assert [freed(cache.evict(1)) for _ in range(4)] == [[C], [A[1:]], [[40]], [B]]
    assert policy.key(prefix)[0] == 1  # a leaf now, still judged by A's high water


# ---------------------------------------------------------------------------- greedydual
def test_greedydual_lowest_cost_per_block_first_then_inflation() -> None:
    policy, cache, _clock = policy_setup("greedydual")
    leaves = three_sessions(cache)
    # Priorities: A[2,6) 4 blocks, B[2,8) 6 blocks, C[2,4) 2 blocks; one use each (the insert).
    h = {s: price(leaves[s].start * BS, leaves[s].end * BS) / leaves[s].num_blocks
         for s in range(3)}
    assert h[2] < h[0] < h[1]  # the per-block price grows with position
    assert [policy.priority(leaves[s]) for s in range(3)] == pytest.approx([h[0], h[1], h[2]])
    assert freed(cache.evict(1)) == [C]
    assert policy.clock == pytest.approx(h[2])  # the clock is the last victim's priority
    # C's history again (a hit on S, a new leaf): its priority starts from the clock.
    c2 = cache.insert(joined(S, C)).node
    assert policy.priority(c2) == pytest.approx(h[2] + h[2])
    assert policy.priority(leaves[0]) == pytest.approx(h[0])  # older nodes keep theirs
    assert freed(cache.evict(1)) == [A]  # h0 < h2 + h2 < h1
    assert policy.clock == pytest.approx(h[0])


def test_greedydual_counts_uses() -> None:
    policy, cache, _ = policy_setup("greedydual")
    leaves = three_sessions(cache)
    for _ in range(3):  # C's history is matched three times: four uses
        cache.match(joined(S, C))
    one = price(2 * BS, 4 * BS) / 2
    assert leaves[2].hit_count == 3
    assert policy.priority(leaves[2]) == pytest.approx(4 * one)
    assert freed(cache.evict(1)) == [A]


# ---------------------------------------------------------------------------- memdecay
def regions(*names: str) -> np.ndarray:
    return np.array([REGIONS.index(n) for n in names], dtype=np.uint8)


def test_memdecay_scores_regions_with_decay_and_pins_the_system_prefix() -> None:
    policy, cache, clock = policy_setup("memdecay", step_s=0.1)
    leaves = three_sessions(cache)
    sys2 = ("system", "tools")
    prompts = {0: regions(*sys2, "user", "user", "user", "user"),
               1: regions(*sys2, "assistant", "assistant", "assistant", "assistant",
                          "tool_result", "tool_result"),
               2: regions(*sys2, "user", "tool_result")}
    for s in range(3):
        arrival(policy, s, 0.0, joined(S, (A, B, C)[s]), prompts[s])
        reply(policy, s, leaves[s], 0.0 if s < 2 else 5.0)
    clock.t = 10.0
    hl = {r: getattr(policy, f"half_life_{r}") * 0.1 for r in REGIONS}
    base = {r: getattr(policy, f"base_{r}") for r in REGIONS}

    def w(r: str, age: float) -> float:
        return base[r] * 2 ** (-age / hl[r])

    want = {0: w("user", 10), 1: (4 * w("assistant", 10) + 2 * w("tool_result", 10)) / 6,
            2: (w("user", 5) + w("tool_result", 5)) / 2}
    assert [policy.score(leaves[s]) for s in range(3)] == pytest.approx(
        [want[0], want[1], want[2]])
    assert want[1] < want[0] < want[2]
    assert [freed(cache.evict(1)) for _ in range(3)] == [[B[:1]], [B[1:2]], [B[2:3]]]
    assert policy.pinned_until(leaves[0].parent) == math.inf  # S: system + tools only
    assert policy.pinned_until(leaves[0]) == -math.inf
    # The rest by score; C's chain would reach S once it is C's alone: S stays, pinned,
    # and goes last, under pressure only.
    assert freed(cache.evict(100)) == [B[3:], A, C, S]


def test_memdecay_without_regions_counts_unknown() -> None:
    policy, cache, clock = policy_setup("memdecay")
    leaves = three_sessions(cache)
    for s in range(3):
        arrival(policy, s, float(s), joined(S, (A, B, C)[s]))  # no regions in the trace
        reply(policy, s, leaves[s], float(s))
    clock.t = 3.0
    assert freed(cache.evict(1)) == [A[:1]]  # equal regions: the oldest use decays most


def test_memdecay_weight_follows_an_event_at_the_same_instant() -> None:
    """A score taken at t, then an arrival of the same session at t: the history is fresh
    (age 0), not the weight cached a moment before the event."""
    policy, cache, clock = policy_setup("memdecay")
    leaves = three_sessions(cache)
    for s in range(3):
        arrival(policy, s, 0.0, joined(S, (A, B, C)[s]))
        reply(policy, s, leaves[s], 0.0)
    clock.t = 3.0
    decayed = policy.score(leaves[0])
    assert decayed < policy.base_unknown
    arrival(policy, 0, 3.0, joined(S, A, [14]))
    assert policy.score(leaves[0]) == pytest.approx(policy.base_unknown)
    assert freed(cache.evict(1)) == [B[:1]]  # s1 and s2 (equal, older) before fresh s0


# ---------------------------------------------------------------------------- clairvoyant
def test_clairvoyant_belady_furthest_next_use_first_from_the_front() -> None:
    policy, cache, clock = policy_setup("clairvoyant", cost_aware=False)
    leaves = three_sessions(cache)
    reply(policy, 0, leaves[0], 0.0, gap_s=100.0)
    reply(policy, 1, leaves[1], 0.0, gap_s=5.0)
    reply(policy, 2, leaves[2], 0.0, gap_s=50.0)
    clock.t = 1.0
    # next uses: A at 100 s, C at 50 s, B at 5 s; each freed from its front, block by block
    assert freed(cache.evict(5)) == [A, C[:1]]
    arrival(policy, 2, 2.0, joined(S, C, [32]))  # C waits now: due, kept to the last ...
    reply(policy, 1, leaves[1], 2.0, gap="end")  # ... B ended: never used again, first
    assert policy.key(leaves[2])[0] == -2.0 and policy.key(leaves[1])[0] == -math.inf
    assert freed(cache.evict(2)) == [B[:2]]
    # S is shared by B and C: neither chain reaches it while both remain
    assert freed(cache.evict(5)) == [B[2:], C[1:]]


def test_clairvoyant_cost_aware_prices_the_next_block_per_second_of_wait() -> None:
    policy, cache, clock = policy_setup("clairvoyant")
    leaves = three_sessions(cache)
    reply(policy, 0, leaves[0], 0.0, gap_s=100.0)
    reply(policy, 1, leaves[1], 0.0, gap_s=90.0)
    reply(policy, 2, leaves[2], 0.0, gap="end")
    clock.t = 10.0
    one = price(2 * BS, 3 * BS)  # every history's front block sits at position 2
    assert policy.key(leaves[0])[0] == pytest.approx(one / 90)
    assert policy.key(leaves[1])[0] == pytest.approx(one / 80)
    assert policy.key(leaves[2])[0] == 0.0  # ended: never used again
    assert freed(cache.evict(3)) == [C, A[:1]]  # C first, then A (waits longer)
    # A's next block sits at position 3 now: 78,304 us / 90 s < B's 74,208 us / 80 s
    assert price(3 * BS, 4 * BS) / 90 < price(2 * BS, 3 * BS) / 80
    assert freed(cache.evict(1)) == [A[1:2]]
    # ... and at position 4: 82,400 / 90 < 74,208 / 80 still
    assert freed(cache.evict(2)) == [A[2:]]
    # B alone under S now: PRIVATE_HEAD's run would start at S, but S is every session's
    # (shared): the oracle keeps it and frees B's front
    assert freed(cache.evict(1)) == [B[:1]]
    assert policy.head_position(leaves[1]) == 3
