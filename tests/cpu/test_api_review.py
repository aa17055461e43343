"""The public API under uses a review tried: a forked child, a group open in another thread or on another
communicator, output shapes at one rank and several, a communicator never closed, profiling blocks from two
threads, an op started from inside another. Each test failed on the tree before its fix."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import slicetrace
from slicetrace.errors import UsageError
from tests.helpers.procs import wait_child
from tests.unit.test_plugin import RecPlugin

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def comm():
    c = slicetrace.init(backend="null")
    yield c
    c.close()


def _in_a_fork(call) -> str:
    """What call() says in a forked child ('ok', or its error), reported through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                        # the child: report, then leave at once
        try:
            call()
            msg = "ok"
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            msg = f"{type(e).__name__}: {e}"
        os.write(w, msg.encode()[:500])
        os._exit(0)
    os.close(w)
    wait_child(pid)
    got = os.read(r, 600).decode()
    os.close(r)
    return got


def test_a_forked_child_cannot_use_its_parents_communicator(comm):
    """The child's all_reduce paired with the peer's next op and both got wrong sums, without an error."""
    got = _in_a_fork(lambda: comm.all_reduce(np.ones(4, np.float32)))
    assert got.startswith(f"UsageError: this communicator was made in process {os.getpid()}; a forked child "
                          f"cannot use it"), got
    assert (comm.all_reduce(np.ones(4, np.float32)) == 1).all()         # the parent's is as it was


def _in_anothers_group(comm, call) -> str:
    """What call() (a thread's) says while this thread has comm.group() open, with a self send/recv in it."""
    opened, done, seen = threading.Event(), threading.Event(), {}

    def other():
        opened.wait(10)
        try:
            call()
            seen["b"] = "returned"
        except UsageError as e:
            seen["b"] = str(e)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with comm.group():
        comm.send(np.ones(4, np.float32), 0)
        opened.set()
        assert done.wait(10)
        comm.recv(np.zeros(4, np.float32), 0)
    t.join(10)
    return seen["b"]


def test_a_call_from_another_thread_while_a_group_is_open_is_refused(comm):
    """Thread B's recv joined thread A's open group and returned at once, its buffer not yet filled."""
    assert _in_anothers_group(comm, lambda: comm.recv(np.zeros(4, np.float32), 0)) == (
        "recv: another thread has comm.group() open on this communicator; a group's calls come from the thread "
        "that opened it")


def test_another_communicators_ops_inside_a_group_are_refused(comm):
    """They ran at once, before the group's own ops (16 MiB each way: a deadlock until the timeout)."""
    with slicetrace.init(backend="null") as other:
        for call in (lambda: other.send(np.ones(4, np.float32), 0), lambda: other.all_reduce(np.ones(4, np.float32)),
                     other.barrier):
            with pytest.raises(UsageError, match=r"inside another communicator's comm.group\(\): slicetrace's "
                                                 r"groups do not span communicators"):
                with comm.group():
                    call()
        with other.group():                             # a group of its own inside: fine
            with comm.group():
                comm.send(np.ones(4, np.float32), 0)
                comm.recv(np.zeros(4, np.float32), 0)


def test_all_gather_and_reduce_scatter_return_1d_at_one_rank_too(comm):
    """At one rank they kept x's shape, (2, 4); at several they are flat: code tried on one rank broke on two."""
    x = np.ones((2, 4), np.float32)
    assert comm.all_gather(x).shape == (8,) and comm.reduce_scatter(x).shape == (8,)
    assert comm.all_reduce(x).shape == (2, 4) and comm.broadcast(x).shape == (2, 4)


def test_profiling_blocks_of_two_threads_are_refused_and_nested_masks_only_narrow(comm):
    """Two threads' overlapping blocks left profiling off for good; an inner mask= widened the outer one."""
    s, entered, leave, seen = comm._session, threading.Event(), threading.Event(), {}

    def other():
        with comm.profiling(False):
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert entered.wait(10)
    with pytest.raises(UsageError, match="another thread has a profiling block of this communicator open"):
        with comm.profiling(True):
            pass
    leave.set()
    t.join(10)
    assert (s.paused, s.profiling_owner) == (False, None)
    with comm.profiling(True, mask="Coll"):
        with comm.profiling(True, mask=0xFFFFFFFF):
            seen["inner"] = s.mask_limit
    assert seen["inner"] == 2 and s.mask_limit == -1


_REENTERED: list = []


class Reentrant(RecPlugin):
    """Starts an op of the communicator from inside its own start_event."""
    comm = None

    def __init__(self, settings=None):
        super().__init__()

    def start_event(self, ctx, descr):
        if Reentrant.comm is not None and not _REENTERED:
            try:
                Reentrant.comm.all_reduce(np.ones(2, np.float32))
            except UsageError as e:
                _REENTERED.append(str(e))
        return super().start_event(ctx, descr)


def test_an_op_started_from_inside_another_says_so():
    """It said 'another thread is inside an operation': it was this one (a plugin callback here)."""
    with slicetrace.init(backend="null", profiler_plugin="tests.cpu.test_api_review:Reentrant") as c:
        Reentrant.comm = c
        c.all_reduce(np.ones(2, np.float32))
        Reentrant.comm = None
    assert _REENTERED and _REENTERED[0].startswith("all_reduce: this thread is inside an operation of this "
                                                   "communicator already (from a plugin callback or a signal handler?)")


def test_a_send_from_a_signal_handler_inside_group_s_opening_does_not_hang():
    """comm.group() holds the communicator's group lock while it opens; a signal handler that ran there (in the
    same thread) and called send waited on that lock for good. It now gets its answer (here: a lone send to
    itself is refused), and the group runs."""
    code = ("import signal, numpy as np, slicetrace\n"
            "import slicetrace.api as api\n"
            "from slicetrace.errors import UsageError\n"
            "c = slicetrace.init(backend='null')\n"
            "real, seen = api.outside_groups, []\n"
            "def checks(comm, what, *a, **k):\n"
            "    real(comm, what, *a, **k)\n"
            "    if what == 'comm.group()' and not seen:\n"
            "        seen.append('in')\n"
            "        signal.raise_signal(signal.SIGUSR1)\n"      # its handler runs here, under the lock
            "api.outside_groups = checks\n"
            "def handler(signum, frame):\n"
            "    try:\n"
            "        c.send(np.ones(4, np.float32), 0)\n"
            "    except UsageError as e:\n"
            "        seen.append(str(e))\n"
            "signal.signal(signal.SIGUSR1, handler)\n"
            "out = np.zeros(4, np.float32)\n"
            "with c.group():\n"
            "    c.send(np.full(4, 2, np.float32), 0)\n"
            "    c.recv(out, 0)\n"
            "assert out.tolist() == [2] * 4 and len(seen) == 2 and 'to itself' in seen[1], (seen, out)\n"
            "c.close()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLICETRACE_", "RANK", "WORLD_SIZE"))}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=str(ROOT), env=env)


def test_a_communicator_never_closed_still_finishes_its_trace(tmp_path):
    """A script that kept its communicator to the end (a torchrun script's often does) left a trace cut mid-record:
    no Coll events, not JSON, its losses uncounted."""
    code = ("import numpy as np, slicetrace\n"
            f"c = slicetrace.init(profiler_plugin='example', profile_dump_file={str(tmp_path / 't')!r})\n"
            "for _ in range(5):\n    c.all_reduce(np.ones(4, np.float32))\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=str(ROOT))
    (f,) = tmp_path.glob("t_*_0.json")
    recs = json.loads(f.read_text())
    assert sum(r.get("cat") == "COLL" and r.get("ph") == "b" for r in recs) == 5
    assert any(r.get("name") == "slicetrace_counters" for r in recs)


@pytest.mark.parametrize("backend", ["null", "cpu"])
def test_a_communicator_dropped_unclosed_still_finishes_its_trace_at_exit(tmp_path, backend):
    """One made in a function and dropped there (garbage-collected, not kept to the end) left its trace cut after
    the header: every record lost, uncounted. It now lives on until exit, as an NCCL communicator does until
    ncclCommDestroy."""
    code = ("import gc, numpy as np, slicetrace\n"
            "def train():\n"
            f"    c = slicetrace.init(backend={backend!r}, profiler_plugin='example', "
            f"profile_dump_file={str(tmp_path / 't')!r})\n"
            "    for _ in range(5):\n        c.all_reduce(np.ones(4, np.float32))\n"
            "train()\ngc.collect()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLICETRACE_", "RANK", "WORLD_SIZE"))}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=str(ROOT), env=env)
    (f,) = tmp_path.glob("t_*_0.json")
    recs = json.loads(f.read_text())
    assert sum(r.get("cat") == "COLL" and r.get("ph") == "b" for r in recs) == 5
    assert any(r.get("name") == "slicetrace_counters" for r in recs)


def _terminated_with_its_trace(code: str, tmp_path) -> None:
    """Run code (argv[1]: tmp_path) to its SIGTERM: exit 143, and its trace a_*_0.json whole with 5 collectives."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLICETRACE_", "RANK", "WORLD_SIZE"))}
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60, cwd=str(ROOT), env=env,
                       capture_output=True, text=True)
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    (f,) = tmp_path.glob("a_*_0.json")
    recs = json.loads(f.read_text())
    assert sum(r.get("cat") == "COLL" and r.get("ph") == "b" for r in recs) == 5
    assert any(r.get("name") == "slicetrace_counters" for r in recs)


def test_sigterm_to_a_profiled_program_still_finishes_its_trace(tmp_path):
    """torchrun's agent and Slurm stop ranks with SIGTERM, whose default action killed the process: the trace was
    cut after its header. While a communicator has plugins, SIGTERM at its default raises SystemExit(143); the
    default comes back at close, and a handler the program set is left alone."""
    code = ("import os, signal, sys, time, numpy as np, slicetrace\n"
            "t = sys.argv[1]\n"
            "c = slicetrace.init(backend='cpu', profiler_plugin='example', profile_dump_file=t + '/a')\n"
            "assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL\n"
            "d = slicetrace.init(backend='null', profiler_plugin='example', profile_dump_file=t + '/b')\n"
            "d.close()\n"
            "assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # c still open\n"
            "for _ in range(5):\n    c.all_reduce(np.ones(4, np.float32))\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30)\n")
    _terminated_with_its_trace(code, tmp_path)
    back = ("import signal, slicetrace\n"
            "c = slicetrace.init(backend='null', profiler_plugin='example')\n"
            "c.close()\n"
            "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, 'not restored'\n"
            "mine = lambda n, f: None\n"
            "signal.signal(signal.SIGTERM, mine)\n"
            "c = slicetrace.init(backend='null', profiler_plugin='example')\n"
            "assert signal.getsignal(signal.SIGTERM) is mine, 'replaced'\n"
            "c.close()\n"
            "assert signal.getsignal(signal.SIGTERM) is mine, 'replaced at close'\n")
    subprocess.run([sys.executable, "-c", back], check=True, timeout=60, cwd=str(ROOT))


# a profiled program (argv[1]: its trace folder) that sends itself SIGTERM as its plugins start to finish
_TERM_IN_FINISH = ("import os, signal, sys, numpy as np, slicetrace\n"
                   "from slicetrace import session\n"
                   "c = slicetrace.init(backend='cpu', profiler_plugin='example', profile_dump_file=sys.argv[1] + '/a')\n"
                   "for _ in range(5):\n    c.all_reduce(np.ones(4, np.float32))\n"
                   "finish = session.Session._close_host\n"
                   "def close_host(self, *a):\n"
                   "    os.kill(os.getpid(), signal.SIGTERM)\n"
                   "    finish(self, *a)\n"
                   "session.Session._close_host = close_host\n")


def test_sigterm_while_the_last_profiled_communicator_closes_still_finishes_its_trace(tmp_path):
    """close put SIGTERM's default back first, then flushed and finalized the plugins (seconds, for a big trace):
    a SIGTERM there (torchrun's agent stopping the ranks) killed the rank with its trace cut after the header."""
    code = _TERM_IN_FINISH + "c.close()\n"
    _terminated_with_its_trace(code, tmp_path)


def test_sigterm_while_an_unclosed_communicator_is_finished_at_exit_still_finishes_its_trace(tmp_path):
    """A rank whose op raised (a peer died) exits with its communicator open, and its trace is finished at exit;
    torchrun's agent SIGTERMs the other ranks once one failed, often just then: the SystemExit(143) raised in the
    at-exit finish cut the trace short ('Exception ignored in atexit callback', the file not JSON)."""
    code = _TERM_IN_FINISH + "raise RuntimeError('as a PeerError would')\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLICETRACE_", "RANK", "WORLD_SIZE"))}
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60, cwd=str(ROOT), env=env,
                       capture_output=True, text=True)
    assert p.returncode == 1 and "as a PeerError would" in p.stderr, p.stderr
    assert "Exception ignored" not in p.stderr, p.stderr
    (f,) = tmp_path.glob("a_*_0.json")
    recs = json.loads(f.read_text())
    assert sum(r.get("cat") == "COLL" and r.get("ph") == "b" for r in recs) == 5
    assert any(r.get("name") == "slicetrace_counters" for r in recs)


def test_a_profiled_communicator_made_off_the_main_thread_warns_once_that_sigterm_loses_its_trace():
    """There no handler can be set: SIGTERM kills the process before the trace is finished; before, silently."""
    code = ("import threading, slicetrace\n"
            "def f():\n"
            "    for _ in range(2):\n"
            "        slicetrace.init(backend='null', profiler_plugin='example').close()\n"
            "t = threading.Thread(target=f)\nt.start()\nt.join()\n")
    p = subprocess.run([sys.executable, "-c", code], timeout=60, cwd=str(ROOT), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("was made outside the main thread, where SIGTERM") == 1, p.stderr


def test_all_to_all_keeps_to_the_group_rules_too(comm):
    """all_to_all skipped the checks send/recv got: inside another communicator's group it ran at once, and from
    another thread it joined an open group and returned before its output was filled."""
    with slicetrace.init(backend="null") as other:
        with pytest.raises(UsageError, match="inside another communicator's comm.group"):
            with comm.group():
                other.all_to_all(np.ones(2, np.float32))
    assert _in_anothers_group(comm, lambda: comm.all_to_all(np.ones(2, np.float32))).startswith(
        "all_to_all: another thread has comm.group() open")


def test_a_child_forked_inside_a_group_can_use_a_communicator_of_its_own(comm):
    """The thread-local group stack survived the fork: the child's own new communicator was refused."""
    def own():
        with slicetrace.init(backend="null") as mine:
            mine.all_reduce(np.ones(2, np.float32))

    with comm.group():
        got = _in_a_fork(own)
    assert got == "ok", got


def test_a_child_forked_from_a_profiled_program_is_killed_by_sigterm_as_before(tmp_path):
    """The SIGTERM-as-exit handler of a profiled communicator was inherited by forked children (DataLoader workers),
    where SIGTERM then raised SystemExit inside the child's own code; they own no communicator, so it is undone."""
    code = ("import os, signal, time, slicetrace\n"
            "c = slicetrace.init(backend='null', profiler_plugin='example', profile_dump_file=%r)\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    try:\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "        time.sleep(30)\n"
            "    finally:\n"
            "        os._exit(7)                 # SystemExit unwound to here: the handler was inherited\n"
            "_, status = os.waitpid(pid, 0)\n"
            "assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status\n"
            "assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL    # the parent keeps it\n"
            "c.close()\n" % str(tmp_path / "t"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLICETRACE_", "RANK", "WORLD_SIZE"))}
    p = subprocess.run([sys.executable, "-c", code], timeout=60, cwd=str(ROOT), env=env, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
