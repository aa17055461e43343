"""Several communicators in one analysis (analyze/comms.py, --all-comms): failures matched to unfinished ops by
communicator, a communicator with nothing to analyse among others, and the time-overlap guard's grouping."""
from __future__ import annotations

import json
import math

import numpy as np

from slicetrace.analyze.comms import CommFacts, apart
from slicetrace.analyze.trace import KERNEL_CH_TABLE, coll_spans, failures, load_trace
from slicetrace.analyze.verdicts import unfinished
from slicetrace.cli.main import main
from tests.unit.test_trace_analyze import _COLL_ARGS, _run_files


def _failure(comm):
    return {"rank": 0, "ts_ns": 5, "name": "PeerError: rank 1 exited", "error": "PeerError",
            "message": "rank 1 exited", "op": "AllReduce", "seq": 3, "comm": comm}


def test_a_failure_is_quoted_under_its_own_communicators_unfinished_op_only():
    """Two communicators' AllReduce #3 both unfinished on rank 0: the failure rank 0's trace of comm 222 holds
    was quoted under both (matched by op and seq); a failure of unknown communicator still matches by op and seq."""
    spans = [(0, "AllReduce", 3, 100, -1, "111"), (1, "AllReduce", 3, 100, 200, "111"),
             (0, "AllReduce", 3, 150, -1, "222"), (1, "AllReduce", 3, 150, 250, "222")]
    chs = np.array([(1, 0, 3, "AllReduce", 100, 200)], KERNEL_CH_TABLE)
    rows = unfinished(spans, chs, [0, 1], failures=[_failure("222")])
    assert [(r["seq"], r["ranks"], [f["rank"] for f in r["failures"]]) for r in rows] == [(3, [0], []),
                                                                                          (3, [0], [0])]
    rows = unfinished(spans, chs, [0, 1], failures=[_failure(None)])
    assert [len(r["failures"]) for r in rows] == [1, 1]


def test_failures_and_coll_spans_carry_their_files_communicator(tmp_path):
    _run_files(tmp_path, 111)
    path = tmp_path / "trace_111_0.json"
    recs = json.loads(path.read_text())
    recs.append({"name": "PeerError: x", "cat": "ERROR", "ph": "i", "s": "p", "pid": 0, "ts": 8.0,
                 "args": {"Error": "PeerError", "Message": "x", "Op": "AllReduce", "SeqNum": 0}})
    path.write_text(json.dumps(recs))
    recs = load_trace(str(path))
    assert [f["comm"] for f in failures(recs)] == ["111"]
    assert [s[5] for s in coll_spans(recs)] == ["111"]


def test_report_all_comms_says_why_a_communicator_has_nothing_and_reports_the_others(tmp_path, capsys):
    """A 1-rank communicator (tensor-parallel of 1) moves no data: its section says so, the others are reported;
    an error (exit 2) only when no communicator has anything to analyse."""
    _run_files(tmp_path, 111)
    solo = [{"name": "slicetrace_comm", "ph": "M", "pid": 0, "tid": 0,
             "args": {"Rank": 0, "nRanks": 1, "CommHash": 333, "commName": "tp", "EventMask": 65606}},
            {"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 1, "pid": 0, "ts": 1.0,
             "args": {**_COLL_ARGS, "CommHash": 333}},
            {"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 1, "pid": 0, "ts": 4.0}]
    (tmp_path / "trace_333_0.json").write_text(json.dumps(solo))
    js = str(tmp_path / "r.json")
    assert main(["report", str(tmp_path), "--all-comms", "--json", js]) == 0
    out = capsys.readouterr().out
    assert "## commHash 111: ranks 0, 1 of 2\n" in out
    assert ("## commHash 333 (tp): ranks 0 of 1\n# nothing to report: " + str(tmp_path) + " (commHash 333): a "
            "1-rank run moves no data between ranks") in out
    got = json.loads(open(js).read())
    assert list(got) == ["111", "333"] and "links" in got["111"]["report"]
    assert got["333"]["name"] == "tp" and got["333"]["ranks"] == [0] and "1-rank run" in got["333"]["error"]
    assert main(["report", str(tmp_path / "trace_333"), "--all-comms"]) == 2
    assert "a 1-rank run moves no data" in capsys.readouterr().err


def _facts(comm, lo, hi):
    return CommFacts(comm, None, lo, lo, hi)


def test_the_guard_groups_communicators_whose_times_overlap_chained():
    """a overlaps b, b overlaps c: one group though a and c never meet; d after all of them is a second group; a
    communicator without a timed record is in none."""
    got = apart([_facts("d", 40, 50), _facts("c", 15, 30), _facts("a", 0, 10), _facts("b", 5, 20),
                 _facts("e", math.inf, -math.inf)])
    assert [[f.comm for f in g] for g in got] == [["a", "b", "c"], ["d"]]
    assert len(apart([_facts("a", 0, 10), _facts("b", 10, 20)])) == 1       # touching: one job's phases
