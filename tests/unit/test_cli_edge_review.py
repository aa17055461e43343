"""Edge input on the command line, probed as a demanding user would: each answer names the flag, the value and what
is accepted, and a line that suggests a next command suggests one that works."""
import json

import pytest

from slicetrace.cli.main import main
from slicetrace.cli.outputs import trace_note
from slicetrace.errors import LaunchError
from tests.cpu.test_cli import _trace_files


@pytest.fixture(autouse=True)
def _plain_env(monkeypatch):
    for var in ("SLICETRACE_BACKEND", "SLICETRACE_PROFILER_PLUGIN", "SLICETRACE_PROFILE_DUMP_FILE",
                "SLICETRACE_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("value, shown", [("0.001", "0.001"), ("0.5", "0.5"), ("1e-9", "1e-09")])
def test_a_timeout_below_a_second_is_refused_before_any_rank_starts(capsys, value, shown):
    """-T 0.001 started the ranks and failed at their rendezvous, each rank's error naming timeout_s=0.001 (or a
    peer's segment 'gone'), not -T; no start-up fits in it, and nccl-tests' -T takes whole seconds."""
    assert main(["bench", "-T", value, "-b", "4K", "-e", "4K"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"slicetrace: error: -T {shown} must be >= 1 second: it bounds every wait, the ranks' "
                          f"start-up (rendezvous) included")


@pytest.mark.parametrize("value, shown", [("0.5", "0.5"), ("0.0010", "0.001")])
def test_a_timeout_variable_below_a_second_is_refused_as_the_flag_is(capsys, monkeypatch, value, shown):
    """SLICETRACE_TIMEOUT=0.5 passed where -T 0.5 was refused: the ranks started under it. init(timeout_s=0.5)
    still takes it (a fast failure where the caller's ranks are up); -T beats it."""
    monkeypatch.setenv("SLICETRACE_TIMEOUT", value)
    assert main(["bench", "-b", "4K", "-e", "4K"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"slicetrace: error: SLICETRACE_TIMEOUT={shown} must be >= 1 second for bench: it "
                                 f"bounds every wait, the ranks' start-up (rendezvous) included, and ranks start up to "
                                 f"seconds apart, so the run would fail at its first wait; unset it (default 60) or "
                                 f"give -T\n")
    monkeypatch.setenv("SLICETRACE_BACKEND", "null")        # refused after the timeout: no rank starts
    assert main(["bench", "-T", "1", "-b", "4K", "-e", "4K"]) == 2
    assert "SLICETRACE_BACKEND='null': bench runs 'cpu' or 'cuda'" in capsys.readouterr().err


def test_a_timeout_of_one_second_passes_the_flag_checks(capsys):
    assert main(["bench", "-T", "1", "--channels", "999"]) == 2      # --channels is checked after -T
    assert capsys.readouterr().err.startswith("slicetrace: error: --channels 999 must be in 0..")


@pytest.mark.parametrize("argv, env, src", [(["-T", "2"], None, "-T 2 s"), ([], "5", "SLICETRACE_TIMEOUT=5 s"),
                                            ([], None, "the default -T 60 s")])
def test_ranks_that_timed_out_are_told_which_limit_it_was(capsys, monkeypatch, argv, env, src):
    """The ranks' errors name the setting (timeout_s), not the flag or variable the user set."""
    import slicetrace.launcher
    if env is not None:
        monkeypatch.setenv("SLICETRACE_TIMEOUT", env)
    errors = {0: "PeerError: rank 1's segment 'st_x' is gone: rank 1's set-up failed: CommTimeoutError: ...",
              1: "CommTimeoutError: rendezvous: \"rank 0's cpu backend segment\" did not arrive within timeout_s=2"}

    def timed_out(*args, **kw):
        raise LaunchError("rank 1 failed", errors)
    monkeypatch.setattr(slicetrace.launcher, "launch", timed_out)
    assert main(["bench", "-b", "4K", "-e", "4K", *argv]) == 1        # a run that failed, not a refusal (2)
    err = capsys.readouterr().err
    assert err.startswith("slicetrace: error: rank 0: PeerError: ")
    assert err.endswith(f"timeout_s=2 ({src} bounds every wait, the ranks' start-up included; if the ranks were "
                        f"only slow, e.g. on a loaded machine, give a larger -T)\n")
    errors[1] = "MismatchError: ranks disagree"         # not a timeout: no hint
    errors[0] = "PeerError: rank 1 left"
    assert main(["bench", "-b", "4K", "-e", "4K", *argv]) == 1
    assert "bounds every wait" not in capsys.readouterr().err


@pytest.mark.parametrize("mask, arrows, report", [(None, True, True), (65606, True, True), (65536, True, True),
                                                  (66, False, True), (2, False, False), (64, False, False)])
def test_the_trace_line_suggests_report_and_arrows_only_where_the_mask_has_them(tmp_path, mask, arrows, report):
    """`bench --profile Coll --trace DIR` named `slicetrace report` (which refused the files: no KernelStep or
    KernelCh events) and send -> receive arrows (which need KernelSteps)."""
    prefix = _trace_files(tmp_path / "tr", 9)
    note = trace_note(str(tmp_path / "tr"), {}, "example", mask)
    assert ("with send -> receive arrows" in note) == arrows
    assert f"slicetrace convert {prefix}_9 -o run.pftrace" in note
    assert (f"links, waits and stragglers: slicetrace report {prefix}_9)" in note) == report
    assert ("slicetrace report needs KernelStep, or KernelCh with Coll, in the event mask" in note) == (not report)


def test_report_on_kernel_ch_without_its_coll_says_why_it_has_nothing(tmp_path, capsys):
    """`--profile KernelCh`: the files hold KernelCh events, but report said there were none (it reads a KernelCh
    under its Coll only), and to record 'both'."""
    for rank in (0, 1):
        recs = [{"name": "slicetrace_comm", "ph": "M", "pid": rank, "tid": 0,
                 "args": {"Rank": rank, "nRanks": 2, "CommHash": 7, "EventMask": 64}},
                {"name": "KernelCh", "cat": "GPU", "id": 1, "pid": rank, "tid": 1, "ph": "b", "ts": 1.0,
                 "args": {"Channel": 0, "StartGpuClk": 1000, "StopGpuClk": 2000, "ParentId": -1}},
                {"name": "KernelCh", "cat": "GPU", "id": 1, "pid": rank, "tid": 1, "ph": "e", "ts": 2.0}]
        (tmp_path / f"t_7_{rank}.json").write_text(json.dumps(recs))
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no KernelStep events to analyse (6 events in all), and KernelCh events count only under their Coll" in err
    assert "(EventMask 64); record with Coll, KernelCh and KernelStep in the mask" in err


def test_a_csv_naming_an_input_file_is_told_a_csv_example(tmp_path, capsys):
    """The example was report.json for --csv too."""
    prefix = _trace_files(tmp_path / "tr", 9)
    assert main(["report", prefix, "--csv", f"{prefix}_9_0.json"]) == 2
    assert capsys.readouterr().err.endswith("; give another file, e.g. steps.csv\n")


def test_a_run_whose_leading_rank_refused_its_input_exits_2_as_a_refusal(capsys, monkeypatch):
    """Exit status: 1 for a run that failed, 2 when the rank it failed on refused its input (a size too large)."""
    import slicetrace.launcher
    msg = "rank 0 failed: UsageError: -e 1000000G: all_reduce of ... ran out of memory on rank 0"

    def refused(*args, **kw):
        raise LaunchError(msg, {0: "UsageError: -e 1000000G: ...", 1: "PeerError: rank 0 left"})
    monkeypatch.setattr(slicetrace.launcher, "launch", refused)
    assert main(["bench", "-b", "4K", "-e", "4K"]) == 2
    assert capsys.readouterr().err.startswith("slicetrace: error: rank 0: UsageError: -e 1000000G")
