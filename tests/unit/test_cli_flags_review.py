"""`slicetrace bench` flags probed as a new user would: each refusal comes before any rank starts (or any folder is
made), in one line naming the flag, the value and what is accepted."""
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slicetrace.cli.main import main
from tests.cpu.test_cli import _trace_files


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch):
    for var in ("SLICETRACE_BACKEND", "SLICETRACE_PROFILER_PLUGIN", "SLICETRACE_PROFILE_DUMP_FILE"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("ops", ["send_recv", "all"])
def test_compare_gloo_on_one_rank_refuses_send_recv_before_any_rank_starts(capsys, ops):
    """Gloo cannot send to its own rank: every rank failed in torch's pair.cc with a RuntimeError and a traceback
    (without torch: 'needs torch installed', which installing torch did not cure)."""
    assert main(["bench", "--compare", "gloo", "--ranks", "1", "--op", ops, "-b", "4K", "-e", "4K"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"slicetrace: error: --compare gloo --ranks 1 --op {ops}: ") and "--ranks 2" in err


@pytest.mark.parametrize("argv, want", [
    (["-b", "garbage"], "-b='garbage' is not a size"),
    (["-b", "1M", "-e", "4K"], "need 0 <= minbytes <= maxbytes"),
    (["--op", "broadcast", "-r", "2", "--ranks", "2"], "-r 2 must be a rank, 0..1"),
    (["--ranks", "100000"], "--ranks 100000: the cpu backend's shared memory"),
])
def test_a_run_refused_by_a_later_check_leaves_no_trace_folder(tmp_path, capsys, argv, want):
    """--trace's folder was made before the sizes, -r, --ranks' shared memory and the other checks of run_bench,
    so a refused run left an empty folder behind (only bench_settings' own checks came before it)."""
    trace = tmp_path / "t"
    assert main(["bench", "--trace", str(trace), *argv]) == 2
    assert want in capsys.readouterr().err and not trace.exists()


@pytest.mark.parametrize("env", [False, True])
def test_json_naming_the_trace_folder_is_refused_before_the_run(tmp_path, capsys, monkeypatch, env):
    """`--trace out --json out`: --json's check passed (out was not there yet), the sweep ran, --trace made the
    folder, and the results were lost at the end (cannot write the file: Is a directory), against the README's
    promise that output paths fail first; the same with SLICETRACE_PROFILE_DUMP_FILE=out/x."""
    out = tmp_path / "out"
    argv = ["bench", "-b", "4K", "-e", "4K", "-n", "1", "-w", "0", "--ranks", "1", "--json", str(out)]
    if env:
        monkeypatch.setenv("SLICETRACE_PROFILER_PLUGIN", "example")
        monkeypatch.setenv("SLICETRACE_PROFILE_DUMP_FILE", str(out / "x"))
    else:
        argv += ["--trace", str(out)]
    assert main(argv) == 2
    std, err = capsys.readouterr()
    flag = "SLICETRACE_PROFILE_DUMP_FILE" if env else "--trace"
    assert std == "" and err == (f"slicetrace: error: --json '{out}' is the folder {flag} writes the trace files in; "
                                 f"give the JSON a file of its own, e.g. {out}.json\n")
    assert not out.exists()


def test_python_dash_m_slicetrace_runs_the_command():
    """`python -m slicetrace --help` said 'slicetrace is a package and cannot be directly executed' (exit 1): without
    the console script (PYTHONPATH=src) the command was `python -m slicetrace.cli.main`."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-m", "slicetrace", "bench", "--help"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("usage: slicetrace bench "), p.stderr


class _Terminal(io.TextIOWrapper):
    def isatty(self) -> bool:
        return True


def test_convert_to_a_terminal_is_refused_and_into_a_pipe_still_written(tmp_path, capsys, monkeypatch):
    """`convert DIR -o -` typed at a terminal wrote the binary protobuf into it (exit 0, the terminal garbled)."""
    prefix = _trace_files(tmp_path / "tr", 7)
    term = _Terminal(io.BytesIO())
    monkeypatch.setattr(sys, "stdout", term)
    assert main(["convert", prefix, "-o", "-"]) == 2
    assert capsys.readouterr().err.startswith("slicetrace: error: -o '-': standard output is a terminal and the "
                                              "Perfetto trace is binary; redirect it")
    assert term.buffer.getvalue() == b""
    pipe = io.TextIOWrapper(io.BytesIO())
    monkeypatch.setattr(sys, "stdout", pipe)
    assert main(["convert", prefix, "-o", "-"]) == 0
    assert pipe.buffer.getvalue()[:1] == b"\n"         # field 1 (TracePacket), length-delimited


@pytest.mark.parametrize("argv, name", [(["-g", "2"], "--ngpus"), (["-t", "1"], "--nthreads"), (["-z", "1"], "--blocking"),
                                        (["-m", "4"], "--agg_iters"), (["-p", "1"], "--parallel_init"),
                                        (["-G", "1"], "--cudagraph")])
def test_nccl_tests_flags_without_a_counterpart_say_what_to_use(capsys, argv, name):
    """nccl-tests' -g, -t, -m, -p, -z and -G got argparse's bare 'unrecognized arguments' under the top-level usage."""
    with pytest.raises(SystemExit) as e:
        main(["bench", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"slicetrace bench: error: {argv[0]} (nccl-tests' {name}) has no counterpart in " \
        f"slicetrace bench: " in err, err
    assert ("--ranks N" in err) == (argv[0] in ("-g", "-t"))


def test_nccl_tests_zero_for_blocking_and_cuda_graphs_is_what_bench_does(monkeypatch):
    """-z 0 (non-blocking timing) and -G 0 (no CUDA graphs) are nccl-tests' defaults and bench's way: not refused;
    and the hidden flags leave --p / --pro abbreviating --profile as before."""
    seen = []
    monkeypatch.setattr("slicetrace.cli.main.run_bench", lambda a: seen.append(a) or 0)
    assert main(["bench", "-z", "0", "-G", "0", "--pro", "Coll"]) == 0
    assert seen[0].profile == 2 and not hasattr(seen[0], "z")


@pytest.mark.parametrize("mask", ["0", "1048576"])
def test_a_bare_profile_with_a_variable_mask_of_no_event_type_is_refused(capsys, monkeypatch, mask):
    """A bare --profile takes SLICETRACE_PROFILE_EVENT_MASK's mask: one without an event type's bit printed
    'profiling on' and recorded nothing, as --profile 0 did before it was refused."""
    monkeypatch.setenv("SLICETRACE_PROFILE_EVENT_MASK", mask)
    assert main(["bench", "--profile", "--ranks", "1", "-b", "64", "-e", "64"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"error: --profile with event mask {mask} (SLICETRACE_PROFILE_EVENT_MASK) records nothing: it has no " \
        f"event type's bit (0x1ffff)" in err, err
