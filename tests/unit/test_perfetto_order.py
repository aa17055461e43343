"""The order `slicetrace convert` asks Perfetto for, decoded from its output: the root track's process_ordering,
each process's sibling_order_rank (communicators by their first op, each one's ranks together) and the field
numbers and wire types of track_descriptor.proto."""
from __future__ import annotations

import json

from slicetrace.analyze.perfetto import _File, convert, wire_fields
from slicetrace.analyze.perfetto_tracks import pids, places
from slicetrace.analyze.protobuf import pb_bytes, pb_int


def _rank(tmp_path, comm: int, rank: int, op_us: float | None, step_us: float = 50.0) -> str:
    """A rank's trace of communicator `comm`: one KernelStep, and one AllReduce at op_us (None: no op recorded)."""
    recs = [{"name": "KernelStep", "cat": "GPU", "ph": "X", "pid": rank, "tid": 5, "ts": step_us, "dur": 1.0,
             "args": {"Channel": 0, "IsSend": 1, "Peer": 1 - rank, "Step": 0, "Size": 8, "WaitGpuClk": 0,
                      "StartGpuClk": 0, "StopGpuClk": 1000, "CommHash": comm}}]
    if op_us is not None:
        op = {"SeqNum": 0, "CommHash": comm, "Rank": rank, "Count": 8, "Datatype": "float32", "Algorithm": "RING",
              "Protocol": "SIMPLE", "nChannels": 1}
        recs += [{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 1, "pid": rank, "ts": op_us, "args": op},
                 {"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 1, "pid": rank, "ts": op_us + 100.0}]
    path = tmp_path / f"t_{comm}_{rank}.json"
    path.write_text(json.dumps(recs))
    return str(path)


def _descriptors(path) -> list[bytes]:
    """Every TrackDescriptor's bytes, in file order."""
    out = []
    for _, pkt in wire_fields(path.read_bytes()):
        out += [v for f, v in wire_fields(pkt) if f == 60]
    return out


def _processes(path) -> list[tuple[int, int, str]]:
    """(sibling_order_rank, pid, name) of each process track, in that rank's order."""
    procs = []
    for td in _descriptors(path):
        d = dict(wire_fields(td))
        if 3 in d:
            pd = dict(wire_fields(d[3]))
            procs.append((d[12], pd[1], pd[6].decode()))
    return sorted(procs)


def _files(tmp_path, comms: dict[int, float | None], step_us: float = 50.0) -> list:
    """convert's view (_File) of ranks 1 and 0 of each communicator (hash -> its first op's µs, None: no op)."""
    out = []
    for comm, op_us in comms.items():
        for r in (1, 0):
            path = _rank(tmp_path, comm, r, None if op_us is None else op_us + r, step_us)
            out.append(_File(path, json.loads(open(path).read())))
    return out


def test_communicators_come_in_the_order_of_their_first_op_each_with_its_ranks_together(tmp_path):
    """Each process was ranked by its rank: two communicators' would interleave (rank 0 of both, then rank 1 of
    both), with one pid for the same rank of both. Communicator 9's first op comes before 5's, though its hash is
    larger; one without ops (--profile KernelStep) is placed by its first slice. (convert itself refuses files of
    two communicators without --all-comms, trace.load_files: this is the order its tracks are laid out in.)"""
    files = _files(tmp_path, {5: 30.0, 9: 20.0, 7: None}, step_us=25.0)
    place = places(files)
    got = sorted((p, f.comm, f.rank, pid) for p, f, pid in zip(place, files, pids(files, place)))
    assert got == [(0, "9", 0, 1), (1, "9", 1, 2), (2, "7", 0, 3), (3, "7", 1, 4), (4, "5", 0, 5), (5, "5", 1, 6)]


def test_one_communicators_ranks_come_in_rank_order_with_pid_rank_plus_one(tmp_path):
    files = _files(tmp_path, {5: 30.0})
    assert places(files) == [1, 0] and pids(files, places(files)) == [2, 1]
    out = tmp_path / "t.pftrace"
    convert([f.path for f in files], str(out))
    assert _processes(out) == [(0, 1, "rank 0 (comm 5)"), (1, 2, "rank 1 (comm 5)")]


def test_the_root_track_asks_for_explicit_process_order_with_perfettos_field_numbers_and_wire_types(tmp_path):
    """track_descriptor.proto: uint64 uuid = 1, ChildTracksOrdering child_ordering = 11, int32 sibling_order_rank
    = 12, ProcessOrdering process_ordering = 19 (PROCESS_ORDERING_EXPLICIT = 1; read on the root track, uuid 0):
    all varints (wire type 0). The root's descriptor comes first, before any process's."""
    out = tmp_path / "t.pftrace"
    convert([_rank(tmp_path, 5, r, op_us=30.0) for r in (0, 1)], str(out))
    tds = _descriptors(out)
    assert tds[0] == b"\x08\x00" + b"\x98\x01\x01"    # key 1 << 3 | 0, uuid 0; key 19 << 3 | 0 (152 as a varint), 1
    assert sum(1 for td in tds if dict(wire_fields(td))[1] == 0) == 1
    ints = set()
    for td in tds:
        fields = wire_fields(td)
        # re-encoded with every number a varint, the bytes are the same: no number was written as fixed64
        assert b"".join(pb_int(f, v) if isinstance(v, int) else pb_bytes(f, v) for f, v in fields) == td
        ints |= {f for f, v in fields if isinstance(v, int)}
    assert ints == {1, 5, 11, 12, 19}              # uuid, parent_uuid, child_ordering, sibling_order_rank, process_ord.
