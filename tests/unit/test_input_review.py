"""Bad input found in review: each gets a clear error naming the parameter, its value and what is accepted, rather
than an out-of-memory kill, a raw OverflowError / ValueError / RecursionError / OSError, or a silent no-op."""
import json
import re
import threading

import numpy as np
import pytest

import slicetrace
from slicetrace.analyze.records import read_records, record_problem
from slicetrace.analyze.trace import load_files, run_ranks
from slicetrace.cli.main import main
from slicetrace.config import Settings
from slicetrace.errors import ConfigError, TraceFormatError, UsageError
from tests.unit.test_report import _rank_file


# ---- 1: rank counts past int32 are refused; absent ranks are counted, and listed up to 20 ----

def test_a_huge_nranks_is_refused_naming_it(tmp_path):
    """Before: accepted, and report built set(range(nRanks)): killed for memory."""
    f = tmp_path / "j_1_0.json"
    f.write_text('[{"name":"slicetrace_comm","ph":"M","pid":0,"args":{"nRanks":99999999999}}]')
    with pytest.raises(TraceFormatError, match=r"nRanks .*99999999999\): accepted one integer >= 1, .*at most 2147483647"):
        run_ranks([(str(f), json.loads(f.read_text()))])


def test_a_huge_rank_in_a_file_name_is_refused_naming_the_file(tmp_path):
    """Before: the highest rank in the names + 1 was the run's rank count, 10**11 here."""
    (tmp_path / "j_1_0.json").write_text('[{"name":"x","ph":"M","pid":0}]')
    big = tmp_path / "j_1_99999999999.json"
    big.write_text('[{"name":"x","ph":"M","pid":1}]')
    with pytest.raises(TraceFormatError, match=r"j_1_99999999999\.json'.*99999999999, is not one: accepted "
                                               r"0\.\.2147483647"):
        load_files([str(tmp_path / "j_1_0.json")])


def test_many_absent_ranks_are_counted_and_the_first_20_listed(tmp_path, capsys):
    """Before: every absent rank was listed (99 here; billions for a large nRanks)."""
    f = str(_rank_file(tmp_path, 0, 100))
    assert main(["report", f]) == 2
    first = str(list(range(1, 21)))
    assert f"hold no records of rank(s) {first} and 79 more;" in capsys.readouterr().err
    assert main(["report", f, "--partial"]) == 0
    assert f"# --partial: rank(s) {first} and 79 more of 100 absent" in capsys.readouterr().out


def test_the_int32_most_ranks_do_not_exhaust_memory(tmp_path, capsys):
    """Before: set(range(2**31 - 1)) (about 100 GB) for the absent ranks."""
    f = str(_rank_file(tmp_path, 0, 2**31 - 1))
    assert main(["report", f, "--partial"]) == 0
    assert "and 2,147,483,626 more of 2147483647 absent" in capsys.readouterr().out


# ---- 2: an empty output path is an error naming the flag, not a silent no-op ----

@pytest.mark.parametrize("flag", ["--json", "--csv"])
def test_report_refuses_an_empty_output_path(tmp_path, capsys, flag):
    f = str(_rank_file(tmp_path, 0, 2))
    assert main(["report", f, "--partial", flag, ""]) == 2
    assert f"slicetrace: error: {flag} '': an empty path names no file; give a file name" in capsys.readouterr().err


@pytest.mark.parametrize("flag, what", [("--trace", "folder"), ("--json", "file")])
def test_bench_refuses_an_empty_output_path_before_running(capfd, flag, what):
    """Before: the bench ran (--trace '' with profiling off) and wrote nothing, exit 0."""
    assert main(["bench", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0", "--ranks", "1", flag, ""]) == 2
    out, err = capfd.readouterr()
    assert f"slicetrace: error: {flag} '': an empty path names no {what}" in err and "busbw" not in out


def test_convert_refuses_an_empty_output_path(tmp_path, capsys):
    assert main(["convert", str(_rank_file(tmp_path, 0, 2)), "-o", ""]) == 2
    assert "slicetrace: error: -o '': an empty path names no file" in capsys.readouterr().err


# ---- 3: buffsize has an upper limit ----

def test_a_huge_buffsize_is_a_config_error():
    """Before: accepted, then a raw OverflowError from os.ftruncate at set-up."""
    assert Settings(buffsize=1 << 30).buffsize == 1 << 30
    with pytest.raises(ConfigError, match=r"^buffsize=1180591620717411303424 must be .*<= 1073741824 \(1G\)"):
        Settings(buffsize=1 << 70)
    with pytest.raises(ConfigError, match=r"^SLICETRACE_BUFFSIZE='99999999999999999999G': buffsize=\d+ must be "):
        Settings.from_env({"SLICETRACE_BUFFSIZE": "99999999999999999999G"})


# ---- 4: bench sizes past what can be allocated ----

def test_a_size_past_2_to_the_60_is_refused_naming_the_flag():
    """Before: accepted, and numpy's ValueError ('Maximum allowed dimension exceeded') came out raw on every rank."""
    from slicetrace.cli.sweep import parse_size
    assert parse_size("1073741824G", "-e") == 1 << 60
    with pytest.raises(UsageError, match=r"^-e='99999999999999G' is [\d,]+ bytes: accepted at most "
                                         r"1,152,921,504,606,846,976 \(2\*\*60\)"):
        parse_size("99999999999999G", "-e")


def test_numpy_refusing_a_size_is_a_usage_error_and_ours_pass_through():
    """Before: numpy's ValueError ('Maximum allowed dimension exceeded') came out raw on every rank."""
    from slicetrace.cli.bench import _memory
    o, f32 = {"sizes": [1024, 1 << 40], "check": False}, np.dtype(np.float32)
    with pytest.raises(UsageError, match=r"^-e 1099511627776: all_reduce of 1,099,511,627,776 B \(float32\)"):
        with _memory(o, "all_reduce", 1 << 40, f32, 2, 0):
            np.zeros(1 << 62, np.float32)
    with pytest.raises(UsageError, match=r"^mine$"):
        with _memory(o, "all_reduce", 1 << 40, f32, 2, 0):
            raise UsageError("mine")


def test_ranks_whose_shared_memory_cannot_fit_are_refused_before_spawning(capfd):
    """Before: --ranks 1000000 started a million processes, each failing to reserve its segment."""
    assert main(["bench", "-b", "1K", "-e", "1K", "--ranks", "1000000"]) == 2
    assert "slicetrace: error: --ranks 1000000: the cpu backend's shared memory would need about" in \
        capfd.readouterr().err


# ---- 5, 6, 13: launch() and init() arguments ----

def test_launch_refuses_fn_that_is_not_callable_before_spawning():
    """Before: the ranks were spawned and each failed with 'TypeError: 'int' object is not callable'."""
    with pytest.raises(UsageError, match=r"^fn=5 \(type int\) must be callable"):
        slicetrace.launch(5, 2)


def _noop(comm, *args):
    return comm.rank


def test_launch_names_the_argument_that_cannot_be_pickled():
    """Before: a raw 'TypeError: cannot pickle '_thread.lock' object' from Process.start."""
    with pytest.raises(UsageError, match=r"^args\[1\]=<unlocked _thread\.lock .* cannot be sent to the spawned ranks "
                                         r"\(pickle\): TypeError: cannot pickle"):
        slicetrace.launch(_noop, 2, 1, threading.Lock())


def test_multiprocessing_objects_pickled_at_spawn_are_not_refused():
    import multiprocessing

    from slicetrace.launch_checks import _check_picklable
    _check_picklable(_noop, (multiprocessing.get_context("spawn").Lock(), np.arange(3)))


def test_init_takes_numpy_integers():
    """Before: 'rank=np.int64(0) (type int64) must be an int', where numpy ints are accepted elsewhere."""
    c = slicetrace.init(rank=np.int64(0), world_size=np.int32(1), backend="null")
    try:
        assert (c.rank, c.world_size) == (0, 1) and type(c.rank) is int
    finally:
        c.close()


# ---- 7: the job string names shared-memory segments ----

@pytest.mark.parametrize("job", ["a/b", "x" * 300, ""])
def test_a_job_that_cannot_name_a_segment_is_refused(job):
    """Before: a raw OSError from shm_open ('a/b': no such file; 300 characters: name too long)."""
    with pytest.raises(UsageError, match=r"^job=.* must be a str of 1\.\.128 ASCII letters, digits and"):
        slicetrace.init(rank=0, world_size=1, job=job, backend="cpu")


def test_a_job_of_the_accepted_form_runs():
    c = slicetrace.init(rank=0, world_size=1, job="run-1.2:3_x", backend="cpu", buffsize=1 << 16)
    try:
        x = np.ones(4, np.float32)
        c.all_reduce(x)
        assert x.tolist() == [1.0] * 4
    finally:
        c.close()


# ---- 8, 9, 10: trace records the analyses cannot hold ----

@pytest.mark.parametrize("rec, want", [
    ({"ph": "X", "name": "KernelStep", "ts": 1e308, "dur": 1.0}, "'ts' is 1e+308: accepted -9223372036854774.."),
    ({"ph": "i", "name": "x", "ts": -1e300}, "'ts' is -1e+300: accepted -9223372036854774.."),
    ({"ph": "X", "name": "x", "ts": 9e15, "dur": 9e15}, "'dur' is 9000000000000000.0: accepted ts + dur <= "),
])
def test_a_time_whose_ns_do_not_fit_int64_is_named(rec, want):
    """Before: accepted, then OverflowError in report (kernel_chs) and convert (round(inf))."""
    assert (record_problem(rec, need_args=False) or "").startswith(want)


def test_report_and_convert_refuse_a_huge_timestamp(tmp_path, capsys):
    f = tmp_path / "j_1_0.json"
    f.write_text('[{"name":"KernelCh","ph":"b","cat":"GPU","id":1,"pid":0,"ts":1e308,'
                 '"args":{"Channel":0,"StartGpuClk":1,"StopGpuClk":2}}]')
    for argv in (["report", str(f)], ["convert", str(f), "-o", str(tmp_path / "o.pftrace")]):
        assert main(argv) == 2
        assert "record 0 (KernelCh): 'ts' is 1e+308: accepted" in capsys.readouterr().err


def test_a_counter_that_is_not_an_integer_is_named(tmp_path, capsys):
    """Before: report failed with a raw ValueError formatting '1' as a number."""
    rec = {"name": "slicetrace_counters", "ph": "M", "pid": 0, "args": {"plugin_unfinished_PROXY_CTRL": "1"}}
    assert record_problem(rec) == "'args.plugin_unfinished_PROXY_CTRL' must be an integer (a counter), not '1'"
    f = tmp_path / "j_1_0.json"
    f.write_text(json.dumps([rec]))
    assert main(["report", str(f)]) == 2
    assert "record 0 (slicetrace_counters): 'args.plugin_unfinished_PROXY_CTRL' must be an integer" in \
        capsys.readouterr().err


def test_a_deeply_nested_file_is_a_trace_format_error(tmp_path):
    """Before: a raw RecursionError from the JSON parser."""
    f = tmp_path / "j_1_0.json"
    f.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(TraceFormatError, match=r"cannot be read as JSON: nested too deeply"):
        read_records(str(f))


@pytest.mark.parametrize("stream", [0, object()])
def test_a_stream_given_to_a_cpu_op_is_refused_before_it_runs(stream):
    """The cpu backend has no streams: stream= was ignored, and the op's events named it as the op's stream."""
    x = np.arange(4, dtype=np.float32)
    out = np.full(4, -1, np.float32)
    with slicetrace.init(backend="cpu") as comm:
        with pytest.raises(UsageError, match=rf"all_reduce: stream={re.escape(repr(stream))}, but the cpu backend has "
                                             r"no streams \(its ops are complete when they return\); leave stream= "
                                             r"out \(None\)"):
            comm.all_reduce(x, out, stream=stream)
        assert (out == -1).all()                        # nothing ran
        assert (comm.broadcast(x, out, stream=None) == x).all()
