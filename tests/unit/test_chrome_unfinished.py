"""The example plugin's mark on a Coll/P2p that ended without some of its KernelCh (the host's event_unfinished):
args.UnfinishedKernelCh on its "e" record, and nothing on the ops that complete. Driven through the event host as
the drain drives it; report and convert read the marked file as any other."""
from __future__ import annotations

import time

from slicetrace.analyze import check_trace
from slicetrace.analyze.records import read_records
from slicetrace.analyze.trace import UNFINISHED_KCH as ANALYZE_NAME
from slicetrace.cli.main import main
from slicetrace.config import Settings
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, deliver
from slicetrace.sinks.chrome import ChromePlugin
from slicetrace.sinks.chrome_text import UNFINISHED_KCH

COMM = abi.CommInfo(5151, "t", 1, 2, 0)


def _run(prefix: str | None, funcs=("all_reduce",)) -> tuple[ChromePlugin, EventHost]:
    """Four ops: whole, none of its two KernelCh (end_op), one of two (close), whole."""
    plugin = ChromePlugin(Settings(profile_dump_file=prefix))
    host = EventHost([LoadedPlugin(plugin)], COMM)
    # begun 0.1 s ago: close ends the op in flight at the host's clock, which must not come before its start
    src = SyntheticSource(nranks=2, rank=0, nchannels=2, funcs=funcs, seed=7, t0_ns=time.monotonic_ns() - 10 ** 8)
    first, cut, short, last = src.ops(4, host.op_mask())
    host.begin_op(first.info)
    deliver(host, first)
    host.begin_op(cut.info)
    host.end_op(cut.info.tag, cut.end_ns)
    host.begin_op(short.info)
    host.steps(short.info.tag, short.steps)
    host.channel(short.info.tag, short.channels[:1])
    host.begin_op(last.info)            # the short op stays open: close ends it
    deliver(host, last)
    host.close()
    return plugin, host


def test_the_end_record_of_an_op_that_ended_short_says_how_many_kernel_ch_it_lacked(tmp_path):
    prefix = str(tmp_path / "ex")
    _, host = _run(prefix)
    recs = read_records(f"{prefix}_{COMM.comm_hash}_0.json")
    seq = {r["id"]: r["args"]["SeqNum"] for r in recs if r.get("cat") == "COLL" and r["ph"] == "b"}
    ends = {seq[r["id"]]: r.get("args") for r in recs if r.get("cat") == "COLL" and r["ph"] == "e"}
    assert ends == {0: None, 1: {UNFINISHED_KCH: 2}, 2: {UNFINISHED_KCH: 1}, 3: None}     # whole ops: no args
    assert host.counters()["missing_kernel_ch"] == 3
    assert check_trace(recs) == []
    assert UNFINISHED_KCH == ANALYZE_NAME            # the analyzer's copy (it may not import the sinks)


def test_p2p_ops_carry_the_mark_too(tmp_path):
    prefix = str(tmp_path / "ex")
    _run(prefix, ("send_recv",))
    recs = read_records(f"{prefix}_{COMM.comm_hash}_0.json")
    marks = sorted((r["id"], r["name"], (r.get("args") or {}).get(UNFINISHED_KCH)) for r in recs
                   if r.get("cat") == "P2P" and r["ph"] == "e")     # ids in start order
    assert [m[1:] for m in marks] == [("Send", None), ("Recv", None), ("Send", 2), ("Recv", 2),
                                      ("Send", 1), ("Recv", 2), ("Send", None), ("Recv", None)]
    assert check_trace(recs) == []


def test_without_a_dump_file_nothing_is_kept_for_the_mark():
    plugin, host = _run(None)
    (lp,) = host.plugins
    assert lp.ctx.unfinished == {} and plugin.counters(lp.ctx)["plugin_written_COLL"] == 4


def test_report_and_convert_read_a_marked_trace(tmp_path, capsys):
    _run(str(tmp_path / "ex"))
    assert main(["report", "--partial", str(tmp_path)]) == 0
    assert main(["convert", "--partial", str(tmp_path), "-o", str(tmp_path / "out.pftrace")]) == 0
    assert UNFINISHED_KCH.encode() in (tmp_path / "out.pftrace").read_bytes()    # the end's args join the slice
