"""Teardown when something does not return: a drain poll that outlives close keeps the ring memory it reads and
what it left is counted; a stuck plugin callback does not hang close; a plugin that exits in the drain thread
loses a counted batch; close in a forked child, concurrent closes, flush after close; the cuda abort and kept
rings against a fake runtime. In-process, no rank processes (one test forks)."""
from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import threading
import time

import numpy as np
import pytest

import slicetrace.session as session_mod
from slicetrace.analyze.report import build, render
from slicetrace.analyze.trace import counters as trace_counters
from slicetrace.analyze.trace import kernel_steps, load_traces
from slicetrace.api import Communicator
from slicetrace.backend.base import Work
from slicetrace.backend.null import NullBackend
from slicetrace.config import Settings
from slicetrace.errors import CommTimeoutError, UsageError
from slicetrace.events.ops import OpInfo, TaskInfo
from slicetrace.events.plugin import LoadedPlugin
from slicetrace.plan.schedule import plan_collective
from slicetrace.rendezvous import DictStore
from slicetrace.stamps.drain import Drain
from tests.helpers.procs import wait_child
from tests.unit.test_gpu_writer_session import DeviceRings, GpuLike
from tests.unit.test_plugin import RecPlugin

# ---- a drain that cannot finish, plugins that never return or exit, forks, concurrent closes ----

X = np.ones(40_000, np.float32)


class QuickDrain(Drain):
    def stop(self, timeout_s=0.3):          # the session's 5 s, shortened for the tests
        super().stop(timeout_s)


def _gpu(tmp_path, monkeypatch, cls, plugins=None, **kw):
    """A session over an asynchronous fake backend (a drain thread), 4 channels, 2 ranks."""
    monkeypatch.setattr(session_mod, "create", lambda s, r, w, st, j: cls(s, r, w, st, j))
    monkeypatch.setattr(session_mod, "Drain", QuickDrain)
    if plugins is not None:
        monkeypatch.setattr(session_mod, "load_plugins", lambda spec, s, source: [LoadedPlugin(p) for p in plugins])
    kw.setdefault("timeout_s", 0.5)
    return session_mod.Session(Settings(backend="null", nchannels=4, buffsize=64 * 1024, profiler_plugin="example",
                                        profile_dump_file=str(tmp_path / "t"), drain_interval_us=50, **kw),
                               0, 2, DictStore({}), "cp")


def _all_reduce(s, tag, world=2):
    plan = plan_collective("all_reduce", world, 0, len(X), 4, 0, s.settings.nchannels, s.settings.step_bytes)
    task = TaskInfo(func="AllReduce", count=len(X), n_programs=len(plan.programs))
    s.run(Work(tag, plan, "float32", "sum", sendbuf=X, recvbuf=X),
          OpInfo(tag=tag, func="all_reduce", tasks=[task], seq_number=tag, mask=s.op_mask_for(0),
                 ts_ns=time.monotonic_ns()))


class Stalling(DeviceRings):
    """fetch_stamps blocks while `stall` is set (a copy that does not return); close notes whether it freed
    the rings while that poll still ran."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.stall, self.in_fetch, self.kept, self.order = False, False, False, []
        self.entered, self.release = threading.Event(), threading.Event()
        self.freed_under_poll = None

    def fetch_stamps(self, lo, hi):
        if self.stall:
            self.in_fetch = True
            self.entered.set()
            self.release.wait(30)
            self.in_fetch = False
        super().fetch_stamps(lo, hi)

    def keep_rings(self):
        self.order.append("keep_rings")
        self.kept = True

    def close(self):
        self.order.append("close")
        self.freed_under_poll = self.in_fetch and not self.kept
        super().close()


def _stalled(tmp_path, monkeypatch, plugins=None):
    """Ops 1-2 drained, op 3's fetch stuck in the drain thread. Returns the session and op 3's record count."""
    s = _gpu(tmp_path, monkeypatch, Stalling, plugins)
    be = s.backend
    for t in (1, 2):
        _all_reduce(s, t)
    assert s.drain.flush(10)
    before = be.written
    be.stall = True
    _all_reduce(s, 3)
    assert be.entered.wait(10)
    return s, be.written - before


def _unstall(s):
    s.backend.release.set()
    s.drain._thread.join(10)
    assert not s.drain.alive


def test_a_poll_that_outlives_close_keeps_the_ring_memory_it_reads(tmp_path, monkeypatch):
    """Before, close freed the rings (cuda: device ring and pinned mirror) under the stuck poll: a crash."""
    s, _ = _stalled(tmp_path, monkeypatch)
    try:
        s.close()
        assert s.backend.order == ["keep_rings", "close"] and s.backend.freed_under_poll is False
        assert s.drain.poll_once(False, 0.05) is None      # fenced: no later poll reads the rings
    finally:
        _unstall(s)


def test_records_a_drain_that_could_not_finish_left_in_the_rings_are_counted_in_trace_and_report(
        tmp_path, monkeypatch):
    """Before, they were neither delivered nor counted: the trace said no loss."""
    s, n = _stalled(tmp_path, monkeypatch)
    try:
        s.close()
    finally:
        _unstall(s)
    assert n > 0 and s.counters()["undrained"] == n
    recs = load_traces(str(tmp_path / "t*"))
    c = trace_counters(recs)
    assert c[0]["undrained"] == n
    from rich.console import Console
    con = Console(record=True, width=400)
    render(build(kernel_steps(recs), counters=c), console=con)
    assert f"undrained {n}" in con.export_text().split("loss counters:")[1].splitlines()[0]


class Stuck(RecPlugin):
    """kernel_step_batch blocks once `block` is set, until released."""

    def __init__(self):
        super().__init__(name="stuck")
        self.block, self.entered, self.release = False, threading.Event(), threading.Event()

    def _batch(self, ctx, parent, recs):
        if self.block:
            self.entered.set()
            self.release.wait(60)
        return super()._batch(ctx, parent, recs)


def test_close_returns_with_an_error_while_a_plugin_callback_never_returns(tmp_path, monkeypatch):
    """Before, close waited for the callback without limit (the event host's lock)."""
    p = Stuck()
    s = _gpu(tmp_path, monkeypatch, GpuLike, [p])
    _all_reduce(s, 1)
    assert s.drain.flush(10)
    p.block = True
    _all_reduce(s, 2)
    assert p.entered.wait(10)
    got: list = []

    def close():
        try:
            s.close()
            got.append(None)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            got.append(e)
    th = threading.Thread(target=close, daemon=True)
    th.start()
    th.join(15)
    try:
        assert not th.is_alive(), "close waited for the plugin"
        assert isinstance(got[0], CommTimeoutError) and "'stuck'" in str(got[0])
        assert s.backend._closed                            # the backend still closed
    finally:
        p.release.set()
        th.join(10)
        s.drain._thread.join(10)


class Exits(RecPlugin):
    armed = False

    def _batch(self, ctx, parent, recs):
        if self.armed:
            self.armed = False
            raise SystemExit(3)
        return super()._batch(ctx, parent, recs)


def test_a_plugin_that_exits_in_the_drain_thread_loses_a_counted_batch_and_is_logged_once(
        tmp_path, monkeypatch, caplog):
    """Before, the batch was lost without a counter and the thread's death was said only among close's lines."""
    p = Exits()
    with caplog.at_level(logging.ERROR, logger="slicetrace"):
        s = _gpu(tmp_path, monkeypatch, GpuLike, [p])
        _all_reduce(s, 1)
        assert s.drain.flush(10)
        c1 = s.counters()
        rows = c1["delivered_kernel_step"] + c1["delivered_kernel_ch"]     # op 2 has as many as op 1
        p.armed = True
        _all_reduce(s, 2)
        s.drain._thread.join(10)
        assert not s.drain.alive and isinstance(s.drain.error, SystemExit)
        assert "drain thread died" in caplog.text                          # when it happened
        s.close()
    c = p.of("counters")[-1][1]
    assert c["plugin_error"] == rows and c["delivered_kernel_step"] + c["delivered_kernel_ch"] == rows
    assert len([r for r in caplog.records if "SystemExit(3)" in r.getMessage()]) == 1


class Marking(NullBackend):
    """close leaves a file named after the closing process."""
    where = ""

    def close(self):
        open(os.path.join(self.where, f"closed-{os.getpid()}"), "w").close()
        super().close()


def test_close_in_a_forked_child_leaves_the_parents_backend_and_trace_alone(tmp_path, monkeypatch):
    Marking.where = str(tmp_path)
    monkeypatch.setattr(session_mod, "create", lambda s, r, w, st, j: Marking(s, r, w, st, j))
    comm = Communicator(Settings(backend="null", nchannels=1, profiler_plugin="example",
                                 profile_dump_file=str(tmp_path / "t")), 0, 1, DictStore({}), "fork")
    comm.all_reduce(np.ones(1000, np.float32))
    pid = os.fork()
    if pid == 0:                                        # the child: exit whatever happens
        code = 1
        try:
            comm.close()
            code = 0
        finally:
            os._exit(code)
    assert wait_child(pid) == 0
    assert list(tmp_path.glob("closed-*")) == []        # the child closed nothing of the parent's
    comm.all_reduce(np.ones(1000, np.float32))
    comm.close()
    assert [f.name for f in tmp_path.glob("closed-*")] == [f"closed-{os.getpid()}"]
    (path,) = tmp_path.glob("t_*.json")
    with open(path) as f:
        data = json.load(f)                             # one complete trace, the parent's
    assert data[-1]["name"] == "slicetrace_counters"
    assert len([r for r in data if r.get("name") == "AllReduce" and r.get("ph") == "b"]) == 2


def _null_comm(monkeypatch, plugins=()):
    monkeypatch.setattr(session_mod, "load_plugins", lambda spec, s, source: [LoadedPlugin(p) for p in plugins])
    return Communicator(Settings(backend="null", nchannels=1, profiler_plugin="rec" if plugins else "",
                                 timeout_s=0.5), 0, 1, DictStore({}), "cc")


def test_flush_profiler_after_close_is_refused(monkeypatch):
    """Before, it polled the drain of a closed communicator (cuda: rings the backend had freed)."""
    comm = _null_comm(monkeypatch, [RecPlugin()])
    comm.close()
    with pytest.raises(UsageError, match="closed"):
        comm.flush_profiler()


class Window:
    """A communicator's _busy lock whose first acquire runs a second close() from another thread at once:
    in the window before the first close marks the communicator closed."""

    def __init__(self, comm):
        self.lock, self.comm, self.second, self.armed = threading.Lock(), comm, "not run", True

    def acquire(self, blocking=True, timeout=-1):
        got = self.lock.acquire(blocking, timeout)
        if got and self.armed:
            self.armed = False
            t = threading.Thread(target=self._second)
            t.start()
            t.join(10)
        return got

    def _second(self):
        try:
            self.comm.close()
            self.second = "returned"
        except Exception as e:  # noqa: BLE001 - the test looks at it
            self.second = e

    def release(self):
        self.lock.release()


def test_a_second_close_while_the_first_runs_returns(monkeypatch):
    """Before, it raised 'another thread is inside an operation'."""
    comm = _null_comm(monkeypatch)
    comm._busy = w = Window(comm)
    comm.close()
    assert w.second == "returned" and comm._session._closed


def test_an_inline_poll_waits_no_longer_than_timeout_s_for_another_poller(monkeypatch):
    """Before, an op of a synchronous backend waited without limit for a poller that did not return."""
    monkeypatch.setattr(session_mod, "load_plugins", lambda spec, s, source: [LoadedPlugin(RecPlugin())])
    s = session_mod.Session(Settings(backend="null", nchannels=1, profiler_plugin="rec", timeout_s=0.5), 0, 1,
                            DictStore({}), "inl")
    assert s._inline
    s.drain._poll_lock.acquire()                        # a flush in another thread, stuck in a plugin
    t = threading.Thread(target=_all_reduce, args=(s, 1, 1), daemon=True)
    t.start()
    t.join(10)
    alive = t.is_alive()
    s.drain._poll_lock.release()
    t.join(10)
    assert not alive
    s.close()


class AbortRt:
    """The cupy runtime calls of CommMemory.raise_peer_aborts and close, on host memory; the abort's copy
    blocks until `go`."""

    def __init__(self):
        self.events, self.in_copy, self.go = [], threading.Event(), threading.Event()

    def memcpyAsync(self, dst, src, n, kind, stream):
        self.in_copy.set()
        self.go.wait(10)
        ctypes.memmove(dst, src, n)
        self.events.append("abort copy")

    def free(self, p):
        self.events.append(("free", p))

    def freeHost(self, p):
        self.events.append(("freeHost", p))

    def streamDestroy(self, h):
        self.events.append(("streamDestroy", h))

    def eventDestroy(self, h):
        pass


def _fake_memory(rt):
    from slicetrace.backend.cuda.ipc import CommMemory
    ctrl, base = np.zeros(4096, np.uint8), np.zeros(64, np.uint8)
    m = object.__new__(CommMemory)
    m.__dict__.update(_rt=rt, rank=0, _opened=[], _dev=[11, 12], _host=[21, ctrl.ctypes.data], kept=False,
                      _ctrl_lock=threading.Lock(), ctrl=ctrl, ctrl_ptr=ctrl.ctypes.data,
                      words=ctrl[:64].view(np.uint32), base=base.ctypes.data, peer_base=[base.ctypes.data],
                      dring=11, ring_ptr=21, rings=None, ring_mem=None, probe=None, _keep=(ctrl, base))
    return m


def test_close_waits_for_a_watchdog_abort_in_flight_before_freeing_the_control_words():
    """Before, close freed the mapped control words while the watchdog's abort still wrote and copied them."""
    from slicetrace.backend.cuda.backend import CudaBackend
    rt = AbortRt()
    m = _fake_memory(rt)
    be = object.__new__(CudaBackend)
    be.__dict__.update(_broken=None, mem=m, _side=7, store=DictStore({}), _prefix="p", rank=0)
    dog = threading.Thread(target=be.abort, args=("a peer is gone",), daemon=True)
    dog.start()
    assert rt.in_copy.wait(10)
    closer = threading.Thread(target=m.close, daemon=True)
    closer.start()
    closer.join(0.3)
    rt.go.set()
    dog.join(10)
    closer.join(10)
    assert not dog.is_alive() and not closer.is_alive()
    assert rt.events.index("abort copy") < rt.events.index(("freeHost", m.ctrl_ptr))
    n = len(rt.events)
    be.abort("a late watchdog")                         # closed: nothing written, nothing copied
    assert len(rt.events) == n and m.words is None


def test_kept_rings_and_their_copy_stream_survive_close():
    from slicetrace.backend.cuda.backend import CudaBackend
    rt = AbortRt()
    rt.go.set()
    m = _fake_memory(rt)
    be = object.__new__(CudaBackend)
    be.__dict__.update(mem=m, _rt=rt, _dog=None, sigs=None, _side=1, _copy=2, _fetch=3, _fork=4, _join=5)
    be.keep_rings()
    be._free()
    assert rt.events == [("free", 12), ("freeHost", m.ctrl_ptr), ("streamDestroy", 1), ("streamDestroy", 2)]


def test_a_forked_child_that_exits_normally_leaves_the_parents_trace_whole(tmp_path):
    """A child's normal exit flushed its copy of the trace file's buffer: the header came twice, invalid JSON.
    Run as a script: pytest's own process cannot exit normally in a forked child."""
    import subprocess
    import sys
    code = f"""
import os, sys, numpy as np
from slicetrace.api import Communicator
from slicetrace.config import Settings
from slicetrace.rendezvous import DictStore
comm = Communicator(Settings(backend="null", nchannels=1, profiler_plugin="example",
                             profile_dump_file={str(tmp_path / "t")!r}), 0, 1, DictStore({{}}), "fork")
comm.all_reduce(np.ones(1000, np.float32))
pid = os.fork()
if pid == 0:
    comm.close()
    sys.exit(0)                 # a normal exit: the interpreter finalizes what the child inherited
from tests.helpers.procs import wait_child
assert wait_child(pid) == 0
comm.all_reduce(np.ones(1000, np.float32))
comm.close()
"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)    # its fork in its group: killed with it
    try:
        _, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("the script and its fork did not finish within 120 s (killed)") from None
    r = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
    assert r.returncode == 0, r.stderr
    (path,) = tmp_path.glob("t_*.json")
    with open(path) as f:
        data = json.load(f)
    assert [x["name"] for x in data].count("slicetrace_comm") == 1
    assert len([x for x in data if x.get("name") == "AllReduce" and x.get("ph") == "b"]) == 2


def test_close_after_a_ctrl_c_between_an_ops_lock_and_its_try_closes(monkeypatch):
    """A KeyboardInterrupt right after an op took the communicator's lock, before the op's try, left the lock held
    with nobody to release it: close() then said 'another thread is inside an operation' and did not close (under
    launch(), a rank asked to close lost its trace). Another thread's op still holds close off."""
    comm = _null_comm(monkeypatch)
    x = np.ones(8, np.float32)
    comm.all_reduce(x)
    enter = Communicator._enter

    def interrupted(self, func):
        enter(self, func)
        raise KeyboardInterrupt              # where a signal handler may run: the lock is held
    monkeypatch.setattr(Communicator, "_enter", interrupted)
    with pytest.raises(KeyboardInterrupt):
        comm.all_reduce(x)
    monkeypatch.setattr(Communicator, "_enter", enter)
    comm.close()
    assert comm._closed and comm._session._closed

    other = _null_comm(monkeypatch)
    inside, go = threading.Event(), threading.Event()
    t = threading.Thread(target=other._guarded, args=("all_reduce", lambda: (inside.set(), go.wait(10))))
    t.start()                                # another thread inside an op
    try:
        assert inside.wait(10)
        with pytest.raises(UsageError, match="another thread is inside an operation"):
            other.close()
    finally:
        go.set()
        t.join(10)
    other.close()
    assert other._closed


def test_close_from_inside_a_running_op_of_the_same_thread_is_refused(monkeypatch):
    """A signal handler (or callback) that closes the communicator while this thread's op runs must not free the
    op's memory under it: refused, and the op and a later close go on."""
    comm = _null_comm(monkeypatch)
    seen = []
    one = Communicator._collective_one

    def with_handler(self, *a, **k):
        try:
            self.close()                         # as a SIGALRM handler would, mid-op
        except UsageError as e:
            seen.append(str(e))
        return one(self, *a, **k)
    monkeypatch.setattr(Communicator, "_collective_one", with_handler)
    y = comm.all_reduce(np.ones(8, np.float32))
    assert seen and "this thread (a handler?) is inside an operation" in seen[0], seen
    assert not comm._closed and float(y.sum()) == 8.0
    monkeypatch.setattr(Communicator, "_collective_one", one)
    comm.close()
    assert comm._closed
    with pytest.raises(UsageError, match="communicator is closed"):
        comm.all_reduce(np.ones(8, np.float32))
