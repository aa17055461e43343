"""Where does the profiled CUDA path spend its time? Per size: unprofiled, profiled enqueue, sync, flush."""
import faulthandler
import time

import slicetrace


def diag(comm, sizes):
    import cupy as cp
    faulthandler.dump_traceback_later(75, exit=True)
    cp.cuda.Device(comm.rank % cp.cuda.runtime.getDeviceCount()).use()
    out = []
    s = comm._session
    for nbytes in sizes:
        x = cp.ones(nbytes // 4, dtype=cp.float32)
        y = cp.empty_like(x)
        for _ in range(3):
            comm.all_reduce(x, y)
        cp.cuda.runtime.deviceSynchronize()
        comm.flush_profiler()
        with comm.profiling(False):
            t0 = time.perf_counter()
            for _ in range(20):
                comm.all_reduce(x, y)
            cp.cuda.runtime.deviceSynchronize()
            off = (time.perf_counter() - t0) / 20
        comm.barrier()
        t0 = time.perf_counter()
        rs0 = s._resync_at
        for _ in range(20):
            comm.all_reduce(x, y)
        t1 = time.perf_counter()
        cp.cuda.runtime.deviceSynchronize()
        t2 = time.perf_counter()
        comm.flush_profiler()
        t3 = time.perf_counter()
        out.append(dict(size=nbytes, off_us=off * 1e6, enq_us=(t1 - t0) / 20 * 1e6, sync_ms=(t2 - t1) * 1e3,
                        flush_ms=(t3 - t2) * 1e3, resynced=s._resync_at != rs0,
                        unc=s.clock_uncertainty_ns))
        comm.barrier()
    t0 = time.perf_counter()
    s._resync()
    out.append({"resync_ms": (time.perf_counter() - t0) * 1e3, "unc": s.clock_uncertainty_ns})
    c = comm.drop_counters()
    out.append({k: v for k, v in c.items() if v})
    faulthandler.cancel_dump_traceback_later()
    return out


if __name__ == "__main__":
    for r in slicetrace.launch(diag, 2, [64 << 10, 1 << 20, 16 << 20], backend="cuda", profiler_plugin="example",
                               timeout_s=60.0, join_timeout_s=150):
        for row in r:
            print(row)
