#!/usr/bin/env python3
"""What the stamp writer costs where it runs: staging a 1 MiB all_reduce program's 14 records in a hot loop and
right after a 256 KiB numpy copy, then the writer's calls inside a real 2-rank all_reduce (stage, publish, each
wrapped with the same timer), per op.

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


def _wrap(acc: dict) -> None:
    pc = time.perf_counter_ns
    for name in ("stage", "publish"):
        f = getattr(stamper.FastRingWriter, name)

        def w(self, *a, _f=f, _n=name):
            t = pc()
            r = _f(self, *a)
            ns, calls = acc.get(_n, (0, 0))
            acc[_n] = (ns + pc() - t, calls + 1)
            return r
        setattr(stamper.FastRingWriter, name, w)


def calibrate(acc: dict) -> tuple[float, float]:
    v = RingViews(bytearray(ring_bytes(1, 16384)), 1, 16384)
    w = stamper.FastRingWriter(v, 0)
    src = np.ones(1 << 16, np.float32)
    dst = np.empty_like(src)
    words = [1 << 60, 1 << 60, 1 << 60, 5, 7, 262144 | 1 << 32] * 14
    out = []
    for cold in (False, True):
        acc.clear()
        for i in range(20000):
            if cold:
                np.copyto(dst, src)
            w.stage(words)
            if i % 32 == 31:
                w.publish()
        out.append(sum(ns for ns, _ in acc.values()) / 20000)
    return out[0], out[1]


def body(comm, nbytes: int, nops: int) -> str:
    acc: dict = {}
    _wrap(acc)
    hot, cold = calibrate(acc)
    x = np.ones(nbytes // 4, np.float32)
    out = np.empty_like(x)
    for _ in range(50):
        comm.all_reduce(x, out)
    comm.flush_profiler()
    acc.clear()
    for _ in range(nops):
        comm.all_reduce(x, out)
    comm.flush_profiler()
    calls = ", ".join(f"{n} {ns / nops / 1000:.2f} us ({c / nops:.2f} calls)" for n, (ns, c) in sorted(acc.items()))
    return (f"rank {comm.rank}: 14 records staged (+ a publish per 32) {hot:.0f} ns hot, {cold:.0f} ns after a 256 KiB "
            f"copy; per op in the run: {calls}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=lambda s: sweep.parse_size(s, "bytes"), default=1 << 20)
    p.add_argument("--ops", type=int, default=1000)
    a = p.parse_args()
    for line in slicetrace.launch(body, 2, a.bytes, a.ops, backend="cpu", profiler_plugin="example"):
        print(line)


if __name__ == "__main__":
    main()
