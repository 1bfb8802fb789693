"""sim/engines/recorder.py: RunRecorder keeps finished requests' records in compact columns; the
table it returns is the one a list of RequestRecord objects gave (same columns, dtypes, order and
values), and it holds no record object of a finished request."""

from __future__ import annotations

import dataclasses
import gc
import math
import weakref

import numpy as np
import pandas as pd
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.units import Units
from sim.engines.recorder import COLUMNS, RequestRecord, RunRecorder
from sim.engines.request import Req


class _StubPrompt:
    kind = "turn"
    skipped_tokens = restored_tokens = reprefill_tokens = rerotated_tokens = 0

    def recomputed_ranges(self, segments, ranges, ideal, bs):
        return [(0, 16)]

    def units(self, spec, a, b):
        return Units()


def _engine_req(rid: int, session: int, arrival: float) -> Req:
    return Req(rid=rid, session=session, arrival=arrival, seq=0, prompt_tokens=100 + rid,
               output_tokens=5, ids=np.zeros(0, np.int64), done=simpy.Environment().event(),
               prompt=_StubPrompt(), generated=3)  # type: ignore[arg-type]


def _recorder() -> RunRecorder:
    return RunRecorder(["a", "b"], [0, 10], [False, True], [0, 1])


def _by_objects(rec: RunRecorder) -> pd.DataFrame:
    """The table as a list of records gave it."""
    rows = [{k: getattr(r, k) for k in COLUMNS} for r in rec.records]
    df = pd.DataFrame(rows)
    return df.sort_values(["send_s", "request"], kind="stable").reset_index(drop=True)


def _record_run(rec: RunRecorder, n: int = 40, leave_open: int = 3) -> list:
    reqs = []
    for i in range(n):
        # ties in send time (reverse request order) check the stable sort
        r = _engine_req(rid=n - i if i % 3 else i, session=i % 2, arrival=float(i // 4))
        if i % 7 == 0:
            rec.drop(r, 1.0 + i, "context" if i % 2 else "cache")
            continue
        r.record = rec.open(r, 0.5 + i, reused=i, holes=0, ideal=16, recomputed=[],
                            recompute_units=0.0, segments=(), bs=16)
        rec.first_token(r, 1.0 + i)
        rec.tokens([r], 3, 1.5 + i, 2.0 + i, 0.1, 0.01)
        if i % 5 == 0:
            rec.retracted(r)
        reqs.append(r)
    for r in reqs[:-leave_open]:
        rec.close(r, 3.0 + r.rid)
    return reqs


def test_the_table_is_the_records_table():
    rec = _recorder()
    _record_run(rec)
    pd.testing.assert_frame_equal(rec.table(), _by_objects(rec))
    assert len(rec) == 40 and list(rec.table().columns) == list(COLUMNS)


@pytest.mark.pure_path("a compiled RequestRecord takes no weak reference: the Python path "
                       "shows the recorder drops a closed record")
def test_finished_records_are_not_held():
    rec = _recorder()
    reqs = _record_run(rec, leave_open=1)
    gone = weakref.ref(reqs[0].record)
    still = reqs[-1].record  # open: the engine still updates it through req.record
    for r in reqs:
        r.record = None
    del reqs
    gc.collect()
    assert gone() is None
    still.prefill_units += 2.5  # an open record's updates reach the table
    assert rec.table()["prefill_units"].max() == 2.5


@pytest.mark.pure_path("a compiled RequestRecord's int field refuses a float or a bool: "
                       "only the Python path can hold one")
@pytest.mark.parametrize("value, dtype", [(2.5, "float64"), (True, "object")])
def test_a_column_takes_the_dtype_pandas_infers(value, dtype):
    """An int field given a float (or a bool) in one record: the column is what pandas makes
    of the values, float64 (object), as a list of records gave."""
    rec = _recorder()
    reqs = _record_run(rec, leave_open=0)
    r = _engine_req(99, 0, 0.25)
    r.record = rec.open(r, 1.0, reused=0, holes=0, ideal=16, recomputed=[],
                        recompute_units=0.0, segments=(), bs=16)
    r.record.hole_tokens = value
    rec.close(r, 2.0)
    table = rec.table()
    assert str(table["hole_tokens"].dtype) == dtype
    pd.testing.assert_frame_equal(table, _by_objects(rec))
    assert len(reqs) > 0


@pytest.mark.pure_path("a compiled RequestRecord's int field refuses a float or a bool: "
                       "only the Python path can hold one")
@pytest.mark.parametrize("value", [2.5, True])
def test_merged_parts_join_as_pandas_joins_their_tables(value):
    """A fleet's requests are its replicas' merged (sim/fleet/results.py): where one part's
    column took another type's values, the joined column is what ``pd.concat`` of the parts'
    tables makes of it, rows in send order."""
    parts = [_recorder(), _recorder(), _recorder()]
    for k, part in enumerate(parts[:2]):
        _record_run(part, n=10 + 5 * k, leave_open=1)
    r = _engine_req(99, 0, 0.25)
    r.record = parts[1].open(r, 1.0, reused=0, holes=0, ideal=16, recomputed=[],
                             recompute_units=0.0, segments=(), bs=16)
    r.record.hole_tokens = value
    parts[1].close(r, 2.0)
    expect = pd.concat([p.table() for p in parts[:2]], ignore_index=True)
    expect = expect.sort_values(["send_s", "request"], kind="stable").reset_index(drop=True)
    pd.testing.assert_frame_equal(RunRecorder.merged(parts, _session_times()).table(), expect)


def test_absorb_joins_rows_in_order():
    a, b = _recorder(), _recorder()
    _record_run(a, n=20)
    _record_run(b, n=30, leave_open=2)
    expect = pd.concat([_by_objects(a), _by_objects(b)], ignore_index=True)
    expect = expect.sort_values(["send_s", "request"], kind="stable").reset_index(drop=True)
    a.absorb(b)
    pd.testing.assert_frame_equal(a.table(), expect)
    assert math.isfinite(a.table()["end_s"].iloc[0])


def _session_times() -> RunRecorder:
    """A fleet's own recorder: the replay times its sessions (sim/fleet/results.py)."""
    sessions = _recorder()
    sessions.session_started(0, 0.0)
    sessions.session_ended(0, 9.0)
    sessions.session_started(1, 2.0)
    sessions.session_ended(1, 5.5)
    return sessions


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 0, 5, 12]), min_size=1, max_size=5),
       home=st.lists(st.integers(0, 4), min_size=2, max_size=2))
def test_parts_summaries_and_merge_are_each_parts_own(sizes, home):
    """``RunRecorder.summaries``: each part's summary as it alone gives it after adopting its
    home sessions (an empty part's computed once and copied: no field differs), and
    ``RunRecorder.merged``: the parts absorbed one after another under the fleet's sessions
    (the table a fleet run's result is built from)."""
    sessions = _session_times()
    homes = [[s for s in (0, 1) if home[s] % len(sizes) == i] for i in range(len(sizes))]
    parts, alone = [], []
    for n in sizes:
        for copy in (parts, alone):
            copy.append(_recorder())
            if n:
                _record_run(copy[-1], n=n, leave_open=1)
    got = RunRecorder.summaries(parts, sessions, homes, 50.0, 16)
    for part, mine, s in zip(alone, homes, got, strict=True):
        part.adopt_sessions(sessions, mine)
        expect = {k: v for k, v in part.summary(50.0, 16).items()
                  if not isinstance(v, dict | list)}
        assert list(s) == list(expect)
        assert all(s[k] == v or (v != v and s[k] != s[k]) for k, v in expect.items())
    merged = RunRecorder.merged(parts, sessions)
    one = _recorder()
    for part in parts:
        one.absorb(part)
    pd.testing.assert_frame_equal(merged.table(), one.table())
    assert merged.counters == one.counters and merged.hist.tolist() == one.hist.tolist()
    assert (merged.session_start, merged.session_end) == (sessions.session_start,
                                                          sessions.session_end)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-10, 700_000), st.integers(-10, 300_000)), max_size=6))
def test_the_position_histogram_counts_each_position_in_its_bin(ranges) -> None:
    """Recomputed positions ``[a, a + n)`` land in 8K-token bins, the last one open: against
    the clipped-overlap model of every bin at once."""
    import numpy as np

    from sim.engines.recorder import HIST_BIN_TOKENS, HIST_BINS
    rec = _recorder()
    lo = np.arange(HIST_BINS, dtype=np.int64) * HIST_BIN_TOKENS
    hi = np.append(lo[1:], np.iinfo(np.int64).max)
    want = np.zeros(HIST_BINS, dtype=np.int64)
    for a, n in ranges:
        rec._histogram(max(a, 0), max(a, 0) + n)
        want += np.maximum(0, np.minimum(hi, max(a, 0) + n) - np.maximum(lo, max(a, 0)))
    assert rec.hist.tolist() == want.tolist()


def test_a_records_values_are_its_columns_in_order():
    """``RequestRecord.values`` (written out for the compiled core) is every field but ``row``,
    in the order of ``COLUMNS``: a field added to the record must be added there too."""
    rec = RequestRecord(request=7, session="s", session_index=1, turn=2, subagent=True,
                        send_s=0.5)
    for k, name in enumerate(COLUMNS):  # a distinct value per field, of the field's type
        kind = type(getattr(rec, name))
        setattr(rec, name, f"v{k}" if kind is str else bool(k % 2) if kind is bool
                else kind(k + 1))
    assert rec.values() == tuple(getattr(rec, name) for name in COLUMNS)
    assert [f.name for f in dataclasses.fields(RequestRecord)] == [*COLUMNS, "row"]
