"""The inspector plugin on real 2-rank cpu runs, beside the example plugin: NCCL Inspector's lines, their sizes,
bandwidths and sequence numbers, exec times equal to the same run's KernelCh spans in the Chrome trace, interval
sampling, verbose kernel events, a mask without KernelCh, and two communicators sharing a process's file."""
from __future__ import annotations

import glob
import os
import socket

import numpy as np
import pytest

from slicetrace.analyze.records import read_records
from slicetrace.plan.traffic import busbw_factor
from tests.helpers.inspector import check_keys, flatten, read_lines, read_log
from tests.helpers.procs import RankPool

KW = dict(buffsize=1 << 16, nchannels=2, timeout_s=30.0)
N = 60_000                  # elements of x: float32, 240,000 B
OP_OF = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
         "Broadcast": "broadcast", "Reduce": "reduce"}
SIZES = {"AllReduce": N * 4, "AllGather": 2 * N * 4, "ReduceScatter": N * 4, "Broadcast": N * 4, "Reduce": N * 4}


@pytest.fixture(scope="module")
def pool2():
    p = RankPool(2, timeout=240)
    yield p
    p.close()


def _comm(ctx, name, **kw):
    import slicetrace
    return slicetrace.init(rank=ctx["rank"], world_size=ctx["world"], store=ctx["store"],
                           job=f"{ctx['job']}-{name}", **{**KW, **kw})


def _ops(c, r):
    x = np.full(N, r + 1, np.float32)
    for _ in range(3):
        c.all_reduce(x)
    c.all_gather(x)
    c.reduce_scatter(x)
    c.broadcast(x, root=1)
    c.reduce(x, root=0)
    with c.group():                     # point-to-point: not in Inspector's output
        c.send(x, (r + 1) % 2)
        c.recv(np.empty_like(x), (r - 1) % 2)
    c.all_reduce(x[:0])                 # a count of 0: no channel program, timed by its Coll


def _run(ctx, name, kw, limit=None):
    """_ops on a communicator of their own, closed; (comm hash, pid, the inspector's counters at close)."""
    c = _comm(ctx, name, **kw)
    lp = next(s.lp for s in c._session.host._slots if s.lp.name == "inspector")
    try:
        if limit is None:
            _ops(c, ctx["rank"])
        else:
            with c.profiling(True, mask=limit):
                _ops(c, ctx["rank"])
    finally:
        c.close()
    return c.comm_hash, os.getpid(), lp.plugin.counters(lp.ctx)


def _by_rank(folder, runs):
    """Each rank's lines, from its process's file <hostname>-pid<pid>.log."""
    return [read_log(os.path.join(str(folder), f"{socket.gethostname()}-pid{pid}.log")) for _, pid, _ in runs]


def _kernel_spans(trace):
    """(func, SeqNum) -> ns from the first KernelCh start to the last stop of that Coll, from a Chrome trace."""
    recs = read_records(trace)
    colls = {r["id"]: (r["name"], r["args"]["SeqNum"]) for r in recs if r.get("cat") == "COLL" and r["ph"] == "b"}
    begin = {r["id"]: (r["args"]["ParentId"], r["ts"]) for r in recs if r.get("name") == "KernelCh" and r["ph"] == "b"}
    spans: dict = {}
    for r in recs:
        if r.get("name") == "KernelCh" and r["ph"] == "e" and begin[r["id"]][0] in colls:     # not a P2p's
            parent, t0 = begin[r["id"]]
            lo, hi = spans.get(colls[parent], (t0, r["ts"]))
            spans[colls[parent]] = (min(lo, t0), max(hi, r["ts"]))
    return {k: round((hi - lo) * 1000) for k, (lo, hi) in spans.items()}


def test_a_line_per_collective_timed_as_the_trace_s_kernel_channels(pool2, tmp_path):
    runs = pool2.run(_run, "all", dict(profiler_plugin="example,inspector", profile_dump_file=str(tmp_path / "t"),
                                       inspector_dump_dir=str(tmp_path / "ins")))
    h = runs[0][0]
    assert sorted(os.listdir(tmp_path / "ins")) == sorted(f"{socket.gethostname()}-pid{pid}.log" for _, pid, _ in runs)
    for rank, lines in enumerate(_by_rank(tmp_path / "ins", runs)):
        spans = _kernel_spans(str(tmp_path / f"t_{h}_{rank}.json"))
        assert [ln["coll_perf"]["coll"] for ln in lines] == ["AllReduce"] * 3 + ["AllGather", "ReduceScatter",
                                                                                 "Broadcast", "Reduce", "AllReduce"]
        for ln in lines:
            check_keys(ln)
            perf, func = ln["coll_perf"], ln["coll_perf"]["coll"]
            assert ln["header"] == {"id": f"0x{h:x}", "rank": rank, "n_ranks": 2, "nnodes": 1}
            assert ln["metadata"]["pid"] == runs[rank][1]
            assert perf["coll_busbw_gbs"] == pytest.approx(perf["coll_algobw_gbs"] * busbw_factor(OP_OF[func], 2))
            if perf["coll_sn"] == 3:                                  # the count of 0: no kernel, no duration
                assert (perf["coll_msg_size_bytes"], perf["coll_timing_source"], perf["coll_exec_time_us"],
                        perf["coll_algobw_gbs"]) == (0, "collective_cpu", 0, 0.0)
                continue
            span = spans[func, perf["coll_sn"]]
            assert perf["coll_msg_size_bytes"] == SIZES[func] and perf["coll_timing_source"] == "kernel_cpu"
            assert perf["coll_exec_time_us"] == (span + 500) // 1000, (func, span)
            assert perf["coll_algobw_gbs"] == pytest.approx(SIZES[func] / span, rel=1e-6)
        assert [ln["coll_perf"]["coll_sn"] for ln in lines if ln["coll_perf"]["coll"] == "AllReduce"] == [0, 1, 2, 3]
        assert all(ln["coll_perf"]["coll_sn"] == 0 for ln in lines if ln["coll_perf"]["coll"] != "AllReduce")
    for _, _, c in runs:
        assert c == {"plugin_written_COLL": 8, "plugin_sampled_out_COLL": 0, "plugin_lost_COLL": 0,
                     "plugin_dropped_COLL": 0, "plugin_queued_COLL": 0, "plugin_unfinished_COLL": 0,
                     "plugin_unseen_COLL": 0}
    rows = flatten(tmp_path)                  # what the exporter reads: both ranks of each collective
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["id"], r["coll"], r["coll_sn"], r["coll_msg_size_bytes"]), []).append(r["comm_type"])
    assert len(groups) == 8 and all(v == ["nvlink-only"] * 2 for v in groups.values())


def test_an_interval_writes_at_most_a_line_per_interval_and_the_last_at_close(pool2, tmp_path):
    runs = pool2.run(_run, "iv", dict(profiler_plugin="inspector", inspector_dump_dir=str(tmp_path),
                                      inspector_dump_interval_us=3_600_000_000))   # an hour: the first, the last at close
    for lines, (_, _, c) in zip(_by_rank(tmp_path, runs), runs):
        assert [(ln["coll_perf"]["coll"], ln["coll_perf"]["coll_sn"]) for ln in lines] == [("AllReduce", 0),
                                                                                          ("AllReduce", 3)]
        assert c["plugin_written_COLL"] == 2 and c["plugin_sampled_out_COLL"] == 6


def test_verbose_lines_carry_each_channel_s_kernel_events(pool2, tmp_path):
    runs = pool2.run(_run, "vb", dict(profiler_plugin="inspector", inspector_dump_dir=str(tmp_path),
                                      inspector_verbose=True))
    for lines in _by_rank(tmp_path, runs):
        for ln in lines:
            check_keys(ln, verbose=True)
            sn, ts = ln["coll_perf"]["event_trace_sn"], ln["coll_perf"]["event_trace_ts"]
            want = [] if ln["coll_perf"]["coll_msg_size_bytes"] == 0 else [0, 1]
            assert sorted(k["channel_id"] for k in sn["kernel_events"]) == want
            if want:
                first = min(k["kernel_start_ts"] for k in ts["kernel_events"])
                last = max(k["kernel_stop_ts"] for k in ts["kernel_events"])
                assert abs(ln["coll_perf"]["coll_exec_time_us"] - (last - first)) <= 1
                assert all(sn["coll_start_sn"] < k["kernel_start_sn"] < k["kernel_record_sn"] < k["kernel_stop_sn"]
                           < sn["coll_stop_sn"] for k in sn["kernel_events"])


def test_ops_whose_mask_leaves_kernel_ch_out_are_timed_by_their_coll_events(pool2, tmp_path):
    runs = pool2.run(_run, "mk", dict(profiler_plugin="inspector", inspector_dump_dir=str(tmp_path)), "Coll|P2p")
    for lines in _by_rank(tmp_path, runs):
        assert len(lines) == 8 and {ln["coll_perf"]["coll_timing_source"] for ln in lines} == {"collective_cpu"}
        assert all(ln["coll_perf"]["coll_exec_time_us"] > 0 for ln in lines[:-1])
        assert lines[-1]["coll_perf"]["coll_exec_time_us"] == 0           # the count of 0


def _two(ctx, folder):
    a = _comm(ctx, "a", profiler_plugin="inspector", inspector_dump_dir=folder)
    b = _comm(ctx, "b", profiler_plugin="inspector", inspector_dump_dir=folder, nchannels=1)
    x = np.ones(1000, np.float32)
    for _ in range(2):
        a.all_reduce(x)
        b.all_gather(x)
    a.close()
    b.close()
    return a.comm_hash, b.comm_hash


def test_two_communicators_of_a_process_append_to_its_one_file(pool2, tmp_path):
    hashes = pool2.run(_two, str(tmp_path))[0]
    files = glob.glob(str(tmp_path / "*.log"))
    assert len(files) == 2                                  # one per rank process
    for f in files:
        lines = read_log(f)
        assert sorted((ln["header"]["id"], ln["coll_perf"]["coll"], ln["coll_perf"]["coll_sn"]) for ln in lines) == \
            sorted([(f"0x{hashes[0]:x}", "AllReduce", k) for k in (0, 1)] +
                   [(f"0x{hashes[1]:x}", "AllGather", k) for k in (0, 1)])
    assert len(read_lines(tmp_path)) == 8
