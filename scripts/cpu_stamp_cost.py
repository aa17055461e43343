#!/usr/bin/env python3
"""What one stamp-writer call costs where it runs: in a hot loop, right after a 256 KiB numpy copy, and inside
a real 2-rank all_reduce (each FastRingWriter.one/two call wrapped with a timer; the hot figure is measured
with the same wrapper, so the two compare).

    PYTHONPATH=src python scripts/cpu_stamp_cost.py [--bytes 1M] [--ops 1000]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import slicetrace
from slicetrace.backend.cpu import stamper
from slicetrace.cli import sweep
from slicetrace.stamps.layout import RingViews, ring_bytes


def _wrap(acc: list) -> None:
    pc = time.perf_counter_ns
    for name in ("one", "two"):
        f = getattr(stamper.FastRingWriter, name)

        def w(self, *a, _f=f):
            t = pc()
            _f(self, *a)
            acc[0] += pc() - t
            acc[1] += 1
        setattr(stamper.FastRingWriter, name, w)


def calibrate(acc: list) -> tuple[float, float]:
    v = RingViews(bytearray(ring_bytes(1, 16384)), 1, 16384)
    w = stamper.FastRingWriter(v, 0)
    src = np.ones(1 << 16, np.float32)
    dst = np.empty_like(src)
    out = []
    for cold in (False, True):
        acc[:] = [0, 0]
        for _ in range(20000):
            if cold:
                np.copyto(dst, src)
            w.one(5, 7, 1, 2, 3)
        out.append(acc[0] / acc[1])
    return out[0], out[1]


def body(comm, nbytes: int, nops: int) -> str:
    acc = [0, 0]
    _wrap(acc)
    hot, cold = calibrate(acc)
    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    for _ in range(50):
        comm.all_reduce(x, out)
    comm.flush_profiler()
    acc[:] = [0, 0]
    for _ in range(nops):
        comm.all_reduce(x, out)
    comm.flush_profiler()
    return (f"rank {comm.rank}: per writer call {hot:.0f} ns hot, {cold:.0f} ns after a 256 KiB copy, "
            f"{acc[0] / acc[1]:.0f} ns in the run ({acc[1] / nops:.1f} calls and {acc[0] / nops / 1000:.2f} us "
            f"per op)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=lambda s: sweep.parse_size(s, "bytes"), default=1 << 20)
    p.add_argument("--ops", type=int, default=1000)
    a = p.parse_args()
    for line in slicetrace.launch(body, 2, a.bytes, a.ops, backend="cpu", profiler_plugin="example"):
        print(line)


if __name__ == "__main__":
    main()
