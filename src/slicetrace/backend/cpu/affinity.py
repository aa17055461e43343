"""Binding a rank's op thread to one CPU while its communicator is open (cpu_bind='auto', as mpirun binds to cores).

Two ranks that each own a core run a 4 KiB all-reduce in ~22 us; when the scheduler puts both on one core (after
socket wake-ups, e.g. beside Gloo, or right after start) each waits for a peer that cannot run, ~160-230 us per
op, until the load balancer moves one, many ms later. A bound thread cannot be moved there. Only the thread
that runs the ops is bound (threads it starts later inherit that); its own mask comes back at close. Several
communicators in one thread share the first one's binding.
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_held: dict[int, list] = {}          # native thread id -> [mask before binding, communicators holding it]
_first: set[int] | None = None       # the first bound thread's mask before it was bound


def supported() -> bool:
    return hasattr(os, "sched_setaffinity") and hasattr(threading, "get_native_id")


def allowed() -> set[int]:
    """The calling thread's CPUs as they were before any binding of ours (the ones ranks share)."""
    if not supported():
        return set(range(os.cpu_count() or 1))
    with _lock:
        held = _held.get(threading.get_native_id())
    return set(held[0]) if held is not None else os.sched_getaffinity(0)


def choose(rank: int, world: int, nch: int) -> int | None:
    """The CPU for `rank`: its own one of this thread's allowed CPUs when every rank gets one and runs one
    channel, else None (ranks would share a core, or the other channels' threads want cores of their own)."""
    if not supported() or world < 2:
        return None
    cpus = sorted(allowed())
    return cpus[rank] if nch == 1 and world <= len(cpus) else None


def bind(cpu: int) -> int:
    """Bind the calling thread to `cpu`; returns the thread id for release()."""
    global _first
    tid = threading.get_native_id()
    with _lock:
        held = _held.get(tid)
        if held is None:
            before = os.sched_getaffinity(0)
            if _first is None:
                _first = before
            os.sched_setaffinity(0, {cpu})
            _held[tid] = [before, 1]
        else:
            held[1] += 1
    return tid


def release(tid: int) -> None:
    """Undo one bind() of thread `tid` (from any thread); the last one restores the thread's mask."""
    with _lock:
        held = _held.get(tid)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del _held[tid]
            try:
                os.sched_setaffinity(tid, held[0])
            except OSError:         # the thread has exited: nothing left to restore
                pass


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
