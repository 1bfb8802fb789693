"""Stateful test: context strategies (drop, drop+repos, splice, budget) over a RadixKVCache,
against a brute-force model of what every block's KV must be.

Three sessions share one universe of chained raw ids, so histories that drop differently
meet on the same content. Each turn extends (or cuts and extends) a session's prompt; the
session state (``sim.context.session``) makes its keys and edits, and ``tests.contextkit``
serves it as the engine does (arrival edit, match, plan, insert, finish edit). Evictions come
between turns. The model records, per key, what the KV under it was made from (raw id, the raw
ids it attended to, its position: ``contextkit.requirement``) and checks, every turn:

- the cache's invariants (debug recount after every operation), and a node once DROPPED
  stays DROPPED while in the tree (never refilled);
- KV a request reuses was made under its own history (never shared across drop histories);
- every key a computed block attends to is reused or computed in the same batch (dropped
  keys it still sees are restored), and no dropped block is ever reused (never attended
  from the cache);
- an edit moves KV only to keys whose history needs exactly that KV (a later drop does not
  change earlier blocks; repositioned and spliced blocks keep their content).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sim.context.prefill import prefill_ranges
from sim.context.session import SessionState
from sim.context.strategies import parse_context
from sim.kvcache import RadixKVCache, Tier
from sim.kvcache.versions import VersionSpace
from tests.chained import Universe
from tests.contextkit import requirement, room

TOOL, ASST = 4, 3
CAPACITY = 20
SESSIONS = 3


class EditMachine(RuleBasedStateMachine):
    strategy = "drop:1"
    policy = "sglang"

    @initialize()
    def setup(self) -> None:
        self.u = Universe()
        self.region: dict[int, int] = {}
        self.cache = RadixKVCache(CAPACITY, self.policy, debug=True, versioned=True,
                                  block_size=1)
        space = VersionSpace()
        st_ = parse_context(self.strategy)
        self.states = [SessionState(st_, space, 1, k) for k in range(SESSIONS)]
        self.prompts: list[list[int]] = [[] for _ in range(SESSIONS)]
        self.prov: dict[int, tuple] = {}
        self.dropped_serials: set[int] = set()
        self.rid = 0

    # --- model checks -------------------------------------------------------------------
    def moved(self, state, view, after: bool) -> None:
        """Apply the view's edit and carry the model's provenance to the new keys."""
        old, new, dest = view.edit
        had = {int(k): self.prov.get(int(k)) for k in old}
        res = self.cache.edit(old, new, dest, view.rotates)
        if not res.applied:
            return
        for i, d in enumerate(dest.tolist()):
            if d < 0 or int(new[d]) < 0 or int(new[d]) == int(old[i]):
                continue
            before = had.get(int(old[i]))
            need = requirement(state, view, d, after)
            if before is not None:
                if state.st.drops:  # a drop never changes what earlier blocks attended to
                    assert before[:2] == need[:2], (before, need)
                else:  # a splice keeps the raw content (Leyline: corrected == re-prefilled)
                    assert before[0] == need[0]
                self.prov[int(new[d])] = need

    def serve(self, s: int, view) -> None:
        state, cache = self.states[s], self.cache
        if view.edit is not None and not view.edit_on_finish:
            self.moved(state, view, after=True)
        m = cache.match(view.ids)
        cache.lock(m.node)
        n = len(view.ids)
        usable = view.prompt_tokens - 1
        ranges, _, _, _ = prefill_ranges(view, m.segments, usable, view.prompt_tokens, 1)
        computed = {p for a, b in ranges for p in range(a, b) if p < n}
        reused = {p for a, b, t in m.segments for p in range(a, min(b, usable))
                  if t == Tier.GPU}
        assert not reused & computed
        for p in reused:  # never shared across histories, never a dropped block
            key = int(view.ids[p])
            assert key >= 0, f"a dropped block reused at {p}"
            assert key in self.prov, f"KV without provenance at {p}"
            assert self.prov[key] == requirement(state, view, p, after=False), (
                p, self.prov[key], requirement(state, view, p, after=False))
        for p in computed | set(range(usable, n)):  # what a computed block attends to
            raw_seen = set(requirement(state, view, p, after=False)[1])
            for j in range(p):
                if int(view.finish_raw_ids[j]) in raw_seen:
                    assert j in reused or j in computed, f"block {p} attends {j}: no KV"
        for p in range(min(n, usable)):  # (the last token is always computed: the output)
            if int(view.ids[p]) < 0 and p in computed:  # restored: someone needs it
                assert any(int(view.finish_raw_ids[p]) in
                           requirement(state, view, q, after=False)[1]
                           for q in computed if q > p), f"dropped block {p} computed"
        if not room(cache, int(np.count_nonzero(view.ids >= 0))):
            cache.unlock(m.node)
            return
        cache.insert(view.ids)
        for p in computed:
            if int(view.ids[p]) >= 0:
                self.prov[int(view.ids[p])] = requirement(state, view, p, after=False)
        cache.unlock(m.node)
        if view.edit is not None and view.edit_on_finish:
            self.moved(state, view, after=True)
        if room(cache, int(np.count_nonzero(view.finish >= 0))):
            cache.insert(view.finish)

    # --- rules --------------------------------------------------------------------------
    @rule(data=st.data(), s=st.integers(0, SESSIONS - 1))
    def turn(self, data, s: int) -> None:
        prev = self.prompts[s]
        if prev and data.draw(st.integers(0, 4)) == 0:  # a non-append transition
            prev = prev[: data.draw(st.integers(0, len(prev)))]
        choices = prev + data.draw(st.lists(st.sampled_from([0, 0, 1, 2]), min_size=1,
                                            max_size=4))
        choices = choices[:12]
        self.prompts[s] = choices
        raw = self.u.prompt(choices)
        for b in raw.tolist():
            if b not in self.region:
                self.region[b] = data.draw(st.sampled_from([TOOL, TOOL, ASST]))
        reg = np.array([self.region[b] for b in raw.tolist()], np.uint8)
        views = self.states[s].turn(self.rid, raw, reg, raw, reg, len(raw), 1, 0)
        self.rid += 1
        for view in views:
            view.finish_raw_ids = self.raw_of(view)
            self.serve(s, view)

    def raw_of(self, view) -> np.ndarray:
        from sim.kvcache.versions import raw_of

        return raw_of(view.finish)

    @rule(k=st.integers(1, 8))
    def evict(self, k: int) -> None:
        self.cache.evict(k)

    @invariant()
    def dropped_stays_dropped(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check()
        for node in self.cache.iter_nodes():
            if node.serial in self.dropped_serials:
                assert node.tier is Tier.DROPPED, f"a DROPPED node got KV: {node!r}"
            if node.tier is Tier.DROPPED:
                self.dropped_serials.add(node.serial)


SETTINGS = settings(max_examples=60, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
CASES = [(s, p) for s in ("drop:1", "drop:1+repos", "splice:1", "budget:3")
         for p in ("sglang", "penelope")]


@pytest.mark.parametrize(("strategy", "policy"), CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_context_edits_match_the_model(strategy: str, policy: str) -> None:
    machine = type(f"Edit_{strategy}_{policy}", (EditMachine,),
                   {"strategy": strategy, "policy": policy})
    machine.TestCase.settings = SETTINGS
    machine.TestCase().runTest()
