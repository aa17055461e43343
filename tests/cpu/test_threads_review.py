"""Threads: ranks that are threads of one process, a close() from another thread racing an op, and comm.group()
opened by one thread while another opens one or calls in."""
from __future__ import annotations

import sys
import threading
import time

import numpy as np

import slicetrace
from slicetrace.errors import UsageError
from slicetrace.rendezvous import DictStore


def _rank_thread(r: int, n: int, shared: dict, out: dict) -> None:
    try:
        with slicetrace.init(backend="cpu", rank=r, world_size=n, store=DictStore(shared), job="thr", timeout_s=10.0,
                             cpu_bind="off") as c:
            got = c.all_reduce(np.full(1000, r + 1, np.int64))
            out[r] = (int((got != n * (n + 1) // 2).sum()), c.comm_hash)
    except BaseException as e:  # noqa: BLE001 - reported to the test
        out[r] = f"{type(e).__name__}: {e}"


def test_ranks_that_are_threads_of_one_process_meet():
    """The per-job generation counter (a job made again in one process gets new store keys) counted the process's
    ranks as re-inits: rank 1 looked for st/thr/cpu2 keys, rank 0 wrote st/thr/cpu1, and both timed out."""
    shared: dict = {}
    out: dict = {}
    threads = [threading.Thread(target=_rank_thread, args=(r, 3, shared, out), daemon=True) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank thread hung"
    assert sorted(out) == [0, 1, 2] and all(isinstance(v, tuple) for v in out.values()), out
    assert all(v[0] == 0 for v in out.values()) and len({v[1] for v in out.values()}) == 1


def test_a_close_from_another_thread_never_meets_a_torn_down_backend():
    """close() took an op between its lock and its try for a lock leaked by an interrupt, and freed the backend
    under it: BackendError 'the cpu backend is closed' or ValueError 'released memoryview' (11 of 300 trials)
    instead of 'communicator is closed'."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    seen = []
    try:
        for _ in range(150):
            c = slicetrace.init(backend="cpu", timeout_s=5.0)
            c.all_reduce(np.ones(4, np.float32))
            res = []

            def owner(c=c, res=res):
                try:
                    while True:
                        c.barrier()
                        with c.group():
                            c.send(np.ones(4, np.int8), 0)
                            c.recv(np.empty(4, np.int8), 0)
                except Exception as e:  # noqa: BLE001 - what the owner saw
                    res.append(f"{type(e).__name__}: {e}")
            th = threading.Thread(target=owner, daemon=True)
            th.start()
            deadline = time.monotonic() + 30         # the owner is between ops now and then, however loaded
            while time.monotonic() < deadline:
                try:
                    c.close()
                    break
                except UsageError:
                    pass
            th.join(10)
            seen.append(res[0] if res else "no error (hung?)")
    finally:
        sys.setswitchinterval(old)
    assert set(seen) == {"UsageError: communicator is closed"}, sorted(set(seen))


def _slow_checks(monkeypatch, what: str, pause=lambda: time.sleep(0.1)) -> None:
    """outside_groups(..., what) passes, then pause(): another thread runs in the window before the call acts."""
    import slicetrace.api as api
    real = api.outside_groups

    def slow(comm, w, *a, **k):
        real(comm, w, *a, **k)
        if w == what:
            pause()
    monkeypatch.setattr(api, "outside_groups", slow)


def test_two_threads_opening_a_group_at_once_get_a_group_or_an_error(monkeypatch):
    """Both passed the check before either opened and both were let in, one group nested in the other: under load
    a thread's group ended as an inner one and ran nothing (its recv returned unfilled, no error), and its thread
    kept the communicator among its open groups."""
    from slicetrace.api_checks import _OPEN
    _slow_checks(monkeypatch, "comm.group()")
    c = slicetrace.init(backend="null")
    start, tried, res = threading.Barrier(2), threading.Barrier(2), {}

    def body(k):
        out = np.zeros(4, np.float32)
        try:
            start.wait(10)
            with c.group():
                tried.wait(10)      # a group stays open until both tried: the first never ends before the second
                c.send(np.full(4, k + 1, np.float32), 0)
                c.recv(out, 0)
            res[k] = ("ran", out.tolist() == [k + 1] * 4, bool(_OPEN.__dict__.get("stack")))
        except UsageError as e:
            tried.wait(10)
            res[k] = ("refused", "another thread has comm.group() open" in str(e), bool(_OPEN.__dict__.get("stack")))
    threads = [threading.Thread(target=body, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads), "a group() hung"
    c.close()
    assert sorted(res.values()) == [("ran", True, False), ("refused", True, False)], res


def test_an_all_to_all_never_joins_a_group_another_thread_opened_meanwhile(monkeypatch):
    """all_to_all passed the group check, another thread opened comm.group(), and its blocks joined that group: it
    returned at once with its output unfilled (the group's owner then ran them)."""
    res, in_window, opened, leave = {}, threading.Event(), threading.Event(), threading.Event()
    # the window lasts until the group is open (a fixed one lost the race when the owner thread started late)
    _slow_checks(monkeypatch, "all_to_all", lambda: (in_window.set(), opened.wait(10)))
    c = slicetrace.init(backend="null")

    def owner():
        try:
            in_window.wait(10)                  # all_to_all passed its check
            with c.group():
                opened.set()
                leave.wait(10)
            res["owner"] = "ran"
        except UsageError as e:
            res["owner"] = str(e)
    t = threading.Thread(target=owner, daemon=True)
    t.start()
    out = np.zeros(8, np.float32)
    try:
        c.all_to_all(np.arange(8, dtype=np.float32), out)
        res["a2a"] = f"returned, out filled: {out.tolist() == list(range(8))}"
    except UsageError as e:
        res["a2a"] = str(e)
    leave.set()
    t.join(20)
    assert not t.is_alive(), "the group's owner hung"
    c.close()
    assert opened.is_set() and res["owner"] == "ran", res
    assert res["a2a"].startswith("all_to_all: another thread has comm.group() open"), res
