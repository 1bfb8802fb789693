"""Bad input: a message naming file, record and field, exit status 2; --lenient skips."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli.main import cli
from tests import tracefixtures as F
from traces import TraceFormatError, load_trace

S = F.make_sessions(seed=3, n_sessions=2)
CC = [F.cc_session_doc(s) for s in S]
MC = F.mooncake_records(S)
TL = F.tracelab_records(S)
FI = F.freeinference_sessions(S)


def _cc(tmp: Path, mutate) -> Path:
    d = tmp / "cc"
    d.mkdir()
    docs = copy.deepcopy(CC)
    text = mutate(docs)
    for i, doc in enumerate(docs):
        (d / f"trace_{i:04d}.json").write_text(text if (text is not None and i == 1)
                                               else json.dumps(doc))
    return d


def _set(doc_i, req_i, field, value):
    def mutate(docs):
        if value is _DEL:
            del docs[doc_i]["requests"][req_i][field]
        else:
            docs[doc_i]["requests"][req_i][field] = value
    return mutate


_DEL = object()

CC_CASES = {
    "malformed": (lambda docs: '{"id": "x", "requests": [', "trace_0001.json", ": malformed",
                  "malformed JSON"),
    "missing": (_set(1, 2, "in", _DEL), "trace_0001.json", "record requests[2]", "'in': missing"),
    "mistyped": (_set(0, 1, "out", "many"), "trace_0000.json", "record requests[1]",
                 "'out': expected a number"),
    "negative": (_set(0, 3, "in", -64), "trace_0000.json", "record requests[3]",
                 "non-negative integer"),
    "nan": (_set(0, 1, "out", float("nan")), "trace_0000.json", "record requests[1]",
            "finite number"),
    "fraction": (_set(0, 1, "out", 2.5), "trace_0000.json", "record requests[1]",
                 "non-negative integer"),
    "hash_count": (_set(1, 1, "hash_ids", list(range(3))), "trace_0001.json",
                   "record requests[1]", "'hash_ids': 3 ids for"),
    "hash_type": (_set(1, 1, "hash_ids", "abc"), "trace_0001.json", "record requests[1]",
                  "'hash_ids': expected a list of integers"),
    "backwards": (_set(0, 4, "t", 1.0), "trace_0000.json", "record requests[4]",
                  "'t': time goes backwards"),
    "not_object": (lambda docs: "[1, 2]", "trace_0001.json", "record session", "JSON object"),
    "sub_bad": (lambda docs: docs[0]["requests"][2].__setitem__("requests", [{"type": "n"}]),
                "trace_0000.json", "record requests[2].requests[0]", "'t': missing"),
}


@pytest.mark.parametrize("case", sorted(CC_CASES))
def test_cc_traces_bad_input(tmp_path, case):
    mutate, file, record, field = CC_CASES[case]
    d = _cc(tmp_path, mutate)
    with pytest.raises(TraceFormatError) as e:
        load_trace(str(d))
    msg = str(e.value)
    assert file in msg and record in msg and field in msg, msg
    assert e.value.exit_code == 2
    if "[" in record:
        assert msg.endswith("([i] counts from 0)"), msg
    # lenient: the bad record is skipped and counted; a file that is not JSON at all (the
    # malformed case) is counted as a skipped file
    t = load_trace(str(d), lenient=True)
    files = t.options["skipped_files"]
    assert (files, t.skipped) == ((1, 0) if case == "malformed" else (0, 1)) and len(t) > 0
    assert t.stats()["skipped"] == t.skipped


def test_empty_inputs(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "e.json").write_text("")
    (tmp_path / "e.jsonl").write_text("\n\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("hello")
    for p, fmt, msg in [("empty", None, "empty folder"), ("e.json", None, "empty file"),
                        ("e.jsonl", "mooncake", "empty file"), ("e.jsonl", "tracelab",
                                                                "empty file"),
                        ("other", "cc-traces", "empty folder"), ("missing", None, "no such")]:
        with pytest.raises(TraceFormatError, match=msg):
            load_trace(str(tmp_path / p), format=fmt)


def _jsonl(tmp: Path, name: str, rows: list) -> Path:
    p = tmp / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def _with(rows, i, **kw):
    rows = copy.deepcopy(rows)
    for k, v in kw.items():
        if v is _DEL:
            del rows[i][k]
        else:
            rows[i][k] = v
    return rows


@pytest.mark.parametrize("rows,record,field", [
    (_with(MC, 2, input_length=_DEL), "line 3", "'input_length': missing"),
    (_with(MC, 3, output_length=-1), "line 4", "non-negative"),
    (_with(MC, 4, hash_ids=[1, 2]), "line 5", "'hash_ids': 2 ids for"),
    # ids that are not integers, whichever JSON parser reads the line
    (_with(MC, 1, hash_ids=[*MC[1]["hash_ids"][:-1], 1.5]), "line 2", "list of integers"),
    (_with(MC, 1, hash_ids=[[1], *MC[1]["hash_ids"][1:]]), "line 2", "integers"),
    # numpy alone would read true as 1 and a fraction between integers as its floor
    (_with(MC, 1, hash_ids=[True, *MC[1]["hash_ids"][1:]]), "line 2", "integers (got bool)"),
    (_with(MC, 1, hash_ids=[*MC[1]["hash_ids"][:-1], False]), "line 2", "integers (got bool)"),
    (_with(MC, 1, hash_ids=[MC[1]["hash_ids"][0], 2.5, *MC[1]["hash_ids"][2:]]), "line 2",
     "integers (got float)"),
    (_with(MC, 1, hash_ids=[2**70, *MC[1]["hash_ids"][1:]]), "line 2", "integers"),
    (_with(MC, 5, timestamp=0), "line 6", "'timestamp': time goes backwards"),
    ([*MC[:2], "{not json", *MC[3:]], "line 3", "malformed JSON"),
])
def test_mooncake_bad_input(tmp_path, rows, record, field):
    p = _jsonl(tmp_path, "mc.jsonl", rows)
    with pytest.raises(TraceFormatError) as e:
        load_trace(str(p), format="mooncake")
    assert "mc.jsonl" in str(e.value) and record in str(e.value) and field in str(e.value)
    assert str(e.value).endswith("(lines count from 1)")
    t = load_trace(str(p), format="mooncake", lenient=True)
    assert t.skipped == 1 and len(t) == len(MC) - 1


@pytest.mark.parametrize("rows,record,field", [
    (_with(TL, 1, input_tokens_total="x"), "line 2", "'input_tokens_total'"),
    (_with(TL, 2, newly_append_tokens=5), "line 3", "'newly_append_tokens'"),
    (_with(TL, 2, prefix_tokens=10**9, newly_append_tokens=None), "line 3",
     "'prefix_tokens'"),
    (_with(TL, 3, timing_events=[{"event_type": "text", "timestamp": "yesterday"}]),
     "line 4", "'timing_events[0].timestamp'"),
    (_with(TL, 4, timing_events=[{"event_type": "tool_result",
                                  "timestamp": "2026-06-01T00:00:00.000Z"}]),
     "line 5", "'timing_events': time goes backwards"),
    (_with(TL, 0, session_id=7), "line 1", "'session_id'"),
])
def test_tracelab_bad_input(tmp_path, rows, record, field):
    p = _jsonl(tmp_path, "tl.jsonl", rows)
    with pytest.raises(TraceFormatError) as e:
        load_trace(str(p), format="tracelab")
    assert "tl.jsonl" in str(e.value) and record in str(e.value) and field in str(e.value)
    t = load_trace(str(p), format="tracelab", lenient=True)
    assert t.skipped == 1 and len(t) == len(TL) - 1


def _fi_with(path: str, value):
    docs = copy.deepcopy(FI)
    obj = docs
    keys = path.split("/")
    for k in keys[:-1]:
        obj = obj[int(k)] if k.isdigit() else obj[k]
    if value is _DEL:
        del obj[keys[-1]]
    else:
        obj[keys[-1]] = value
    return docs


@pytest.mark.parametrize("docs,record,field", [
    (_fi_with("0/requests/2/prompt_tokens", _DEL), "line 1.requests[2]",
     "'prompt_tokens': missing"),
    (_fi_with("1/requests/1/block_ids", [1, 2, 3]), "line 2.requests[1]",
     "'block_ids': 3 ids for"),
    (_fi_with("1/requests/3/start_ms", 5), "line 2.requests[3]",
     "'start_ms': time goes backwards"),
    (_fi_with("0/requests/1/tool_calls/0/subagent/requests/0/completion_tokens", -3),
     "line 1.requests[1].tool_calls[0].subagent.requests[0]", "'completion_tokens'"),
])
def test_freeinference_bad_input(tmp_path, docs, record, field):
    d = tmp_path / "fi"
    (d / "traces").mkdir(parents=True)
    _jsonl(d / "traces", "2026-06-01.jsonl", docs)
    with pytest.raises(TraceFormatError) as e:
        load_trace(str(d))
    msg = str(e.value)
    assert "2026-06-01.jsonl" in msg and record in msg and field in msg, msg
    t = load_trace(str(d), lenient=True)
    assert t.skipped == 1


def test_freeinference_parquet_bad_file(tmp_path):
    d = tmp_path / "fip"
    d.mkdir()
    (d / "requests.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(TraceFormatError, match=r"requests\.parquet: cannot read Parquet"):
        load_trace(str(d))


def test_cli_reports_bad_input_with_status_2(tmp_path):
    d = _cc(tmp_path, _set(0, 3, "in", -64))
    r = CliRunner().invoke(cli, ["trace", "stats", str(d), "--json"])
    assert r.exit_code == 2
    assert "kvsim: error:" in r.stderr and "record requests[3]" in r.stderr
    assert "Traceback" not in r.output + r.stderr
    r = CliRunner().invoke(cli, ["trace", "stats", str(d), "--json", "--lenient"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["skipped"] == 1
    for bad in (["--gaps", "cap:x"], ["--select", "top:3"], ["--shared-prefix", "lots"]):
        r = CliRunner().invoke(cli, ["trace", "stats", str(d), *bad])
        assert r.exit_code == 2, bad
    r = CliRunner().invoke(cli, ["trace", "stats", "synthetic:nope"])
    assert r.exit_code == 2 and "unknown synthetic trace" in r.stderr


def test_freeinference_parquet_mistyped_block_ids(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = F.write_freeinference_parquet(tmp_path / "fip", S)
    t = pq.read_table(d / "requests.parquet")
    # ids as strings: numeric ones are accepted, request 3's are not
    rows = [[str(x) for x in v] for v in t.column("block_ids").to_pylist()]
    rows[3] = [x + "x" for x in rows[3]]
    bad = pa.array(rows)
    t = t.set_column(t.column_names.index("block_ids"), "block_ids", bad)
    pq.write_table(t, d / "requests.parquet")
    with pytest.raises(TraceFormatError) as e:
        load_trace(str(d))
    assert "requests.parquet: row 3: field 'block_ids'" in str(e.value)
    assert str(e.value).endswith("(rows count from 0)")
    assert load_trace(str(d), lenient=True).skipped == 1
