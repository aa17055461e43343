"""sinks.flightrec: the last N ops kept in bounded memory, eviction counted, written only on a failure, an
unfinished op or DUMP=always, as the example plugin's trace with its window; report leaves evicted ops out."""
from __future__ import annotations

import os
import time

import pytest

from slicetrace.analyze import check_trace
from slicetrace.analyze.records import read_records
from slicetrace.analyze.report import build
from slicetrace.analyze.runtables import run_tables
from slicetrace.cli.main import main
from slicetrace.config import Settings
from slicetrace.errors import ConfigError
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.loading import load_plugins
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, deliver
from slicetrace.sinks.flightrec import FlightRecPlugin
from slicetrace.stamps.layout import FLAG_SEND

COMM = abi.CommInfo(4242, "t", 1, 2, 0)


def _host(tmp_path, comm=COMM, **kw):
    s = Settings(flightrec_file=str(tmp_path / "fr" / "rec"), **kw)
    return EventHost([LoadedPlugin(FlightRecPlugin(s))], comm), str(tmp_path / "fr" / f"rec_{comm.comm_hash}_"
                                                                      f"{comm.rank}.json")


def _ops(host, n, rank=0, seed=1):
    """n synthetic ring all-reduces of a 2-rank communicator; each op's KernelStep and KernelCh counts."""
    src = SyntheticSource(nranks=2, rank=rank, nchannels=2, seed=seed)
    out = []
    for op in src.ops(n, host.op_mask()):
        host.begin_op(op.info)
        deliver(host, op)
        out.append((len(op.steps), len(op.channels)))
    return out


def _window(recs):
    (w,) = [r["args"] for r in recs if r.get("name") == "slicetrace_flightrec"]
    return w


def test_always_writes_the_last_n_ops_with_their_records_and_counts_what_went(tmp_path):
    host, path = _host(tmp_path, flightrec_ops=4, flightrec_dump="always")
    counts = _ops(host, 10)
    host.close()
    assert check_trace(path) == []
    recs = read_records(path)
    colls = [r for r in recs if r.get("cat") == "COLL" and r["ph"] == "b"]
    assert [r["args"]["SeqNum"] for r in colls] == [6, 7, 8, 9]
    assert sum(r.get("name") == "KernelStep" for r in recs) == sum(k for k, _ in counts[6:])
    assert sum(r.get("name") == "KernelCh" and r["ph"] == "b" for r in recs) == sum(c for _, c in counts[6:])
    w = _window(recs)
    assert (w["Trigger"], w["FirstOp"], w["LastOp"], w["OpsSeen"]) == ("always", 7, 10, 10)
    assert w["FirstSeqNum"] == {"AllReduce": 6} and w["LastSeqNum"] == {"AllReduce": 9}
    assert (w["OpsKept"], w["OpsEvicted"], w["OpsInFlight"], w["Unfinished"]) == (4, 6, 0, [])
    assert w["RecordsEvicted"] == sum(k + c for k, c in counts[:6])
    assert w["RecordsKept"] == sum(k + c for k, c in counts[6:])


def test_a_healthy_run_writes_nothing_by_default(tmp_path):
    host, path = _host(tmp_path)
    _ops(host, 5)
    host.close()
    assert not os.path.exists(os.path.dirname(path))     # not even its folder


def test_past_the_record_cap_the_oldest_ops_go_first(tmp_path):
    host, path = _host(tmp_path, flightrec_ops=100, flightrec_max_records=150, flightrec_dump="always")
    counts = _ops(host, 12)
    host.close()
    w = _window(read_records(path))
    per_op = [k + c for k, c in counts]
    assert w["RecordsKept"] <= 150 < w["RecordsKept"] + per_op[-1 - w["OpsKept"]]     # no older op would fit
    assert w["OpsKept"] + w["OpsEvicted"] == 12 and w["LastOp"] == 12
    assert w["RecordsKept"] + w["RecordsEvicted"] == sum(per_op)


def test_a_lone_op_past_the_cap_loses_its_oldest_kernel_steps_counted(tmp_path):
    host, path = _host(tmp_path, flightrec_max_records=10, flightrec_dump="always")
    (op,) = SyntheticSource(nranks=2, rank=0, nchannels=1, loops=4, seed=3).ops(1, host.op_mask())
    host.begin_op(op.info)
    deliver(host, op, batch=4)
    host.close()
    recs = read_records(path)
    w = _window(recs)
    kept = sum(r.get("name") == "KernelStep" for r in recs)
    assert w["RecordsKept"] == kept + 1 <= 10        # the KernelCh and the newest KernelSteps
    assert w["RecordsEvicted"] == len(op.steps) - kept and w["OpsEvicted"] == 0
    steps = sorted(r["args"]["Step"] for r in recs if r.get("name") == "KernelStep")
    assert steps[-1] == int(op.steps["step"].max())


def test_a_lone_batch_bigger_than_the_cap_keeps_its_newest_kernel_steps(tmp_path):
    host, path = _host(tmp_path, flightrec_max_records=10, flightrec_dump="always")
    (op,) = SyntheticSource(nranks=2, rank=0, nchannels=1, loops=4, seed=3).ops(1, host.op_mask())
    host.begin_op(op.info)
    deliver(host, op)                               # every KernelStep in one batch, 3x the cap
    host.close()
    recs = read_records(path)
    w = _window(recs)
    steps = [r for r in recs if r.get("name") == "KernelStep"]
    assert w["RecordsKept"] == len(steps) + 1 == 10 and w["RecordsEvicted"] == len(op.steps) - len(steps)
    newest = op.steps[-len(steps):]                 # the batch's last rows, not none of them
    assert sorted((r["args"]["Channel"], r["args"]["Step"], r["args"]["IsSend"]) for r in steps) == sorted(
        zip(newest["channel"].tolist(), newest["step"].tolist(), ((newest["flags"] & FLAG_SEND) != 0).tolist()))


def _recent(seed: int) -> SyntheticSource:
    """An op begun 0.1 s ago: close ends ops in flight at the host's clock, so a fixed start (10**12 ns) came after
    it on a machine up for less than 17 minutes (the device machine: 'ends before it begins')."""
    return SyntheticSource(nranks=2, rank=0, nchannels=1, seed=seed, t0_ns=time.monotonic_ns() - 10 ** 8)


def test_a_failure_writes_at_once_with_the_op_in_flight_and_the_stalled_connections(tmp_path):
    host, path = _host(tmp_path, flightrec_ops=3)
    _ops(host, 5)
    (op,) = _recent(seed=4).ops(1, host.op_mask())
    host.begin_op(op.info)
    host.steps(op.info.tag, op.steps[:3])          # three slices moved, then a peer died
    host.failed("PeerError", "rank 1 exited; detected by rank 0 in AllReduce #5", "AllReduce", 5)
    assert check_trace(path) == []                 # written before close
    recs = read_records(path)
    (err,) = [r for r in recs if r.get("cat") == "ERROR"]
    assert err["args"]["Error"] == "PeerError" and err["args"]["SeqNum"] == 5
    w = _window(recs)
    assert (w["Trigger"], w["OpsKept"], w["OpsInFlight"]) == ("failure", 4, 1)
    (u,) = w["Unfinished"]
    assert (u["Op"], u["SeqNum"], u["InFlight"]) == ("AllReduce", 0, True)
    first = op.steps[:3]
    snd = (first["flags"] & FLAG_SEND) != 0
    want = {}
    for ch, s, p, step in zip(first["channel"].tolist(), snd.tolist(), first["peer"].tolist(), first["step"].tolist()):
        want[(ch, int(s), p)] = max(want.get((ch, int(s), p), 0), step)
    assert {(c["Channel"], c["IsSend"], c["Peer"]): c["LastStep"] for c in u["Connections"]} == want
    host.close()                                   # the op ends without its KernelCh: unfinished, written again
    recs = read_records(path)
    w = _window(recs)
    assert check_trace(path) == [] and w["OpsInFlight"] == 0
    assert [(u["OpIndex"], u["InFlight"]) for u in w["Unfinished"]] == [(6, False)]
    names = [r["args"]["name"] for r in recs if r.get("name") == "process_name"]
    assert names[-1].endswith("failed: PeerError; lost: missing_kernel_ch 1")


def test_a_failed_write_at_the_failure_is_counted_and_a_good_one_at_close_replaces_it(tmp_path, caplog):
    host, path = _host(tmp_path)
    _ops(host, 3)
    folder = tmp_path / "fr"
    folder.write_text("")                       # the folder cannot be made when the failure writes
    host.failed("PeerError", "rank 1 exited", "AllReduce", 2)         # logged, not raised into the user's error
    assert "writing its trace (failure) failed" in caplog.text
    folder.unlink()
    caplog.clear()
    host.close()                                # written now, with the failure: finalize has nothing to raise
    assert "failed in finalize" not in caplog.text
    recs = read_records(path)
    w = _window(recs)
    assert (w["Trigger"], w["WritesFailed"], w["OpsKept"]) == ("failure", 1, 3) and check_trace(path) == []
    assert [r["args"]["Error"] for r in recs if r.get("cat") == "ERROR"] == ["PeerError"]


def test_failures_past_n_keep_the_first_and_the_latest(tmp_path):
    host, path = _host(tmp_path, flightrec_ops=3)
    for k in range(6):
        host.failed("CommTimeoutError", f"wait {k} timed out")
    host.close()
    errs = [r["args"]["Message"] for r in read_records(path) if r.get("cat") == "ERROR"]
    assert errs == ["wait 0 timed out", "wait 4 timed out", "wait 5 timed out"]


def test_an_op_unfinished_at_close_is_written_without_a_failure(tmp_path):
    host, path = _host(tmp_path)
    _ops(host, 2)
    (op,) = _recent(seed=5).ops(1, host.op_mask())
    host.begin_op(op.info)
    host.steps(op.info.tag, op.steps[:2])
    host.close()
    w = _window(read_records(path))
    assert w["Trigger"] == "unfinished" and [u["OpIndex"] for u in w["Unfinished"]] == [3]
    assert check_trace(path) == []


def test_report_leaves_out_collectives_evicted_before_a_rank_s_window_not_missing(tmp_path, capsys):
    paths = []
    for rank, keep in ((0, 8), (1, 5)):         # rank 1 keeps fewer: its window begins 3 collectives later
        comm = abi.CommInfo(77, "t", 1, 2, rank)
        host, path = _host(tmp_path, comm, flightrec_ops=keep, flightrec_dump="always")
        _ops(host, 10, rank=rank, seed=rank)
        host.close()
        paths.append(path)
    run = run_tables(paths)
    ks, chs = run.steps()
    rep = build(ks, run.counters(), chs=chs, ranks=run.present, starts=run.starts(), spans=run.spans())
    assert rep.stragglers_left_out["collectives"] == 0 and rep.unfinished == []
    assert sorted(set(chs["seq_number"].tolist())) == [5, 6, 7, 8, 9]
    assert main(["report", str(tmp_path / "fr")]) == 0
    out = capsys.readouterr().out
    assert "missing" not in out and "left out" in out and "rank 1 (always) kept ops 6..10 of 10" in out
    # the same files without their window records: the 3 collectives would be called missing
    for p in paths:
        with open(p) as f:
            lines = [ln for ln in f if "slicetrace_flightrec" not in ln]
        with open(p, "w") as f:
            f.writelines(lines)
    run = run_tables(paths)
    assert build(*run.steps()[:1], run.counters(), chs=run.steps()[1], ranks=run.present,
                 spans=run.spans()).stragglers_left_out["collectives"] == 3


def _dumps_with_lost_kernel_ch(tmp_path, comm_hash: int, keeps: list[int], lost_rank: int, lost_seq: int) -> list:
    """Every rank's DUMP=always flight record of 10 synthetic all-reduces (rank r keeps keeps[r] ops), where rank
    lost_rank's op lost_seq lost its KernelCh records (unfinished there)."""
    paths = []
    for rank, keep in enumerate(keeps):
        comm = abi.CommInfo(comm_hash, "t", 1, len(keeps), rank)
        host, path = _host(tmp_path, comm, flightrec_ops=keep, flightrec_dump="always")
        for op in SyntheticSource(nranks=len(keeps), rank=rank, nchannels=2, seed=rank).ops(10, host.op_mask()):
            host.begin_op(op.info)
            if rank == lost_rank and op.info.seq_number == lost_seq:
                host.steps(op.info.tag, op.steps)
                host.end_op(op.info.tag, op.end_ns)
            else:
                deliver(host, op)
        host.close()
        paths.append(path)
    return paths


def _report(paths):
    run = run_tables(paths)
    ks, chs = run.steps()
    return build(ks, run.counters(), chs=chs, ranks=run.present, starts=run.starts(), spans=run.spans()), chs


def test_a_collective_before_one_rank_s_window_but_unfinished_on_another_rank_is_still_reported(tmp_path):
    # rank 0 evicted collectives 0..4; ranks 1, 2 kept 2..9; rank 2's #3 is unfinished
    rep, chs = _report(_dumps_with_lost_kernel_ch(tmp_path, 78, [5, 8, 8], lost_rank=2, lost_seq=3))
    assert [(u["func"], u["seq"], u["ranks"]) for u in rep.unfinished] == [("AllReduce", 3, [2])]
    assert sorted(set(chs["seq_number"].tolist())) == [3] + list(range(5, 10))    # 2 and 4: evicted on rank 0


def test_an_unfinished_op_kept_from_before_the_evicted_ones_opens_no_gap_called_missing(tmp_path):
    # rank 0 keeps its unfinished #1, then evicts #2..#6
    paths = _dumps_with_lost_kernel_ch(tmp_path, 79, [3, 20], lost_rank=0, lost_seq=1)
    w = _window(read_records(paths[0]))
    assert (w["FirstSeqNum"], w["EvictedSeqNum"]) == ({"AllReduce": 1}, {"AllReduce": 6})
    rep, _ = _report(paths)
    assert rep.stragglers_left_out["collectives"] == 1          # #1 alone: unfinished on rank 0, and said so
    assert [(u["func"], u["seq"], u["ranks"]) for u in rep.unfinished] == [("AllReduce", 1, [0])]


@pytest.mark.parametrize("var,value,accepted", [
    ("SLICETRACE_FLIGHTREC_OPS", "0", ">= 1"), ("SLICETRACE_FLIGHTREC_OPS", "many", "decimal"),
    ("SLICETRACE_FLIGHTREC_MAX_RECORDS", "-5", ">= 1"), ("SLICETRACE_FLIGHTREC_DUMP", "sometimes", "'always'"),
    ("SLICETRACE_FLIGHTREC_FILE", "a\0b", "NUL")])
def test_bad_settings_name_the_variable_the_value_and_what_is_accepted(var, value, accepted):
    with pytest.raises(ConfigError) as e:
        Settings.from_env({var: value})
    assert var in str(e.value) and repr(value) in str(e.value) and accepted in str(e.value)


def test_settings_defaults_and_any_case_dump():
    s = Settings.from_env({"SLICETRACE_FLIGHTREC_DUMP": "ALWAYS"})
    assert (s.flightrec_dump, s.flightrec_ops, s.flightrec_max_records, s.flightrec_file) == (
        "always", 32, 1_000_000, "flightrec")


def test_loaded_by_name_beside_other_plugins_and_not_on_the_example_s_files(tmp_path):
    s = Settings(flightrec_file=str(tmp_path / "fr"), linkstats_file=str(tmp_path / "ls"))
    assert [p.name for p in load_plugins("linkstats,flightrec", s)] == ["linkstats", "flightrec"]
    (lp,) = load_plugins("flightrec", s.with_(profile_dump_file=str(tmp_path / "fr")))
    with pytest.raises(ConfigError, match="SLICETRACE_FLIGHTREC_FILE.*same files"):
        EventHost([lp], COMM)


def test_a_prefix_that_cannot_be_a_folder_s_is_refused_at_init(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match="SLICETRACE_FLIGHTREC_FILE.*afile.*not a folder that can be written"):
        FlightRecPlugin(Settings(flightrec_file=str(tmp_path / "afile" / "sub" / "fr"))).init(COMM,
                                                                                            abi.ActivationMask())
    assert os.listdir(tmp_path) == ["afile"]
