"""cpu backend: how long a busy peer is waited for (Guard's heartbeat limit), and a /dev/shm too small for a
segment (a BackendError at creation, not SIGBUS at first touch)."""
from __future__ import annotations

import errno
import os
import re
import secrets
import subprocess
import sys
import time

import pytest

from slicetrace.backend import segment
from slicetrace.backend.cpu.backend import advice
from slicetrace.backend.cpu.shm import C_HEARTBEAT, PAGE, REASON_MAX
from slicetrace.backend.segment import Segment, unlink_name
from slicetrace.backend.cpu.transport import Guard
from slicetrace.backend.procs import proc_start_time
from slicetrace.errors import BackendError, PeerError


def guard_with_peer(timeout_s: float, heartbeat_age_s: float, pid: int | None = None) -> Guard:
    """Rank 0's Guard with one peer (rank 1) whose last heartbeat is heartbeat_age_s old; the peer's process is
    this one (alive) unless pid is given."""
    g = Guard(0, memoryview(bytearray(PAGE)).cast("Q"), memoryview(bytearray(REASON_MAX)), timeout_s)
    pctl = memoryview(bytearray(PAGE)).cast("Q")
    pctl[C_HEARTBEAT] = time.monotonic_ns() - int(heartbeat_age_s * 1e9)
    pid = os.getpid() if pid is None else pid
    g.peers[1] = (pctl, memoryview(bytearray(REASON_MAX)), pid, proc_start_time(pid))
    return g


def check_twice(g: Guard, waiting_on: tuple[int, ...] = (1,)) -> None:
    for _ in range(2):               # a peer counts as gone when seen so at two checks 20 ms apart or more
        g.check(waiting_on)
        time.sleep(0.025)


def test_a_busy_live_peer_is_waited_for_up_to_timeout_s():
    """A peer in a C call that holds the GIL for 12 s has no heartbeat meanwhile: with timeout_s=30 it was
    declared dead after 10 s ("stopped responding") although the user allowed 30."""
    check_twice(guard_with_peer(timeout_s=30, heartbeat_age_s=12))
    t0 = time.monotonic()
    with pytest.raises(PeerError, match=r"rank 1 \(pid \d+\) stopped responding \(no heartbeat for 3\d\.\ds\)") as e:
        check_twice(guard_with_peer(timeout_s=30, heartbeat_age_s=31))
    took = time.monotonic() - t0
    age = float(re.search(r"no heartbeat for (\d+\.\d)s", str(e.value)).group(1))
    assert 31.0 <= age <= 31.0 + took + 0.05, (age, took)     # the heartbeat's age when seen, whatever the delay


def test_a_short_timeout_keeps_the_10s_heartbeat_floor():
    check_twice(guard_with_peer(timeout_s=1, heartbeat_age_s=5))     # a few seconds' stall is not a death
    with pytest.raises(PeerError, match="stopped responding"):
        check_twice(guard_with_peer(timeout_s=1, heartbeat_age_s=11))


def test_a_dead_peer_is_found_at_once_whatever_timeout_s():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    g = guard_with_peer(timeout_s=600, heartbeat_age_s=0, pid=p.pid)
    with pytest.raises(PeerError, match=rf"rank 1 \(pid {p.pid}\) exited"):
        check_twice(g)


def test_a_peer_that_exited_is_judged_only_by_the_waits_that_need_it():
    """A rank that did its part and exited without close() aborted a point-to-point op between two other ranks
    (and, with one rank descheduled for 0.4 s, a reduce that would have completed): every wait judged every peer
    dead. A ring's dead rank is still found, by the neighbour that waits on it, whose abort reaches every rank."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    g = guard_with_peer(timeout_s=600, heartbeat_age_s=0, pid=p.pid)
    check_twice(g, waiting_on=(2,))                     # a wait on another rank: rank 1 is not its concern
    check_twice(g, waiting_on=())
    with pytest.raises(PeerError, match=rf"rank 1 \(pid {p.pid}\) exited"):
        check_twice(g)


def test_a_wait_on_a_live_peer_does_not_clear_another_waits_sighting_of_a_dead_one():
    """Channel threads share one Guard: a check by a wait on live rank 2 cleared the first sighting a wait on dead
    rank 1 had made, so with the two in phase the death went unseen until timeout_s (a 60 s hang by default)."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    g = guard_with_peer(timeout_s=600, heartbeat_age_s=0, pid=p.pid)
    pctl = memoryview(bytearray(PAGE)).cast("Q")
    pctl[C_HEARTBEAT] = time.monotonic_ns()
    g.peers[2] = (pctl, memoryview(bytearray(REASON_MAX)), os.getpid(), proc_start_time(os.getpid()))
    g.check((1,))                                       # channel 0's wait: first sighting of rank 1's death
    g.check((2,))                                       # channel 1's wait, on a live peer
    time.sleep(0.025)
    g.check((2,))
    with pytest.raises(PeerError, match=rf"rank 1 \(pid {p.pid}\) exited"):
        g.check((1,))


def test_a_peer_in_another_pid_namespace_is_not_judged_by_its_pid():
    """Containers that share /dev/shm but not a PID namespace: a peer's pid (1 in its own namespace) named some
    other process here, and any wait over 50 ms aborted the communicator ("rank 1 (pid 1) exited (pid reused)").
    Its attach records pid 0 for such a peer, which only its heartbeat and closed word judge."""
    from slicetrace.backend.cpu.backend import peer_pid
    from slicetrace.backend.cpu.shm import C_PID, C_PIDNS
    from slicetrace.backend.procs import pid_ns_id
    if os.path.exists("/proc/self/ns/pid"):
        assert pid_ns_id() == os.stat("/proc/self/ns/pid").st_ino > 0
    words = memoryview(bytearray(PAGE)).cast("Q")
    words[C_PID], words[C_PIDNS] = 1, 4026531836
    assert peer_pid(words, 4026531836) == 1                 # one namespace: its pid is judged
    assert peer_pid(words, 4026532999) == 0                 # another: never
    words[C_PIDNS] = 0
    assert peer_pid(words, 0) == 0                          # unknown on both sides: never
    g = guard_with_peer(timeout_s=600, heartbeat_age_s=0)
    pctl, reason, _, start = g.peers[1]
    g.peers[1] = (pctl, reason, 0, start)               # as _attach stores a peer of another namespace
    check_twice(g)                                      # alive by its heartbeat
    pctl[C_HEARTBEAT] = time.monotonic_ns() - int(700 * 1e9)
    with pytest.raises(PeerError, match=r"rank 1 \(pid \d+\) stopped responding"):
        check_twice(g)


def no_space(fd: int, offset: int, length: int) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_dev_shm_is_a_backend_error_that_says_what_to_change(monkeypatch):
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    name = f"st_test_{secrets.token_hex(4)}"
    size = 14 << 20
    try:
        with pytest.raises(BackendError) as ei:
            Segment(name, size, create=True, advice=advice(64, 2, 1 << 16, 1 << 20))   # the cpu backend's
    finally:
        left = os.path.exists(f"/dev/shm/{name}")
        unlink_name(name)                # a failing run leaves nothing either
    assert not left
    msg = str(ei.value)
    assert f"could not reserve {size} bytes (14.0 MiB) of shared memory for segment {name!r}" in msg, msg
    assert "No space left on device" in msg and "/dev/shm has " in msg and " MiB free of " in msg, msg
    for hint in ("SLICETRACE_BUFFSIZE", "SLICETRACE_NCHANNELS", "SLICETRACE_STAMP_RING_SLOTS", "--shm-size"):
        assert hint in msg, msg
    # here the rings are most of it (the reviewer's case: ring_slots large, nchannels 64)
    assert "4.4 MiB of FIFOs ((nchannels 64 + world 2) x buffsize 65536)" in msg, msg
    assert "6144.0 MiB of stamp rings (nchannels x ring_slots 1048576)" in msg, msg


def test_a_created_segment_has_its_pages_reserved():
    """st_blocks counts allocated pages: ftruncate alone leaves the segment sparse (SIGBUS later if /dev/shm
    fills up)."""
    name = f"st_test_{secrets.token_hex(4)}"
    seg = Segment(name, 1 << 20, create=True)
    try:
        assert os.stat(f"/dev/shm/{name}").st_blocks * 512 >= 1 << 20
    finally:
        seg.unlink()
        seg.close()


def test_the_free_space_report_survives_a_missing_dir(monkeypatch):
    monkeypatch.setattr(segment, "SHM_DIR", "/nonexistent-shm-dir")
    monkeypatch.setattr(os, "posix_fallocate", no_space)
    name = f"st_test_{secrets.token_hex(4)}"
    try:
        with pytest.raises(BackendError, match="the free space in /nonexistent-shm-dir is unknown"):
            Segment(name, PAGE, create=True)
    finally:
        left = os.path.exists(f"/dev/shm/{name}")
        unlink_name(name)
    assert not left


# a collective in flight: AllReduce's signature (opsig.encode_sig) as Guard.publish_sig takes it
def _in_all_reduce(g: Guard, peer_started: bool) -> None:
    from slicetrace.backend.opsig import encode_sig
    from slicetrace.backend.cpu.shm import NSIG, SIG_WORD
    sig = (5,) + encode_sig("all_reduce", 1000, "float32", "sum", 0, 1, 1 << 19)
    g.publish_sig(sig, 3)
    if peer_started:                  # the peer's signature words as its own publish_sig left them
        pctl = g.peers[1][0]
        base = SIG_WORD + (5 % NSIG) * 4
        pctl[base + 1], pctl[base + 2], pctl[base + 3], pctl[base] = sig[1], sig[2], sig[3], sig[0]


def test_a_timeout_names_the_collective_when_every_rank_had_started_it():
    """A rank stopped (SIGSTOP) inside an all_reduce every rank had begun: the others' CommTimeoutError said
    "waited 3.0s (timeout_s) for data from rank 0 on channel 0 (step 76)", no op, where one with a late rank
    names it ("rank(s) 1 had not started AllReduce #3 ...")."""
    from slicetrace.backend.cpu.transport import Backoff
    from slicetrace.errors import CommTimeoutError
    for started, tail in ((True, " in AllReduce #3 (collective #5 of this communicator)"),
                          (False, "; rank(s) 1 had not started AllReduce #3 (collective #5 of this communicator)")):
        g = guard_with_peer(timeout_s=0.05, heartbeat_age_s=0)
        _in_all_reduce(g, started)
        b = Backoff(g, ("data", 1, 0, 76), (1,))
        with pytest.raises(CommTimeoutError) as e:
            for _ in range(10_000):
                b.pause()
        assert str(e.value) == "rank 0 waited 0.05s (timeout_s) for data from rank 1 on channel 0 (step 76)" + tail


def test_a_dead_peer_found_in_a_wait_names_the_collective_and_the_wait():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    g = guard_with_peer(timeout_s=600, heartbeat_age_s=0, pid=p.pid)
    _in_all_reduce(g, True)
    with pytest.raises(PeerError) as e:
        for _ in range(2):
            g.check((1,), ("credit", 1, 0, 4))
            time.sleep(0.025)
    assert str(e.value) == (f"rank 1 (pid {p.pid}) exited; detected by rank 0 in AllReduce #3 (collective #5 of this "
                            f"communicator), waiting for credit from rank 1 on channel 0 (step 4)")
