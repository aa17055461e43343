"""`slicetrace convert`: values Perfetto would misread, checked in the protobuf it writes (analyze/protobuf.py's
decoder; field numbers of perfetto_trace.proto)."""
from __future__ import annotations

import json

from slicetrace.analyze.perfetto import convert, wire_fields

_STEP = {"Channel": 0, "IsSend": 1, "Peer": 1, "Step": 0, "Size": 8, "WaitGpuClk": 0, "StartGpuClk": 0,
         "StopGpuClk": 2250}


def _events(path) -> list[tuple[int, dict]]:
    """Each TrackEvent packet's timestamp (field 8) and its TrackEvent's fields (repeated ones as lists)."""
    out = []
    for _, pkt in wire_fields(path.read_bytes()):
        p = dict(wire_fields(pkt))
        if 11 in p:
            te: dict = {}
            for f, v in wire_fields(p[11]):
                te.setdefault(f, []).append(v)
            out.append((p[8], te))
    return out


def _annotations(te: dict) -> dict[str, dict]:
    """A TrackEvent's debug annotations: name (field 10) -> {value field: value}."""
    out = {}
    for da in te.get(4, []):
        d = dict(wire_fields(da))
        out[d.pop(10).decode()] = d
    return out


def test_an_integer_arg_past_64_bits_is_written_as_its_digits(tmp_path):
    """A DebugAnnotation holds int64 (int_value, 4) or uint64 (uint_value, 3): 2**64 + 5 was written as 5, -2**63 - 1
    as 2**63 - 1 and 2**70 as 0. Such a value is written as a string (string_value, 6), its digits intact."""
    path = tmp_path / "t_1_0.json"
    recs = [{"name": "KernelStep", "cat": "GPU", "ph": "X", "pid": 0, "tid": 5, "ts": 1.0, "dur": 2.25,
             "args": {**_STEP, "Big": 2 ** 64 + 5}},        # the run's one shape of int args: the numpy rows
            {"name": "misc", "cat": "x", "ph": "X", "pid": 0, "tid": 6, "ts": 4.0, "dur": 1.0,
             "args": {"Neg": -2 ** 63 - 1, "Huge": 2 ** 70, "Low": -2 ** 63, "High": 2 ** 64 - 1, "Bool": True}}]
    path.write_text(json.dumps(recs))
    out = tmp_path / "t.pftrace"
    assert convert([str(path)], str(out))["slices"] == 2
    got = {}
    for _, te in _events(out):
        got.update(_annotations(te))
    assert got["Big"] == {6: str(2 ** 64 + 5).encode()}
    assert got["Neg"] == {6: str(-2 ** 63 - 1).encode()} and got["Huge"] == {6: str(2 ** 70).encode()}
    assert got["Low"] == {4: 2 ** 63} and got["High"] == {3: 2 ** 64 - 1}   # int64's least (as its varint), uint64's most
    assert got["Size"] == {4: 8} and got["Bool"] == {2: 1}


def test_a_trace_that_begins_before_zero_is_moved_after_it_whole(tmp_path, caplog):
    """TracePacket.timestamp is read as int64 ns and Perfetto drops every event before 0: a slice at -1.5 µs was
    written as 2**64 - 1500 (its begin dropped, its end then ending nothing). The whole trace moves later."""
    path = tmp_path / "t_1_0.json"
    recs = [{"name": "KernelStep", "cat": "GPU", "ph": "X", "pid": 0, "tid": 5, "ts": -1.5, "dur": 2.25,
             "args": _STEP},
            {"name": "phase", "cat": "x", "ph": "b", "id": 7, "pid": 0, "ts": -2.0},
            {"name": "phase", "cat": "x", "ph": "e", "id": 7, "pid": 0, "ts": 3.0},
            {"name": "misc", "cat": "x", "ph": "X", "pid": 0, "tid": 6, "ts": 3.0, "dur": 1.0}]
    path.write_text(json.dumps(recs))
    out = tmp_path / "t.pftrace"
    assert convert([str(path)], str(out))["slices"] == 3
    got = sorted((ts, te[9][0], te.get(23, [b""])[0].decode()) for ts, te in _events(out))
    assert got == [(0, 1, "phase"), (500, 1, "KernelStep"), (2750, 2, ""), (5000, 1, "misc"), (5000, 2, ""),
                   (6000, 2, "")]                         # (ns, 1 begin / 2 end, name): 2000 ns later
    assert "the trace begins at -2000 ns, before 0, where Perfetto drops events: every timestamp is written " \
           "2000 ns later" in caplog.text


def test_a_trace_spanning_more_than_int64_ns_is_refused(tmp_path):
    import pytest
    from slicetrace.errors import TraceFormatError
    path = tmp_path / "t_1_0.json"
    far = 5_000_000_000_000_000                                # µs either side of 0: 10**19 ns apart
    path.write_text(json.dumps([{"name": "a", "cat": "x", "ph": "X", "pid": 0, "tid": 1, "ts": t, "dur": 0}
                                for t in (-far, far)]))
    with pytest.raises(TraceFormatError, match=r"the trace's slices span -\d+ \.\. \d+ ns: a Perfetto trace's "
                                               r"timestamps are ns from 0 to 9223372036854775807"):
        convert([str(path)], str(tmp_path / "t.pftrace"))
    assert not (tmp_path / "t.pftrace").exists()


def test_a_timestamp_at_the_records_bound_converts_and_one_past_it_is_refused(tmp_path, capsys):
    """9223372036854775 µs was accepted, then read as a float and * 1000 rounded to 2**63 ns: convert died with a
    raw OverflowError. The bound is 1 µs lower, and a slice there is written below 2**63 ns."""
    from slicetrace.cli.main import main
    path = tmp_path / "t_1_0.json"
    for ts in (9_223_372_036_854_774, -9_223_372_036_854_774):
        path.write_text(json.dumps([{"name": "a", "cat": "x", "ph": "X", "pid": 0, "tid": 1, "ts": ts, "dur": 0}]))
        assert convert([str(path)], str(tmp_path / "t.pftrace"))["slices"] == 1
        assert all(0 <= t < 2 ** 63 for t, _ in _events(tmp_path / "t.pftrace"))
    path.write_text('[{"name":"a","cat":"x","ph":"X","pid":0,"tid":1,"ts":9223372036854775,"dur":0}]')
    assert main(["convert", str(path), "-o", str(tmp_path / "u.pftrace")]) == 2
    assert "record 0 (a): 'ts' is 9223372036854775: accepted -9223372036854774..9223372036854774 µs (its ns must " \
           "fit in int64)" in capsys.readouterr().err
