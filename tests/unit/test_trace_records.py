"""report and convert read a run through one set of checks (analyze.trace.load_files, analyze.records): a bad value
is refused naming the file, the record's index, the field, the value and what is accepted, by both commands."""
from __future__ import annotations

import json
import shutil

import pytest

from slicetrace.analyze.perfetto import convert
from slicetrace.analyze.trace import load_run, trace_files
from slicetrace.cli.main import main
from slicetrace.errors import TraceFormatError
from tests.unit.test_trace_analyze import _run_files, write_ranks


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A two-rank run as the example plugin writes it (Coll, P2p, KernelCh, KernelStep); the files' folder."""
    prefix, _ = write_ranks(tmp_path_factory.mktemp("rec"))
    return prefix


def _copy(run, tmp_path):
    out = tmp_path / "tr"
    shutil.copytree(run.rsplit("/", 1)[0], out)
    return out, out / "tr_99_0.json"


def _mutated(run, tmp_path, pred, fn):
    """The run's copy with the first record of rank 0 matching pred changed by fn: (folder, file, its index)."""
    folder, path = _copy(run, tmp_path)
    recs = json.loads(path.read_text())
    i = next(i for i, r in enumerate(recs) if r and pred(r))
    fn(recs[i])
    path.write_text(json.dumps(recs))
    return folder, path, i


def step(r):
    return r.get("name") == "KernelStep"


def coll_b(r):
    return r.get("cat") == "COLL" and r["ph"] == "b"


def p2p_b(r):
    return r.get("cat") == "P2P" and r["ph"] == "b"


def kch_b(r):
    return r.get("name") == "KernelCh" and r["ph"] == "b"


def comm_meta(r):
    return r.get("name") == "slicetrace_comm"


def counters_meta(r):
    return r.get("name") == "slicetrace_counters"


def _set(field, value):
    return lambda r: r["args"].update({field: value})


@pytest.mark.parametrize("pred, fn, want", [
    (step, _set("Channel", 10**30), f"'args.Channel' is {10**30}: accepted 0..63 (a channel)"),
    (step, lambda r: r.pop("args"), "'args' lacks ['Channel', 'IsSend', 'Peer', 'Step', 'Size', 'WaitGpuClk', "
                                    "'StartGpuClk', 'StopGpuClk'], which every KernelStep record carries"),
    (step, _set("Peer", 99), "'args.Peer' is 99: accepted 0..1, the ranks of this run (nRanks of the trace's "
                             "slicetrace_comm record)"),
    (step, _set("Size", -5), "'args.Size' is -5: accepted 0..9223372036854775807 (bytes)"),
    (step, _set("IsSend", 2), "'args.IsSend' is 2: accepted 0..1 (1 for a send, 0 for a receive)"),
    (step, lambda r: r["args"].update(StopGpuClk=r["args"]["WaitGpuClk"] - 1),
     "clocks out of order (WaitGpuClk "),
    (step, lambda r: r["args"].update(WaitGpuClk=r["args"]["StartGpuClk"] + 1),
     "accepted WaitGpuClk <= StartGpuClk <= StopGpuClk"),
    (step, lambda r: r.update(dur=-1.0), "'dur' must be a finite number >= 0"),
    (step, lambda r: r.update(pid=7), "'pid' is 7: accepted 0..1, the ranks of this run"),
    (kch_b, lambda r: r["args"].update(StopGpuClk=r["args"]["StartGpuClk"] - 1),
     "accepted StartGpuClk <= StopGpuClk"),
    (coll_b, lambda r: r.pop("args"), "'args' lacks ['SeqNum', 'CommHash', 'Rank', 'Count', 'Datatype', "
                                      "'Algorithm', 'Protocol', 'nChannels'], which every COLL 'b' record carries"),
    (coll_b, lambda r: r["args"].pop("SeqNum"), "'args' lacks ['SeqNum']"),
    (coll_b, _set("SeqNum", -1), "'args.SeqNum' is -1: accepted 0..9223372036854775807"),
    (coll_b, _set("Count", -1), "'args.Count' is -1: accepted 0..9223372036854775807 (elements)"),
    (coll_b, _set("nChannels", 65), "'args.nChannels' is 65: accepted 0..64 (a channel count)"),
    (p2p_b, _set("Peer", 5), "'args.Peer' is 5: accepted 0..1, the ranks of this run"),
    (p2p_b, _set("Rank", -1), "'args.Rank' is -1: accepted 0..1"),
    # a hash that is no integer made its file a run of its own: "2 communicators", naming this run's prefix twice
    (comm_meta, _set("CommHash", "x"), "'args.CommHash' must be an integer, not 'x'"),
    (comm_meta, _set("CommHash", -1), "'args.CommHash' is -1: accepted 0..18446744073709551615 (a 64-bit hash)"),
    # a negative count was printed as a loss ("overrun -3")
    (counters_meta, _set("overrun", -3), "'args.overrun' is -3: accepted >= 0 (a count"),
])
def test_report_and_convert_refuse_a_bad_value_naming_file_record_field_and_range(run, tmp_path, capsys, pred, fn,
                                                                                   want):
    folder, path, i = _mutated(run, tmp_path, pred, fn)
    out = tmp_path / "x.pftrace"
    for read in (lambda: load_run(str(folder)), lambda: convert(trace_files(str(folder)), str(out))):
        with pytest.raises(TraceFormatError) as e:
            read()
        assert str(e.value).startswith(f"trace file {str(path)!r}, record {i} (") and want in str(e.value), e.value
    for argv in (["report", str(folder)], ["convert", str(folder), "-o", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert want in err and "Traceback" not in err
    assert not out.exists()


def test_the_rank_count_comes_from_the_runs_files_on_disk_or_its_metadata(run, tmp_path):
    folder, path = _copy(run, tmp_path)
    for name in ("tr_99_0.json", "tr_99_1.json"):     # as traces of earlier versions: no slicetrace_comm record
        recs = [r for r in json.loads((folder / name).read_text()) if r.get("name") != "slicetrace_comm"]
        for r in recs:
            if "pid" in r:                             # and pid = rank
                r["pid"] = int(name[-6])
        (folder / name).write_text(json.dumps(recs))
    recs = json.loads(path.read_text())
    i = next(i for i, r in enumerate(recs) if r and step(r))
    recs[i]["args"]["Peer"] = 99
    path.write_text(json.dumps(recs))
    with pytest.raises(TraceFormatError, match=r"'args.Peer' is 99: accepted 0..1, the ranks of this run \(2 rank "
                                               r"files, the highest rank 1, of "):
        load_run(str(path))                        # rank 0's file alone: rank 1's beside it still counts
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(folder / "tr_99_1.json", alone)
    assert {r["pid"] for r in load_run(str(alone))} == {1}      # one rank's file alone: its peers are not judged
    # a slicetrace_comm record's nRanks, where the trace has one, is the count (here 4: peer 3 is fine, 4 is not)
    for name in ("tr_99_0.json", "tr_99_1.json"):
        recs = json.loads((folder / name).read_text())
        recs.append({"name": "slicetrace_comm", "ph": "M", "pid": int(name[-6]), "tid": 0, "args": {"nRanks": 4}})
        (folder / name).write_text(json.dumps(recs))
    recs = json.loads(path.read_text())
    recs[i]["args"]["Peer"] = 3
    path.write_text(json.dumps(recs))
    assert len(load_run(str(folder))) > 0
    recs[i]["args"]["Peer"] = 4
    path.write_text(json.dumps(recs))
    with pytest.raises(TraceFormatError, match=rf"record {i} \(KernelStep\): 'args.Peer' is 4: accepted 0..3, the "
                                               r"ranks of this run \(nRanks of the trace's slicetrace_comm record\)"):
        load_run(str(folder))
    recs[-1]["args"]["nRanks"] = 3
    path.write_text(json.dumps(recs))
    with pytest.raises(TraceFormatError, match=r"slicetrace_comm records' nRanks \(.*_0.json': 3, .*_1.json': 4\): "
                                               r"accepted one integer >= 1, the same in every file of the run"):
        load_run(str(folder))


@pytest.mark.parametrize("text", ["[]", "[{}]", '{"traceEvents": []}'])
def test_a_rank_file_without_records_is_refused_naming_it(run, tmp_path, capsys, text):
    """It used to be skipped without a word: the report covered the other ranks only."""
    folder, _ = _copy(run, tmp_path)
    empty = folder / "tr_99_1.json"
    empty.write_text(text)
    want = f"trace file {str(empty)!r} holds no records"
    for read in (lambda: load_run(str(folder)), lambda: convert(trace_files(str(folder)), str(tmp_path / "x.pf"))):
        with pytest.raises(TraceFormatError, match="holds no records") as e:
            read()
        assert str(e.value).startswith(want)
    assert main(["report", str(folder)]) == 2 and want in capsys.readouterr().err
    assert {r["pid"] for r in load_run(str(folder / "tr_99_0.json"))} == {0}    # the other rank, asked for by name


def test_convert_takes_partial_as_report_does(run, tmp_path, capsys):
    """A rank file without records: convert had no --partial, so it refused the folder (report --partial went on),
    yet converted one rank's file of the 2-rank run without a word, where report refused it. Both now refuse a run
    with a rank missing or empty unless --partial, with the same check, and say what --partial left out."""
    folder, _ = _copy(run, tmp_path)
    one = str(folder / "tr_99_0.json")
    out = str(tmp_path / "x.pftrace")
    for cmd in (["convert", one, "-o", out], ["report", one]):
        assert main(cmd) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "the run had 2 ranks" in err and "rank(s) [1]" in err and "pass --partial to go on with the ranks " \
            "present" in err, (cmd, err)
    with pytest.raises(TraceFormatError, match=r"rank\(s\) \[1\]"):
        convert(trace_files(one), out)
    assert main(["convert", one, "-o", out, "--partial"]) == 0
    assert "# --partial: rank(s) [1] of 2 absent; the trace shows the ranks present only" in capsys.readouterr().out
    assert convert(trace_files(one), out, partial=True)["files"] == 1
    (folder / "tr_99_1.json").write_text("[]")
    for cmd in (["convert", str(folder), "-o", out], ["report", str(folder)]):
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert "holds no records" in err and "pass --partial if that is what you want" in err, (cmd, err)
    assert main(["convert", str(folder), "-o", out, "--partial"]) == 0
    assert "# --partial: rank(s) [1] of 2 absent" in capsys.readouterr().out


def test_convert_refuses_two_runs_in_one_folder_as_report_does(tmp_path, capsys, monkeypatch):
    """It used to merge them into one trace, the ranks of both runs sharing processes and connections."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tr").mkdir()
    _run_files(tmp_path / "tr", 111)
    _run_files(tmp_path / "tr", 222)
    with pytest.raises(TraceFormatError) as e:
        convert(trace_files("tr"), "x.pftrace")
    msg = str(e.value)
    assert "the trace files hold 2 communicators (runs), which one convert does not pool" in msg
    assert "commHash 111 (2 file(s)): slicetrace convert tr/trace_111 -o run_111.pftrace;" in msg
    assert main(["convert", "tr", "-o", "x.pftrace"]) == 2
    assert "slicetrace convert tr/trace_222 -o run_222.pftrace" in capsys.readouterr().err
    # the command it gives runs as given (it lacked -o, which convert requires)
    assert main("convert tr/trace_222 -o run_222.pftrace".split()) == 0 and (tmp_path / "run_222.pftrace").exists()
    assert not (tmp_path / "x.pftrace").exists()
    assert convert(trace_files("tr/trace_222"), "x.pftrace")["files"] == 2       # the prefix it names selects one
    shutil.copy("tr/trace_111_0.json", "dup_111_0.json")
    with pytest.raises(TraceFormatError, match="are both rank 0 of commHash 111; pass one of them"):
        convert(trace_files(["tr/trace_111", "dup_111_0.json"]), "y.pftrace")


def test_the_example_plugin_writes_the_runs_rank_count(run):
    """So a trace says itself which peers exist (report and convert check Peer and Rank against it)."""
    for name in ("tr_99_0.json", "tr_99_1.json"):
        recs = json.loads(open(run.rsplit("/", 1)[0] + "/" + name).read())
        comm = [r for r in recs if r and r.get("name") == "slicetrace_comm"]
        assert len(comm) == 1 and comm[0]["args"]["nRanks"] == 2 and comm[0]["args"]["Rank"] == int(name[-6]), comm


def test_a_file_cut_short_is_read_to_its_last_whole_record_and_an_empty_one_says_why(run, tmp_path, caplog):
    """A rank killed while its plugin wrote left an array without its end; report refused the whole file. Chrome's
    format lets the closing ] go: the whole records are read, with a warning."""
    folder, f0 = _copy(run, tmp_path)
    text = f0.read_text()
    whole = load_run(str(f0))
    lines = text.rstrip().split("\n")
    assert len(lines) > 4                                      # the sink writes one record per line
    cut = "\n".join(lines[:-3]) + "\n" + lines[-3][: len(lines[-3]) // 2]     # mid-record, no end
    f0.write_text(cut)
    with caplog.at_level("WARNING", logger="slicetrace"):
        got = load_run(str(f0))
    assert got == whole[: len(got)] and len(whole) - 4 <= len(got) < len(whole)
    assert "was cut short" in caplog.text
    f0.write_text("")
    with pytest.raises(TraceFormatError, match="is empty: its rank ended before its profiler wrote anything"):
        load_run(str(folder))


def test_check_trace_lists_a_file_cut_short_as_a_problem(run, tmp_path, caplog):
    """check_trace returned [] for a file cut short (a rank killed while writing): the cut was only a warning on
    stderr, so a caller asserting the list empty passed a trace that lacks its last records."""
    from slicetrace.analyze.trace import check_trace
    _, f0 = _copy(run, tmp_path)
    assert check_trace(str(f0)) == []
    lines = f0.read_text().rstrip().split("\n")
    f0.write_text("\n".join(lines[:-3]) + "\n" + lines[-3][: len(lines[-3]) // 2])    # mid-record, no end
    with caplog.at_level("WARNING", logger="slicetrace"):
        problems = check_trace(str(f0))
    assert problems and problems[0].startswith(f"trace file {str(f0)!r} was cut short") and "whole records" in \
        problems[0], problems
    assert "cut short" not in caplog.text             # said in the list, not warned as well


def test_two_runs_of_different_rank_counts_are_refused_as_two_runs(tmp_path, monkeypatch):
    """The rank count was read before the files were grouped by run, so a 2-rank and a 3-rank run in one folder
    got "the slicetrace_comm records' nRanks (...)" instead of the message naming how to pick each run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tr").mkdir()
    for comm, n in ((111, 2), (222, 3)):
        for rank in range(n):
            recs = [{"name": "slicetrace_comm", "ph": "M", "pid": rank, "tid": 0,
                     "args": {"nRanks": n, "CommHash": comm, "commName": ""}}]
            (tmp_path / "tr" / f"trace_{comm}_{rank}.json").write_text(json.dumps(recs))
    with pytest.raises(TraceFormatError, match=r"2 communicators \(runs\).*commHash 111 \(2 file\(s\)\): slicetrace "
                                               r"report tr/trace_111; commHash 222 \(3 file\(s\)\)"):
        load_run("tr")


def test_a_whole_file_with_a_damaged_last_record_is_refused_not_read_as_cut_short(run, tmp_path):
    """A file that has its closing ] was written to the end: a bad record in it is damage, not an interrupted
    writer, and dropping it (often the counters record) would hide that."""
    _, f0 = _copy(run, tmp_path)
    lines = f0.read_text().rstrip().split("\n")
    assert lines[-1].endswith("]")
    lines[-2] = lines[-2][: len(lines[-2]) // 2]                 # the last record, damaged
    f0.write_text("\n".join(lines))
    with pytest.raises(TraceFormatError, match="cannot be read as JSON"):
        load_run(str(f0))


def test_partial_reports_the_ranks_present_when_a_rank_file_is_empty(run, tmp_path, capsys):
    folder, _ = _copy(run, tmp_path)
    (folder / "tr_99_1.json").write_text("")                   # a killed rank's file
    assert main(["report", str(folder)]) == 2
    assert "is empty: its rank ended before its profiler wrote anything" in capsys.readouterr().err
    assert main(["report", str(folder), "--partial"]) == 0
    assert "# --partial: rank(s) [1] of 2 absent" in capsys.readouterr().out


def test_a_file_is_parsed_a_block_of_lines_at_a_time_not_read_whole(run, tmp_path, monkeypatch, caplog):
    """report and convert held the file's text and its parse at once (5-7x the trace in memory): the sinks' one
    record per line is parsed a bounded block of lines at a time, to the same records."""
    from slicetrace.analyze import records
    _, f0 = _copy(run, tmp_path)
    whole = json.loads(f0.read_text())
    lines = f0.read_text().split("\n")
    f0.write_text("\n".join(lines[:1] + lines[1:-3] * 40 + lines[-3:]))      # ~40x the records, still one array
    want = whole[:-1] * 40 + whole[-1:]
    seen = []
    loads = json.loads

    def spy(s, *a, **kw):
        seen.append(len(s))
        return loads(s, *a, **kw)
    monkeypatch.setattr(records, "_BLOCK", 4096, raising=False)
    monkeypatch.setattr(records.json, "loads", spy)
    with caplog.at_level("WARNING", logger="slicetrace"):
        got = records.read_records(str(f0))
    assert [(r["name"], r.get("ts")) for r in got] == [(r["name"], r.get("ts")) for r in want if r]
    assert f0.stat().st_size > 100_000 and max(seen) < 8192 and len(seen) > 20
    assert caplog.text == ""


_B = '{"name":"b","ph":"M","pid":0}'


@pytest.mark.parametrize("end, ok", [(_B + "\n]", True), (_B + ",\n{}]", True), (_B + "]", True),
                                     (_B + ",\n{}\n]", True), (_B + ",\n]", False), (_B + "\n" + _B + "\n]", False)])
def test_other_ends_of_the_array_are_read_whole_and_bad_ones_refused_as_before(tmp_path, caplog, end, ok):
    """NCCL's "{}]" and a record ending the array on its line are no cut; a trailing comma or two records without
    one between them is no JSON."""
    from slicetrace.analyze.records import read_records
    path = tmp_path / "t_1_0.json"
    path.write_text('[\n{"name":"a","ph":"M","pid":0},\n' + end + "\n")
    if ok:
        with caplog.at_level("WARNING", logger="slicetrace"):
            assert [r["name"] for r in read_records(str(path))] == ["a", "b"]
        assert "cut short" not in caplog.text
    else:
        with pytest.raises(TraceFormatError, match="cannot be read as JSON"):
            read_records(str(path))


def test_a_cut_file_is_said_once_when_a_later_file_is_refused(run, tmp_path, caplog, capsys):
    """Reading one file at a time, then the run again whole to word a refusal, said rank 0's cut twice."""
    folder, path = _copy(run, tmp_path)
    path.write_text("\n".join(path.read_text().split("\n")[:-4]))        # its last records and "]" lost
    bad = folder / "tr_99_1.json"
    recs = json.loads(bad.read_text())
    next(r for r in recs if r and step(r))["args"]["Channel"] = 99
    bad.write_text(json.dumps(recs))
    for argv in (["report", str(folder)], ["convert", str(folder), "-o", str(tmp_path / "x.pftrace")]):
        caplog.clear()
        with caplog.at_level("WARNING", logger="slicetrace"):
            assert main(argv) == 2
        assert "'args.Channel' is 99" in capsys.readouterr().err
        assert [r.getMessage().count("was cut short") for r in caplog.records] == [1], (argv, caplog.text)


def test_a_record_whose_args_are_null_reads_as_no_args():
    """record_problem takes "args": null as no args; counters (and the other readers) then raised a TypeError."""
    from slicetrace.analyze.records import record_problem
    from slicetrace.analyze.trace import coll_spans, counters
    recs = [{"name": "slicetrace_counters", "ph": "M", "pid": 0, "tid": 0, "args": None},
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": None}]
    assert [record_problem(r) for r in recs] == [None, None]
    assert counters(recs) == {0: {}} and coll_spans(recs) == []
