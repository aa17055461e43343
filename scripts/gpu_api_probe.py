"""Eighteenth session: on cuda, a barrier ends when a peer fails, and x/out that overlap without being in place are refused."""
import slicetrace
def bail(comm):
    if comm.rank == 1:
        raise RuntimeError("rank 1 bails out")
    comm.barrier()
    return "passed"
def overlap(comm):
    import cupy as cp
    buf = cp.arange(4000, dtype=cp.float32)
    out = []
    try:
        comm.all_reduce(buf[:1000], buf[1:1001])
    except Exception as e:
        out.append(type(e).__name__ + ": " + str(e)[:90])
    x = cp.ones(1000, cp.float32)
    comm.all_reduce(x, x)
    comm.synchronize()
    out.append(float(x[0]))
    return out
if __name__ == "__main__":
    import time
    t = time.time()
    try:
        slicetrace.launch(bail, 2, backend="cuda", timeout_s=600, join_timeout_s=90)
    except Exception as e:
        print("barrier:", str(e).splitlines()[0][:200], f"({time.time() - t:.1f}s)")
    print("overlap:", slicetrace.launch(overlap, 2, backend="cuda", timeout_s=60, join_timeout_s=90))
