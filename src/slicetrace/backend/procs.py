"""Process liveness of the ranks on this host, shared by the backends (no reliance on a parent reaping them).

`PeerWatch` is what a backend without shared control blocks (cuda) uses while it waits: every rank publishes
its pid and start time in the rendezvous store at setup and a `closed` key when it closes its communicator.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any

from ..rendezvous import Store


def pid_space() -> str:
    """This host and PID namespace: a peer's pid means something here only if it says the same."""
    return f"{socket.gethostname()}/{pid_ns_id()}"


def pid_ns_id() -> int:
    """This process's PID namespace as a number (the inode of /proc/self/ns/pid), 0 if unknown: a peer's pid is
    judged only when both say the same non-zero number."""
    try:
        return int(os.readlink("/proc/self/ns/pid").rsplit("[", 1)[1].rstrip("]"))
    except (OSError, IndexError, ValueError):
        return 0


def _stat(pid: int) -> list[bytes]:
    """The fields of /proc/<pid>/stat after the command name (fields 3..); OSError if unreadable."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def proc_start_time(pid: int) -> int:
    """Start time of pid in clock ticks (field 22 of /proc/<pid>/stat); 0 if unknown."""
    try:
        return int(_stat(pid)[19])
    except OSError:
        return 0


def proc_dead(pid: int, start: int) -> str | None:
    """A reason string if pid is gone, a zombie, or a different process now; None if alive (or unknown)."""
    try:
        fields = _stat(pid)
    except FileNotFoundError:
        return "exited"
    except OSError:
        return None
    if fields[0] in (b"Z", b"X", b"x"):
        return "died (zombie)"
    if start and int(fields[19]) != start:
        return "exited (pid reused)"
    return None


def proc_stopped(pid: int) -> bool:
    """pid is stopped by a signal (state T: SIGSTOP, a job scheduler's suspend); False if it runs, is traced or is
    unknown."""
    try:
        return _stat(pid)[0] == b"T"
    except (OSError, IndexError):
        return False


def this_proc() -> str:
    """This process as a peer may judge it later (proc_gone): pid, start time, host and PID namespace."""
    pid = os.getpid()
    return f"{pid} {proc_start_time(pid)} {pid_space()}"


def proc_gone(info: str) -> str | None:
    """proc_dead of a this_proc() string; None (not judged) for a process of another host or PID namespace, or of
    an unknown one (0: no /proc, where proc_dead would call every pid exited), as the cpu Guard's peer_pid."""
    pid, start, space = info.split(" ", 2)
    return proc_dead(int(pid), int(start)) if space == pid_space() and not space.endswith("/0") else None


class TwoChecks:
    """A peer counts as gone only when seen so at two checks at least gap_s apart (for any reason): it may have
    posted the last of our data just before it left, and the caller re-checks that data in between. Apart in
    time, not merely consecutive: two threads (a wait and the watchdog) may check back to back."""

    def __init__(self, gap_s: float = 0.02):
        self._first: dict[int, float] = {}
        self._gap = gap_s

    def confirm(self, peer: int, why: str | None) -> bool:
        if why is None:
            self._first.pop(peer, None)
            return False
        now = time.monotonic()
        return now - self._first.setdefault(peer, now) >= self._gap


class PeerWatch:
    """Tells a waiting rank that a peer its op needs has closed its communicator or is no longer running.

    A condition must be seen at two consecutive checks: a peer may finish its part of our op and close just
    before our side of the op completes (the caller checks a few times a second). A peer in another host or PID
    namespace (containers), or an unknown one (0: no /proc, as proc_gone), is never judged by its pid, only by its
    closed key (and the caller's timeout)."""

    def __init__(self, store: Store, prefix: str, rank: int):
        self.store, self.prefix, self.rank = store, prefix, rank
        self._procs: dict[int, tuple[int, int] | None] = {}
        self._space = pid_space()
        self._twice = TwoChecks()

    def publish(self) -> None:
        pid = os.getpid()
        self.store.set(f"{self.prefix}/proc/{self.rank}", f"{pid} {proc_start_time(pid)} {self._space}".encode())

    def closed(self) -> None:
        self.store.set(f"{self.prefix}/closed/{self.rank}", b"1")

    def gone(self, peers: tuple[int, ...], did_its_part: Any = None, closed_ok: bool = False) -> str | None:
        """'rank p <reason>' for the first peer seen gone at two checks at least TwoChecks' gap apart, else None.
        did_its_part(p): a closed peer that did is not gone (what we wait on from it is on its way to us).
        closed_ok (the close barrier's check): a closed peer is on its way there, gone only if its process is."""
        for p in peers:
            why = None
            if not closed_ok and self.store.try_get(f"{self.prefix}/closed/{p}") is not None:
                why = None if did_its_part is not None and did_its_part(p) else "closed its communicator"
            else:
                if p not in self._procs:
                    raw = self.store.try_get(f"{self.prefix}/proc/{p}")
                    if raw is not None:
                        pid, start, space = raw.decode().split(" ", 2)
                        known = space == self._space and not space.endswith("/0")     # 0: no /proc
                        self._procs[p] = (int(pid), int(start)) if known else None
                info = self._procs.get(p)
                if info is not None:
                    why = proc_dead(*info)
            if self._twice.confirm(p, why):
                return f"rank {p} {why}"
        return None
