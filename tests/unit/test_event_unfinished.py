"""The host's explicit word that a Coll/P2p ended short of its KernelCh records (event_unfinished, slicetrace's
optional extension), and the flight recorder acting on it instead of diffing the host's missing_kernel_ch counter."""
from __future__ import annotations

import os
import time

from slicetrace.analyze.records import read_records
from slicetrace.config import Settings
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, deliver
from slicetrace.sinks.flightrec import FlightRecPlugin

T = abi.EventType
COMM = abi.CommInfo(4343, "t", 1, 2, 0)


def _source(seed: int) -> SyntheticSource:
    # begun 0.1 s ago: close ends ops in flight at the host's clock, which must not come before their start
    return SyntheticSource(nranks=2, rank=0, nchannels=2, seed=seed, t0_ns=time.monotonic_ns() - 10 ** 8)


class Listener:
    """A v8 plugin that takes Coll and KernelCh and logs each stop and each event_unfinished, in order."""
    version, name = 8, "listener"

    def __init__(self):
        self.calls: list[tuple] = []

    def init(self, comm, mask):
        mask.value = T.COLL | T.KERNEL_CH
        return self

    def start_event(self, ctx, descr):
        return ("coll", descr.seq_number) if isinstance(descr, abi.CollDescr) else ("other",)

    def stop_event(self, handle, ts_ns):
        if handle[0] == "coll":
            self.calls.append(("stop", handle[1]))

    def record_event_state(self, handle, state, args):
        pass

    def event_unfinished(self, handle, missing):
        self.calls.append(("unfinished", handle[1], missing))

    def finalize(self, ctx):
        pass


def test_a_plugin_is_told_before_the_stop_of_an_op_that_ended_without_its_kernel_ch_only():
    lis = Listener()
    host = EventHost([LoadedPlugin(lis)], COMM)
    src = _source(1)
    done, cut, short = src.next_op(host.op_mask()), src.next_op(host.op_mask()), src.next_op(host.op_mask())
    host.begin_op(done.info)
    deliver(host, done)                             # whole: no word
    host.begin_op(cut.info)
    host.end_op(cut.info.tag, cut.end_ns)           # neither KernelCh came
    host.begin_op(short.info)
    host.channel(short.info.tag, short.channels[:1])        # one of two
    host.close()
    assert lis.calls == [("stop", 0), ("unfinished", 1, 2), ("stop", 1), ("unfinished", 2, 1), ("stop", 2)]
    assert host.counters()["missing_kernel_ch"] == 3


def test_an_op_without_kernel_ch_records_stamped_is_not_unfinished():
    lis = Listener()
    host = EventHost([LoadedPlugin(lis)], COMM)
    (op,) = _source(2).ops(1, int(T.COLL))          # profiling(mask=Coll): no channel records are made
    host.begin_op(op.info)
    host.end_op(op.info.tag, op.end_ns)
    host.close()
    assert lis.calls == [("stop", 0)] and host.counters()["missing_kernel_ch"] == 0


def test_flightrec_does_not_blame_a_whole_op_for_an_unfinished_op_it_did_not_record(tmp_path):
    """Before: the recorder compared missing_kernel_ch before and after each op with fewer KernelCh than channels,
    so an op recorded without KernelCh (mask Coll|KernelStep) took the blame for an earlier op it never saw (mask
    KernelCh alone: no Coll event): a healthy-run dump, Trigger 'unfinished', naming the whole op."""
    prefix = str(tmp_path / "fr" / "rec")
    host = EventHost([LoadedPlugin(FlightRecPlugin(Settings(flightrec_file=prefix)))], COMM)
    src = _source(3)
    unseen = src.next_op(int(T.KERNEL_CH))
    host.begin_op(unseen.info)
    host.end_op(unseen.info.tag, unseen.end_ns)     # its KernelCh never came: counted, no Coll of the recorder's
    whole = src.next_op(int(T.COLL | T.KERNEL_STEP))
    host.begin_op(whole.info)
    deliver(host, whole)                            # every record: its KernelCh completed it (no plugin took them)
    host.close()
    assert host.counters()["missing_kernel_ch"] == 2
    assert not os.path.exists(tmp_path / "fr")      # nothing unfinished that it recorded: nothing written


def test_flightrec_marks_the_op_the_host_says_ended_short(tmp_path):
    prefix = str(tmp_path / "fr" / "rec")
    host = EventHost([LoadedPlugin(FlightRecPlugin(Settings(flightrec_file=prefix)))], COMM)
    src = _source(4)
    for _ in range(2):
        op = src.next_op(host.op_mask())
        host.begin_op(op.info)
        deliver(host, op)
    short = src.next_op(host.op_mask())
    host.begin_op(short.info)
    host.steps(short.info.tag, short.steps)
    host.channel(short.info.tag, short.channels[1:])        # channel 0's KernelCh lost
    host.end_op(short.info.tag, short.end_ns)
    host.close()
    (w,) = [r["args"] for r in read_records(f"{prefix}_{COMM.comm_hash}_0.json")
            if r.get("name") == "slicetrace_flightrec"]
    assert w["Trigger"] == "unfinished" and [(u["OpIndex"], u["SeqNum"]) for u in w["Unfinished"]] == [(3, 2)]


class Raises(Listener):
    def event_unfinished(self, handle, missing):
        raise RuntimeError("bug in the plugin")


def test_an_event_unfinished_that_raises_is_counted_and_the_stop_still_comes(caplog):
    lis = Raises()
    host = EventHost([LoadedPlugin(lis)], COMM)
    (op,) = _source(5).ops(1, host.op_mask())
    host.begin_op(op.info)
    host.end_op(op.info.tag, op.end_ns)
    host.close()
    assert lis.calls == [("stop", 0)] and host.counters()["plugin_error"] == 1
    assert "raised in event_unfinished" in caplog.text
