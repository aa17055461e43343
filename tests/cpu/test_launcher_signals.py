"""The launcher's ranks never outlive it: killed (SIGKILL) or terminated (SIGTERM), its ranks and its store
server stop within seconds and the job's shared memory is removed.

Other test runs on the machine create and remove st_* segments at the same time, so the checks look only at the
segments this job's ranks have mapped (/proc/<pid>/maps), never at every st_* segment that appeared meanwhile."""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import slicetrace
from slicetrace.backend.procs import proc_dead
from slicetrace.errors import ConfigError, UsageError
from slicetrace.rendezvous import Store

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

pytestmark = pytest.mark.usefixtures("sigint_on")   # tests/cpu/conftest.py


def _session_pids(sid):
    """Processes of session sid (the launcher runs as a session leader; its ranks are in its session)."""
    pids = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:                                  # gone meanwhile
            continue
        if int(stat[stat.rindex(")") + 2:].split()[3]) == sid:     # fields after "(comm) ": state ppid pgrp session
            pids.append(int(d))
    return pids


def _mapped_segments(pids):
    """Names of the st_* segments these processes have mapped: each rank maps its own and its peers'."""
    names = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                names.update(re.findall(r"/dev/shm/(st_\S+)", f.read()))
        except OSError:
            pass
    return names


def _left_of_job(segments):
    """Segments still there of the launcher jobs these belong to (st_<10-hex job id>..., as launch() names them)."""
    jobs = {name[3:13] for name in segments}
    return {os.path.basename(f) for j in jobs for f in glob.glob(f"/dev/shm/st_{j}*")}


def _reap(p) -> None:
    """Whatever is left of the launcher's process group, killed before the test asserts."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(timeout=10)


def _slowfin(tmp_path, driver: str, *args: str):
    """The driver, launched in a session of its own with the SlowFinalize plugin importable."""
    (tmp_path / "slowfin.py").write_text(SLOW_PLUGIN)
    (tmp_path / "driver.py").write_text(driver)
    env = {**os.environ, "SLOWFIN_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), *args], env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, start_new_session=True)


def _run_and_signal(tmp_path, sig, twice=False):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
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
        ours = _mapped_segments(pids)                    # this job's segments, whatever other runs make
        os.kill(p.pid, sig)
        if twice:                                        # as timeout(1) does: the launcher, then its whole group
            os.killpg(p.pid, sig)
        rc = p.wait(timeout=30)
        deadline = time.monotonic() + 15
        while any(proc_dead(q, 0) is None for q in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [q for q in pids if proc_dead(q, 0) is None]
        leaked = _left_of_job(ours)
    finally:
        _reap(p)
        err = p.stderr.read()
    return rc, survivors, leaked, ours, err.decode(errors="replace")[-3000:]


@pytest.mark.parametrize("sig, want_rc, twice", [(signal.SIGTERM, 143, False), (signal.SIGKILL, -9, False),
                                                 (signal.SIGTERM, 143, True)], ids=["term", "kill", "term-group"])
def test_ranks_and_shared_memory_do_not_outlive_the_launcher(tmp_path, sig, want_rc, twice):
    """term-group: a second SIGTERM while the launcher cleans up (timeout(1), batch schedulers) used to kill it
    with the default action before the shared memory was removed."""
    rc, survivors, leaked, ours, err = _run_and_signal(tmp_path, sig, twice)
    assert len(ours) == 2, ours                          # one segment per rank existed before the signal
    assert (rc, survivors, leaked) == (want_rc, [], set()), err


@pytest.mark.parametrize("sig,rc,said", [(signal.SIGINT, 130, "slicetrace: interrupted"),
                                         (signal.SIGTERM, 143, "slicetrace: terminated (SIGTERM)")])
def test_ctrl_c_stops_bench_with_a_message_and_no_traceback_and_the_traces_written(tmp_path, sig, rc, said):
    """Before: the ranks were killed at once, so the example plugin never wrote what it held: 0-byte trace files
    that report could not read. Now each rank closes its communicator first (the plugins' finalize). SIGTERM to the
    group (timeout(1), Slurm, Kubernetes) killed the ranks by its default action: traces cut after the header."""
    from slicetrace.analyze.trace import check_trace, kernel_steps, load_traces
    # -N 1000000: cycles until interrupted (-N 0 with --trace is refused: its files would grow without bound); its
    # first row says the warm-up and the first ops ran (a fixed sleep after start-up did not: under CI's load the
    # Ctrl-C came before the warm-up op, and its trace had no KernelSteps)
    err_file = open(tmp_path / "err", "wb")
    p = subprocess.Popen([sys.executable, "-m", "slicetrace.cli.main", "bench", "-b", "1M", "-e", "1M", "-n", "5",
                          "-w", "1", "-N", "1000000", "--trace", str(tmp_path / "tr")], stdout=subprocess.PIPE,
                         stderr=err_file, start_new_session=True)
    err_file.close()                                     # the child has its own copy
    rows: list[str] = []
    first_row = threading.Event()

    def read_rows():
        for line in p.stdout:
            rows.append(line.decode(errors="replace"))
            if rows[-1].strip().startswith("1048576"):
                first_row.set()
    reader = threading.Thread(target=read_rows, daemon=True)
    reader.start()
    try:
        assert first_row.wait(120), f"no row from the bench: {rows}"
        ours = _mapped_segments(_session_pids(p.pid))
        assert len(ours) == 2, f"the bench's ranks do not map their segments: {ours}"
        os.killpg(p.pid, sig)                            # what a terminal's Ctrl-C does: the whole group
        p.wait(timeout=30)
        reader.join(10)
    finally:
        _reap(p)
    err = (tmp_path / "err").read_text(errors="replace")
    assert p.returncode == rc, err
    assert said in err and "Traceback" not in err
    assert _left_of_job(ours) == set()                   # removed before the launcher exited: no waiting
    files = sorted(glob.glob(str(tmp_path / "tr" / "trace_*_*.json")))
    assert len(files) == 2
    tails = {f: open(f, "rb").read()[-80:] for f in files}        # what a failure below needs to be understood
    assert any(ln.startswith("# traces: ") and "(2 file(s); " in ln for ln in rows), (rows, err, tails)  # was left out
    for f in files:
        assert check_trace(f) == [], f
        assert open(f).read().endswith("]\n"), f               # finalized, not cut short
        assert len(kernel_steps(load_traces([f]))) >= 8      # at least the warm-up op's slices


def test_a_terminated_bench_writes_the_rows_so_far_to_its_json_marked_incomplete(tmp_path):
    """Before, SIGTERM after 143 rows left no --json file at all."""
    out = tmp_path / "r.json"
    p = subprocess.Popen([sys.executable, "-m", "slicetrace.cli.main", "bench", "-b", "4K", "-e", "4K", "-n", "2",
                          "-w", "1", "-N", "1000000", "--json", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    rows: list[str] = []
    two = threading.Event()

    def read_rows():
        for line in p.stdout:
            rows.append(line.decode(errors="replace"))
            if sum(r.strip().startswith("4096") for r in rows) >= 2:
                two.set()
    threading.Thread(target=read_rows, daemon=True).start()
    try:
        assert two.wait(120), f"no rows from the bench: {rows}"
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
    finally:
        _reap(p)
    assert p.returncode == 143
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["incomplete"] == "terminated (SIGTERM)"
    assert len(doc["rows"]) >= 2 and all(r["size"] == 4096 and r["wrong"] == 0 for r in doc["rows"])
    assert [r["cycle"] for r in doc["rows"]] == list(range(len(doc["rows"])))


# ---- init() checks rank and world_size before any store is used (a bad rank used to wait out the timeout) ----

class _UnusedStore(Store):
    def set(self, key, value):
        raise AssertionError(f"store used (set {key!r}) before rank/world_size were checked")

    def try_get(self, key):
        raise AssertionError(f"store used (get {key!r}) before rank/world_size were checked")


@pytest.mark.parametrize("kw,msg", [
    ({"rank": 1, "world_size": 1}, "rank=1 must be an int in 0..0 (world_size=1)"),
    ({"rank": -1, "world_size": 1}, "rank=-1 must be an int in 0..0 (world_size=1)"),
    ({"rank": 2, "world_size": 2}, "rank=2 must be an int in 0..1 (world_size=2)"),
    ({"rank": "0", "world_size": 1}, "rank='0' (type str) must be an int in 0..world_size-1"),
    ({"rank": True, "world_size": 1}, "rank=True (type bool) must be an int in 0..world_size-1"),
    ({"rank": 0, "world_size": 0}, "world_size=0 must be an int >= 1"),
    ({"rank": 0, "world_size": "1"}, "world_size='1' (type str) must be an int >= 1"),
    ({"rank": 0, "world_size": 1.0}, "world_size=1.0 (type float) must be an int >= 1"),
])
def test_init_checks_rank_and_world_size_first(monkeypatch, kw, msg):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(UsageError) as e:
        slicetrace.init("null", store=_UnusedStore(), timeout_s=1, **kw)
    assert str(e.value) == msg


@pytest.mark.parametrize("env,kw,err,msg", [
    ({"RANK": "3", "WORLD_SIZE": "2"}, {}, ConfigError, "RANK='3' must be an integer in 0..1 (WORLD_SIZE=2)"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, {}, ConfigError, "RANK='-1' must be an integer in 0..1 (WORLD_SIZE=2)"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, {}, ConfigError, "WORLD_SIZE='0' must be an integer >= 1"),
    ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "x"}, {}, ConfigError, "LOCAL_RANK='x' must be an integer >= 0"),
    ({"WORLD_SIZE": "2"}, {"rank": 2}, UsageError, "rank=2 must be an int in 0..1 (WORLD_SIZE=2)"),
    ({"RANK": "1"}, {"world_size": 1}, UsageError, "RANK=1 must be an int in 0..0 (world_size=1)"),
    # an explicit rank= beats RANK: a bad one is named as the argument it is
    ({"RANK": "0", "WORLD_SIZE": "2"}, {"rank": 5}, UsageError, "rank=5 must be an int in 0..1 (WORLD_SIZE=2)"),
    ({"RANK": "0"}, {"rank": 3, "world_size": 2}, UsageError, "rank=3 must be an int in 0..1 (world_size=2)"),
])
def test_init_names_the_environment_variable(monkeypatch, env, kw, err, msg):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(err) as e:                    # not "torch is not installed", not a rendezvous timeout
        slicetrace.init("null", timeout_s=1, **kw)
    assert str(e.value) == msg


def _never_run(comm):
    raise AssertionError("a rank started")


def test_launch_refuses_an_infinite_timeout_before_starting_ranks():
    with pytest.raises(ConfigError) as e:             # its join bound is timeout_s + 5: inf waited forever
        slicetrace.launch(_never_run, 2, timeout_s=float("inf"))
    assert str(e.value) == "timeout_s=inf must be > 0 seconds and <= 86400"


def test_init_refuses_a_store_that_is_not_one(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(UsageError) as e:
        slicetrace.init("null", rank=0, world_size=1, store={})
    assert str(e.value) == ("store={} (type dict) must be a slicetrace.rendezvous.Store, e.g. DictStore(a dict "
                            "shared by the ranks)")


def test_init_without_a_store_or_torch_says_what_is_missing(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)          # as if torch were not installed
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(ConfigError) as e:
        slicetrace.init("null", rank=0, world_size=2, timeout_s=1)
    assert str(e.value).startswith("world_size=2 without store=: the rendezvous needs torch.distributed's TCPStore")


def test_signals_during_the_cleanup_are_held_and_delivered_after_it():
    """The launcher's cleanup (kill the ranks, remove their shared memory) defers SIGTERM and SIGINT: before, a
    second SIGTERM there (timeout(1) signals the launcher and then its group) killed it with the memory left."""
    from slicetrace.launcher import _hold_signals, _release_signals
    got = []
    old = signal.signal(signal.SIGTERM, lambda n, f: got.append(n))
    try:
        held = _hold_signals(None)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)                                 # a handler runs between bytecodes: give it the chance
        assert got == [] and held["came"] == [signal.SIGTERM] * 2
        _release_signals(held)                           # the application's handler again, and the signal once
        assert got == [signal.SIGTERM]
        held = _hold_signals(None)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        try:
            raise SystemExit(143)                        # already on its way out: the same request is not repeated
        except SystemExit:
            _release_signals(held)
        assert got == [signal.SIGTERM] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGTERM, old)


SLOW_PLUGIN = textwrap.dedent("""
    import os, time
    class SlowFinalize:          # a plugin whose finalize (at close) takes a while, as writing a large trace does
        version, name = 8, "slowfin"
        def __init__(self, settings=None):
            pass
        def init(self, comm, mask):
            mask.value = 0
            return comm.rank
        def start_event(self, ctx, descr):
            return None
        def stop_event(self, h, ts):
            pass
        def record_event_state(self, h, s, a):
            pass
        def finalize(self, ctx):
            d = os.environ["SLOWFIN_DIR"]
            open(os.path.join(d, f"fin{ctx}.start"), "w").close()
            time.sleep(1.5)
            open(os.path.join(d, f"fin{ctx}.done"), "w").close()
""")
QUICK_DRIVER = textwrap.dedent("""
    import numpy as np, slicetrace
    def fn(comm):
        comm.all_reduce(np.ones(4, np.float32))
    if __name__ == "__main__":
        slicetrace.launch(fn, 2, profiler_plugin="slowfin:SlowFinalize", timeout_s=20.0)
""")


def test_a_launch_interrupted_while_its_ranks_close_lets_them_finish(tmp_path):
    """The launcher's SIGINT to its ranks used to reach ranks whose fn had returned too, cutting their close (the
    plugins' finalize, which writes the traces) short."""
    p = _slowfin(tmp_path, QUICK_DRIVER)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("fin*.start"))) < 2 and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.02)
        assert len(list(tmp_path.glob("fin*.start"))) == 2, p.stderr.read() if p.poll() is not None else ""
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
    finally:
        _reap(p)
    assert p.returncode == 143
    assert sorted(f.name for f in tmp_path.glob("fin*.done")) == ["fin0.done", "fin1.done"]


LOOP_DRIVER = DRIVER.replace("timeout_s=20.0)", 'profiler_plugin="slowfin:SlowFinalize", timeout_s=20.0)')


def test_a_launcher_terminated_alone_asks_its_ranks_inside_fn_to_close_and_waits_for_their_finalize(tmp_path):
    """SIGTERM to the launcher only (kill <pid>, not the group): the ranks, busy inside fn, hear of it from the
    launcher alone (SIGINT), and their close (a finalize of ~1.5 s, as writing a large trace) is waited for, not
    cut short after the first half second."""
    _terminate_busy(tmp_path, LOOP_DRIVER)


def _terminate_busy(tmp_path, driver: str) -> None:
    """SIGTERM to the launcher alone once both ranks loop in fn; both must close, their finalize done."""
    p = _slowfin(tmp_path, driver, str(tmp_path))
    try:
        deadline = time.monotonic() + 60
        pids = []
        while len(pids) < 2 and time.monotonic() < deadline and p.poll() is None:
            pids = [f for f in tmp_path.glob("rank*.pid") if f.read_text()]
            time.sleep(0.05)
        assert len(pids) == 2, p.stderr.read() if p.poll() is not None else "ranks did not start"
        time.sleep(0.5)                                  # ranks busy in all_reduce, inside fn
        assert list(tmp_path.glob("fin*")) == []         # none is closing yet
        os.kill(p.pid, signal.SIGTERM)                   # the launcher alone: no signal reaches the ranks from us
        p.wait(timeout=60)
    finally:
        _reap(p)
    err = p.stderr.read().decode(errors="replace")
    assert p.returncode == 143, err
    assert sorted(f.name for f in tmp_path.glob("fin*")) == ["fin0.done", "fin0.start", "fin1.done", "fin1.start"], err


IGNORING_DRIVER = LOOP_DRIVER.replace('if __name__ == "__main__":',
                                     'if __name__ == "__main__":\n    import signal\n'
                                     '    signal.signal(signal.SIGINT, signal.SIG_IGN)   # as `cmd &` in a script')


def test_a_launcher_started_with_sigint_ignored_still_gets_its_ranks_to_close(tmp_path):
    """The close request was a SIGINT, which ranks of a launcher started with SIGINT ignored ignore too: they were
    killed 10 s later with their traces cut short."""
    _terminate_busy(tmp_path, IGNORING_DRIVER)


FAULTHANDLER_DRIVER = LOOP_DRIVER.replace("    x = np.ones(", "    import faulthandler, signal\n"
                                          "    faulthandler.register(signal.SIGUSR1)   # a user's debugging aid\n"
                                          "    x = np.ones(")


def test_a_rank_that_takes_sigusr1_for_itself_still_closes_when_the_launcher_is_terminated(tmp_path):
    """SIGINT is not ignored here, so the launcher asks with SIGINT, as before: a fn that registers faulthandler
    on SIGUSR1 (the request used only when SIGINT is ignored) still closes and writes its trace."""
    _terminate_busy(tmp_path, FAULTHANDLER_DRIVER)


EARLY_DRIVER = textwrap.dedent("""
    import os, signal, sys, time, slicetrace
    def fn(comm, d):
        open(os.path.join(d, f"rank{comm.rank}.up"), "w").close()
        time.sleep(float(sys.argv[3]))
        return comm.rank
    if __name__ == "__main__":
        if sys.argv[2] == "ignore":
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:                    # hold the launcher inside its start-up window, where it hides SIGINT from ranks
            import multiprocessing.managers as mm
            start = mm.BaseManager.start
            def slow_start(self, *a, **k):
                open(os.path.join(sys.argv[1], "starting"), "w").close()
                time.sleep(30)   # the test's SIGINT ends it (KeyboardInterrupt) unless the launcher loses it
                return start(self, *a, **k)
            mm.BaseManager.start = slow_start
        print("DONE", slicetrace.launch(fn, 2, sys.argv[1], timeout_s=20.0), flush=True)
""")


def _early(tmp_path, mode: str, sleep_s: float, wait_for: str):
    """The driver in a session of its own; SIGINT to its group once `wait_for` files exist; (rc, stdout, stderr,
    whether those files existed when the signal was sent)."""
    (tmp_path / "driver.py").write_text(EARLY_DRIVER)
    p = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path), mode, str(sleep_s)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        want = 2 if "*" in wait_for else 1
        while len(list(tmp_path.glob(wait_for))) < want and time.monotonic() < deadline:
            time.sleep(0.005)
        ready = len(list(tmp_path.glob(wait_for))) >= want
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=90)     # a lost Ctrl-C: start-up's 30 s, then the run
    finally:
        _reap(p)
    return p.returncode, out.decode(), err.decode(errors="replace"), ready


def test_a_ctrl_c_while_the_ranks_start_is_not_lost(tmp_path):
    """The launcher ignored SIGINT while it started its store server and ranks (so they would not print import
    tracebacks): a Ctrl-C then was thrown away and the run went on. SIGINT is blocked instead, and raised after."""
    rc, out, err, ready = _early(tmp_path, "default", 8.0, "starting")
    assert ready, "the launcher never reached its start-up window"
    # the interrupt ends the driver as an uncaught KeyboardInterrupt does (killed by SIGINT: 130 in a shell), with
    # the driver's own traceback from launch() only: no rank ran, none printed one
    assert rc == -signal.SIGINT and out == "", (rc, out, err)
    assert err.count("Traceback") == 1 and "in launch" in err and err.rstrip().endswith("\nKeyboardInterrupt"), err
    assert list(tmp_path.glob("rank*.up")) == []


def test_a_program_that_ignores_sigint_keeps_ranks_that_ignore_it(tmp_path):
    """Ranks used to get Python's KeyboardInterrupt handler whatever the launcher had (nohup, `cmd &` in a script,
    an explicit SIG_IGN), so one Ctrl-C to the group killed the run."""
    rc, out, err, ready = _early(tmp_path, "ignore", 1.5, "rank*.up")
    assert ready and rc == 0 and "DONE [0, 1]" in out, err


SLEEPER_DRIVER = textwrap.dedent("""
    import os, sys, time, numpy as np, slicetrace
    def fn(comm, d):
        open(os.path.join(d, f"rank{comm.rank}.pid"), "w").write(str(os.getpid()))
        if comm.rank == 1:
            try:
                time.sleep(1000)                # blocked in a system call, not running Python
            except KeyboardInterrupt:
                open(os.path.join(d, "rank1.interrupted"), "w").close()
                raise
        comm.all_reduce(np.ones(1000, np.float32))
    if __name__ == "__main__":
        slicetrace.launch(fn, 2, sys.argv[1], timeout_s=600.0)
""")


def test_a_rank_blocked_in_a_system_call_hears_of_its_killed_launcher():
    """The orphan watch scheduled a KeyboardInterrupt (interrupt_main), which waits for the main thread to run
    Python: a rank in time.sleep never got it and was ended by the 10 s grace's exit, its error path (abort,
    close, plugin finalize) never run. A real signal to the main thread wakes the call."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        driver = os.path.join(d, "driver.py")
        with open(driver, "w") as f:
            f.write(SLEEPER_DRIVER)
        p = subprocess.Popen([sys.executable, driver, d], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
        pids = []
        try:
            deadline = time.monotonic() + 60
            while len(pids) < 2 and time.monotonic() < deadline:
                pids = [int(open(f).read()) for f in glob.glob(os.path.join(d, "rank*.pid")) if open(f).read()]
                time.sleep(0.05)
            assert len(pids) == 2, "ranks did not start"
            time.sleep(0.5)                                  # rank 1 asleep, rank 0 waiting in all_reduce
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
            deadline = time.monotonic() + 30
            while any(proc_dead(q, 0) is None for q in pids) and time.monotonic() < deadline:
                time.sleep(0.1)
            survivors = [q for q in pids if proc_dead(q, 0) is None]
            interrupted = os.path.exists(os.path.join(d, "rank1.interrupted"))
        finally:
            for q in pids:
                if proc_dead(q, 0) is None:
                    os.kill(q, signal.SIGKILL)
            _reap(p)
    assert survivors == [] and interrupted


SERVER_DRIVER = textwrap.dedent("""
    import multiprocessing, multiprocessing.connection as mc, os, sys, slicetrace
    def fn(comm):
        return comm.rank
    if __name__ == "__main__":
        recv = mc.Connection.recv
        def interrupted(self):              # Ctrl-C as the launcher reads its store server's address
            mc.Connection.recv = recv
            raise KeyboardInterrupt
        mc.Connection.recv = interrupted
        try:
            slicetrace.launch(fn, 2)
        except KeyboardInterrupt:
            print("left:", [(c.name, c.pid) for c in multiprocessing.active_children()], flush=True)
        os._exit(0)                         # not the exit hook that would wait for a server left running
""")


def test_a_ctrl_c_while_the_store_server_starts_leaves_no_server():
    """Before, that server (SIGINT ignored, no shutdown hook yet) stayed, and the launcher's exit waited on it for
    good."""
    p = subprocess.run([sys.executable, "-c", SERVER_DRIVER], capture_output=True, text=True, timeout=60)
    left = re.findall(r"\('[^']*', (\d+)\)", p.stdout)
    for pid in left:                        # killed before asserting
        os.kill(int(pid), signal.SIGKILL)
    assert p.stdout == "left: []\n", (p.stdout, p.stderr[-2000:])
