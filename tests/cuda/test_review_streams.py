"""Ops issued from two threads on the per-thread default stream (cudaStreamPerThread, handle 2: another stream in
each thread). The order check compared handles, so the second op did not wait for the first and both kernels ran
at once on the same FIFO step counters."""
from __future__ import annotations

import threading

import pytest


def _two_threads_ptds(comm):
    import cupy
    dev = comm._session.backend.device
    n = 64 << 20                                      # 256 MiB each: the first still runs when the second starts
    with cupy.cuda.Device(dev):
        xs = [cupy.full(n, k + 1 + comm.rank, dtype=cupy.float32) for k in range(2)]
        cupy.cuda.runtime.deviceSynchronize()         # nothing on the legacy stream orders them from here on
    errs = []

    def op(k):
        try:
            with cupy.cuda.Device(dev), cupy.cuda.Stream.ptds:
                comm.all_reduce(xs[k], xs[k], stream=cupy.cuda.Stream.ptds)
        except Exception as e:  # noqa: BLE001 - the test checks it
            errs.append(type(e).__name__)
    t = threading.Thread(target=op, args=(0,))
    t.start()
    t.join(120)
    op(1)
    try:
        comm.synchronize()
        with cupy.cuda.Device(dev):
            cupy.cuda.runtime.deviceSynchronize()
    except Exception as e:  # noqa: BLE001
        errs.append(type(e).__name__)
    with cupy.cuda.Device(dev):
        return errs, [(float(x.min().get()), float(x.max().get())) for x in xs]


@pytest.mark.cuda
def test_ops_from_two_threads_on_the_per_thread_stream_run_in_issue_order(gpu, kcache):
    import slicetrace
    res = slicetrace.launch(_two_threads_ptds, 2, backend="cuda", cache_dir=kcache, timeout_s=20.0,
                            join_timeout_s=240)
    assert res == [([], [(3.0, 3.0), (5.0, 5.0)])] * 2, res
