#!/usr/bin/env python3
"""A digest of what the cpu ring loop does, to compare two trees after a change meant to keep behaviour: rank 0's
programs of 2-rank all_reduce, all_gather and reduce_scatter looped back (as cpu_op_icount.py), every dtype,
reduction, in place or not, with and without KernelStep, sampled, over FIFO wraps; the clocks are counters (the
worker's and the reclaim decision's), so the stamp rings' every word, the outputs, the FIFO and the step counters
must match exactly.

    PYTHONPATH=src python scripts/cpu_ring_digest.py            # prints one sha256; run it in both trees
"""
from __future__ import annotations

import hashlib
import itertools
import time
import types

import numpy as np

from slicetrace.backend.base import Work
from slicetrace.backend.cpu import transport, worker
from slicetrace.backend.cpu.shm import PAGE, REASON_MAX
from slicetrace.backend.cpu.stamper import FastRingWriter
from slicetrace.config import Settings
from slicetrace.plan.schedule import plan_collective
from slicetrace.stamps.layout import RingViews, ring_bytes


def counter_clock():
    c = itertools.count(1_000_000_007, 1_000_003)      # two-digit PyLongs, as real clocks are
    return lambda: next(c)


def main() -> None:
    fake = types.SimpleNamespace(monotonic_ns=counter_clock(), perf_counter_ns=counter_clock(),
                                 monotonic=time.monotonic, sleep=time.sleep)    # a wait still times out
    worker.time = transport.time = fake
    h = hashlib.sha256()
    for reclaim in ("auto", "off"):
        s = Settings(cpu_reclaim=reclaim, buffsize=1 << 18)
        ctl = memoryview(bytearray(PAGE)).cast("Q")
        fifo = memoryview(bytearray(s.buffsize))
        rconn, sconn = transport.Conn(ctl, fifo, 0, False, reclaim), transport.Conn(ctl, fifo, 0, True, reclaim)
        rconn.base = sconn.base = 0
        guard = transport.Guard(0, memoryview(bytearray(PAGE)).cast("Q"), memoryview(bytearray(REASON_MAX)), 5.0)
        views = RingViews(bytearray(ring_bytes(1, 256)), 1, 256)
        w = FastRingWriter(views, 0)
        tag = 0
        rng = np.random.default_rng(7)
        for func, dtype, redop, count, inplace, steps, rate in itertools.product(
                ("all_reduce", "all_gather", "reduce_scatter"),    # rank 0 sends first: no peer needed
                ("float32", "int32", "float16"), ("sum", "avg", "max"), (1, 1001, 70000),
                (False, True), (False, True), (1, 3)):
            if rate > 1 and not steps:
                continue
            dt = np.dtype(dtype)
            plan = plan_collective(func, 2, 0, count, dt.itemsize, 0, 1, s.step_bytes)
            cin = count * 2 if func == "reduce_scatter" else count
            cout = count * 2 if func == "all_gather" else count
            x = (rng.integers(-50, 50, max(cin, cout)) / 4).astype(dt)
            if inplace:                                 # rank 0's in-place buffers, as NCCL places them
                x, out = x[:cin], x[:cout]
            else:
                x, out = x[:cin].copy(), np.zeros(cout, dt)
            tag += 1
            work = Work(tag=tag, plan=plan, dtype=dtype, redop=redop, sendbuf=x, recvbuf=out, stamp_steps=steps,
                        stamp_channels=True, sample_rate=rate)
            delta = None
            if np.may_share_memory(x, out):
                delta = x.__array_interface__["data"][0] - out.__array_interface__["data"][0]
            for prog in plan.programs:
                worker.run_ring(prog, worker.RingJob(work, rconn, sconn, w, guard, delta))
            if tag % 5 == 0:
                w.publish()
            h.update(out.tobytes())
            h.update(np.asarray([rconn.step, sconn.step, ctl[0], ctl[1], w.hdr[0], w.hdr[1]]).tobytes())
        w.publish()
        h.update(bytes(fifo))
        h.update(bytes(ctl))
        h.update(views.header.tobytes() + views.started.tobytes() + views.completed.tobytes())
    print(h.hexdigest(), tag)


if __name__ == "__main__":
    main()
