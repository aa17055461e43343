#!/usr/bin/env python3
"""The first block of profiled cuda ops: per block, us per op, and the longest calls of the drain, event host and
plugin stages (any thread), 1 MiB all_reduce, 2 ranks, example plugin; then which GPUs hold a context of which
rank (a drain thread that did not select its device made one on GPU 0: ~200 ms once, ~500 MiB).

    NCCL_NVLS_ENABLE=0 PYTHONPATH=src python3 scripts/gpu_first_block.py [ops per block, default 200]
"""
from __future__ import annotations

import os
import sys
import threading
import time

import slicetrace
from slicetrace.events import host as ev_host
from slicetrace.events import plugin as ev_plugin
from slicetrace.stamps import drain as st_drain

STAGES = ((st_drain.Drain, "poll_once"), (st_drain.Drain, "_drain_many"), (st_drain.Drain, "_deliver"),
          (ev_host.EventHost, "batch"), (ev_host.EventHost, "begin_op"), (ev_host.EventHost, "end_ops"),
          (ev_plugin.LoadedPlugin, "kernel_step_runs"), (ev_plugin.LoadedPlugin, "kernel_ch_batch"))


def body(comm, n: int) -> str:
    import cupy
    calls: list[tuple[str, str, float, float]] = []
    for cls, name in STAGES:
        orig = getattr(cls, name, None)
        if orig is None:
            continue

        def wrap(*a, _o=orig, _n=name, **k):
            t = time.perf_counter()
            try:
                return _o(*a, **k)
            finally:
                calls.append((_n, threading.current_thread().name, t, time.perf_counter() - t))
        setattr(cls, name, wrap)
    x = cupy.ones(1 << 18, cupy.float32)
    for _ in range(5):
        comm.all_reduce(x)
    cupy.cuda.Stream.null.synchronize()
    comm.flush_profiler()
    out = []
    for blk in range(3):
        calls.clear()
        t = time.perf_counter()
        for _ in range(n):
            comm.all_reduce(x)
        cupy.cuda.Stream.null.synchronize()
        t1 = time.perf_counter()
        comm.flush_profiler()
        t2 = time.perf_counter()
        tot: dict[tuple[str, str], float] = {}
        for name, th, _, d in calls:
            tot[(name, th)] = tot.get((name, th), 0.0) + d
        top = sorted(calls, key=lambda c: -c[3])[:6]
        out.append(f"rank {comm.rank} block {blk}: {1e6 * (t1 - t) / n:.1f} us/op, flush {1e3 * (t2 - t1):.1f} ms; "
                   f"totals ms " + ", ".join(f"{k[0]}@{k[1][:16]} {1e3 * v:.1f}" for k, v in sorted(tot.items())) +
                   "\n   longest: " + ", ".join(f"{c[0]}@{c[1][:16]} {1e3 * c[3]:.1f} ms at +{1e3 * (c[2] - t):.0f}"
                                             for c in top))
    comm.barrier()                     # both ranks alive: which GPUs hold a context of which rank's process
    if comm.rank == 0:
        import subprocess
        q = ["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id,used_memory", "--format=csv,noheader"]
        apps = subprocess.run(q, capture_output=True, text=True).stdout.strip().replace("\n", " | ")
        out.append(f"compute apps: {apps}")
    out.append(f"rank {comm.rank} pid {os.getpid()} device {cupy.cuda.runtime.getDevice()}")
    comm.barrier()
    return "\n".join(out)


if __name__ == "__main__":
    for r in slicetrace.launch(body, 2, int(sys.argv[1]) if len(sys.argv) > 1 else 200, backend="cuda",
                               profiler_plugin="example"):
        print(r)
