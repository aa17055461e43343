"""cpu backend set-up: a rank stopped by SIGTERM while it waits for peers, and ranks on two hosts."""
from __future__ import annotations

import glob
import multiprocessing as mp
import os
import signal
import time


def _init_alone(store_map, job):
    import slicetrace
    from slicetrace.rendezvous import DictStore
    slicetrace.init(backend="cpu", rank=0, world_size=2, store=DictStore(store_map), job=job, timeout_s=60)


def test_sigterm_during_set_up_removes_the_segment():
    """torchrun answers a rank that died at start-up with SIGTERM to the others: each left its segment in /dev/shm
    (the name stays until every rank attached), and Docker's 64 MiB /dev/shm filled after a few."""
    ctx = mp.get_context("spawn")
    job = f"sgt{os.getpid()}"
    with ctx.Manager() as m:
        store = m.dict()                                 # kept: the child's proxy needs its referent
        p = ctx.Process(target=_init_alone, args=(store, job), daemon=True)
        p.start()
        try:
            deadline = time.monotonic() + 60
            while not glob.glob(f"/dev/shm/st_{job}_*") and time.monotonic() < deadline:
                time.sleep(0.02)
            assert glob.glob(f"/dev/shm/st_{job}_*"), "the rank never created its segment"
            time.sleep(0.2)                              # waiting for rank 1 at the rendezvous
            os.kill(p.pid, signal.SIGTERM)
            p.join(30)
        finally:
            if p.is_alive():
                p.kill()
                p.join(10)
        left = glob.glob(f"/dev/shm/st_{job}_*")
        for f in left:                                   # leave the machine clean either way
            os.unlink(f)
    assert p.exitcode == 143 and left == [], (p.exitcode, left)


def test_a_peer_on_another_host_is_named_as_such():
    """Before: "rank 1's segment ... is gone: rank 1 closed or was cleaned up" for a rank that runs elsewhere."""
    import pytest

    import slicetrace
    from slicetrace.errors import BackendError
    from slicetrace.rendezvous import DictStore
    job = f"hst{os.getpid()}"
    store = {f"st/{job}/cpu1/seg/1": b"st_not_here_0 elsewhere/01234567"}       # as rank 1 on another host
    with pytest.raises(BackendError, match=r"rank 1 runs on host elsewhere/01234567, rank 0 on .*every rank must run "
                                           r"on one machine"):
        slicetrace.init(backend="cpu", rank=0, world_size=2, store=DictStore(store), job=job, timeout_s=5)
    assert glob.glob(f"/dev/shm/st_{job}_*") == []


def test_an_exit_as_the_segment_is_made_removes_its_name(monkeypatch):
    """A SIGTERM handled as the segment's constructor ended (past its own cleanup, whose try ends at the mapping)
    or as it returned escaped both that cleanup and the set-up's, which unlinked only a segment it held: the name
    stayed in /dev/shm for good (test_sigterm_during_set_up_removes_the_segment's signal can land there)."""
    import pytest

    import slicetrace
    from slicetrace.backend import segment
    from slicetrace.rendezvous import DictStore

    def exit_here(self, value):
        raise SystemExit(143)           # as the SIGTERM handler of sigterm_exits raises it, at the constructor's end
    monkeypatch.setattr(segment.Segment, "_views", property(fset=exit_here), raising=False)
    job = f"sgx{os.getpid()}"
    with pytest.raises(SystemExit):
        slicetrace.init(backend="cpu", rank=0, world_size=2, store=DictStore({}), job=job, timeout_s=5)
    left = glob.glob(f"/dev/shm/st_{job}_*")
    for f in left:                      # leave the machine clean either way
        os.unlink(f)
    assert left == []
