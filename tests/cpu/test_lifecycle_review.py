"""Resources of closed and dropped communicators: their shared memory is unmapped at close, whoever keeps the
object, and a communicator dropped without close() is freed (each test failed on the tree before its fix)."""
from __future__ import annotations

import gc
import threading
import time

import numpy as np

import slicetrace


def _mapped(job: str = "") -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if f"/dev/shm/st_{job}" in line)


def test_closed_communicators_unmap_their_segments_even_when_kept_and_profiled():
    """close() could not unmap (numpy views over the segment lived on) and a profiled session is a reference cycle:
    each closed communicator kept its /dev/shm pages until a GC, and Docker's 64 MiB /dev/shm ran out at the 11th
    (the 3rd of 2 ranks)."""
    before = _mapped()
    kept = []
    gc.disable()
    try:
        for _ in range(3):
            c = slicetrace.init(backend="cpu", profiler_plugin="example", profile_dump_file="")
            for _ in range(20):
                c.all_reduce(np.ones(1 << 12, np.float32))
            c.close()
            kept.append(c)
        assert _mapped() == before and all(k._session.backend.seg.mm.closed for k in kept)
    finally:
        gc.enable()


def test_a_communicator_dropped_without_close_is_freed():
    """Its heartbeat thread held it: threads, descriptors and mappings stayed for the life of the process."""
    before = _mapped()
    for _ in range(3):
        c = slicetrace.init(backend="cpu")
        c.all_reduce(np.ones(1 << 12, np.float32))
        del c
    gc.collect()
    deadline = time.monotonic() + 5
    while any(t.name.startswith("slicetrace-heartbeat") for t in threading.enumerate()) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert _mapped() == before
    assert not any(t.name.startswith("slicetrace-heartbeat") for t in threading.enumerate())


def _kept_sub_comms(comm):
    kept = []
    for i in range(3):
        job = f"{comm._session.job}k{i}"
        c = slicetrace.init(backend="cpu", rank=comm.rank, world_size=2, store=comm._session.store, job=job,
                            profiler_plugin="example", profile_dump_file="", timeout_s=10)
        c.all_reduce(np.ones(1 << 12, np.float32))
        c.close()
        kept.append(c)
    return [_mapped(f"{comm._session.job}k") for _ in (0,)][0]


def test_two_ranks_unmap_their_own_and_their_peers_segments_at_close():
    gc.collect()
    assert slicetrace.launch(_kept_sub_comms, 2, backend="cpu", timeout_s=10, join_timeout_s=120) == [0, 0]
