"""Continuum's pin decisions (policies.continuum) and TTL rules (policies.ttl_rule), by hand."""

from __future__ import annotations

import math

import pytest

from policies.continuum import ContinuumPins
from policies.ttl_rule import FIXED_THRESHOLD_S, fixed_threshold_tau


def pins(ttl: str = "learned", **kw) -> ContinuumPins:
    return ContinuumPins(ttl, lambda tokens: tokens / 1000, **kw)  # 1 s per 1000 tokens


def test_tool_call_pins_for_learned_tau_and_end_or_human_do_not():
    p = pins()
    p.arrived(0, 1, 0.0)
    p.admitted(0, 1)
    # cold start: B = T_q + C = 0 + 5 s, mu = 1: tau = ln 5
    assert p.finished(0, rid=1, now=10.0, next_gap="tool", context_tokens=5000,
                      queue_s=math.nan)
    assert p.pins[0].deadline == pytest.approx(10.0 + math.log(5.0))
    p.arrived(1, 2, 1.0)
    p.admitted(1, 2)
    assert not p.finished(1, rid=2, now=3.0, next_gap="human", context_tokens=5000,
                          queue_s=0.0)
    assert not p.finished(1, rid=3, now=4.0, next_gap="end", context_tokens=5000,
                          queue_s=0.0)
    # a history cheaper than the prior's mean is not worth holding: tau = 0
    p.arrived(2, 4, 2.0)
    p.admitted(2, 4)
    assert not p.finished(2, rid=4, now=5.0, next_gap="tool", context_tokens=500,
                          queue_s=0.0)
    assert p.taus == [pytest.approx(math.log(5.0)), 0.0]


def test_fixed_threshold_rule_follows_the_running_mean_duration():
    assert fixed_threshold_tau(math.nan) == FIXED_THRESHOLD_S
    assert fixed_threshold_tau(2.0) == FIXED_THRESHOLD_S
    assert fixed_threshold_tau(2.5) == 0.0
    p = pins("fixed")
    p.arrived(0, 1, 0.0)
    p.admitted(0, 1)
    assert p.finished(0, 1, 1.0, "tool", 100, math.nan)  # no duration yet: pin 2 s
    assert p.pins[0].deadline == 3.0
    p.arrived(0, 2, 6.0)  # a 5 s tool: after its deadline, the mean is 5 s
    assert p.expired(6.0) == [1]
    assert not p.finished(0, 2, 7.0, "tool", 100, 0.0)


def test_pin_ends_strictly_after_deadline_earliest_first_unless_next_turn_waits():
    p = pins(tau_s=2.0)
    for s in (0, 1, 2):
        p.arrived(s, 10 + s, 0.0)
        p.admitted(s, 10 + s)
    p.finished(0, 10, 1.0, "tool", 100, math.nan)  # deadline 3
    p.finished(1, 11, 0.5, "tool", 100, math.nan)  # deadline 2.5
    p.finished(2, 12, 0.8, "tool", 100, math.nan)  # deadline 2.8
    assert p.expired(2.5) == []  # strict: not at the deadline itself
    p.arrived(2, 13, 2.7)  # session 2's next turn arrives in time: held until admitted
    assert p.expired(10.0) == [11, 10]
    assert p.admitted(2, 13) == 12  # handed over to the admitted turn
    assert p.pin_counts == {"pins": 3, "handed_over": 1, "expired": 2, "pressure": 0,
                            "dropped": 0, "superseded": 0}


def test_pressure_unpins_the_latest_program_first_and_spares_the_keeper():
    p = pins(tau_s=5.0)
    for rid, s, now in ((1, 7, 0.0), (2, 3, 1.0), (3, 9, 2.0)):
        p.arrived(s, rid, now)
        p.admitted(s, rid)
    for rid, s in ((1, 7), (2, 3), (3, 9)):
        p.finished(s, rid, 3.0, "tool", 100, math.nan)
    assert p.victim(keep=9) == 2  # program 9 started last but is kept: then program 3
    assert p.victim() == 3
    assert p.victim() == 1
    assert p.victim() is None
    assert p.expired(100.0) == []


def test_returning_to_an_unpinned_history_feeds_the_queue_mean():
    p = pins(tau_s=0.0)  # never pins
    p.arrived(0, 1, 0.0)
    p.admitted(0, 1)
    p.finished(0, 1, 1.0, "tool", 100, math.nan)
    p.arrived(0, 2, 4.0)
    assert p.seen == 1 and p.grid.tolist() == [3.0]
    p.finished(0, 2, 9.0, "end", 100, queue_s=2.0)
    assert p.queue_s == pytest.approx(0.2)
    assert p.order_key(0, 5) == (0.0, 5)


def test_open_loop_one_pin_per_program_the_latest_finished_turn():
    # Turns 1 and 2 of program 0 run at once (the open loop): 1 finishes first and pins;
    # 2's finish ends that pin (superseded) before pinning its own longer history.
    p = pins(tau_s=2.0)
    p.arrived(0, 1, 0.0)
    p.admitted(0, 1)
    p.arrived(0, 2, 0.1)
    p.admitted(0, 2)
    assert p.superseded(0, 1) is None
    assert p.finished(0, 1, 1.0, "tool", 100, math.nan)
    assert p.superseded(0, 2) == 1  # the engine frees request 1 now
    assert p.finished(0, 2, 1.5, "tool", 100, math.nan)
    assert p.pins[0].rid == 2 and p.pins[0].deadline == 3.5
    assert p.expired(3.2) == []  # request 1's stale deadline (3.0) ends nothing
    # A stale finish (turn 3 finished before turn 2 of program 1) keeps the later pin and
    # pins, learns and counts nothing.
    p.arrived(1, 12, 0.0)
    p.arrived(1, 13, 0.1)
    p.admitted(1, 12)
    p.admitted(1, 13)
    assert p.finished(1, 13, 1.0, "tool", 100, math.nan)
    taus, turns = list(p.taus), dict(p.turns)
    assert p.superseded(1, 12) is None
    assert not p.finished(1, 12, 2.0, "end", 100, math.nan)
    assert p.pins[1].rid == 13 and p.taus == taus and p.turns == turns
    assert p.pin_counts == {"pins": 3, "handed_over": 0, "expired": 0, "pressure": 0,
                            "dropped": 0, "superseded": 1}


def test_a_pin_set_while_a_later_turn_waits_is_held_until_its_admission():
    p = pins(tau_s=2.0)
    p.arrived(0, 1, 0.0)
    p.admitted(0, 1)
    p.arrived(0, 2, 0.5)  # waits (the server is full)
    assert p.finished(0, 1, 1.0, "tool", 100, math.nan)
    assert p.pins[0].deadline == math.inf
    assert p.expired(100.0) == []
    assert p.admitted(0, 2) == 1
    # a dropped waiting turn ends the hold, and the program waits for nothing more
    p.arrived(0, 3, 101.0)
    p.admitted(0, 3)
    p.arrived(0, 4, 101.5)
    assert p.superseded(0, 3) is None and p.finished(0, 3, 102.0, "tool", 100, math.nan)
    assert p.dropped(0, 4) == 3
    assert p.waiting == {} and p.pins == {}


def test_finishing_over_a_pin_without_ending_it_is_an_error():
    # the protocol's guard is an exception, not an assert (python -O keeps it)
    p = pins(tau_s=2.0)
    p.arrived(0, 1, 0.0)
    p.admitted(0, 1)
    assert p.finished(0, 1, 1.0, "tool", 100, math.nan)
    with pytest.raises(RuntimeError, match="call superseded"):
        p.finished(0, 2, 1.5, "tool", 100, math.nan)


def test_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="unknown TTL rule"):
        ContinuumPins("adaptive", lambda t: 0.0)
