"""The inspector plugin through the event host with synthetic ops: NCCL Inspector's line format, timing, interval
sampling, verbose fields, its variables, the exporter's flattening, and a disk that fills up."""
from __future__ import annotations

import errno
import glob
import logging
import os
import re
import socket
import threading

import pytest

from slicetrace.config import Settings, inspector_dir
from slicetrace.errors import ConfigError
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.loading import load_plugins
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, deliver
from slicetrace.sinks import inspector
from slicetrace.sinks.inspector import InspectorPlugin
from tests.helpers.inspector import check_keys, flatten, read_lines

COMM = abi.CommInfo(0xABC123, "t", 1, 4, 1)
def _run(tmp_path, n_ops=6, mask=None, **kw):
    """Synthetic all_reduce/send_recv ops through the host to the plugin; (plugin, host, ctx, the ops)."""
    p = InspectorPlugin(Settings(inspector_dump_dir=str(tmp_path / "ins"), **kw))
    host = EventHost([LoadedPlugin(p)], COMM)
    src = SyntheticSource(nranks=4, rank=1, nchannels=2, loops=2, funcs=("all_reduce", "send_recv"), seed=3)
    ops = list(src.ops(n_ops))
    for op in ops:
        op.info.mask = host.op_mask() if mask is None else mask
        host.begin_op(op.info)
        deliver(host, op, batch=3)
    return p, host, host.plugins[0].ctx, ops


def test_a_line_per_collective_in_inspector_s_format_timed_by_its_kernel_channels(tmp_path):
    p, host, ctx, ops = _run(tmp_path, n_ops=8)
    host.close()
    lines = read_lines(tmp_path / "ins")
    assert [os.path.basename(f) for f in glob.glob(str(tmp_path / "ins" / "*"))] == \
        [f"{socket.gethostname()}-pid{os.getpid()}.log"]
    colls = [op for op in ops if op.info.func == "all_reduce"]       # the send_recv ops are not in it
    assert len(lines) == len(colls) == 4 == p.counters(ctx)["plugin_written_COLL"]
    for line, op in zip(lines, colls):
        check_keys(line)
        perf = line["coll_perf"]
        span = int(op.channels["done_ns"].max() - op.channels["ready_ns"].min())   # first start to last stop
        size = op.info.tasks[0].count * 4
        assert line["header"] == {"id": "0xabc123", "rank": 1, "n_ranks": 4, "nnodes": 1}
        assert (perf["coll"], perf["coll_sn"], perf["coll_timing_source"]) == ("AllReduce", op.info.seq_number,
                                                                               "kernel_cpu")
        assert perf["coll_msg_size_bytes"] == size and perf["coll_exec_time_us"] == round(span / 1000)
        assert perf["coll_algobw_gbs"] == pytest.approx(size / span)
        assert perf["coll_busbw_gbs"] == pytest.approx(perf["coll_algobw_gbs"] * 2 * 3 / 4)
        assert line["metadata"]["pid"] == os.getpid() and line["metadata"]["hostname"] == socket.gethostname()
    assert [ln["coll_perf"]["coll_sn"] for ln in lines] == [0, 1, 2, 3]


def test_collectives_that_never_reached_the_plugin_are_counted_from_the_seq_gaps(tmp_path):
    p = InspectorPlugin(Settings(inspector_dump_dir=str(tmp_path / "ins")))
    host = EventHost([LoadedPlugin(p)], COMM)
    src = SyntheticSource(nranks=4, rank=1, nchannels=1, funcs=("all_reduce",), seed=3)
    for op in src.ops(7):
        if op.info.seq_number in (1, 2, 5):                 # run unprofiled: no events at all
            continue
        op.info.mask = host.op_mask()
        host.begin_op(op.info)
        deliver(host, op)
    ctx = host.plugins[0].ctx
    host.close()
    assert [ln["coll_perf"]["coll_sn"] for ln in read_lines(tmp_path / "ins")] == [0, 3, 4, 6]
    assert p.counters(ctx)["plugin_unseen_COLL"] == 3 and p.counters(ctx)["plugin_written_COLL"] == 4


def test_without_kernel_ch_the_collective_s_own_start_and_stop_time_it(tmp_path):
    p, host, ctx, _ = _run(tmp_path, n_ops=4, mask=int(abi.EventType.COLL | abi.EventType.P2P))
    host.close()
    lines = read_lines(tmp_path / "ins")
    assert len(lines) == 2 and {ln["coll_perf"]["coll_timing_source"] for ln in lines} == {"collective_cpu"}


def test_a_count_of_0_ran_no_kernel_and_reports_no_duration(tmp_path):
    """Before: a count of 0 was timed from its Coll start to the host's end of the op (2-3 ms on cpu), a slow
    collective in a dashboard though nothing moved. It says collective_cpu (no kernel timed it) with 0 us, as NCCL's
    Inspector has no time for it either; an op with data and no KernelCh keeps its Coll span."""
    p = InspectorPlugin(Settings(inspector_dump_dir=str(tmp_path / "ins"), inspector_verbose=True))
    ctx = p.init(COMM, abi.ActivationMask())
    for sn, count in enumerate((0, 1000)):
        h = p.start_event(ctx, abi.CollDescr(abi.EventType.COLL, ts_ns=1_000_000, seq_number=sn, func="AllReduce",
                                             count=count, datatype="ncclFloat32", n_channels=2))
        p.stop_event(h, 3_500_000)                      # the host's end of the op, 2.5 ms after its start
    p.finalize(ctx)
    zero, full = read_lines(tmp_path / "ins")
    for line in (zero, full):
        check_keys(line, verbose=True)
    perf = zero["coll_perf"]
    assert (perf["coll_msg_size_bytes"], perf["coll_exec_time_us"], perf["coll_timing_source"],
            perf["coll_algobw_gbs"], perf["coll_busbw_gbs"]) == (0, 0, "collective_cpu", 0.0, 0.0)
    assert zero["coll_perf"]["event_trace_ts"] == {"coll_start_ts": 1000, "coll_stop_ts": 3500, "kernel_events": []}
    perf = full["coll_perf"]
    assert (perf["coll_msg_size_bytes"], perf["coll_exec_time_us"], perf["coll_timing_source"]) == \
        (4000, 2500, "collective_cpu")
    assert perf["coll_algobw_gbs"] == pytest.approx(4000 / 2_500_000)


def test_verbose_adds_the_callbacks_order_and_times_per_channel(tmp_path):
    p, host, ctx, _ = _run(tmp_path, n_ops=2, inspector_verbose=True)
    host.close()
    (line,) = read_lines(tmp_path / "ins")
    check_keys(line, verbose=True)
    sn, ts = line["coll_perf"]["event_trace_sn"], line["coll_perf"]["event_trace_ts"]
    assert [k["channel_id"] for k in sn["kernel_events"]] == [k["channel_id"] for k in ts["kernel_events"]] == [0, 1]
    for k in sn["kernel_events"]:           # start, the KernelChStop record, stop: inside the Coll's start..stop
        assert sn["coll_start_sn"] < k["kernel_start_sn"] < k["kernel_record_sn"] < k["kernel_stop_sn"] \
            < sn["coll_stop_sn"]
    for k in ts["kernel_events"]:
        assert ts["coll_start_ts"] <= k["kernel_start_ts"] <= k["kernel_stop_ts"] == k["kernel_record_ts"] \
            <= ts["coll_stop_ts"]
    span = max(k["kernel_stop_ts"] for k in ts["kernel_events"]) - min(k["kernel_start_ts"] for k in ts["kernel_events"])
    assert abs(line["coll_perf"]["coll_exec_time_us"] - span) <= 1


def test_an_interval_writes_the_first_and_the_last_at_close_and_counts_the_rest(tmp_path):
    p, host, ctx, _ = _run(tmp_path, n_ops=12, inspector_dump_interval_us=3_600_000_000)    # an hour: one interval
    host.close()
    lines = read_lines(tmp_path / "ins")
    assert [ln["coll_perf"]["coll_sn"] for ln in lines] == [0, 5]         # the first, and the latest at close
    c = p.counters(ctx)
    assert c["plugin_written_COLL"] == 2 and c["plugin_sampled_out_COLL"] == 4 and c["plugin_lost_COLL"] == 0


def test_two_communicators_of_a_process_append_to_one_file_and_the_exporter_s_flattening_reads_it(tmp_path):
    s = Settings(inspector_dump_dir=str(tmp_path / "ins"))
    hosts = []
    for h, nodes in ((0x10, 1), (0x2F, 2)):
        host = EventHost([LoadedPlugin(InspectorPlugin(s))], abi.CommInfo(h, "c", nodes, 2, 0))
        src = SyntheticSource(nranks=2, rank=0, nchannels=1, loops=1, funcs=("all_reduce",), seed=1)
        for op in src.ops(3):
            op.info.mask = host.op_mask()
            host.begin_op(op.info)
            deliver(host, op)
        hosts.append(host)
    (tmp_path / "ins" / "sub").mkdir()
    with open(tmp_path / "ins" / "sub" / "other.log", "w") as f:     # a line without the three parts is skipped
        f.write('{"slicetrace": 1}\n')
    for host in hosts:
        host.close()
    assert len(glob.glob(str(tmp_path / "ins" / "*.log"))) == 1
    rows = flatten(tmp_path)
    assert sorted({(r["id"], r["comm_type"]) for r in rows}) == [("0x10", "nvlink-only"), ("0x2f", "hca-only")]
    assert len(rows) == 6 and all(r["coll"] == "AllReduce" and "dump_timestamp_us" in r for r in rows)
    groups: dict = {}                       # the exporter's groupby(id, coll_sn, size).coll_busbw_gbs.mean()
    for r in rows:
        groups.setdefault((r["id"], r["coll_sn"], r["coll_msg_size_bytes"]), []).append(r["coll_busbw_gbs"])
    assert len(groups) == 6


def _fills(fail_at):
    """_File.write that writes half of its `fail_at`-th call's bytes, then fails as a full disk."""
    calls = [0]

    def put(f, mv):
        calls[0] += 1
        if calls[0] == fail_at:
            os.write(f.fd, mv[:len(mv) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(f.fd, mv)
    return put


def test_a_full_disk_leaves_whole_lines_counts_the_rest_and_finalize_raises(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(inspector, "_BATCH", 2)            # a write per two lines
    monkeypatch.setattr(inspector._File, "write", _fills(2))
    p, host, ctx, _ = _run(tmp_path, n_ops=12)
    with pytest.raises(OSError) as e:
        p.finalize(ctx)
    msg = str(e.value)
    assert e.value.errno == errno.ENOSPC and ctx.file.path in msg and "4 line(s) of rank 1" in msg, msg
    assert "SLICETRACE_INSPECTOR_DUMP_DIR" in msg
    lines = read_lines(tmp_path / "ins")                   # whole lines only: the cut one is gone
    assert [ln["coll_perf"]["coll_sn"] for ln in lines] == [0, 1]
    c = p.counters(ctx)
    assert c["plugin_written_COLL"] == 2 and c["plugin_lost_COLL"] == 4
    with caplog.at_level(logging.ERROR, logger="slicetrace"):
        host.close()                                       # finalized already: nothing raised twice


def test_a_hung_filesystem_drops_and_counts_lines_past_the_bound_and_never_blocks(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(inspector, "_BATCH", 2)            # a write per two lines
    monkeypatch.setattr(inspector, "_QUEUED", 4, raising=False)     # the writer may be two writes behind
    hung, entered, put = threading.Event(), threading.Event(), inspector._File.write

    def stuck(f, mv):
        entered.set()
        assert hung.wait(30), "never released"
        return put(f, mv)
    monkeypatch.setattr(inspector._File, "write", stuck)
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        p, host, ctx, _ = _run(tmp_path, n_ops=16)         # 8 collectives: 4 writes of 2 lines, the first hangs
    assert entered.wait(30)
    c = p.counters(ctx)
    assert (c["plugin_dropped_COLL"], c["plugin_queued_COLL"], c["plugin_written_COLL"]) == (4, 4, 0), c
    assert sum("lines are dropped until it catches up (counted as plugin_dropped_COLL)" in r.getMessage()
               for r in caplog.records) == 1
    hung.set()
    with caplog.at_level(logging.WARNING, logger="slicetrace"):
        host.close()
    assert [ln["coll_perf"]["coll_sn"] for ln in read_lines(tmp_path / "ins")] == [0, 1, 2, 3]
    c = p.counters(ctx)
    assert (c["plugin_written_COLL"], c["plugin_dropped_COLL"], c["plugin_queued_COLL"],
            c["plugin_sampled_out_COLL"], c["plugin_lost_COLL"]) == (4, 4, 0, 0, 0), c
    assert any("plugin_dropped_COLL 4" in r.getMessage() for r in caplog.records)      # finalize's warning


def test_the_variables_are_checked_and_named(tmp_path):
    env = {"SLICETRACE_INSPECTOR_DUMP_INTERVAL_US": "500", "SLICETRACE_INSPECTOR_VERBOSE": "yes",
           "SLICETRACE_INSPECTOR_DUMP_DIR": str(tmp_path)}
    s = Settings.from_env(env)
    assert (s.inspector_dump_interval_us, s.inspector_verbose, s.inspector_dump_dir) == (500, True, str(tmp_path))
    for var, raw, said in (("SLICETRACE_INSPECTOR_DUMP_INTERVAL_US", "-1", "in 0..86400000000 microseconds"),
                           ("SLICETRACE_INSPECTOR_DUMP_INTERVAL_US", "1.5", "an integer, decimal or 0x hex"),
                           ("SLICETRACE_INSPECTOR_DUMP_INTERVAL_US", "86400000001", "in 0..86400000000"),
                           ("SLICETRACE_INSPECTOR_VERBOSE", "2", "one of 0/1/true/false")):
        with pytest.raises(ConfigError) as e:
            Settings.from_env({var: raw})
        assert f"{var}={raw!r}" in str(e.value) and said in str(e.value), str(e.value)
    for kw, said in (({"inspector_verbose": 1}, "a bool"), ({"inspector_dump_dir": "a\0b"}, "without a NUL byte"),
                     ({"inspector_dump_interval_us": True}, "an int (not a bool)")):
        with pytest.raises(ConfigError, match=re.escape(said)):
            Settings(**kw)


def test_the_default_folder_is_nccl_inspector_s(tmp_path):
    assert inspector_dir(Settings(), {"SLURM_JOBID": "812"}) == "nccl-inspector-812"
    assert inspector_dir(Settings(), {}) == "nccl-inspector-unknown-jobid"
    assert inspector_dir(Settings(inspector_dump_dir="x/y"), {"SLURM_JOBID": "812"}) == "x/y"


def test_a_folder_that_cannot_hold_the_file_is_refused_at_init(tmp_path):
    (tmp_path / "f").write_text("")
    for given, said in ((tmp_path / "f", "is not a folder"), (tmp_path / "f" / "sub", "cannot create")):
        (lp,) = load_plugins("inspector", Settings(inspector_dump_dir=str(given)))
        with pytest.raises(ConfigError) as e:
            lp.init(COMM, 0)
        assert str(e.value).startswith(f"inspector_dump_dir={str(given)!r}: ") and said in str(e.value)


def test_an_empty_folder_keyword_is_refused_and_an_empty_variable_is_unset(tmp_path):
    for given in ("", "  "):             # no folder: not NCCL's default one, made in the working directory unasked
        with pytest.raises(ConfigError) as e:
            Settings.from_env({}, inspector_dump_dir=given)
        assert str(e.value).startswith(f"inspector_dump_dir={given!r} must be a folder path") and \
            "not empty ('.': the working directory; None: NCCL's default" in str(e.value), str(e.value)
    s = Settings.from_env({"SLICETRACE_INSPECTOR_DUMP_DIR": "", "SLURM_JOBID": "7"})    # unset, as NCCL reads it
    assert s.inspector_dump_dir is None and inspector_dir(s, {"SLURM_JOBID": "7"}) == "nccl-inspector-7"
    assert inspector_dir(Settings(inspector_dump_dir="."), {}) == "."
