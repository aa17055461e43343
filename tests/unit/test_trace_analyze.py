"""analyze.trace: loading, the invariant checker (each rule must catch its violation), the KernelStep table."""
from __future__ import annotations

import copy
import os
import json

import numpy as np
import pytest

from slicetrace.analyze import check_trace, counters, kernel_steps, load_trace, load_traces
from slicetrace.analyze.trace import trace_files
from slicetrace.config import Settings
from slicetrace.errors import TraceFormatError
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.events.synthetic import SyntheticSource, deliver
from slicetrace.sinks.chrome import ChromePlugin


def write_ranks(tmp_path, nranks=2, n_ops=3):
    """One trace per rank from the synthetic source; returns (prefix, {rank: ops})."""
    prefix = str(tmp_path / "tr")
    out = {}
    for rank in range(nranks):
        host = EventHost([LoadedPlugin(ChromePlugin(Settings(profile_dump_file=prefix)))],
                         abi.CommInfo(99, "a", 1, nranks, rank))
        src = SyntheticSource(nranks=nranks, rank=rank, nchannels=2, loops=1, funcs=("all_reduce", "send_recv"),
                              seed=rank)
        ops = []
        for op in src.ops(n_ops):
            op.info.mask = host.op_mask()
            host.begin_op(op.info)
            deliver(host, op)
            ops.append(op)
        host.close()
        out[rank] = ops
    return prefix, out


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    prefix, ops = write_ranks(tmp_path_factory.mktemp("an"))
    return prefix, ops, load_trace(f"{prefix}_99_0.json")


def test_good_traces_have_no_problems(traces):
    prefix, _, recs = traces
    assert check_trace(f"{prefix}_99_0.json") == [] and check_trace(f"{prefix}_99_1.json") == []
    assert check_trace(recs) == []


def test_load_traces_merges_ranks_by_prefix_glob_or_list(traces):
    prefix, _, _ = traces
    merged = load_traces(prefix)
    assert {r.get("pid") for r in merged} == {0, 1}
    assert len(load_traces(f"{prefix}_*_1.json")) == len(load_trace(f"{prefix}_99_1.json"))
    assert len(load_traces([f"{prefix}_99_0.json", f"{prefix}_99_1.json"])) == len(merged)
    assert len(load_traces([prefix])) == len(load_traces([f"{prefix}_*_0.json", f"{prefix}_99_1.json"])) \
        == len(merged)                      # each list entry as one argument: a prefix, a glob or a file
    assert check_trace(merged) == []
    assert set(counters(merged)) == {0, 1} and counters(merged)[0]["overrun"] == 0
    with pytest.raises(TraceFormatError, match=r"no trace files match '.*nothing'"):
        load_traces(prefix + "nothing")


def test_a_folder_means_the_dump_files_in_it(traces, tmp_path):
    prefix, _, _ = traces
    folder = os.path.dirname(prefix)
    assert trace_files(folder) == trace_files(prefix) and len(trace_files(folder)) == 2
    (tmp_path / "bench.json").write_text("{}")             # bench --json output beside the traces is no trace
    with pytest.raises(TraceFormatError, match=r"no trace files match .*a folder of"):
        trace_files(str(tmp_path))


def test_a_prefix_that_ends_at_the_underscore_before_the_hash_or_rank_means_the_same_files(traces):
    """Tab completion of traces/trace_<commHash>_0.json and _1.json stops at 'traces/trace_<commHash>_' (and of one
    run's prefix at 'traces/trace_'): both said "no trace files match"."""
    prefix, _, _ = traces
    both = trace_files(prefix)
    assert len(both) == 2
    assert trace_files(prefix + "_") == both == trace_files(prefix + "_99_") == trace_files(prefix + "_99")
    with pytest.raises(TraceFormatError, match=r"no trace files match '.*_98_'"):
        trace_files(prefix + "_98_")


def test_a_path_that_is_there_but_no_file_or_folder_is_named_as_such(tmp_path, capsys):
    """report /dev/null said "no trace files match '/dev/null'", as for a path that does not exist."""
    from slicetrace.cli.main import main
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "gone.json").symlink_to(tmp_path / "deleted.json")
    for path, what in [("/dev/null", "a character device, not a trace file or a folder"),
                       (str(tmp_path / "pipe"), "a named pipe (FIFO), not a trace file or a folder"),
                       (str(tmp_path / "gone.json"), f"a symbolic link to {str(tmp_path / 'deleted.json')!r}, "
                                                     f"which is not there")]:
        with pytest.raises(TraceFormatError) as e:
            trace_files(path)
        assert str(e.value) == f"{path!r} is {what}; give a file, a folder of <prefix>_<commHash>_<rank>.json " \
                               f"files, a glob, or a dump prefix", str(e.value)
    assert main(["report", "/dev/null"]) == 2
    assert capsys.readouterr().err.startswith("slicetrace: error: '/dev/null' is a character device, not a trace")


def test_bad_json_and_shapes_are_reported(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('[{"name": "x", "ph": "b"},')
    (problem,) = check_trace(bad)
    assert "cannot be read as JSON" in problem and str(bad) in problem
    bad.write_text('{"a": 1}')
    with pytest.raises(TraceFormatError, match="is not a JSON array of objects"):
        load_trace(bad)
    bad.write_text('[{"name": "KernelStep", "ph": "X"}, {}]')       # NCCL's trailing {} is fine, a missing ts is not
    assert check_trace(bad) == ["record 0 (KernelStep) has no numeric 'ts'"]


def _mutate(recs, pred, fn):
    out = copy.deepcopy(recs)
    hit = next(r for r in out if pred(r))
    fn(hit, out)
    return out


def is_step(r):
    return r.get("name") == "KernelStep"


def is_coll_b(r):
    return r.get("cat") == "COLL" and r["ph"] == "b"


@pytest.mark.parametrize("pred, fn, expect", [
    (is_coll_b, lambda r, out: out.remove(r), "'e' record(s) without a 'b'"),
    (lambda r: r.get("cat") == "COLL" and r["ph"] == "e", lambda r, out: out.remove(r), "1 'b' and 0 'e'"),
    (lambda r: r.get("cat") == "COLL" and r["ph"] == "e", lambda r, out: r.update(cat="P2P"), "'b' and 0 'e'"),
    (lambda r: r.get("cat") == "GPU" and r["ph"] == "e", lambda r, out: r.update(ts=0.0), "before it begins"),
    (lambda r: r.get("cat") == "GPU" and r["ph"] == "e", lambda r, out: r.update(name="X"), "'b' name 'KernelCh'"),
    (is_coll_b, lambda r, out: r["args"].pop("Protocol"), "lacks args ['Protocol']"),
    (lambda r: r.get("name") == "KernelCh" and r["ph"] == "b", lambda r, out: r["args"].pop("StopGpuClk"),
     "lacks args ['StopGpuClk']"),
    (is_step, lambda r, out: r["args"].pop("Size"), "KernelStep at ts"),
    (is_step, lambda r, out: r.update(ts=r["ts"] - 1e6), "outside its op"),
    (is_step, lambda r, out: r["args"].update(ParentId=123456789), "parent op 123456789 is not in the trace"),
    (is_step, lambda r, out: r["args"].update(Channel=7), "has no KernelCh on channel 7"),
])
def test_each_invariant_catches_its_violation(traces, pred, fn, expect):
    _, _, recs = traces
    problems = check_trace(_mutate(recs, pred, fn))
    assert any(expect in p for p in problems), problems


def test_kernel_step_outside_every_kernel_ch_of_its_op(traces):
    _, _, recs = traces
    out = copy.deepcopy(recs)
    kch = next(r for r in out if r.get("name") == "KernelCh" and r["ph"] == "b")
    kch["ts"] += 10**7                          # the channel starts after every slice of its op
    assert any("outside every KernelCh" in p for p in check_trace(out))


def test_without_parent_ids_steps_must_lie_in_some_op_of_their_rank(traces):
    _, _, recs = traces
    out = copy.deepcopy(recs)
    for r in out:
        if is_step(r):
            r["args"].pop("ParentId")
    assert check_trace(out) == []
    next(r for r in out if is_step(r))["ts"] = 1.0
    assert any("inside no Coll/P2p of its rank" in p for p in check_trace(out))


def test_kernel_steps_table_matches_the_source(traces):
    prefix, ops, _ = traces
    table = kernel_steps(load_traces(prefix))
    assert table.dtype.names[:3] == ("rank", "channel", "is_send")
    for rank in (0, 1):
        want = np.concatenate([op.steps for op in ops[rank]])
        got = table[table["rank"] == rank]
        order = np.lexsort((got["wait_ns"],))
        worder = np.lexsort((want["wait_ns"],))
        got, want = got[order], want[worder]
        for g, w in (("wait_ns", "wait_ns"), ("ready_ns", "ready_ns"), ("done_ns", "done_ns"), ("step", "step"),
                     ("peer", "peer"), ("size", "size"), ("channel", "channel")):
            assert (got[g] == want[w].astype(np.int64)).all(), g
        assert (got["is_send"] == (want["flags"] & 1)).all()
        assert set(got["seq_number"][got["seq_number"] >= 0]) == {0, 1}
    assert kernel_steps([]).shape == (0,)


def test_written_file_is_one_json_array(traces):
    prefix, _, _ = traces
    with open(f"{prefix}_99_1.json") as f:
        text = f.read()
    assert text.startswith("[\n") and text.rstrip().endswith("]")
    assert isinstance(json.loads(text), list)


_STEP = {"name": "KernelStep", "cat": "GPU", "ph": "X", "pid": 0, "tid": 1, "ts": 1.0, "dur": 2.0,
         "args": {"Channel": 0, "IsSend": 1, "Peer": 1, "Step": 0, "Size": 8, "WaitGpuClk": 0, "StartGpuClk": 1,
                  "StopGpuClk": 2}}
_COLL_ARGS = {"SeqNum": 0, "CommHash": 1, "Rank": 0, "Count": 2, "Datatype": "ncclFloat32", "Algorithm": "RING",
              "Protocol": "SIMPLE", "nChannels": 1}


@pytest.mark.parametrize("record, field, want", [
    ({**_STEP, "ts": "abc"}, "'ts'", "must be a finite number, not 'abc'"),
    ({**_STEP, "ts": float("nan")}, "'ts'", "must be a finite number, not nan"),
    ({"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 1, "pid": 0}, "'ts'", "has no 'ts'"),
    ({"name": "x", "ph": "X", "ts": 1, "args": 5}, "'args'", "must be an object, not 5"),
    ({"name": "x", "cat": "c", "ph": "i", "ts": 1, "pid": "abc"}, "'pid'", "must be an integer (the rank)"),
    ({**_STEP, "args": {**_STEP["args"], "Channel": {"a": 1}}}, "'args.Channel'", "must be an integer"),
    ({**_STEP, "tid": [1]}, "'tid'", "must be an integer or a string"),
])
def test_a_malformed_record_is_refused_naming_the_file_the_record_and_the_field(tmp_path, record, field, want):
    """What used to end in KeyError/ValueError/TypeError tracebacks in report and convert."""
    path = tmp_path / "t_1_0.json"
    path.write_text(json.dumps([{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}}, record]))
    with pytest.raises(TraceFormatError) as e:
        load_trace(path)
    msg = str(e.value)
    assert f"trace file {str(path)!r}, record 1" in msg and field in msg and want in msg
    assert any(field in p for p in check_trace(path))       # the checker lists it instead of failing on it


def test_report_and_convert_need_every_kernel_step_arg(tmp_path):
    """Convert used to draw a KernelStep without its args (or drop it) that report refused: both read through
    load_files now."""
    from slicetrace.analyze.perfetto import convert
    from slicetrace.analyze.trace import load_run
    path = tmp_path / "t_1_0.json"
    path.write_text(json.dumps([{**_STEP, "args": {"Channel": 0, "IsSend": 1, "Peer": 1, "Step": 0}}]))
    want = r"record 0 \(KernelStep\): 'args' lacks \['Size', 'WaitGpuClk'"
    for read in (load_trace, load_run, lambda p: convert([p], str(tmp_path / "x.pftrace"))):
        with pytest.raises(TraceFormatError, match=want):
            read(str(path))
    assert not (tmp_path / "x.pftrace").exists()
    with pytest.raises(TraceFormatError, match=r"record 0 \(KernelStep\): 'args' lacks \['StartGpuClk'"):
        kernel_steps([{**_STEP, "args": {k: v for k, v in _STEP["args"].items() if k != "StartGpuClk"}}])
    with pytest.raises(TraceFormatError, match=r"record 1 \(KernelStep\): 'args.Channel' is 1099511627776: "
                                               r"accepted 0..63 \(a channel\)"):
        kernel_steps([_STEP, {**_STEP, "args": {**_STEP["args"], "Channel": 1 << 40}}])   # records not loaded


def _run_files(folder, comm, ranks=2):
    for rank in range(ranks):
        recs = [{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 1, "pid": rank, "ts": 0.0,
                 "args": {**_COLL_ARGS, "CommHash": comm, "Rank": rank}},
                {**_STEP, "pid": rank, "args": {**_STEP["args"], "Peer": 1 - rank, "ParentId": 1}},
                {"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 1, "pid": rank, "ts": 9.0}]
        (folder / f"trace_{comm}_{rank}.json").write_text(json.dumps(recs))


def test_report_refuses_two_runs_in_one_folder_and_names_how_to_pick_each(tmp_path, monkeypatch):
    from slicetrace.analyze.trace import load_run
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tr").mkdir()
    _run_files(tmp_path / "tr", 111)
    assert len(load_run("tr")) == 6
    _run_files(tmp_path / "tr", 222)                        # a second run beside the first
    with pytest.raises(TraceFormatError) as e:
        load_run("tr")
    msg = str(e.value)
    assert "2 communicators (runs)" in msg
    assert "commHash 111 (2 file(s)): slicetrace report tr/trace_111" in msg and "tr/trace_222" in msg
    assert {r["pid"] for r in load_run("tr/trace_222")} == {0, 1}       # the prefix the message names selects it
    assert len(load_run(["tr/trace_111", "tr/trace_111_0.json"])) == 6  # one file named twice counts once
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "trace_111_0.json").write_text((tmp_path / "tr" / "trace_111_0.json").read_text())
    with pytest.raises(TraceFormatError, match=r"are both rank 0 of commHash 111; pass one of them"):
        load_run(["tr/trace_111", "copy"])


def test_one_file_named_by_two_spellings_counts_once(tmp_path, monkeypatch):
    """A relative path, ./ and an absolute path of one file are one file, not rank 0 twice."""
    from slicetrace.analyze.trace import load_files
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tr").mkdir()
    _run_files(tmp_path / "tr", 111)
    got = load_files(["tr/trace_111_0.json", "./tr/trace_111_0.json", str(tmp_path / "tr" / "trace_111_0.json"),
                      "tr/trace_111_1.json"])
    assert [f for f, _ in got] == ["tr/trace_111_0.json", "tr/trace_111_1.json"]     # the first spelling kept
    assert [len(recs) for _, recs in got] == [3, 3]


@pytest.mark.parametrize("begin, end, ok", [(10.0, 9.9995, True), (1234567.891, 1234567.8905, True),
                                            (10.0, 9.998, False)])
def test_an_end_within_a_nanosecond_before_its_begin_is_float_noise(begin, end, ok):
    """ts are written in us with 3 decimals: a pair rounded apart by under 1 ns is not an end before its begin."""
    recs = [{"name": "GroupApi", "cat": "GROUP_API", "ph": "b", "id": 1, "pid": 0, "ts": begin, "args": {}},
            {"name": "GroupApi", "cat": "GROUP_API", "ph": "e", "id": 1, "pid": 0, "ts": end}]
    want = [] if ok else [f"async id (0, 'GROUP_API', 1) (GroupApi): ends at {end} before it begins at {begin}"]
    assert check_trace(recs) == want


def test_a_folder_holds_only_the_sinks_files_so_a_report_json_beside_them_is_no_trace(tmp_path, monkeypatch, capsys):
    """report --json DIR/report_of_run.json, then report DIR: the folder form took any *_*_*.json for a trace."""
    from slicetrace.cli.main import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tr").mkdir()
    _run_files(tmp_path / "tr", 111)
    assert main(["report", "--json", "tr/report_of_run.json", "tr"]) == 0
    assert main(["report", "tr"]) == 0, capsys.readouterr().err
    assert trace_files("tr") == ["tr/trace_111_0.json", "tr/trace_111_1.json"]
    assert trace_files("tr/trace") == trace_files("tr/trace_111") == trace_files("tr")


def test_a_folder_or_prefix_with_glob_characters_is_taken_literally_first(tmp_path, monkeypatch, capsys):
    """bench --trace /tmp/x[1] suggests `slicetrace report /tmp/x[1]/trace_<hash>`: '[1]' made it a glob."""
    from slicetrace.cli.main import main
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x[1]").mkdir()
    _run_files(tmp_path / "x[1]", 111)
    want = ["x[1]/trace_111_0.json", "x[1]/trace_111_1.json"]
    assert trace_files("x[1]") == trace_files("x[1]/trace") == trace_files("x[1]/trace_111") == want
    assert main(["report", "x[1]/trace_111"]) == 0, capsys.readouterr().err
    assert trace_files("x[[]1]/trace_*_1.json") == want[1:]          # a glob that matches nothing literally


def test_kernel_steps_recorded_without_their_ops_in_the_mask_are_no_problem(tmp_path):
    """--profile KernelStep (a valid mask) records no Coll/P2p: check_trace flagged every KernelStep as inside no
    op. The trace says its mask; with Coll and P2p in it a step outside every op is still flagged."""
    for mask, clean in ((int(abi.EventType.KERNEL_STEP), True), (None, False)):
        prefix = str(tmp_path / f"m{mask}")
        host = EventHost([LoadedPlugin(ChromePlugin(Settings(profile_dump_file=prefix, profile_event_mask=mask)))],
                         abi.CommInfo(99, "a", 1, 2, 0))
        src = SyntheticSource(nranks=2, rank=0, nchannels=2, loops=1, funcs=("all_reduce", "send_recv"), seed=0)
        for op in src.ops(3):
            op.info.mask = host.op_mask()
            host.begin_op(op.info)
            deliver(host, op)
        host.close()
        recs = load_trace(f"{prefix}_99_0.json")
        steps = [r for r in recs if is_step(r)]
        assert steps and not any(r.get("cat") in ("COLL", "P2P") for r in recs) == clean
        if clean:
            assert all(r["args"]["ParentId"] == -1 for r in steps) and check_trace(recs) == []
        else:                                   # parents recorded: a step without one, outside them, is flagged
            steps[0]["args"]["ParentId"] = -1
            steps[0]["ts"] = 1.0
            assert any("inside no Coll/P2p of its rank" in p for p in check_trace(recs))


def test_a_json_array_named_as_a_rank_file_but_without_a_rank_is_refused(tmp_path):
    """Before: `[{"a": 1}]` named trace_<hash>_3.json beside a 3-rank run was read as a fourth rank's file."""
    import json as _json
    from slicetrace.analyze.trace import load_run
    from slicetrace.errors import TraceFormatError
    step = {"name": "KernelStep", "cat": "GPU", "ph": "X", "tid": 1, "ts": 1.0, "dur": 2.0,
            "args": {"Channel": 0, "IsSend": 1, "Peer": 1, "Step": 0, "Size": 8, "WaitGpuClk": 0, "StartGpuClk": 0,
                     "StopGpuClk": 2000}}
    for r in range(2):
        (tmp_path / f"t_7_{r}.json").write_text(_json.dumps([dict(step, pid=r, args=dict(step["args"], Peer=1 - r))]))
    assert len(load_run(str(tmp_path / "t"))) == 2
    (tmp_path / "t_7_3.json").write_text('[{"a": 1}]')
    with pytest.raises(TraceFormatError, match=r"t_7_3.json': none of its 1 record\(s\) has a pid"):
        load_run(str(tmp_path / "t"))
