"""check_trace on an op that ended unfinished: a channel whose program never ended has KernelSteps (the slices it
did move) and no KernelCh, while the op's other channels have theirs. Fine where the trace says the op did not
finish (its e record's UnfinishedKernelCh, an ERROR instant naming it, the flight record's Unfinished list); a
problem anywhere else. The traces are
what the example and flightrec plugins write, driven through the event host as the drain drives it."""
from __future__ import annotations

import time

import pytest

from slicetrace.analyze import check_trace
from slicetrace.analyze.records import read_records
from slicetrace.analyze.trace import UNFINISHED_KCH
from slicetrace.config import Settings
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, deliver
from slicetrace.sinks.chrome import ChromePlugin
from slicetrace.sinks.flightrec import FlightRecPlugin

COMM = abi.CommInfo(4343, "t", 1, 2, 0)
NO_KCH = "has no KernelCh on channel 0"


def _host(tmp_path):
    """A host with both plugins; the paths of their files (the example's, the flight record's)."""
    ex, fr = str(tmp_path / "ex"), str(tmp_path / "fr" / "rec")
    plugins = [LoadedPlugin(ChromePlugin(Settings(profile_dump_file=ex))),
               LoadedPlugin(FlightRecPlugin(Settings(flightrec_file=fr, flightrec_dump="always")))]
    return EventHost(plugins, COMM), [f"{p}_{COMM.comm_hash}_{COMM.rank}.json" for p in (ex, fr)]


def _source(funcs=("all_reduce",)):
    # starts 0.1 s ago: an op in flight at a flight record's dump ends at the dump's time, after its records
    return SyntheticSource(nranks=2, rank=0, nchannels=2, funcs=funcs, seed=3, t0_ns=time.monotonic_ns() - 10 ** 8)


def _cut(host, op, slices=3):
    """op's channel-1 programs whole, its channel-0 programs' first slices only and no KernelCh (never ended)."""
    for ch, recs, chrec in op.programs:
        host.steps(op.info.tag, recs[:slices] if ch == 0 else recs)
        if ch:
            host.channel(op.info.tag, chrec)


def _shape(path, name):
    """Of the op `name`'s last event: the channels of its KernelCh and of its KernelSteps."""
    recs = read_records(path)
    (op,) = [r["id"] for r in recs if r.get("name") == name and r["ph"] == "b"][-1:]
    chans = {r["args"]["Channel"] for r in recs if r.get("name") == "KernelCh" and r["ph"] == "b"
             and r["args"]["ParentId"] == op}
    steps = {r["args"]["Channel"] for r in recs if r.get("name") == "KernelStep" and r["args"]["ParentId"] == op}
    return chans, steps


def _two_whole_then_cut(host):
    """Two all_reduces delivered whole, then a third begun with channel 0's KernelCh never arriving (_cut): it."""
    src = _source()
    for op in src.ops(2, host.op_mask()):
        host.begin_op(op.info)
        deliver(host, op)
    (op,) = src.ops(1, host.op_mask())
    host.begin_op(op.info)
    _cut(host, op)
    return op


def test_a_failed_op_s_channel_that_never_ended_is_no_problem_in_either_plugin_s_trace(tmp_path):
    host, (ex, fr) = _host(tmp_path)
    _two_whole_then_cut(host)
    host.failed("PeerError", "rank 1 exited; detected by rank 0 in AllReduce #2", "AllReduce", 2)
    assert _shape(fr, "AllReduce") == ({1}, {0, 1})        # the flight record at once: the op still in flight
    assert check_trace(fr) == []
    host.close()                                            # the op ends without channel 0's KernelCh
    for path in (ex, fr):
        assert _shape(path, "AllReduce") == ({1}, {0, 1}), path
        assert check_trace(path) == [], path
        ends = [r.get("args") for r in read_records(path) if r.get("name") == "AllReduce" and r["ph"] == "e"]
        assert ends[-1] == {UNFINISHED_KCH: 1} and not any(ends[:-1]), path     # the flight record's replay too
    (u,) = [r["args"]["Unfinished"] for r in read_records(fr) if r.get("name") == "slicetrace_flightrec"][0]
    assert (u["Op"], u["SeqNum"], u["InFlight"]) == ("AllReduce", 2, False)


def test_a_p2p_op_the_flight_record_calls_unfinished_is_no_problem(tmp_path):
    """No failure: the op ended (close) without channel 0's KernelCh, and only the flight record names it (by
    function and peer: a P2p event has no SeqNum)."""
    host, (_, fr) = _host(tmp_path)
    (op,) = _source(("send_recv",)).ops(1, host.op_mask())
    host.begin_op(op.info)
    _cut(host, op)
    host.close()
    assert _shape(fr, "Send") == ({1}, {0, 1})
    w = [r["args"] for r in read_records(fr) if r.get("name") == "slicetrace_flightrec"][0]
    assert w["Trigger"] == "unfinished" and sorted((u["Op"], u["ToPeer"]) for u in w["Unfinished"]) == \
        [("Recv", 1), ("Send", 1)]
    assert check_trace(fr) == []


@pytest.mark.parametrize("failure", [None, ("AllReduce", 1), ("Broadcast", 2)])
def test_an_op_cut_short_without_an_error_of_its_own_is_no_problem_in_the_example_trace(tmp_path, failure):
    """The op ended (end_op) without channel 0's KernelCh and no ERROR names it (none, or another op's: another
    SeqNum, another function). The host's event_unfinished marks its e record, and the mark is what excuses it:
    the same records without it have a problem per slice of channel 0, as every such trace had before."""
    host, (ex, _) = _host(tmp_path)
    op = _two_whole_then_cut(host)
    if failure:
        host.failed("PeerError", "rank 1 exited", *failure)
    host.end_op(op.info.tag, op.end_ns)
    host.close()
    recs = read_records(ex)
    (counts,) = [r["args"] for r in recs if r.get("name") == "slicetrace_counters"]
    assert counts["missing_kernel_ch"] == 1
    ends = [r for r in recs if r.get("name") == "AllReduce" and r["ph"] == "e"]
    assert [e.get("args") for e in ends] == [None, None, {UNFINISHED_KCH: 1}]     # the whole ops: no args
    assert check_trace(ex) == []
    del ends[-1]["args"]
    problems = check_trace(recs)
    assert len(problems) == 3 and all(NO_KCH in p and "ch 0" in p for p in problems), problems


def test_a_failed_p2p_op_is_no_problem_in_the_example_trace(tmp_path):
    """Its ERROR names SendRecv and a SeqNum, which the Send and Recv records do not carry: before the mark,
    check_trace flagged channel 0's slices of both in the example trace."""
    host, (ex, fr) = _host(tmp_path)
    (op,) = _source(("send_recv",)).ops(1, host.op_mask())
    host.begin_op(op.info)
    _cut(host, op)
    host.failed("PeerError", "rank 1 exited; detected by rank 0 in SendRecv #0", "SendRecv", 0)
    host.close()
    for path in (ex, fr):
        ends = {r["name"]: r.get("args") for r in read_records(path) if r.get("cat") == "P2P" and r["ph"] == "e"}
        assert ends == {"Send": {UNFINISHED_KCH: 1}, "Recv": {UNFINISHED_KCH: 1}}, path
        assert _shape(path, "Send") == ({1}, {0, 1}) and check_trace(path) == [], path


def test_a_complete_op_missing_a_kernel_ch_is_still_flagged_beside_a_marked_one(tmp_path):
    """A KernelCh record gone after the host saw it (an edited trace, a plugin's bug): the op completed, so its e
    record has no mark, and the mark of the op cut short next to it excuses nothing of it."""
    host, (ex, _) = _host(tmp_path)
    whole, cut = _source().ops(2, host.op_mask())
    host.begin_op(whole.info)
    deliver(host, whole)
    host.begin_op(cut.info)
    _cut(host, cut)
    host.end_op(cut.info.tag, cut.end_ns)
    host.close()
    recs = read_records(ex)
    assert check_trace(recs) == []
    op = next(r["id"] for r in recs if r.get("name") == "AllReduce" and r["ph"] == "b")
    (kch,) = [r["id"] for r in recs if r.get("name") == "KernelCh" and r["ph"] == "b"
              and r["args"]["ParentId"] == op and r["args"]["Channel"] == 0]
    slices = sum(r.get("name") == "KernelStep" and r["args"]["ParentId"] == op and r["args"]["Channel"] == 0
                 for r in recs)
    problems = check_trace([r for r in recs if not (r.get("name") == "KernelCh" and r["id"] == kch)])
    assert slices and len(problems) == slices, problems
    assert all(f"its op {op} has no KernelCh on channel 0" in p for p in problems), problems


@pytest.mark.parametrize("mark", [0, -1, "2", True, None])
def test_a_mark_that_says_no_kernel_ch_is_missing_excuses_nothing(tmp_path, mark):
    host, (ex, _) = _host(tmp_path)
    (op,) = _source().ops(1, host.op_mask())
    host.begin_op(op.info)
    _cut(host, op)
    host.end_op(op.info.tag, op.end_ns)
    host.close()
    recs = read_records(ex)
    (end,) = [r for r in recs if r.get("name") == "AllReduce" and r["ph"] == "e"]
    end["args"][UNFINISHED_KCH] = mark
    problems = check_trace(recs)
    assert len(problems) == 3 and all(NO_KCH in p for p in problems), problems
