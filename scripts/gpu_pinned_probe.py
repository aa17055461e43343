#!/usr/bin/env python3
"""CPU read speed of host memory by allocation kind, as the drain reads its ring mirror: a sequential sum and a
gather of 48-byte rows, from cudaHostAlloc memory (flags 0 / portable+mapped / write-combined), memory
registered with cudaHostRegister, and plain numpy memory; and a device-to-host copy of 1 MiB into each.

    PYTHONPATH=src python3 scripts/gpu_pinned_probe.py [--mib 8]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    import cupy as cp
    from cupy.cuda import runtime as rt
    from slicetrace.backend.cuda.ipc import host_array
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=8)
    a = p.parse_args()
    n = a.mib << 20
    kinds = {}
    for name, flags in (("hostAlloc 0", 0), ("hostAlloc portable|mapped", 3), ("hostAlloc write-combined", 4)):
        kinds[name] = host_array(rt.hostAlloc(n, flags), n)
    reg = np.zeros(n, np.uint8)
    rt.hostRegister(reg.ctypes.data, n, 0)
    kinds["numpy + hostRegister"] = reg
    kinds["numpy"] = np.zeros(n, np.uint8)
    rows = n // 48
    idx = np.random.default_rng(0).permutation(rows)[:24000]
    dev = cp.zeros(1 << 20, np.uint8)
    s = cp.cuda.Stream(non_blocking=True)
    for name, buf in kinds.items():
        buf[:] = 1
        u = buf.view(np.uint64)
        r = buf[:rows * 48].view(np.uint64).reshape(rows, 6)
        t = time.perf_counter()
        for _ in range(5):
            int(u.sum())
        seq = n * 5 / (time.perf_counter() - t) / 1e9
        t = time.perf_counter()
        for _ in range(5):
            r[idx]
        gat = (time.perf_counter() - t) / 5 * 1e3
        t = time.perf_counter()
        for _ in range(20):
            rt.memcpyAsync(buf.ctypes.data, dev.data.ptr, 1 << 20, 2, s.ptr)
            s.synchronize()
        cp_us = (time.perf_counter() - t) / 20 * 1e6
        print(f"{name:28s} sequential read {seq:6.2f} GB/s   gather 24,000 rows {gat:7.3f} ms   "
              f"1 MiB device->host copy {cp_us:7.1f} us", flush=True)


if __name__ == "__main__":
    main()
