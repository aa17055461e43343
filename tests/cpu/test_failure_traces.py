"""A failed rank's trace says why it stopped: the example plugin's instant where the op raised, the process renamed
"failed: <Error>", `slicetrace report` quoting it (text and --json) and `slicetrace convert` keeping both."""
from __future__ import annotations

import glob
import json
import os
import re
import signal

import numpy as np
import pytest

import slicetrace
from slicetrace.analyze.perfetto import wire_fields as _fields
from slicetrace.analyze.trace import load_trace
from slicetrace.cli.main import main
from tests.cpu.test_faults import JOIN, _mismatch_later


def _one(fields, n):
    vals = [v for f, v in fields if f == n]
    assert len(vals) <= 1
    return vals[0] if vals else None


def _killed_at_50(comm):
    x = np.ones(1 << 16, np.float32)
    for i in range(100):
        if i == 50 and comm.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        comm.all_reduce(x, x)
    return "finished"


def _file(prefix: str, rank: int) -> str:
    (path,) = glob.glob(f"{prefix}_*_{rank}.json")
    return path


def _failure_and_name(path: str) -> tuple[list[dict], str]:
    """A rank's failure instants and its process's last name (a viewer's)."""
    recs = load_trace(path, validate=False)
    names = [r["args"]["name"] for r in recs if r.get("name") == "process_name"]
    return [r for r in recs if r.get("ph") == "i" and r.get("cat") == "ERROR"], names[-1]


def _converted(prefix: str, out: str) -> tuple[dict, list[dict]]:
    """convert's output: process track uuid -> its name, and the instants on process tracks (name, annotations);
    every event in time order, on the one sequence (a flow's end must follow its start)."""
    assert main(["convert", prefix, "-o", out]) == 0
    procs, instants, stamps = {}, [], []
    for _, pkt in _fields(open(out, "rb").read()):
        p = _fields(pkt)
        td, te = _one(p, 60), _one(p, 11)
        if td is not None:
            d = _fields(td)
            if _one(d, 3) is not None:
                procs[_one(d, 1)] = _one(_fields(_one(d, 3)), 6).decode()
            continue
        e = _fields(te)
        stamps.append((_one(p, 8), _one(p, 10)))
        if _one(e, 9) == 3 and _one(e, 11) in procs:          # TYPE_INSTANT on a process's own track
            ann = {}
            for f, v in e:
                if f == 4:
                    a = _fields(v)
                    ann[_one(a, 10).decode()] = _one(a, 4) if _one(a, 4) is not None else _one(a, 6).decode()
            instants.append({"proc": procs[_one(e, 11)], "name": _one(e, 23).decode(), "ts": _one(p, 8),
                             "cat": _one(e, 22).decode(), "args": ann})
    assert stamps == sorted(stamps) and {q for _, q in stamps} == {1}
    return procs, instants


def test_a_rank_whose_peer_died_says_so_in_its_trace_report_and_convert(tmp_path, capsys):
    prefix = str(tmp_path / "t")
    with pytest.raises(slicetrace.LaunchError, match="rank 1 died"):
        slicetrace.launch(_killed_at_50, 2, profiler_plugin="example", profile_dump_file=prefix, timeout_s=10,
                          join_timeout_s=JOIN)
    (inst,), name = _failure_and_name(_file(prefix, 0))
    seq = int(re.search(r"detected by rank 0 in AllReduce #(\d+) ", inst["name"]).group(1))
    assert inst["name"].startswith("PeerError: rank 1 (pid ") and inst["s"] == "p", inst
    assert inst["args"]["Error"] == "PeerError" and inst["args"]["Op"] == "AllReduce" and \
        inst["args"]["SeqNum"] == seq and inst["args"]["Message"] == inst["name"][len("PeerError: "):]
    assert re.fullmatch(r"rank 0 \(comm \d+\) failed: PeerError(; lost: .*)?", name), name
    assert _failure_and_name(_file(prefix, 1)) == ([], name.replace("rank 0", "rank 1").split(" failed")[0])

    out = tmp_path / "rep.json"
    assert main(["report", prefix, "--json", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert re.search(rf"unfinished: AllReduce #{seq} has no channel records on rank\(s\) 0\b.*; rank 0 raised "
                     rf"PeerError: rank 1 \(pid \d+\) exited; detected by rank 0 in AllReduce #{seq} ", text), text
    rep = json.loads(out.read_text())
    (row,) = [u for u in rep["unfinished"] if (u["func"], u["seq"]) == ("AllReduce", seq)]
    assert [(f["rank"], f["error"], f["message"]) for f in row["failures"]] == \
        [(0, "PeerError", inst["args"]["Message"])]
    assert [(f["rank"], f["op"], f["seq"]) for f in rep["failures"]] == [(0, "AllReduce", seq)]

    procs, instants = _converted(prefix, str(tmp_path / "run.pftrace"))
    assert sorted(procs.values()) == sorted([name, name.replace("rank 0", "rank 1").split(" failed")[0]])
    assert [(i["proc"], i["name"], i["cat"]) for i in instants] == [(name, inst["name"], "ERROR")]
    assert instants[0]["args"] == {"Error": "PeerError", "Message": inst["args"]["Message"], "Op": "AllReduce",
                                   "SeqNum": seq}
    assert instants[0]["ts"] == round(inst["ts"] * 1000)


def test_a_planted_mismatch_is_in_both_ranks_traces_report_and_convert(tmp_path, capsys):
    prefix = str(tmp_path / "t")
    with pytest.raises(slicetrace.LaunchError, match="MismatchError"):
        slicetrace.launch(_mismatch_later, 2, "dtype", profiler_plugin="example", profile_dump_file=prefix,
                          timeout_s=10, join_timeout_s=JOIN)
    names = {}
    for rank in (0, 1):
        (inst,), names[rank] = _failure_and_name(_file(prefix, rank))
        assert inst["name"].startswith("MismatchError: collective #2 differs across ranks: rank "), inst
        assert (inst["args"]["Op"], inst["args"]["SeqNum"]) == ("AllReduce", 1)     # the second all_reduce
        assert re.fullmatch(rf"rank {rank} \(comm \d+\) failed: MismatchError(; lost: .*)?", names[rank]), names

    out = tmp_path / "rep.json"
    assert main(["report", prefix, "--json", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for rank in (0, 1):         # on an unfinished line or one of its own, as the op's channel records came or not
        assert re.search(rf"rank {rank}( in AllReduce #1)? raised MismatchError: collective #2 differs across ranks: "
                         r"rank [01] runs all_reduce\(count=1000, dtype=\w+, op=max\) \[nchannels=1", text), text
    rep = json.loads(out.read_text())
    assert sorted((f["rank"], f["error"], f["op"], f["seq"]) for f in rep["failures"]) == \
        [(0, "MismatchError", "AllReduce", 1), (1, "MismatchError", "AllReduce", 1)]

    procs, instants = _converted(prefix, str(tmp_path / "run.pftrace"))
    assert sorted(procs.values()) == sorted(names.values())
    assert sorted((i["proc"], i["args"]["Error"], i["args"]["SeqNum"]) for i in instants) == \
        [(names[0], "MismatchError", 1), (names[1], "MismatchError", 1)]


def _mismatch_then_more(comm):
    """A mismatch in AllReduce #1, then two more ops on the aborted communicator ("aborted earlier")."""
    x = np.ones(1000, dtype=np.float32)
    comm.all_reduce(x, op="max")
    said = []
    for y in (x.view(np.int32) if comm.rank else x, x, x):
        try:
            comm.all_reduce(y, op="max")
        except slicetrace.MismatchError as e:
            said.append("communicator aborted earlier" in str(e))
    return said


def test_an_abort_said_again_to_a_later_op_is_not_credited_to_it(tmp_path):
    prefix = str(tmp_path / "t")
    said = slicetrace.launch(_mismatch_then_more, 2, profiler_plugin="example", profile_dump_file=prefix,
                             timeout_s=10, join_timeout_s=JOIN)
    assert said == [[False, True, True]] * 2
    recs = load_trace(_file(prefix, 0), validate=False)
    insts = [r["args"] for r in recs if r.get("ph") == "i" and r.get("cat") == "ERROR"]
    assert [(a["Error"], a.get("Op"), a.get("SeqNum")) for a in insts] == [
        ("MismatchError", "AllReduce", 1), ("MismatchError", None, None), ("MismatchError", None, None)], insts
