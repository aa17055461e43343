#!/usr/bin/env python3
"""KernelStep's cost in the cpu ring loop alone, with little noise: one process runs rank 0's program of a 2-rank
all_reduce whose next rank is itself (its send FIFO is its receive FIFO), so no peer, no drain and no event host
take part. Blocks with and without KernelStep alternate (KernelCh on in both); the stamp ring is published every
32 ops, as the session's inline poll does.

    PYTHONPATH=src python scripts/cpu_ks_loopback.py [--bytes 1M] [--ops 200] [--rounds 40] [--no-publish]

Two-rank runs (cpu_ks_steady.py) read the same cost with a spread of +-2 us per op; this one within ~0.3 us.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from slicetrace.backend.base import Work
from slicetrace.backend.cpu import worker
from slicetrace.backend.cpu.stamper import FastRingWriter
from slicetrace.backend.cpu.transport import Conn, Guard
from slicetrace.cli import sweep
from slicetrace.config import Settings
from slicetrace.plan.schedule import plan_collective
from slicetrace.stamps.layout import RingViews, ring_bytes

PAGE = 4096


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=lambda v: sweep.parse_size(v, "bytes"), default=1 << 20)
    p.add_argument("--ops", type=int, default=200)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--no-publish", action="store_true", help="drop staged records instead of writing the ring")
    a = p.parse_args()
    s = Settings()
    ctl = memoryview(bytearray(PAGE)).cast("Q")          # one connection: what rank 0 sends, it receives
    fifo = memoryview(bytearray(s.buffsize))
    rconn, sconn = Conn(ctl, fifo, 0, False, s.cpu_reclaim), Conn(ctl, fifo, 0, True, s.cpu_reclaim)
    rconn.base = sconn.base = 0                          # no futex waits: nothing ever sleeps here
    guard = Guard(0, memoryview(bytearray(PAGE)).cast("Q"), memoryview(bytearray(256)), 5.0)
    w = FastRingWriter(RingViews(bytearray(ring_bytes(1, 65536)), 1, 65536), 0)
    count = a.bytes // 4
    plan = plan_collective("all_reduce", 2, 0, count, 4, 0, 1, s.step_bytes)
    x = np.ones(count, np.float32)
    out = np.empty_like(x)
    prog = plan.programs[0]

    def drop() -> None:                 # what is staged, of either kind (stamper: blocks), is thrown away
        w._cut()
        w.blocks.clear()
    publish = drop if a.no_publish else w.publish
    tag = [0]

    def block(steps: bool) -> float:
        t0 = time.perf_counter_ns()
        for i in range(a.ops):
            tag[0] += 1
            work = Work(tag=tag[0], plan=plan, dtype="float32", redop="sum", sendbuf=x, recvbuf=out,
                        stamp_steps=steps, stamp_channels=True)
            worker.run_ring(prog, worker.RingJob(work, rconn, sconn, w, guard, None))
            if i % 32 == 31:
                publish()
        publish()
        return (time.perf_counter_ns() - t0) / a.ops / 1e3

    block(True)
    block(False)
    base, delta = [], []
    for r in range(a.rounds):                       # which goes first alternates
        if r % 2:
            without = block(False)
            with_ks = block(True)
        else:
            with_ks = block(True)
            without = block(False)
        base.append(without)
        delta.append(with_ks - without)
    q1, q3 = np.percentile(delta, [25, 75])
    print(f"{a.bytes} B, {len(prog.prims)} primitives: {statistics.median(base):.1f} us per op without KernelStep, "
          f"KernelStep {statistics.median(delta):+.2f} us per op [{q1:+.2f}, {q3:+.2f}] (median of {a.rounds} "
          f"adjacent pairs{', records dropped unpublished' if a.no_publish else ''})")


if __name__ == "__main__":
    main()
