#!/usr/bin/env python3
"""Instructions per op of the cpu backend's own paths, for cachegrind: run it twice with different --ops and take
the difference of the totals over the difference of the op counts (set-up and import cancel out).

    ring:   rank 0's program of a 2-rank all_reduce looped back (its next rank is itself), worker.run_ring alone
    submit: CpuBackend.submit of the same op looped back (the peer's control block is this rank's own, so the
            signature check passes at once): the backend's per-op path around the ring program

The stamp ring is published every 32 ops (the session's inline poll does too). Exact from run to run with

    OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 setarch -R valgrind --tool=cachegrind --cache-sim=no \\
        --cachegrind-out-file=/dev/null python scripts/cpu_op_icount.py --mode ring --bytes 1M --steps --ops 1500

(the "I refs" line; scripts/cpu_op_icount.sh runs the pairs).
"""
from __future__ import annotations

import argparse

import numpy as np

from slicetrace.backend.base import Work
from slicetrace.backend.cpu import worker
from slicetrace.backend.cpu.backend import CpuBackend
from slicetrace.backend.cpu.shm import PAGE, REASON_MAX
from slicetrace.backend.cpu.stamper import FastRingWriter
from slicetrace.backend.cpu.transport import Conn, Guard
from slicetrace.cli import sweep
from slicetrace.config import Settings
from slicetrace.plan.schedule import plan_collective
from slicetrace.stamps.layout import RingViews, ring_bytes


def looped(s: Settings):
    ctl = memoryview(bytearray(PAGE)).cast("Q")          # one connection: what rank 0 sends, it receives
    fifo = memoryview(bytearray(s.buffsize))
    rconn, sconn = Conn(ctl, fifo, 0, False, s.cpu_reclaim), Conn(ctl, fifo, 0, True, s.cpu_reclaim)
    rconn.base = sconn.base = 0                          # no futex waits: nothing ever sleeps here
    gctl = memoryview(bytearray(PAGE)).cast("Q")
    guard = Guard(0, gctl, memoryview(bytearray(REASON_MAX)), 5.0)
    guard.peers[1] = (gctl, guard.reason, 0, 0)          # submit's signature check reads our own words
    w = FastRingWriter(RingViews(bytearray(ring_bytes(1, 65536)), 1, 65536), 0)
    return rconn, sconn, guard, w


def backend(s: Settings, rconn, sconn, guard, w) -> CpuBackend:
    """A CpuBackend with its per-op state only (no segment, no peers, no heartbeat)."""
    be = CpuBackend.__new__(CpuBackend)
    be.settings, be.rank, be.world, be.nch = s, 0, 2, 1
    be._closed, be._told, be._ntok, be._coll_seq, be._sigs, be._pool = False, False, 0, 0, {}, None
    be.guard, be.ring_recv, be.ring_send, be.writers = guard, [rconn], [sconn], [w]
    return be


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("ring", "submit"), default="ring")
    p.add_argument("--bytes", type=lambda v: sweep.parse_size(v, "bytes"), default=4096)
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--steps", action="store_true", help="KernelStep on (KernelCh is on in both)")
    p.add_argument("--off", action="store_true", help="no stamps at all (no writer)")
    p.add_argument("--reclaim", choices=("on", "off", "auto"), default="on",
                   help="FIFO line reclaim; auto decides from wall-clock timings, so its counts vary run to run")
    a = p.parse_args()
    s = Settings(cpu_reclaim=a.reclaim)
    rconn, sconn, guard, w = looped(s)
    count = a.bytes // 4
    plan = plan_collective("all_reduce", 2, 0, count, 4, 0, 1, s.step_bytes)
    x = np.ones(count, np.float32)
    out = np.empty_like(x)
    prog = plan.programs[0]
    be = backend(s, rconn, sconn, guard, w)
    for i in range(a.ops):
        work = Work(tag=i + 1, plan=plan, dtype="float32", redop="sum", sendbuf=x, recvbuf=out,
                    stamp_steps=a.steps and not a.off, stamp_channels=not a.off)
        if a.mode == "ring":
            worker.run_ring(prog, worker.RingJob(work, rconn, sconn, None if a.off else w, guard, None))
        else:
            be.submit(work)
        if i % 32 == 31:
            w.publish()
    w.publish()
    assert out[0] == 2 or not count


if __name__ == "__main__":
    main()
