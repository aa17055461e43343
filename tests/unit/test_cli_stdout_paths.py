"""Output paths that are standard output under another name (/dev/stdout, the file stdout is redirected to) are
'-': the command's own text goes to stderr, not into the JSON, CSV or protobuf; and a KernelStep-only trace without
KernelSteps is not told to add what its mask already has."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slicetrace.cli.main import main
from tests.cpu.test_cli import _trace_files
from tests.unit.test_report import _no_op_files

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "slicetrace", *args], env=env, capture_output=True, timeout=120)


def test_report_json_to_dev_stdout_is_json_alone(tmp_path):
    """--json /dev/stdout got the JSON, then the report's text after it on the same stream (not JSON any more)."""
    prefix = _trace_files(tmp_path / "tr", 7)
    p = _cli("report", prefix, "--json", "/dev/stdout")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["links"] and b"slow links" in p.stderr


def test_report_json_and_csv_both_on_stdout_are_refused(tmp_path):
    """--json - --csv /dev/stdout wrote the JSON and the CSV one after the other into one stream."""
    prefix = _trace_files(tmp_path / "tr", 7)
    p = _cli("report", prefix, "--json", "-", "--csv", "/dev/stdout")
    assert p.returncode == 2 and p.stdout == b""
    assert p.stderr.decode().startswith("slicetrace: error: --json '-' and --csv '-': standard output can carry "
                                        "one of them"), p.stderr


def test_convert_to_dev_stdout_writes_the_protobuf_alone(tmp_path):
    """-o /dev/stdout: the summary line ('# ...: 2 rank file(s) ...') was printed after the binary trace."""
    prefix = _trace_files(tmp_path / "tr", 7)
    p = _cli("convert", prefix, "-o", "/dev/stdout")
    assert p.returncode == 0, p.stderr
    assert p.stdout[:1] == b"\n" and b"rank file(s)" not in p.stdout and b"rank file(s)" in p.stderr


def test_report_json_to_the_file_stdout_is_redirected_to(tmp_path, monkeypatch, capsys):
    """`report ... --json out.json > out.json`: the JSON was renamed over the file the text was being written to."""
    prefix = _trace_files(tmp_path / "tr", 7)
    out = tmp_path / "out.json"
    with open(out, "w") as f:
        monkeypatch.setattr(sys, "stdout", f)
        assert main(["report", prefix, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["links"] and "slow links" in capsys.readouterr().err


def test_bench_json_to_dev_stdout_is_refused_as_dash_is(tmp_path, monkeypatch, capsys):
    """bench prints its table on stdout: --json naming stdout's file mixed the two (as '-' was refused for)."""
    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        monkeypatch.setattr(sys, "stdout", f)
        assert main(["bench", "-b", "4K", "-e", "4K", "--json", str(out)]) == 2
    assert capsys.readouterr().err == (f"slicetrace: error: --json {str(out)!r}: this command prints its table on "
                                       f"standard output, so that cannot be the file too; give a file name\n")


@pytest.mark.parametrize("mask", [65536, 65538])
def test_a_kernel_step_mask_without_kernel_steps_is_not_told_to_add_them(tmp_path, capsys, mask):
    """A KernelStep-only mask (KernelStep alone is enough to analyse) whose files hold no KernelStep was told
    'record with both in the mask', which its mask already had what analysis needs of."""
    _no_op_files(tmp_path, mask)
    assert main(["report", str(tmp_path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"no KernelStep events to analyse (4 events in all), though the trace's event mask had KernelStep " \
        f"(EventMask {mask}): no op moved data between ranks with profiling on" in err, err
    assert "record with both" not in err


def test_a_bench_run_refused_by_launch_writes_no_json(tmp_path, monkeypatch, capsys):
    """Only a run that started (a LaunchError) or was stopped writes its partial --json; a refusal writes none."""
    import slicetrace.launcher
    from slicetrace.errors import ConfigError

    def refuse(*a, **k):
        raise ConfigError("buffsize=3 must be ...")
    monkeypatch.setattr(slicetrace.launcher, "launch", refuse)
    out = tmp_path / "r.json"
    assert main(["bench", "-b", "4K", "-e", "4K", "--ranks", "1", "--json", str(out)]) == 2
    assert not out.exists() and "buffsize=3" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
