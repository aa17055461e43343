"""Shared-memory segments of the cpu backend: one per rank, created by that rank, attached by its peers.

Segment of rank r (all offsets 4 KiB aligned):

    control block      4 KiB   pid, heartbeat, abort word + reason, op-signature table (read by peers)
    connections        (nch + world) x (4 KiB header + buffsize FIFO); r is the *receiver* of all of them:
                       index c < nch: ring channel c from rank r-1; index nch + s: point-to-point from rank s
    stamp rings        stamps.layout.ring_bytes(nch, ring_slots)  (read by this rank's drain thread)

A segment's pages are reserved at creation (posix_fallocate): a /dev/shm too small is a BackendError, not SIGBUS.
Segments bypass Python's resource_tracker (spawned ranks share one tracker, and a segment registered by
both its creator and an attacher makes the tracker print spurious errors). The creator unlinks it
once every rank attached (the mapping lives on), so nothing stays in /dev/shm however a rank ends; a launcher
removes what a set-up that failed part way left, by the job string in the name (`st_<job>_...`).
"""
from __future__ import annotations

import mmap
import os

from ...errors import BackendError
from ...stamps.layout import ring_bytes

try:
    import _posixshmem
except ImportError:  # pragma: no cover - not a POSIX system
    _posixshmem = None

PAGE = 4096
SHM_DIR = "/dev/shm"               # where Linux keeps POSIX shared memory (for the free-space report only)
MAGIC = 0x53544350_55000004        # "STCPU" + layout version 4
NSIG = 16                          # op-signature / message tables keep the last 16 entries

# control block, u64 word indices
C_MAGIC, C_PID, C_START, C_HEARTBEAT, C_ABORT, C_ABORT_FROM, C_CLOSED, C_REASON_LEN = range(8)
C_NCH, C_BUFFSIZE, C_WORLD, C_SLOTS = 8, 9, 10, 11
C_FUTEX = 12                               # 1: this rank's ring waits sleep on a futex; its peers wake it
REASON_OFF, REASON_MAX = 256, 512          # bytes
SIG_WORD = 1024 // 8                       # 16 entries x 4 words: seq, count, packed, cfg
# connection header, u64 word indices (tail and head on separate cache lines)
H_TAIL, H_HEAD, H_MSG = 0, 8, 16           # H_MSG: 16 entries x 4 words: seq+1, count, dtype code, whole message's count
H_MSGACK = 80                              # headers the receiver has checked: a sender stays < NSIG ahead of it
H_SLEEP = 1                                # word after tail / head: 1 while its waiter sleeps on it (futex.py)
# FIFO line reclaim (transport.Reclaim): the mode word the sender sets, then one word per slot that the
# receiver writes when it frees the slot: 0 = not yet, 1 = freed as is, 2 + ns = lines reclaimed in ns
H_RECLAIM, H_RECLAIMED = 128, 136

ABORT_PEER, ABORT_MISMATCH, ABORT_TIMEOUT = 1, 2, 3


def layout(nch: int, world: int, buffsize: int) -> tuple[int, int, int]:
    """(offset of connection 0, connection stride, offset of the stamp rings); total = rings + ring_bytes."""
    stride = PAGE + buffsize
    rings = PAGE + (nch + world) * stride
    return PAGE, stride, rings


def segment_size(nch: int, world: int, buffsize: int, slots: int) -> int:
    _, _, rings = layout(nch, world, buffsize)
    return rings + -(-ring_bytes(nch, slots) // PAGE) * PAGE


class Segment:
    """One POSIX shared-memory object mapped into this process."""

    def __init__(self, name: str, size: int = 0, create: bool = False):
        if _posixshmem is None:  # pragma: no cover
            raise BackendError("backend='cpu' needs POSIX shared memory (_posixshmem); this platform has none")
        self.name, self.owner = name, create
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        try:
            if create:
                os.ftruncate(fd, size)
                _reserve(fd, name, size)
            self.size = os.fstat(fd).st_size
            self.mm = mmap.mmap(fd, self.size)
        except BaseException:          # any failure (a bad size, an interrupt) must not leave the name behind
            if create:
                _posixshmem.shm_unlink("/" + name)
            raise
        finally:
            os.close(fd)
        self._views: list[memoryview] = []
        self.unlinked = False

    def words(self, off: int, nbytes: int) -> memoryview:
        """A u64 view (memoryview 'Q': the fastest scalar load/store Python has)."""
        mv = memoryview(self.mm)[off:off + nbytes].cast("Q")
        self._views.append(mv)
        return mv

    def bytes_(self, off: int, nbytes: int) -> memoryview:
        mv = memoryview(self.mm)[off:off + nbytes]
        self._views.append(mv)
        return mv

    def unlink(self) -> None:
        if not self.unlinked:
            self.unlinked = True
            unlink_name(self.name)

    def close(self) -> None:
        for mv in self._views:
            try:
                mv.release()
            except (ValueError, BufferError):
                pass
        self._views.clear()
        try:
            self.mm.close()
        except BufferError:       # numpy views (rings held by the drain, slot views) still exist: GC frees it
            pass


def _reserve(fd: int, name: str, size: int) -> None:
    """Allocate the pages now, as NCCL does: a sparse segment on a full /dev/shm (Docker's default is 64 MiB)
    kills the rank with SIGBUS at its first touch of a missing page, with no message."""
    if not hasattr(os, "posix_fallocate"):  # pragma: no cover - macOS: no tmpfs /dev/shm to fill
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        try:
            st = os.statvfs(SHM_DIR)
            mib = st.f_frsize / 2**20
            free = f"{SHM_DIR} has {st.f_bavail * mib:.1f} MiB free of {st.f_blocks * mib:.1f} MiB"
        except OSError:
            free = f"the free space in {SHM_DIR} is unknown"
        raise BackendError(
            f"backend='cpu' could not reserve {size} bytes ({size / 2**20:.1f} MiB) of shared memory for segment "
            f"{name!r}: {e.strerror or e}; {free}, and every rank on this host needs one such segment, about "
            f"(nchannels + world) x buffsize. Lower SLICETRACE_BUFFSIZE (buffsize=, default 4M) or "
            f"SLICETRACE_NCHANNELS (nchannels=), or enlarge {SHM_DIR} (docker run --shm-size=1g)") from None


def unlink_name(name: str) -> None:
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass

