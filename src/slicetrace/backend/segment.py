"""A POSIX shared-memory object mapped into this process, outside Python's resource_tracker (spawned ranks share
one tracker, and a segment registered by both its creator and an attacher makes the tracker print spurious errors).
Used by the cpu backend (a segment per rank) and the cuda backend (the collective-signature table)."""
from __future__ import annotations

import contextlib
import mmap
import os
import signal
import socket
from typing import Iterator

from ..errors import BackendError
from .signals import sigterm_as_exit

try:
    import _posixshmem
except ImportError:  # pragma: no cover - not a POSIX system
    _posixshmem = None

SHM_DIR = "/dev/shm"               # where Linux keeps POSIX shared memory (for the free-space report only)


def host_id() -> str:
    """This machine as its peers can compare it: host name and boot id (no spaces). Shared memory reaches only the
    ranks of one host (one /dev/shm)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()[:8]
    except OSError:
        boot = "?"
    return f"{socket.gethostname().replace(' ', '_')}/{boot}"


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """While set-up keeps a segment's name in /dev/shm (until every rank attached), SIGTERM raises SystemExit(143)
    in the main thread, so the set-up's cleanup removes the name: torchrun answers a rank that died at start-up
    with SIGTERM to the others, whose names were left behind (Docker's /dev/shm fills after a few). A handler the
    program installed (launch()'s ranks have one) is left as it is."""
    if not sigterm_as_exit():
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Segment:
    """One POSIX shared-memory object mapped into this process."""

    def __init__(self, name: str, size: int = 0, create: bool = False, advice: str = ""):
        if _posixshmem is None:  # pragma: no cover
            raise BackendError("slicetrace needs POSIX shared memory (_posixshmem); this platform has none")
        self.name, self.owner = name, create
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        try:
            if create:
                os.ftruncate(fd, size)
                _reserve(fd, name, size, advice)
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


def _reserve(fd: int, name: str, size: int, advice: str) -> None:
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
            f"could not reserve {size} bytes ({size / 2**20:.1f} MiB) of shared memory for segment {name!r}: "
            f"{e.strerror or e}; {free}{advice}, or enlarge {SHM_DIR} (docker run --shm-size=1g)") from None


def unlink_name(name: str) -> None:
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass

