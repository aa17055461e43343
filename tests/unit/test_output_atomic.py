"""Output files (report/bench --json, report --csv, convert -o) are replaced whole: a write that fails half-way
(a full disk) leaves the previous file as it was and no temporary file behind, instead of half a file."""
from __future__ import annotations

import builtins
import errno
import json
import os
import stat
import subprocess
import sys
import threading

import pytest

from slicetrace.analyze.perfetto import convert
from slicetrace.analyze.steps_csv import write_steps_csv
from slicetrace.analyze.trace import kernel_steps, load_traces, trace_files
from slicetrace.cli.outputs import write_json
from slicetrace.errors import UsageError
from tests.unit.test_trace_analyze import write_ranks


class _Full:
    """A file under the full folder: bytes past the space left are refused, as a full disk does."""

    def __init__(self, f, room):
        self.f, self.room = f, room

    def write(self, data):
        if len(data) > self.room[0]:
            self.f.write(data[:self.room[0]])
            self.room[0] = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room[0] -= len(data)
        return self.f.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.fixture
def full_folder(tmp_path, monkeypatch):
    """tmp_path/out, where files opened for writing take 100 bytes in all."""
    out = tmp_path / "out"
    out.mkdir()
    real, room = builtins.open, [100]

    def opener(file, mode="r", *a, **kw):
        f = real(file, mode, *a, **kw)
        if isinstance(file, (str, os.PathLike)) and os.path.dirname(os.path.abspath(file)) == str(out) \
                and any(c in mode for c in "wax+"):
            return _Full(f, room)
        return f
    monkeypatch.setattr(builtins, "open", opener)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    prefix, _ = write_ranks(tmp_path_factory.mktemp("atomic"))
    return trace_files(prefix)


def _writers(run):
    return {"write_json": (lambda p: write_json("--json", p, {"rows": list(range(1000))}), UsageError),
            "write_steps_csv": (lambda p: write_steps_csv(kernel_steps(load_traces(run)), p), OSError),
            "convert": (lambda p: convert(run, p), OSError)}


@pytest.mark.parametrize("writer", ["write_json", "write_steps_csv", "convert"])
def test_a_write_that_fails_half_way_leaves_the_previous_file_whole(run, full_folder, writer):
    fn, err = _writers(run)[writer]
    path = full_folder / "result"
    path.write_bytes(b"the previous run's output")
    with pytest.raises(err, match="No space left on device"):
        fn(str(path))
    assert path.read_bytes() == b"the previous run's output"
    assert os.listdir(full_folder) == ["result"]                # no temporary file left


@pytest.mark.parametrize("writer", ["write_json", "write_steps_csv", "convert"])
def test_the_file_is_written_whole_through_a_link_and_in_place_on_a_fifo(run, tmp_path, writer):
    fn, _ = _writers(run)[writer]
    (tmp_path / "real").write_bytes(b"old")
    os.symlink(tmp_path / "real", tmp_path / "link")
    fn(str(tmp_path / "link"))
    assert os.path.islink(tmp_path / "link") and (tmp_path / "real").read_bytes() not in (b"", b"old")
    assert sorted(os.listdir(tmp_path)) == ["link", "real"]
    fifo = tmp_path / "fifo"                      # e.g. /dev/stdout: a rename would replace the node itself
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    fn(str(fifo))
    reader.join(10)
    assert got and got[0] == (tmp_path / "real").read_bytes() and stat.S_ISFIFO(os.stat(fifo).st_mode)
    if writer == "write_json":
        assert json.loads(got[0]) == {"rows": list(range(1000))}


_TERM_MID_WRITE = """
import os, signal, sys
import slicetrace.analyze.atomic as atomic
from slicetrace.cli.main import main

def opener(file, mode="r", *a, **kw):      # SIGTERM once the temporary file exists, as timeout(1) may send it
    f = open(file, mode, *a, **kw)
    if str(file).endswith(".tmp"):
        os.kill(os.getpid(), signal.SIGTERM)
    return f
atomic.open = opener
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("cmd", ["convert", "report"])
def test_sigterm_during_the_write_leaves_no_temporary_file(run, tmp_path, cmd):
    """SIGTERM (timeout(1), Slurm) killed report and convert outright: their half-written temporary file stayed
    beside the output, e.g. a multi-GB out.pftrace.<pid>.<tid>.tmp."""
    out = tmp_path / "out"
    out.mkdir()
    target = str(out / "result")
    argv = [*run, "-o", target] if cmd == "convert" else [*run, "--csv", target]
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    p = subprocess.run([sys.executable, "-c", _TERM_MID_WRITE, cmd, *argv], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": os.path.abspath(src)})
    assert p.returncode == 143, (p.returncode, p.stderr)
    assert os.listdir(out) == [], os.listdir(out)
