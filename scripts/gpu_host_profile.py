#!/usr/bin/env python3
"""Where the host time of a profiled CUDA run goes: cProfile of rank 0 over the op loop and the flush (Python
3.12+ profiles every thread, so the drain thread's polls are in it), all_reduce, example plugin, KernelStep on.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=src python3 scripts/gpu_host_profile.py [--sizes 64K,1M,16M] [--ops 200] [--pin] [--top 30]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import slicetrace
from slicetrace.cli import sweep


def parse_size(s: str) -> int:
    return sweep.parse_size(s, "size")


def pin_threads(rank: int) -> int:
    """Every thread of this process (main, drain, CUDA's) onto one CPU of the allowed set, one per rank."""
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[(2 + rank * 2) % len(cpus)]
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), {cpu})
    return cpu


def body(comm, sizes: list[int], nops: int, top: int, switch_us: float = 0, pin: bool = False) -> str:
    if switch_us:
        sys.setswitchinterval(switch_us / 1e6)
    import cupy as cp
    cp.cuda.Device(comm.rank % cp.cuda.runtime.getDeviceCount()).use()
    out = io.StringIO()
    if pin:
        out.write(f"# rank {comm.rank}: every thread on CPU {pin_threads(comm.rank)}\n")
    acc: dict[str, list[float]] = {}
    sess = comm._session
    pc, tt = time.perf_counter, time.thread_time     # wall, and CPU of the calling thread

    def timed(obj, name: str, label: str) -> None:     # wall time per call of obj.name, any thread
        orig = getattr(obj, name)

        def wrap(*a, **k):
            t, c = pc(), tt()
            try:
                return orig(*a, **k)
            finally:
                v = acc.setdefault(label, [0.0, 0, 0.0])
                v[0] += pc() - t
                v[1] += 1
                v[2] += tt() - c
        setattr(obj, name, wrap)
    for obj, name in ((sess.host, "begin_op"), (sess.backend, "submit"), (sess.drain, "op_submitted"),
                      (sess.drain, "expect"), (sess, "_resync"), (sess.drain, "poll_once"), (sess.host, "batch")):
        timed(obj, name, name)
    d = sess.drain           # the drain's stages, and the device-to-host copy it calls (an instance attribute)
    for obj, name, label in ((d, "_fetch", "drain.fetch"), (d, "_drain_many", "drain._drain_many"),
                             (d, "_deliver", "drain._deliver"), (sess.host, "end_ops", "host.end_ops"),
                             (sess.host, "channel", "host.channel")):
        if getattr(obj, name, None) is not None:
            timed(obj, name, label)
    for nbytes in sizes:
        x = cp.ones(nbytes // 4, dtype=cp.float32)
        y = cp.empty_like(x)
        for prof in (False, True):
            with comm.profiling(prof):
                for _ in range(10):
                    comm.all_reduce(x, y)
                comm.synchronize()
                comm.flush_profiler()
                comm.barrier()
                main_prof = cProfile.Profile()
                acc.clear()
                t0, c0 = time.perf_counter(), time.process_time()
                if prof and top:
                    main_prof.enable()
                for _ in range(nops):
                    comm.all_reduce(x, y)
                t1 = time.perf_counter()
                comm.synchronize()
                t2 = time.perf_counter()
                comm.flush_profiler()
                t3, c1 = time.perf_counter(), time.process_time()
                main_prof.disable()
            out.write(f"## {nbytes} B profiled={prof}: enqueue {(t1 - t0) / nops * 1e6:.1f} us/op, sync "
                      f"{(t2 - t1) * 1e3:.2f} ms, flush {(t3 - t2) * 1e3:.2f} ms, total "
                      f"{(t3 - t0) / nops * 1e6:.1f} us/op\n")
            out.write(f"   process CPU {(c1 - c0) / nops * 1e6:.1f} us/op; per op, wall (CPU of its thread): "
                      + ", ".join(f"{k} {v[0] / nops * 1e6:.1f} ({v[2] / nops * 1e6:.1f}) us, {v[1]} calls"
                                  for k, v in sorted(acc.items())) + "\n")
            if prof and top and comm.rank == 0:
                s = io.StringIO()
                pstats.Stats(main_prof, stream=s).sort_stats("tottime").print_stats(top)
                out.write("\n".join(s.getvalue().splitlines()[4:6 + top + 2]) + "\n")
    return out.getvalue()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="64K,1M,16M")
    p.add_argument("--ops", type=int, default=200)
    p.add_argument("--top", type=int, default=0, help="cProfile rows to print (0: no cProfile, timers only)")
    p.add_argument("--switch-us", type=float, default=0, help="sys.setswitchinterval in every rank (0: Python's)")
    p.add_argument("--pin", action="store_true", help="all threads of a rank on one CPU (main and drain share it)")
    a = p.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    res = slicetrace.launch(body, 2, sizes, a.ops, a.top, a.switch_us, a.pin, backend="cuda",
                            profiler_plugin="example")
    print(res[0])


if __name__ == "__main__":
    main()
