"""Linux futexes on words of the shared segments: a waiting rank sleeps in the kernel until its peer posts.

Used when ranks outnumber CPUs (transport.Guard.wait_ge): spinning or sched_yield there keeps the CPU from the
rank that would post. Shared (not private) futexes, keyed by the page, so two processes that map the segment at
different addresses meet. The waiter sets a flag word, re-reads the counter, then FUTEX_WAIT on its low 32 bits
(the kernel sleeps only if they still hold that value); the poster stores the counter, then wakes if the flag is
set. x86 may let the poster's flag load pass its counter store, so a wake can be missed: every wait has a 1 ms
timeout, after which the waiter re-reads (measured: about one timeout per 700 waits).
"""
from __future__ import annotations

import ctypes
import os
import sys

_NR = {"x86_64": 202, "aarch64": 98}.get(os.uname().machine) if sys.platform == "linux" else None
_WAIT, _WAKE = 0, 1
TIMEOUT_NS = 1_000_000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc = ctypes.CDLL(None, use_errno=True) if _NR is not None else None
_TIMEOUT = _Timespec(0, TIMEOUT_NS)


def available() -> bool:
    return _libc is not None


def wait(addr: int, value: int) -> int:
    """Sleep while the u32 at addr equals value's low 32 bits, at most TIMEOUT_NS; 0 or the errno (EAGAIN: it
    had changed already; ETIMEDOUT)."""
    r = _libc.syscall(_NR, ctypes.c_void_p(addr), _WAIT, ctypes.c_uint32(value & 0xFFFFFFFF),
                      ctypes.byref(_TIMEOUT), None, 0)
    return ctypes.get_errno() if r else 0


def wake(addr: int) -> None:
    _libc.syscall(_NR, ctypes.c_void_p(addr), _WAKE, 1, None, None, 0)
