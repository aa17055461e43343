"""`slicetrace convert`'s tracks as Perfetto reads them (track_descriptor.proto): processes in rank order, a rank's
tracks in channel order, and pids that fit ProcessDescriptor's int32."""
from __future__ import annotations

import json

import pytest

from slicetrace.analyze.perfetto import convert, wire_fields
from slicetrace.analyze.protobuf import track_descriptor


def _descriptors(path) -> dict[int, dict[int, object]]:
    """uuid -> the TrackDescriptor's fields (process: its ProcessDescriptor's fields)."""
    out = {}
    for _, pkt in wire_fields(path.read_bytes()):
        p = dict(wire_fields(pkt))
        if 60 in p:
            d = dict(wire_fields(p[60]))
            if 3 in d:
                d[3] = dict(wire_fields(d[3]))
            out[d[1]] = d
    return out


def _rank_file(tmp_path, rank: int, names: dict[int, str], slices: list[tuple[int, float, float]]) -> str:
    """A rank's trace: thread names by tid, X slices (tid, ts µs, dur µs) and one op (an async b/e pair)."""
    recs = [{"name": "thread_name", "ph": "M", "pid": rank, "tid": t, "args": {"name": n}} for t, n in names.items()]
    recs += [{"name": "copy", "cat": "GPU", "ph": "X", "pid": rank, "tid": t, "ts": ts, "dur": dur}
             for t, ts, dur in slices]
    op = {"SeqNum": 0, "CommHash": 7, "Rank": rank, "Count": 8, "Datatype": "float32", "Algorithm": "RING",
          "Protocol": "SIMPLE", "nChannels": 1}
    recs += [{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 1, "pid": rank, "tid": 1, "ts": 0.0, "args": op},
             {"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 1, "pid": rank, "tid": 1, "ts": 9.0}]
    path = tmp_path / f"t_7_{rank}.json"
    path.write_text(json.dumps(recs))
    return str(path)


def test_ranks_and_their_channels_are_ordered_as_numbers(tmp_path):
    """The lanes were children of the process track, whose children Perfetto orders as it likes (it ignores
    child_ordering there), and processes went by activity: ch 10 sorted before ch 2 by name, rank 1 could come
    first. Now each process carries its rank as sibling_order_rank, and a track of each rank's own
    orders its tracks explicitly: operations, then channel by channel, a track's extra lanes after it."""
    names = {5: "ch 10 send->0", 6: "ch 2 send->0", 7: "ch 2 recv<-0"}
    slices = [(5, 1.0, 2.0), (5, 1.5, 2.0), (6, 1.0, 1.0), (7, 2.0, 1.0)]       # tid 5's two overlap: a lane more
    out = tmp_path / "t.pftrace"
    got = convert([_rank_file(tmp_path, r, names, slices) for r in (1, 0)], str(out))     # rank 1's file first
    assert got["tracks"] == 2 * 5
    ds = _descriptors(out)
    assert ds[0] == {1: 0, 19: 1}       # the root track: process_ordering EXPLICIT, nothing a row is drawn for
    procs = {u: d for u, d in ds.items() if 3 in d}
    assert sorted((d[3][6], d[3][1], d[12]) for d in procs.values()) == [
        (b"rank 0 (comm 7)", 1, 0), (b"rank 1 (comm 7)", 2, 1)]     # name, pid = rank + 1, sibling_order_rank
    groups = {u: d for u, d in ds.items() if d.get(5) in procs}
    assert {(d[2], d[11]) for d in groups.values()} == {(b"rank 0", 3), (b"rank 1", 3)}     # EXPLICIT children
    for g in groups:
        lanes = sorted((d[12], d[2].decode()) for d in ds.values() if d.get(5) == g)
        assert lanes == list(enumerate(["operations", "ch 2 recv<-0", "ch 2 send->0", "ch 10 send->0",
                                        "ch 10 send->0 #1"]))


def test_a_rank_past_int32_less_one_gets_a_pid_that_fits(tmp_path):
    """ProcessDescriptor.pid is int32: rank 2**31 - 1 (the largest the records accept) was written as pid 2**31,
    which Perfetto reads as -2**31. Ranks that large take their place in rank order as the pid instead (their
    sibling_order_rank is their place too)."""
    out = tmp_path / "t.pftrace"
    convert([_rank_file(tmp_path, r, {5: "ch 0 send->0"}, [(5, 1.0, 1.0)]) for r in (2 ** 31 - 1, 3)], str(out),
            partial=True)         # a run of 2**31 ranks by its files' names, two of them given
    procs = sorted((d[12], d[3][1], d[3][6].decode()) for d in _descriptors(out).values() if 3 in d)
    assert procs == [(0, 1, "rank 3 (comm 7)"), (1, 2, "rank 2147483647 (comm 7)")]


@pytest.mark.parametrize("kw", [{"process": (2 ** 31, "p")}, {"process": (0, "p")}, {"order_rank": -1},
                                {"order_rank": 2 ** 31}])
def test_a_descriptor_refuses_an_int32_field_past_its_range(kw):
    with pytest.raises(ValueError, match=r"outside \d\.\.2147483647 \(int32\)"):
        track_descriptor(9, "x", **kw)


def test_a_file_of_several_ranks_is_refused_not_drawn_as_its_first(tmp_path):
    """Ranks merged into one file were all drawn on the first record's rank: rank 1's slices on rank 0's tracks."""
    from slicetrace.errors import TraceFormatError
    path = tmp_path / "m_3_0.json"
    path.write_text(json.dumps([{"name": "a", "cat": "x", "ph": "X", "pid": p, "tid": 1, "ts": 1.0 + p, "dur": 1.0}
                                for p in (0, 1, 1, 2)]))
    out = tmp_path / "m.pftrace"
    with pytest.raises(TraceFormatError, match=r"m_3_0\.json' holds records of 3 ranks \(pid 0, then 1, 2\): convert "
                                               r"takes one file per rank"):
        convert([str(path)], str(out))
    assert not out.exists()


def test_a_ranks_losses_are_in_its_process_name(tmp_path):
    """Perfetto shows no record's args until one is clicked, and the loss counters are in none it draws: a rank
    whose ring overran looked as whole as the others. Its process is now named with what it lost."""
    files = [_rank_file(tmp_path, r, {5: "ch 0 send->0"}, [(5, 1.0, 1.0)]) for r in (0, 1)]
    for f, c in zip(files, ({"overrun": 0, "delivered_coll": 1}, {"overrun": 12, "plugin_dropped_COLL": 2,
                                                                 "delivered_coll": 1})):
        recs = json.loads(open(f).read())
        recs.append({"name": "slicetrace_counters", "ph": "M", "pid": recs[0]["pid"], "tid": 0, "args": c})
        open(f, "w").write(json.dumps(recs))
    out = tmp_path / "t.pftrace"
    convert(files, str(out), partial=True)
    procs = sorted((d[3][1], d[3][6].decode()) for d in _descriptors(out).values() if 3 in d)
    assert procs == [(1, "rank 0 (comm 7)"), (2, "rank 1 (comm 7) lost: overrun 12, plugin_dropped_COLL 2")]
