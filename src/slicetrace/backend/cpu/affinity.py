"""Binding a rank's op thread to one CPU while its communicator is open (cpu_bind='auto', as mpirun binds to cores).

Two ranks that each own a core run a 4 KiB all-reduce in ~22 us; when the scheduler puts both on one core (after
socket wake-ups, e.g. beside Gloo, or right after start) each waits for a peer that cannot run, ~160-230 us per
op, until the load balancer moves one, many ms later. A bound thread cannot be moved there. Only the thread
that runs the ops is bound (threads it starts later inherit that); its own mask comes back at close. Several
communicators in one thread share the first one's binding.

A CPU is claimed host-wide first, with an flock on a file per CPU (the kernel drops it when the process dies), so
two jobs on one host never bind to the same CPU: a rank that finds none free stays unbound.
"""
from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from typing import Iterator

from ...config import temp_dir

_lock = threading.Lock()
_held: dict[int, list] = {}          # native thread id -> [mask before binding, communicators holding it, lock fd]
_first: set[int] | None = None       # the first bound thread's mask before it was bound
LOCK_DIR = os.path.join(temp_dir(), f"slicetrace-cpus-{os.getuid() if hasattr(os, 'getuid') else 0}")


def supported() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(threading, "get_native_id")


def allowed() -> set[int]:
    """The calling thread's CPUs as they were before any binding of ours (the ones ranks share)."""
    if not supported():
        return set(range(os.cpu_count() or 1))
    with _lock:
        held = _held.get(threading.get_native_id())
    return set(held[0]) if held is not None else os.sched_getaffinity(0)


def candidates(rank: int, world: int, nch: int) -> list[int]:
    """CPUs to try for `rank`, its own one first, when every rank can have one and runs one channel; else none
    (ranks would share a core, or the other channels' threads want cores of their own)."""
    if not supported() or world < 2 or nch != 1:
        return []
    cpus = sorted(allowed())
    if world > len(cpus):
        return []
    return cpus[rank:] + cpus[:rank]


def _claim(cpu: int) -> int | None:
    """An exclusive, non-blocking flock on CPU `cpu`'s file: the open fd, or None if another process holds it."""
    os.makedirs(LOCK_DIR, exist_ok=True)
    fd = os.open(os.path.join(LOCK_DIR, f"cpu{cpu}"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def bind(cpus: list[int]) -> int | None:
    """Bind the calling thread to the first of `cpus` that no other holder claims; the thread id for release(),
    or None when every one is taken (or the locks cannot be made: then nothing is bound)."""
    global _first
    tid = threading.get_native_id()
    with _lock:
        held = _held.get(tid)
        if held is not None:
            held[1] += 1
            return tid
        for cpu in cpus:
            try:
                fd = _claim(cpu)
            except OSError:
                return None
            if fd is None:
                continue
            before = os.sched_getaffinity(0)
            if _first is None:
                _first = before
            os.sched_setaffinity(0, {cpu})
            _held[tid] = [before, 1, fd]
            return tid
    return None


def release(tid: int) -> None:
    """Undo one bind() of thread `tid` (from any thread); the last one restores the mask and frees the CPU."""
    with _lock:
        held = _held.get(tid)
        if held is None:
            return
        held[1] -= 1
        if held[1]:
            return
        del _held[tid]
        try:
            os.sched_setaffinity(tid, held[0])
        except OSError:             # the thread has exited: nothing left to restore
            pass
        os.close(held[2])           # drops the claim


def unbind_thread() -> None:
    """For threads that a bound thread starts to run other channels: they get the CPUs it had before binding."""
    if _first is not None and threading.get_native_id() not in _held:
        os.sched_setaffinity(0, _first)


@contextmanager
def unbound() -> Iterator[None]:
    """The calling thread's mask from before binding, for the block: threads started inside (e.g. a reference
    library's workers) get every CPU the process had, not the rank's one."""
    tid = threading.get_native_id() if supported() else None
    with _lock:
        held = _held.get(tid)
        before = held[0] if held is not None else None
    if before is None:
        yield
        return
    now = os.sched_getaffinity(0)
    os.sched_setaffinity(0, before)
    try:
        yield
    finally:
        os.sched_setaffinity(0, now)
