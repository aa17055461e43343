#!/usr/bin/env python3
"""Why a FIFO write can be slow on this host: process A (core 0) writes a 512 KiB slot of shared memory, process B
(core 1) then reads it (or not) and maybe stores once per cache line; A's write time per mode, 8 slots in turn.

    python scripts/cpu_line_probe.py [--writes 2000]

On a host whose two cores sit on different L3 caches, A's write after B's plain read runs ~10x slower than
untouched memory, and a store per line by B after its read brings it back (transport.Reclaim acts on this).
"""
from __future__ import annotations

import argparse
import os
import time
from multiprocessing import get_context, shared_memory

import numpy as np

N = 512 * 1024 // 4
SLOTS = 8
MODES = ("untouched", "read", "read+store/line")


def peer(name: str, mode: str, n: int) -> None:
    os.sched_setaffinity(0, {1})
    shm = shared_memory.SharedMemory(name=name)
    flag = np.ndarray((16,), np.int64, shm.buf)
    bufs = [np.ndarray((N,), np.float32, shm.buf, offset=4096 + k * N * 4) for k in range(SLOTS)]
    mine = np.empty(N, np.float32)
    took = []
    deadline = time.monotonic() + 60
    for i in range(n):
        while flag[0] != 2 * i + 1:
            if time.monotonic() > deadline:
                raise SystemExit("writer stopped")
        t = time.perf_counter()
        if mode != "untouched":
            np.copyto(mine, bufs[i % SLOTS])
        if mode == "read+store/line":
            bufs[i % SLOTS].view(np.uint8)[::64] = 0
        took.append(time.perf_counter() - t)
        flag[0] = 2 * i + 2
    flag[1] = int(sorted(took)[len(took) // 2] * 1e9)
    del flag, bufs
    shm.close()


def run(mode: str, n: int) -> tuple[float, float]:
    shm = shared_memory.SharedMemory(create=True, size=4096 + SLOTS * N * 4)
    try:
        flag = np.ndarray((16,), np.int64, shm.buf)
        flag[:] = 0
        bufs = [np.ndarray((N,), np.float32, shm.buf, offset=4096 + k * N * 4) for k in range(SLOTS)]
        src = np.ones(N, np.float32)
        p = get_context("spawn").Process(target=peer, args=(shm.name, mode, n))
        p.start()
        took = []
        deadline = time.monotonic() + 60
        for i in range(n):
            t = time.perf_counter()
            np.copyto(bufs[i % SLOTS], src)
            took.append(time.perf_counter() - t)
            flag[0] = 2 * i + 1
            while flag[0] != 2 * i + 2:
                if time.monotonic() > deadline or not p.is_alive():
                    p.kill()
                    raise SystemExit("reader stopped")
        p.join(10)
        if p.is_alive():
            p.kill()
        res = sorted(took)[len(took) // 2] * 1e6, flag[1] / 1e3
        del flag, bufs
        return res
    finally:
        shm.close()
        shm.unlink()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writes", type=int, default=2000)
    a = p.parse_args()
    os.sched_setaffinity(0, {0})
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} 512 KiB slot, {SLOTS} slots, median of {a.writes} writes")
    for mode in MODES:
        w, r = run(mode, a.writes)
        print(f"{mode:16s} A writes {w:7.1f} us   B reads/stores {r:7.1f} us")


if __name__ == "__main__":
    main()
