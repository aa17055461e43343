"""The cpu backend's futex waits: the helper's three outcomes, and a Guard wait that a Conn.post wakes."""
from __future__ import annotations

import errno
import mmap
import threading
import time

import pytest

from slicetrace.backend.base import host_pointer
from slicetrace.backend.cpu import futex
from slicetrace.backend.cpu.shm import H_HEAD, H_SLEEP, H_TAIL
from slicetrace.backend.cpu.transport import Conn, Guard
from slicetrace.config import Settings
from slicetrace.errors import CommTimeoutError, ConfigError

pytestmark = pytest.mark.skipif(not futex.available(), reason="futexes need Linux on x86_64 or aarch64")


def words():
    m = mmap.mmap(-1, 4096)              # shared anonymous memory, as the segments are shared files
    return m, memoryview(m).cast("Q")


def test_wait_returns_at_once_when_the_word_moved_and_times_out_when_it_did_not():
    m, w = words()
    w[0] = 5
    assert futex.wait(host_pointer(w), 4) == errno.EAGAIN          # the kernel compares first
    assert futex.wait(host_pointer(w), 5) == errno.ETIMEDOUT       # nobody wakes: back after TIMEOUT_NS


def guard_and_conn(timeout_s=5.0):
    m, ctl = words()
    g = Guard(0, memoryview(bytearray(4096)).cast("Q"), memoryview(bytearray(512)), timeout_s)
    g.futex = True
    g.spins = 0
    return m, ctl, g, Conn(ctl, memoryview(bytearray(64)), 1, True)


@pytest.mark.parametrize("idx", [H_TAIL, H_HEAD])
def test_a_sleeping_wait_is_woken_by_the_post_and_clears_its_flag(idx, monkeypatch):
    m, ctl, g, conn = guard_and_conn()
    seen = {}
    monkeypatch.setattr(futex._TIMEOUT, "tv_sec", 30)      # no timeout can end this wait: only the post's wake
    results = []
    real_wait = futex.wait
    monkeypatch.setattr(futex, "wait", lambda addr, value: results.append(real_wait(addr, value)) or results[-1])

    def waiter():
        g.wait_ge(ctl, idx, 3, 1, "the test's post", conn.base)
        seen["value"] = ctl[idx]
    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while not ctl[idx + H_SLEEP] and time.monotonic() < deadline:      # until it is about to sleep
        time.sleep(0.001)
    assert ctl[idx + H_SLEEP] == 1
    time.sleep(0.05)                                       # into the syscall, most likely
    conn.post(idx, 3)
    t.join(5)                                              # without the wake it would sleep 30 s
    assert not t.is_alive() and seen["value"] == 3 and ctl[idx + H_SLEEP] == 0
    assert results[-1] in (0, errno.EAGAIN)                # woken, or the post came before it slept


def test_a_futex_wait_still_ends_at_its_deadline():
    m, ctl, g, conn = guard_and_conn(timeout_s=0.2)
    with pytest.raises(CommTimeoutError, match="waited 0.2s"):
        g.wait_ge(ctl, H_TAIL, 1, 1, "data that never comes", conn.base)
    assert ctl[H_TAIL + H_SLEEP] == 0


def test_setting_is_checked():
    with pytest.raises(ConfigError, match="cpu_wait='sometimes'"):
        Settings(cpu_wait="sometimes")
    assert Settings.from_env({"SLICETRACE_CPU_WAIT": "futex"}).cpu_wait == "futex"
