#!/usr/bin/env python3
"""Host time of a small all_to_all against a small all_reduce on the cuda backend (no profiler plugin): wall time
per enqueued op, then cProfile of rank 0's all_to_all loop (top functions by own time).

    NCCL_NVLS_ENABLE=0 PYTHONPATH=src python3 scripts/gpu_a2a_host.py [--bytes 64] [--ops 2000] [--top 25]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import slicetrace


def body(comm, nbytes: int, nops: int, top: int) -> str:
    import cupy as cp
    cp.cuda.Device(comm.rank).use()
    x = cp.ones(max(1, nbytes // 4) * comm.world_size, cp.float32)
    y = cp.empty_like(x)
    out = io.StringIO()
    for name, fn in (("all_reduce", lambda: comm.all_reduce(x, y)), ("all_to_all", lambda: comm.all_to_all(x, y))):
        for _ in range(50):
            fn()
        comm.synchronize()
        comm.barrier()
        t = time.perf_counter()
        for _ in range(nops):
            fn()
        t1 = time.perf_counter()
        comm.synchronize()
        t2 = time.perf_counter()
        out.write(f"{name} {x.nbytes} B: enqueue {(t1 - t) / nops * 1e6:.1f} us/op, total "
                  f"{(t2 - t) / nops * 1e6:.1f} us/op\n")
    if top and comm.rank == 0:
        pr = cProfile.Profile()
        comm.barrier()
        pr.enable()
        for _ in range(nops):
            comm.all_to_all(x, y)
        comm.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top)
        out.write("\n".join(s.getvalue().splitlines()[4:top + 10]) + "\n")
    elif top:
        comm.barrier()
        for _ in range(nops):
            comm.all_to_all(x, y)
        comm.synchronize()
    return out.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=64)
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    for r in slicetrace.launch(body, 2, a.bytes, a.ops, a.top, backend="cuda", profiler_plugin="none"):
        print(r, flush=True)


if __name__ == "__main__":
    main()
