"""Run the mixed-op sequence one op at a time with a bounded wait; report which op stalls, stamps off and on."""
import time

import slicetrace


def seq(comm, n):
    import cupy as cp
    cp.cuda.Device(comm.rank % cp.cuda.runtime.getDeviceCount()).use()
    x = cp.random.standard_normal(n, dtype=cp.float32)
    w = comm.world_size
    small = x[: n // 16 // w * w]
    ops = [("all_reduce", lambda: comm.all_reduce(x, cp.empty_like(x))),
           ("all_gather", lambda: comm.all_gather(small)),
           ("reduce_scatter", lambda: comm.reduce_scatter(small)),
           ("broadcast", lambda: comm.broadcast(small, root=0)),
           ("reduce", lambda: comm.reduce(small, root=0)),
           ("all_reduce_1001", lambda: comm.all_reduce(x[:1001])),
           ("all_reduce_again", lambda: comm.all_reduce(x, cp.empty_like(x)))]
    log = []
    for name, fn in ops:
        t0 = time.perf_counter()
        try:
            fn()
            comm.synchronize()
            log.append(f"{name} ok {1e3 * (time.perf_counter() - t0):.1f} ms")
        except Exception as e:
            log.append(f"{name} FAILED {type(e).__name__}: {str(e)[:160]}")
            break
    try:
        comm.flush_profiler(5.0)
    except Exception as e:
        log.append(f"flush FAILED {e}")
    return log


if __name__ == "__main__":
    for prof in ("none", "example"):
        try:
            r = slicetrace.launch(seq, 2, 16 << 20, backend="cuda", profiler_plugin=prof, timeout_s=8.0,
                                  join_timeout_s=60)
            print(prof, r[0], flush=True)
        except Exception as e:
            print(prof, "LAUNCH FAILED", str(e)[:1500], flush=True)
