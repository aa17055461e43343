"""The main job end to end: `slicetrace bench` with check, traces and JSON, then `slicetrace report`."""
import glob
import json

import numpy as np
import pytest

from slicetrace.analyze.trace import check_trace
from slicetrace.cli.main import main


def test_bench_checks_traces_and_reports(tmp_path, capfd):
    out = tmp_path / "r.json"
    rc = main(["bench", "-b", "4K", "-e", "256K", "-f", "8", "-n", "3", "-w", "1", "--op", "all_reduce,all_gather",
               "--ranks", "3", "--trace", str(tmp_path / "tr"), "--json", str(out)])
    assert rc == 0
    doc = json.load(open(out))
    rows, env = doc["rows"], doc["env"]
    assert env["backend"] == "cpu" and env["ranks"] == 3 and env["cpus"] >= 1 and env["numpy"] and env["python"]
    assert [r["op"] for r in rows] == ["all_reduce"] * 3 + ["all_gather"] * 3
    assert all(r["wrong"] == 0 for r in rows)
    for r in rows:
        f = 4 / 3 if r["op"] == "all_reduce" else 2 / 3
        assert abs(r["busbw"] - r["algbw"] * f) < 1e-9
    files = glob.glob(str(tmp_path / "tr" / "trace_*.json"))
    assert len(files) == 3 and all(check_trace(f) == [] for f in files)
    text = capfd.readouterr().out
    assert "#wrong" in text and "busbw" in text
    avg = sum(r["busbw"] for r in rows) / len(rows)         # nccl-tests' closing lines, also in the JSON
    assert doc["summary"] == {"out_of_bounds": 0, "avg_busbw": pytest.approx(avg)}
    assert "# Out of bounds values : 0 OK" in text and f"# Avg bus bandwidth    : {avg:g}" in text
    assert main(["report", str(tmp_path / "tr" / "trace"), "--json", str(tmp_path / "rep.json"),
                 "--csv", str(tmp_path / "steps.csv")]) == 0
    rep = json.load(open(tmp_path / "rep.json"))
    assert {(ln["src"], ln["dst"]) for ln in rep["links"]} == {(0, 1), (1, 2), (2, 0)}
    import csv
    from slicetrace.analyze.trace import kernel_steps, load_traces
    ks = kernel_steps(load_traces(str(tmp_path / "tr" / "trace")))
    rows = list(csv.DictReader(open(tmp_path / "steps.csv")))
    assert len(rows) == len(ks) > 0
    assert [int(r["wait_ns"]) for r in rows] == sorted(ks["wait_ns"].tolist())
    for r in rows:
        xfer = int(r["done_ns"]) - int(r["ready_ns"])
        assert float(r["wait_us"]) == pytest.approx((int(r["ready_ns"]) - int(r["wait_ns"])) / 1e3, abs=1e-3)
        assert float(r["gbps"]) == pytest.approx(int(r["size"]) / xfer if xfer > 0 else 0.0, abs=1e-3)
    sent = sum(int(r["size"]) for r in rows if r["is_send"] == "1" and r["rank"] == "0")
    assert sent == sum(int(s) for s in ks["size"][(ks["is_send"] == 1) & (ks["rank"] == 0)])
    # a rank whose file was cut after its header (killed before its first write) is present, and said to be empty
    (f2,) = glob.glob(str(tmp_path / "tr" / "trace_*_2.json"))
    head = open(f2).read().split("\n")[:2]
    open(f2, "w").write("\n".join(head) + "\n")
    capfd.readouterr()
    assert main(["report", str(tmp_path / "tr" / "trace")]) == 0
    assert "# rank(s) 2: the file holds no events (cut short before its first write?)" in capfd.readouterr().out


def test_a_wrong_value_is_counted_and_fails_the_run(tmp_path, capfd, monkeypatch):
    """The check can find a wrong value: one corrupted element of every output is one wrong value per size, the
    summary says FAILED and the exit code is 1. In process (one rank, the launcher replaced) so the op can be patched."""
    import slicetrace
    import slicetrace.launcher
    from slicetrace.cli import bench

    def in_process(fn, nranks, *args, **settings):
        assert nranks == 1
        with slicetrace.init(rank=0, world_size=1, **settings) as comm:
            return [fn(comm, *args)]

    real = bench._call

    def corrupting(comm, op, x, out, redop, root):
        real(comm, op, x, out, redop, root)
        out[3:6] += 1                                   # 3 elements off by one: int32, no tolerance hides them

    monkeypatch.setattr(slicetrace.launcher, "launch", in_process)
    monkeypatch.setattr(bench, "_call", corrupting)
    out = tmp_path / "w.json"
    assert main(["bench", "-b", "64", "-e", "256", "-f", "4", "-n", "1", "-w", "0", "-d", "int32", "--ranks", "1",
                 "--json", str(out)]) == 1
    doc = json.load(open(out))
    assert [(r["size"], r["wrong"], r["wrong_ranks"]) for r in doc["rows"]] == [(64, 3, 1), (256, 3, 1)]
    assert doc["summary"]["out_of_bounds"] == 2         # nccl-tests counts failed checks, not wrong values
    o, err = capfd.readouterr()
    assert "# Out of bounds values : 2 FAILED" in o
    assert "# 2 size(s) had wrong results" in err
    monkeypatch.setattr(bench, "_call", real)           # the same run, uncorrupted: the check passes it
    assert main(["bench", "-b", "64", "-e", "256", "-f", "4", "-n", "1", "-w", "0", "-d", "int32", "--ranks", "1",
                 "--json", str(out)]) == 0
    assert [r["wrong"] for r in json.load(open(out))["rows"]] == [0, 0]
    assert "# Out of bounds values : 0 OK" in capfd.readouterr().out


def test_bad_flags_are_clear_errors(capsys):
    assert main(["bench", "-d", "complex", "--ranks", "1"]) == 2
    assert "-d 'complex' is not one of" in capsys.readouterr().err
    assert main(["bench", "--op", "all_reduce,scan", "--ranks", "1"]) == 2
    assert "--op ['scan']" in capsys.readouterr().err
    assert main(["bench", "--overhead-of", "kernel_step", "--ranks", "1"]) == 2
    assert "--overhead-of kernel_step needs --overhead" in capsys.readouterr().err
    assert main(["bench", "--overhead", "--overhead-of", "kernel_step", "--profile", "70", "--ranks", "1"]) == 2
    assert "--profile 70 has no KernelStep bit (65536)" in capsys.readouterr().err
    assert main(["bench", "--rounds", "4", "--ranks", "1"]) == 2          # was ignored without --overhead
    assert "--rounds 4 counts only with --overhead or --compare" in capsys.readouterr().err


def test_nccl_tests_habits_get_their_meaning_or_a_hint(tmp_path, capsys):
    """nccl-tests' --op is the reduction (-o here): --op prod named no -o; -T 0 (nccl-tests: no timeout) named no
    reason; -r past the ranks refused an all_reduce, which has no root; --trace made its folder before a later
    check refused the run."""
    assert main(["bench", "--op", "prod", "--ranks", "1"]) == 2
    assert "the reduction is -o/--redop (nccl-tests' --op)" in capsys.readouterr().err
    assert main(["bench", "-T", "0", "--ranks", "1"]) == 2
    err = capsys.readouterr().err
    assert "-T 0 must be > 0 seconds" in err and "every wait here has a timeout" in err      # 0 as typed (was 0.0)
    trace = tmp_path / "t"
    assert main(["bench", "--trace", str(trace), "--profile", "0", "--ranks", "1"]) == 2
    assert "records nothing" in capsys.readouterr().err and not trace.exists()
    assert main(["bench", "--op", "broadcast", "-r", "2", "--ranks", "2"]) == 2
    assert "-r 2 must be a rank, 0..1" in capsys.readouterr().err
    out = tmp_path / "r.json"
    assert main(["bench", "-r", "2", "-b", "1.5K", "-e", "1.5K", "-n", "1", "-w", "0", "--ranks", "2",
                 "--json", str(out)]) == 0
    assert [(r["size"], r["root"], r["wrong"]) for r in json.load(open(out))["rows"]] == [(1536, -1, 0)]


def test_overhead_of_kernel_step_refuses_a_mask_from_the_environment_without_it(monkeypatch, capsys):
    """Only --profile's mask was checked: SLICETRACE_PROFILE_EVENT_MASK=70 compared two identical sides."""
    monkeypatch.setenv("SLICETRACE_PROFILE_EVENT_MASK", "70")
    assert main(["bench", "--overhead", "--overhead-of", "kernel_step", "--ranks", "1"]) == 2
    assert "SLICETRACE_PROFILE_EVENT_MASK=70 has no KernelStep bit (65536)" in capsys.readouterr().err


def test_overhead_alone_times_the_main_columns_unprofiled_and_float16_overflow_warns_nothing(capfd):
    """--overhead loaded the example plugin for the whole run, so its main columns became the profiled times;
    a float16 sum that overflows to inf (in place, re-reduced every iteration) printed numpy warnings per rank."""
    assert main(["bench", "--overhead", "--rounds", "2", "-d", "half", "--inplace", "-b", "64K", "-e", "64K", "-n",
                 "30", "-w", "2", "--ranks", "2"]) == 0
    out, err = capfd.readouterr()
    assert "profiling off" in out.splitlines()[0] and "RuntimeWarning" not in err + out


def test_output_paths_that_cannot_be_written_fail_before_the_run(tmp_path, capsys):
    """A sweep's results are not lost at its end: output paths are checked first, with the flag named."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    for argv, want in (
        (["bench", "--json", str(tmp_path / "no" / "r.json")], f"--json '{tmp_path / 'no' / 'r.json'}': cannot write"),
        (["bench", "--json", str(tmp_path)], f"--json '{tmp_path}' is a folder"),
        (["bench", "--trace", str(afile / "tr")], f"--trace '{afile / 'tr'}': cannot create the folder"),
        (["bench", "--trace", str(afile)], f"--trace '{afile}' is a file, not a folder; give a folder name"),
        (["report", str(afile), "--top", "-1"], "--top -1 must be >= 0"),
        (["report", str(afile), "--json", str(tmp_path / "no" / "r.json")], "cannot write a file there"),
    ):
        assert main(argv) == 2, argv
        assert want in capsys.readouterr().err, argv
    assert not (tmp_path / "no").exists()


def test_a_bad_plugin_spec_is_one_line_before_any_rank_starts(monkeypatch, capsys):
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "nosuch")
    assert main(["bench", "-b", "1K", "-e", "1K", "--profile"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slicetrace: error: SLICETRACE_PROFILER_PLUGIN='nosuch' (item 1 of 2 in 'nosuch,example') "
                          "is not a built-in") and "Traceback" not in err     # --profile added example


def test_report_on_traces_without_slices_says_what_to_record(tmp_path, capsys):
    f = tmp_path / "t_1_0.json"
    args = {"SeqNum": 0, "CommHash": 1, "Rank": 0, "Count": 1, "Datatype": "ncclFloat32", "Algorithm": "RING",
            "Protocol": "SIMPLE", "nChannels": 1}
    f.write_text(json.dumps({"traceEvents": [{"name": "AllReduce", "ph": "b", "cat": "COLL", "id": 1, "ts": 0,
                                              "pid": 0, "tid": 0, "args": args}]}))
    assert main(["report", str(f)]) == 2
    err = capsys.readouterr().err
    assert "no KernelStep or KernelCh events to analyse (1 events in all)" in err and "65606" in err


@pytest.mark.timeout(120)        # a check that let a bad value through would run the bench instead
def test_bad_values_name_the_flag_the_value_and_what_is_accepted(capsys):
    """Rejected before any rank starts: nothing is launched for a flag that cannot work."""
    for argv, want in (
        (["-o", "bogus"], "-o 'bogus' is not one of ('sum', 'prod', 'min', 'max', 'avg')"),
        (["--ranks", "0"], "--ranks 0 must be >= 1"),
        (["--channels", "-1"], "--channels -1 must be in 0..64 (0: the backend chooses)"),
        (["--channels", "65"], "--channels 65 must be in 0..64 (0: the backend chooses)"),
        (["--backend", "gpu"], "--backend 'gpu' is not one of ('cpu', 'cuda')"),
        (["--backend", "null"], "--backend 'null' is not one of ('cpu', 'cuda') (null is the tests' backend: it "
                                "moves no data)"),
        (["--seed", "-1"], "--seed -1 must be >= 0"),
        (["-r", "5", "--op", "broadcast"], "-r 5 must be a rank, 0..1 (the run has 2 rank(s): --ranks)"),
        (["-r", "-1", "--ranks", "3", "--op", "reduce"], "-r -1 must be a rank, 0..2 (the run has 3 rank(s): --ranks)"),
        (["-n", "0"], "-n 0 must be >= 1"),
        (["-N", "-1"], "-N -1 must be >= 0 (0: until interrupted)"),
        (["-T", "0"], "-T 0 must be > 0 seconds"),
        (["-N", "0", "--json", "r.json"], "--json 'r.json' with -N 0: a run without end never writes it"),
        (["--compare", "nccl"], "--compare nccl runs beside --backend cuda, not the default backend 'cpu'"),
        (["--backend", "cuda", "--compare", "gloo"], "--compare gloo runs beside --backend cpu, not --backend cuda"),
    ):
        assert main(["bench", *argv]) == 2, argv
        assert want in capsys.readouterr().err, argv
    with pytest.raises(SystemExit) as e:                 # argparse's own error exit for a malformed mask
        main(["bench", "--profile", "abc"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "'abc' is not an event mask: " in err and "; give an integer, e.g. 65606 or 0x10046" in err
    assert "'abc' is not an event type, which are GROUP, COLL, P2P" in err
    for bad in ("5", "-1"):                              # -c is a switch: 0 or 1
        with pytest.raises(SystemExit) as e:
            main(["bench", "-c", bad])
        assert e.value.code == 2
        assert f"argument -c/--check: invalid choice: {bad} (choose from 0, 1)" in capsys.readouterr().err


def test_profile_mask_takes_event_type_names():
    from slicetrace.cli.main import _mask
    assert _mask("Coll|P2p|KernelCh|KernelStep") == _mask("coll,p2p,kernel_ch,kernel_step") == 65606
    assert _mask("0x10046") == _mask("65606") == 65606
    assert _mask("KERNEL_STEP") == 1 << 16 and _mask("coll") == 2
    import argparse
    with pytest.raises(argparse.ArgumentTypeError, match="'KernelStp' is not an event type, which are GROUP"):
        _mask("Coll|KernelStp")


def test_overhead_reports_the_median_inside_the_rounds_spread(tmp_path, capfd):
    out = tmp_path / "o.json"
    assert main(["bench", "-b", "64K", "-e", "64K", "-n", "5", "-w", "1", "-c", "0", "--overhead", "--rounds", "5",
                 "--json", str(out)]) == 0
    row, = json.load(open(out))["rows"]
    q1, q3 = row["overhead_iqr_pct"]
    lo, hi = row["overhead_ci95_pct"]
    assert q1 <= row["overhead_pct"] <= q3 and row["overhead_of"] == "profiling"
    assert lo <= row["overhead_pct"] <= hi
    # 5 rounds make 3 ratios: the interval is the whole sample, which covers the median 75 % of the time, and says so
    assert row["overhead_ratios"] == 3 and row["overhead_ci_coverage_pct"] == 75.0
    text = capfd.readouterr().out                   # the header names the interval the rows print (was 95 %)
    assert "overhead [75% CI of the median]" in text and "95% CI" not in text, text
    assert f"[{lo:.1f}, {hi:.1f}] (3 ratios; --rounds 12 for 95%)" in text, text
    assert row["profiled_us"] > 0 and row["unprofiled_us"] > 0


def test_rank_failures_of_our_own_kinds_read_as_one_line_per_rank_and_bugs_keep_their_tracebacks():
    from slicetrace.cli.main import _brief
    from slicetrace.errors import LaunchError
    tb = "Traceback (most recent call last):\n  File ...\n"
    ours = LaunchError("rank 0 failed: ...", {1: f"PeerError: rank 0 closed its communicator\n{tb}",
                                              0: f"CommTimeoutError: rank 0 waited 60s (timeout_s)\n{tb}"})
    assert _brief(ours) == ("rank 0: CommTimeoutError: rank 0 waited 60s (timeout_s); "
                            "rank 1: PeerError: rank 0 closed its communicator")
    bug = LaunchError("rank 0 failed: KeyError: 'x'\n" + tb, {0: f"KeyError: 'x'\n{tb}", 1: f"PeerError: gone\n{tb}"})
    assert _brief(bug) == str(bug) and "Traceback" in _brief(bug)


def test_in_place_runs_every_collective_that_has_an_in_place_form_and_checks_it(tmp_path, capfd):
    out = tmp_path / "ip.json"
    assert main(["bench", "-b", "12", "-e", "96K", "-f", "8", "-n", "2", "-w", "1", "--op", "all", "--inplace",
                 "--ranks", "3", "-d", "int32", "-o", "max", "-r", "2", "--json", str(out)]) == 0
    rows = json.load(open(out))["rows"]
    assert len(rows) == 7 * 5 and all(r["wrong"] == 0 for r in rows)
    for r in rows:
        assert r["inplace"] == (r["op"] not in ("all_to_all", "send_recv"))
        assert r["redop"] == ("max" if r["op"] in ("all_reduce", "reduce", "reduce_scatter") else "none")
    text = capfd.readouterr().out
    assert ", in place" in text and "# all_to_all (out of place: no in-place form)" in text


def test_all_types_and_reductions_as_nccl_tests_runs_them(tmp_path):
    from slicetrace.cli.sweep import all_dtypes
    out = tmp_path / "all.json"
    assert main(["bench", "-d", "all", "-o", "all", "--op", "all_reduce,broadcast", "-b", "40", "-e", "40", "-n",
                 "1", "-w", "0", "--ranks", "3", "--json", str(out)]) == 0
    rows = json.load(open(out))["rows"]
    types = all_dtypes()
    assert {"int8", "uint8", "int32", "int64", "float16", "float32", "float64"} <= set(types)
    assert sorted((r["type"], r["redop"]) for r in rows if r["op"] == "all_reduce") == sorted(
        (str(np.dtype(t)) if t != "bfloat16" else "bfloat16", o) for t in types
        for o in ("sum", "prod", "min", "max", "avg"))
    assert [r["redop"] for r in rows if r["op"] == "broadcast"] == ["none"] * len(types)   # once per type
    assert all(r["wrong"] == 0 for r in rows)


def test_cycles_repeat_the_sweep_and_the_timeout_reaches_the_ranks(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("SLICETRACE_PROFILE_OP_SAMPLE_RATE", "3")     # the JSON keeps every effective setting
    out = tmp_path / "r.json"
    assert main(["bench", "-b", "4K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1", "-N", "2", "-T", "7",
                 "-a", "1", "--json", str(out)]) == 0
    doc = json.load(open(out))
    assert [(r["cycle"], r["size"]) for r in doc["rows"]] == [(0, 4096), (0, 16384), (1, 4096), (1, 16384)]
    assert all(r["wrong"] == 0 for r in doc["rows"]) and doc["settings"]["timeout_s"] == 7.0
    assert doc["settings"]["op_sample_rate"] == 3 and doc["settings"]["buffsize"] == 1 << 22     # typed, not text
    assert doc["settings"]["profiler_plugin"] is None
    text = capfd.readouterr().out
    assert "# cycle 0" in text and "# cycle 1" in text and "time: the mean over ranks of the timings" in text


def test_a_reader_that_leaves_early_stops_the_table_not_the_run(tmp_path):
    """`slicetrace bench ... | head -1`: no broken-pipe tracebacks; the sweep ends and its JSON is complete."""
    import os
    import subprocess
    import sys
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-m", "slicetrace.cli.main", "bench", "-b", "4K", "-e", "1M", "-f", "4",
                          "-n", "3", "-w", "1", "--json", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    try:
        assert p.stdout.readline().startswith(b"# slicetrace bench")
        p.stdout.close()                                  # the reader is gone
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 0, err.decode()
    assert b"Traceback" not in err and b"BrokenPipe" not in err
    assert [r["size"] for r in json.load(open(out))["rows"]] == [4096, 16384, 65536, 262144, 1048576]


def _trace_files(folder, comm):
    """A small two-rank run as the example plugin writes it: one AllReduce, one send and one receive per rank."""
    folder.mkdir(exist_ok=True)
    for rank in (0, 1):
        steps = [{"name": "KernelStep", "cat": "GPU", "ph": "X", "pid": rank, "tid": 1, "ts": 1.0 + s, "dur": 2.0,
                  "args": {"Channel": 0, "IsSend": s, "Peer": 1 - rank, "Step": 0, "Size": 4096, "WaitGpuClk": 0,
                           "StartGpuClk": 500, "StopGpuClk": 2000, "SeqNum": 0, "ParentId": 1}} for s in (1, 0)]
        recs = [{"name": "AllReduce", "cat": "COLL", "ph": "b", "id": 1, "pid": rank, "tid": 0, "ts": 0.0,
                 "args": {"SeqNum": 0, "CommHash": comm, "Rank": rank, "Count": 1024, "Datatype": "float32",
                          "Algorithm": "RING", "Protocol": "SIMPLE", "nChannels": 1, "ParentId": -1}},
                *steps, {"name": "AllReduce", "cat": "COLL", "ph": "e", "id": 1, "pid": rank, "tid": 0, "ts": 9.0},
                {"name": "slicetrace_counters", "ph": "M", "pid": rank, "tid": 0, "args": {"overrun": rank}}]
        (folder / f"trace_{comm}_{rank}.json").write_text(json.dumps(recs))
    return str(folder / "trace")


@pytest.mark.parametrize("plugins", ["none", "linkstats"])
def test_trace_writes_through_the_example_plugin_whatever_the_environment_lists(tmp_path, capfd, monkeypatch,
                                                                                plugins):
    """SLICETRACE_PROFILER_PLUGIN=none or =linkstats used to leave --trace's folder empty while it named files."""
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", plugins)
    tr = tmp_path / "trA"
    assert main(["bench", "-b", "8", "-e", "64", "-n", "1", "-w", "0", "--trace", str(tr)]) == 0
    files = sorted(glob.glob(str(tr / "trace_*_*.json")))
    assert len(files) == 2 and all(check_trace(f) == [] for f in files)
    run = files[0].rsplit("_", 1)[0]
    out = capfd.readouterr().out
    assert "profiling on" in out
    assert f"# traces: {run}_<rank>.json (2 file(s);" in out and f"slicetrace report {run})" in out


def test_the_example_plugin_joins_the_environments_list_once():
    from slicetrace.cli.benchflags import with_example as _with_example
    assert _with_example(None) == _with_example("none") == _with_example(" None ") == "example"
    assert _with_example("linkstats") == "linkstats,example"
    assert _with_example("example,linkstats") == "example,linkstats"
    assert _with_example("slicetrace.sinks.chrome:ChromePlugin") == "slicetrace.sinks.chrome:ChromePlugin"


def test_the_trace_line_names_only_files_the_run_wrote(tmp_path):
    from slicetrace.cli.outputs import dump_files, trace_note
    from slicetrace.errors import SliceTraceError
    old = _trace_files(tmp_path / "tr", 7)
    before = dump_files(str(tmp_path / "tr"))
    with pytest.raises(SliceTraceError, match=rf"--trace '{tmp_path / 'tr'}': the run wrote no trace file there; "
                                              r"was profiling off\? \(profiler plugins 'example', event mask 0:"):
        trace_note(str(tmp_path / "tr"), before, "example", 0)
    _trace_files(tmp_path / "tr", 8)
    note = trace_note(str(tmp_path / "tr"), before, "example", None)
    assert note.startswith(f"# traces: {old[:-len('trace')]}trace_8_<rank>.json (2 file(s);")


def test_outputs_that_only_root_seems_able_to_write_fail_before_any_work(tmp_path, capfd):
    """os.access says yes to root for /proc: the file is opened first, so nothing runs and nothing is printed."""
    prefix = _trace_files(tmp_path / "tr", 5)
    for argv, flag in ((["report", prefix, "--csv", "/proc/x.csv"], "--csv '/proc/x.csv'"),
                       (["report", prefix, "--json", "/proc/x.json"], "--json '/proc/x.json'"),
                       (["bench", "-b", "8", "-e", "8", "-n", "1", "-w", "0", "--json", "/proc/x.json"],
                        "--json '/proc/x.json'")):
        assert main(argv) == 2, argv
        out, err = capfd.readouterr()
        assert out == ""
        assert err == f"slicetrace: error: {flag}: cannot write a file there (No such file or directory)\n"
    assert main(["report", prefix, "--csv", str(tmp_path / "s.csv"), "--json", str(tmp_path / "r.json")]) == 0
    assert (tmp_path / "s.csv").read_text().startswith("rank,channel,is_send,peer,step,size,wait_ns,ready_ns,done_ns,"
                                                       "seq_number,op,wait_us,transfer_us,gbps\n")
    assert json.load(open(tmp_path / "r.json"))["links"]


def test_report_refuses_two_runs_in_one_folder_and_reports_either_by_its_prefix(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _trace_files(tmp_path / "trC", 11)
    _trace_files(tmp_path / "trC", 22)
    assert main(["report", "trC"]) == 2
    err = capsys.readouterr().err
    assert "the trace files hold 2 communicators (runs)" in err and "Traceback" not in err
    assert "commHash 11 (2 file(s)): slicetrace report trC/trace_11;" in err and "slicetrace report trC/trace_22" in err
    assert main(["report", "trC/trace_22", "--json", "r.json"]) == 0
    rep = json.load(open("r.json"))
    assert [(ln["src"], ln["dst"], ln["slices"]) for ln in rep["links"]] == [(0, 1, 1), (1, 0, 1)]
    assert set(rep["counters"]) == {"0", "1"} and rep["counters"]["1"] == {"overrun": 1}


def test_report_names_the_file_record_and_field_of_a_malformed_record(tmp_path, capsys):
    for rec, want in (({"name": "KernelStep", "ph": "X", "ts": 1, "args": {}}, "'args' lacks ['Channel'"),
                      ({"name": "KernelStep", "ph": "X"}, "has no 'ts'"),
                      ({"name": "KernelStep", "ph": "X", "ts": "abc"}, "'ts' must be a finite number, not 'abc'")):
        path = tmp_path / "t_1_0.json"
        path.write_text(json.dumps([rec]))
        assert main(["report", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"slicetrace: error: trace file {str(path)!r}, record 0 (KernelStep): {want}"), err


def test_a_size_past_the_hosts_memory_is_one_line_before_any_rank_starts(capfd):
    """1000000G is past any host's memory: refused up front, one line naming -e as typed (it was one line per rank,
    after the launch; the ranks' own check, bench._memory, stays for what the launcher cannot see)."""
    assert main(["bench", "-b", "1000000G", "-e", "1000000G", "-n", "1", "-w", "0", "-c", "0"]) == 2
    err = capfd.readouterr().err
    assert err.startswith("slicetrace: error: -e 1000000G (the sweep's largest size: 1,073,741,824,000,000 B): "
                          "all_reduce of 1,073,741,824,000,000 B (float32) needs about 2,147,483,648,000,000 B per "
                          "rank (2,147,483,648,000,000 for its buffers), 4,294,967,296,000,000 B over 2 ranks, more "
                          "than the ")
    assert err.rstrip().endswith("give a smaller -e, and a smaller -b than 1000000G")
    assert "rank 0" not in err and "Traceback" not in err and "MemoryError" not in err


def test_config_refuses_a_plugin_that_would_not_load(monkeypatch, capsys):
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "bogus")
    assert main(["config"]) == 2
    assert ("slicetrace: error: SLICETRACE_PROFILER_PLUGIN='bogus' is not a built-in or entry point name"
            in capsys.readouterr().err)


def test_compare_without_torch_is_refused_before_any_rank_starts(capsys):
    import importlib.util
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here: the refusal cannot happen")
    assert main(["bench", "--compare", "gloo", "-b", "4K", "-e", "4K"]) == 2
    err = capsys.readouterr().err
    assert "--compare gloo needs torch installed" in err and "rank 0" not in err     # not relayed from the ranks


def test_report_on_a_one_rank_run_says_why_there_are_no_slices(tmp_path, capsys):
    assert main(["bench", "--ranks", "1", "-b", "64K", "-e", "64K", "-n", "2", "-w", "1", "--trace",
                 str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path)]) == 2
    assert "a 1-rank run moves no data between ranks, so it has no slices" in capsys.readouterr().err


def test_count_column_is_nccl_tests_and_the_json_keeps_the_bench_flags(tmp_path, capsys):
    """nccl-tests prints the per-rank count for all_gather and reduce_scatter and the per-peer count for
    all_to_all (before: the total); --json records -a and the other flags, without which its times cannot be read."""
    out = tmp_path / "b.json"
    assert main(["bench", "--op", "all_gather,reduce_scatter,all_to_all,all_reduce", "--ranks", "2", "-b", "256",
                 "-e", "256", "-n", "2", "-w", "1", "-a", "1", "--json", str(out)]) == 0
    capsys.readouterr()
    d = json.loads(out.read_text())
    assert {r["op"]: (r["size"], r["count"]) for r in d["rows"]} == {
        "all_gather": (256, 32), "reduce_scatter": (256, 32), "all_to_all": (256, 32), "all_reduce": (256, 64)}
    assert d["bench"]["average"] == 1 and d["bench"]["iters"] == 2 and d["bench"]["warmup_iters"] == 1


@pytest.mark.parametrize("mask", ["0", "1048576"])
def test_a_trace_with_event_mask_0_is_refused_before_the_run(tmp_path, capsys, monkeypatch, mask):
    """It printed "profiling on" and named trace files that held only metadata, which report then refused; a mask
    of bits no event type has (1 << 20) did so still."""
    monkeypatch.setenv("SLICETRACE_PROFILE_EVENT_MASK", mask)
    assert main(["bench", "-b", "4K", "-e", "4K", "--trace", str(tmp_path / "t")]) == 2
    assert f"with event mask {mask} (SLICETRACE_PROFILE_EVENT_MASK or --profile) records nothing: it has no event " \
        f"type's bit (0x1ffff)" in " ".join(capsys.readouterr().err.split())
    assert not list((tmp_path / "t").glob("*.json"))


def test_all_types_say_which_type_is_left_out_and_why(monkeypatch):
    from slicetrace.cli import sweep
    from slicetrace.errors import UsageError

    def no_bf16(name, backend):
        if name == "bfloat16":
            raise UsageError("-d bfloat16 needs the ml_dtypes package on cpu")
        return name
    monkeypatch.setattr(sweep, "bench_dtype", no_bf16)
    why: list[str] = []
    assert "bfloat16" not in sweep.all_dtypes("cpu", why)
    assert why == ["uint32, uint64 left out: slicetrace's backends have no unsigned 32- or 64-bit types",
                   "bfloat16 left out: -d bfloat16 needs the ml_dtypes package on cpu"]


def test_config_into_a_pipe_that_closes_early_is_not_an_error():
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-m", "slicetrace.cli.main", "config"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()                          # gone before the first line: `| head -0`, at once
    try:
        err = p.stderr.read().decode()
        assert p.wait(timeout=60) == 0 and err == ""
    finally:
        p.kill()
        p.wait()


@pytest.mark.timeout(120)        # a root past the last rank that got through would wait for a rank that is not there
def test_a_root_equal_to_the_rank_count_is_refused(capsys):
    for argv, want in ((["-r", "2", "--op", "broadcast"], "-r 2 must be a rank, 0..1 (the run has 2 rank(s): --ranks)"),
                       (["-r", "3", "--ranks", "3", "--op", "all"], "-r 3 must be a rank, 0..2 (the run has 3 rank(s): --ranks)")):
        assert main(["bench", *argv]) == 2, argv
        assert want in capsys.readouterr().err, argv


def test_the_json_document_records_the_rank_count_the_settings_and_the_flags(tmp_path, capsys):
    """Without --ranks the run has 2 ranks (cpu): the document says 2, not the flag's None; the flags as given."""
    from dataclasses import fields

    from slicetrace.config import Settings
    out = tmp_path / "b.json"
    assert main(["bench", "-b", "256", "-e", "256", "-n", "1", "-w", "0", "--json", str(out)]) == 0
    capsys.readouterr()
    d = json.loads(out.read_text())
    assert set(d) == {"settings", "ranks", "bench", "env", "rows", "summary", "profiling", "complete"}
    assert d["bench"]["profile"] is None and d["profiling"] == {"plugins": [], "event_mask": None,
                                                                "unloaded_plugins": [], "main_profiled": False}
    assert d["ranks"] == 2 and d["env"]["ranks"] == 2
    assert set(d["settings"]) == {f.name for f in fields(Settings)} and d["settings"]["backend"] == "cpu"
    assert d["bench"]["ranks"] is None and d["bench"]["iters"] == 1 and d["bench"]["warmup_iters"] == 0
    assert "cmd" not in d["bench"] and "func" not in d["bench"]


def test_unchecked_rows_have_null_wrong_counts_and_zero_byte_sizes_make_one_row(tmp_path, capfd):
    """-c 0: the JSON said "wrong": -1, a count no run can have; -b 0 made three 0-element float32 rows (0, 1, 2 B)."""
    out = tmp_path / "r.json"
    assert main(["bench", "-b", "0", "-e", "16", "-n", "1", "-w", "0", "-c", "0", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(r["size"], r["count"], r["wrong"]) for r in doc["rows"]] == [(0, 0, None), (4, 1, None), (8, 2, None),
                                                                         (16, 4, None)]
    assert doc["summary"]["out_of_bounds"] is None
    table = [ln.split() for ln in capfd.readouterr().out.splitlines() if not ln.startswith("#")]
    assert [row[0] for row in table] == ["0", "4", "8", "16"] and all(row[-1] == "N/A" for row in table)


def test_convert_refuses_to_write_over_one_of_its_inputs(tmp_path, capsys):
    prefix = _trace_files(tmp_path / "tr", 5)
    victim = tmp_path / "tr" / "trace_5_0.json"
    before = victim.read_bytes()
    for target in (victim, tmp_path / "tr" / "." / "trace_5_0.json"):
        assert main(["convert", str(tmp_path / "tr"), "-o", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"slicetrace: error: -o '{target}' is one of the input trace files") and "\n" == err[-1]
        assert victim.read_bytes() == before
    assert main(["convert", prefix, "-o", str(tmp_path / "run.pftrace")]) == 0


def test_report_refuses_to_write_over_one_of_its_inputs(tmp_path, capsys):
    """report --json / --csv wrote over a trace file given as input (exit 0, that rank's trace gone); --json and
    --csv naming one file let the CSV replace the JSON."""
    _trace_files(tmp_path / "tr", 5)
    victim = tmp_path / "tr" / "trace_5_1.json"
    before = victim.read_bytes()
    for flag in ("--json", "--csv"):
        assert main(["report", str(tmp_path / "tr"), flag, str(victim)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"slicetrace: error: {flag} '{victim}' is one of the input trace files")
        assert victim.read_bytes() == before
    both = str(tmp_path / "r.out")
    assert main(["report", str(tmp_path / "tr"), "--json", both, "--csv", both]) == 2
    assert "are one file: the CSV would replace the JSON" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["report", "TRACES"], ["config"]])
def test_output_to_a_full_device_is_one_line_and_exit_2(tmp_path, argv):
    """`slicetrace report DIR > /dev/full` ended in a rich traceback of OSError ENOSPC."""
    import os
    import subprocess
    import sys
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    argv = [a.replace("TRACES", _trace_files(tmp_path / "tr", 5)) for a in argv]
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "slicetrace.cli.main", *argv], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert p.returncode == 2, p.stderr
    assert p.stderr == "slicetrace: error: cannot write the output (No space left on device)\n"


@pytest.mark.timeout(120)
def test_a_bench_table_to_a_full_device_is_one_line_per_rank_and_exit_2():
    import os
    import subprocess
    import sys
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "slicetrace.cli.main", "bench", "-b", "4K", "-e", "4K", "-n", "1",
                            "-w", "0"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=100,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("slicetrace: error: rank 0: UsageError: cannot write the output (No space left on "
                               "device)") and "Traceback" not in p.stderr and p.stderr.count("\n") == 1


def test_a_bare_profile_flag_keeps_the_variables_mask(tmp_path, monkeypatch):
    """`--profile` without a mask meant 65606 and replaced SLICETRACE_PROFILE_EVENT_MASK=Coll without a word."""
    monkeypatch.setenv("SLICETRACE_PROFILE_EVENT_MASK", "Coll")
    assert main(["bench", "--profile", "--trace", str(tmp_path), "-b", "4K", "-e", "4K", "-n", "1", "-w", "0",
                 "--ranks", "2"]) == 0
    heads = [json.load(open(f))[0] for f in glob.glob(str(tmp_path / "trace_*.json"))]
    assert len(heads) == 2 and all(h["args"]["EventMask"] == 2 for h in heads)


@pytest.mark.parametrize("env_mask,mask", [(None, 65606), ("Coll", 2)])
def test_the_json_says_what_profiling_a_bare_profile_flag_ran(tmp_path, monkeypatch, env_mask, mask):
    """A bare --profile wrote "profile": null, as a run without --profile did; the mask it ran with (the
    variable's, else the example plugin's default) was in neither the flags nor (unset) the settings."""
    if env_mask is None:
        monkeypatch.delenv("SLICETRACE_PROFILE_EVENT_MASK", raising=False)
    else:
        monkeypatch.setenv("SLICETRACE_PROFILE_EVENT_MASK", env_mask)
    out = tmp_path / "b.json"
    assert main(["bench", "--profile", "--trace", str(tmp_path / "t"), "-b", "4K", "-e", "4K", "-n", "1", "-w", "0",
                 "--ranks", "2", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["bench"]["profile"] == mask
    assert d["profiling"] == {"plugins": ["example"], "event_mask": mask, "unloaded_plugins": [],
                              "main_profiled": True}


def test_a_dump_file_from_the_environment_is_checked_first_and_named(tmp_path, monkeypatch, capsys):
    """Only --trace's folder was checked before the sweep and its files named: SLICETRACE_PROFILE_DUMP_FILE wrote
    its files without a word, and an unwritable prefix failed in every rank after they started."""
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "example")
    monkeypatch.setenv("SLICETRACE_PROFILE_DUMP_FILE", str(tmp_path / "dd" / "x"))
    assert main(["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--ranks", "2"]) == 0
    note = capsys.readouterr().out.splitlines()[-1]
    assert note.startswith(f"# traces: {tmp_path}/dd/x_") and "(2 file(s);" in note
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SLICETRACE_PROFILE_DUMP_FILE", str(tmp_path / "file" / "x"))
    assert main(["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--ranks", "2"]) == 2
    assert "SLICETRACE_PROFILE_DUMP_FILE" in capsys.readouterr().err


def test_a_dash_writes_reports_json_csv_or_converts_trace_to_stdout_and_the_text_to_stderr(tmp_path, capsys):
    """`report --json -` wrote a file named '-' (and `--csv -` then replaced it); '-' is now standard output, as
    Unix tools take it, with the human text on stderr so a pipe gets the file alone."""
    import csv
    import io
    import os
    import subprocess
    import sys
    prefix = _trace_files(tmp_path / "tr", 7)
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src)}

    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "slicetrace.cli.main", *argv], capture_output=True,
                              timeout=120, env=env, cwd=tmp_path)
    assert main(["report", prefix, "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "s.csv")]) == 0
    p = cli("report", prefix, "--json", "-")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == json.load(open(tmp_path / "r.json"))
    assert b"links" in p.stderr
    p = cli("report", prefix, "--csv", "-", "--json", str(tmp_path / "r2.json"))
    assert p.returncode == 0, p.stderr
    assert p.stdout == (tmp_path / "s.csv").read_bytes()
    assert len(list(csv.DictReader(io.StringIO(p.stdout.decode())))) == 4
    assert b"# 4 KernelStep rows: standard output" in p.stderr
    assert main(["convert", prefix, "-o", str(tmp_path / "run.pftrace")]) == 0
    p = cli("convert", prefix, "-o", "-")
    assert p.returncode == 0, p.stderr
    assert p.stdout == (tmp_path / "run.pftrace").read_bytes() and b"# standard output: 2 rank file(s)" in p.stderr
    assert not (tmp_path / "-").exists()
    capsys.readouterr()
    assert main(["report", prefix, "--json", "-", "--csv", "-"]) == 2
    assert "standard output can carry one of them" in capsys.readouterr().err
    assert main(["bench", "-b", "4K", "-e", "4K", "--json", "-"]) == 2
    assert "--json '-': this command prints its table on standard output" in capsys.readouterr().err
    assert not (tmp_path / "-").exists() and not os.path.exists("-")


@pytest.mark.parametrize("argv", [["report", "--json", "-"], ["report", "--csv", "-"], ["convert", "-o", "-"],
                                  ["report", "--csv", "/dev/stdout"]])
def test_a_dash_output_into_a_pipe_that_closes_early_is_not_an_error(tmp_path, argv):
    """`report --csv - | head`: the closed pipe was taken for the file's own write failing ("--csv '-': cannot
    write the file (Broken pipe)", exit 2); a reader gone from standard output is not an error (as `config | head`)."""
    import os
    import subprocess
    import sys
    prefix = _trace_files(tmp_path / "tr", 7)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.Popen([sys.executable, "-m", "slicetrace.cli.main", argv[0], prefix, *argv[1:]],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    p.stdout.close()                          # gone before the first byte: `| head -0`
    try:
        err = p.stderr.read().decode()
        assert p.wait(timeout=120) == 0, err
        assert "error" not in err and "Traceback" not in err, err
    finally:
        p.kill()
        p.wait()
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("argv", [["report", "--json"], ["report", "--csv"], ["convert", "-o"]])
def test_an_output_file_whose_write_fails_is_one_line_naming_its_flag(tmp_path, capsys, argv):
    """A write that fails after the up-front check (a full disk) is a UsageError naming the flag and the file."""
    import os
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    prefix = _trace_files(tmp_path / "tr", 7)
    assert main([argv[0], prefix, argv[1], "/dev/full"]) == 2
    assert capsys.readouterr().err == f"slicetrace: error: {argv[1]} '/dev/full': cannot write the file (No space " \
        "left on device)\n"


def test_a_bench_run_that_fails_part_way_writes_its_rows_so_far_exits_1_and_names_its_traces(tmp_path, capfd,
                                                                                           monkeypatch):
    """Before, --json wrote nothing when the run failed, the `# traces:` line was missing though the traces were
    written, and the exit status was 2, as for a bad flag."""
    monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "tests.helpers.plugins:Rank1DiesAtColl12")
    out = tmp_path / "r.json"
    rc = main(["bench", "-b", "4K", "-e", "1M", "-n", "2", "-w", "1", "--trace", str(tmp_path / "tr"),
               "--json", str(out), "-T", "10"])
    text, err = capfd.readouterr()
    assert rc == 1, err
    doc = json.load(open(out))
    assert doc["complete"] is False and doc["incomplete"].startswith("failed: rank 1 died with exit "
                                                                      "code 3"), doc["incomplete"]
    assert 1 <= len(doc["rows"]) < 9 and [r["size"] for r in doc["rows"]] == [4096 << i for i in range(len(doc["rows"]))]
    note = text.split("# traces: ", 1)[1]
    assert note.startswith(str(tmp_path / "tr")) and "(2 file(s), cut short when the run failed: " in note, note


def test_a_bench_run_that_completes_says_so_in_its_json(tmp_path):
    out = tmp_path / "r.json"
    assert main(["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--ranks", "1", "--json", str(out)]) == 0
    assert json.load(open(out))["complete"] is True


def test_bench_ranks_meet_after_rank_0_prints_before_their_next_op(monkeypatch):
    """Rank 0 prints each row while the other ranks went on to the next size: it came late to that size's first
    ops, and the trace of a healthy run named it a straggler. Every op after a printed row now waits for a barrier."""
    import slicetrace
    from slicetrace.cli import bench
    log: list[str] = []

    class Logged:
        def __init__(self, comm):
            self._comm = comm

        def __getattr__(self, name):
            v = getattr(self._comm, name)
            if name in ("barrier", "all_reduce", "all_gather", "broadcast"):
                log.append(name)
            return v
    monkeypatch.setattr(bench, "say", lambda text: log.append("row") if text[:1] != "#" else None)
    o = {"sizes": [4096, 8192], "ops": ["all_reduce", "all_gather", "broadcast"], "dtypes": ["float32"],
         "redops": ["sum"], "root": 0, "iters": 2, "warmup": 1, "check": True, "compare": None, "overhead": False,
         "main_unprofiled": False, "rounds": 12, "seed": 1, "inplace": False, "average": 3, "cycles": 1}
    with slicetrace.init(backend="cpu") as comm:
        rows, _ = bench.bench_rank(Logged(comm), o)
    assert len(rows) == 6 and log.count("row") == 6
    after = [log[i + 1] for i, x in enumerate(log[:-1]) if x == "row"]
    assert after == ["barrier"] * 5, log
