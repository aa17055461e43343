"""The launcher's ranks never outlive it: killed (SIGKILL) or terminated (SIGTERM), its ranks and its store
server stop within seconds and the job's shared memory is removed."""
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from slicetrace.backend.procs import proc_dead

DRIVER = textwrap.dedent("""
    import os, sys, numpy as np, slicetrace
    def body(comm, d):
        open(os.path.join(d, f"rank{comm.rank}.pid"), "w").write(str(os.getpid()))
        x = np.ones(1 << 16, np.float32)
        while True:
            comm.all_reduce(x)
    if __name__ == "__main__":
        slicetrace.launch(body, 2, sys.argv[1], timeout_s=20.0)
""")


def _run_and_signal(tmp_path, sig):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    shm_before = set(glob.glob("/dev/shm/st_*"))
    p = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, start_new_session=True)
    pids, err = [], b""
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            pids = [int(f.read_text()) for f in tmp_path.glob("rank*.pid") if f.read_text()]
            time.sleep(0.1)
        assert len(pids) == 2, "ranks did not start"
        time.sleep(0.5)                                  # ranks busy in all_reduce
        ours = set(glob.glob("/dev/shm/st_*")) - shm_before     # this job's segments (others may come and go)
        os.kill(p.pid, sig)
        rc = p.wait(timeout=30)
        deadline = time.monotonic() + 15
        while any(proc_dead(q, 0) is None for q in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [q for q in pids if proc_dead(q, 0) is None]
        leaked = ours & set(glob.glob("/dev/shm/st_*"))
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)             # whatever is left of the group, before asserting
        except ProcessLookupError:
            pass
        p.wait(timeout=10)
        err = p.stderr.read()
    return rc, survivors, leaked, ours, err.decode(errors="replace")[-3000:]


@pytest.mark.parametrize("sig, want_rc", [(signal.SIGTERM, 143), (signal.SIGKILL, -9)])
def test_ranks_and_shared_memory_do_not_outlive_the_launcher(tmp_path, sig, want_rc):
    rc, survivors, leaked, ours, err = _run_and_signal(tmp_path, sig)
    assert len(ours) == 2, ours                          # one segment per rank existed before the signal
    assert (rc, survivors, leaked) == (want_rc, [], set()), err


def test_ctrl_c_stops_bench_with_a_message_and_no_traceback():
    shm_before = set(glob.glob("/dev/shm/st_*"))
    p = subprocess.Popen([sys.executable, "-m", "slicetrace.cli.main", "bench", "-b", "1M", "-e", "1M", "-n",
                          "1000000", "-w", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    try:
        time.sleep(4)                                    # ranks spawned and timing
        os.killpg(p.pid, signal.SIGINT)                  # what a terminal's Ctrl-C does: the whole group
        out, err = p.communicate(timeout=30)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=10)
    assert p.returncode == 130
    assert "slicetrace: interrupted" in err.decode() and "Traceback" not in err.decode()
    assert set(glob.glob("/dev/shm/st_*")) - shm_before == set()
