"""The user thread's time per all_reduce call while the example plugin writes its trace (2 ranks): the worst call,
calls over 100 ms and consumer_behind, with the KernelSteps delivered (a buffer filling mid-run wrote itself under
the host's lock before the writer thread, and ops behind it went unprofiled).

    PYTHONPATH=src python3 scripts/gpu_writer_probe.py N_OPS NBYTES DUMP_PREFIX [cuda|cpu]
"""
import json
import sys
import time

import numpy as np

import slicetrace

def work(comm, n_ops, nbytes, out):
    if comm.backend_name == "cuda":
        import cupy as cp
        sync = cp.cuda.runtime.deviceSynchronize
    else:
        cp, sync = np, (lambda: None)
    x = cp.ones(nbytes // 4, cp.float32)
    y = cp.empty_like(x)
    for _ in range(20):
        comm.all_reduce(x, y)
    sync()
    ts = []
    t_all = time.perf_counter()
    for _ in range(n_ops):
        t0 = time.perf_counter()
        comm.all_reduce(x, y)
        ts.append(time.perf_counter() - t0)
    sync()
    wall = time.perf_counter() - t_all
    comm.flush_profiler()
    c = comm.drop_counters()
    ts = np.array(ts) * 1e3
    return {"rank": comm.rank, "wall_s": round(wall, 3), "median_ms": round(float(np.median(ts)), 4),
            "p99_ms": round(float(np.percentile(ts, 99)), 3), "max_ms": round(float(ts.max()), 1),
            "calls_over_100ms": int((ts > 100).sum()), "consumer_behind": c.get("consumer_behind", 0),
            "delivered_coll": c.get("delivered_coll", 0), "delivered_kernel_step": c.get("delivered_kernel_step", 0)}

if __name__ == "__main__":
    n_ops, nbytes, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    backend = sys.argv[4] if len(sys.argv) > 4 else "cuda"
    res = slicetrace.launch(work, 2, n_ops, nbytes, out, backend=backend, profiler_plugin="example",
                            profile_dump_file=out)
    print(json.dumps({"src": slicetrace.__file__, "ranks": res}))
